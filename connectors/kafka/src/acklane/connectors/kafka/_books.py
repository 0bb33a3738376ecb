"""The rebalance books: which partitions this consumer owns, since when, and how its
records are named; kept by the consumer group's rebalance callbacks.

Each assignment of a partition gets a new generation (a record advanced after its
partition was revoked and assigned again is not committed by the new owner's
books); its records are fetched only once its topic's id is known (their message
ids name it, see :mod:`._identity`). A revoke or a loss drops a partition from
every book: floors, pauses, deferred seeks, seeks back, starting positions.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from acklane.core.connectors import CommitLedger
from acklane.core.producer import AdvanceItem

from ._clients import KafkaClients
from ._config import KafkaConfig
from ._identity import ask_topic_ids, read_topic_ids
from ._message import KafkaDelivery, id_prefix

__all__ = ["TP", "RebalanceBooks", "names", "tp_of"]

log = logging.getLogger("acklane.connectors.kafka")

TP = tuple[str, int]


def tp_of(p: Any) -> TP:
    """A ``TopicPartition``'s ``(topic, partition)``."""
    return (p.topic, p.partition)


def names(tps: Any) -> str:
    """``(topic, partition)`` pairs as a log shows them."""
    return ",".join(f"{t}[{p}]" for t, p in sorted(tps)) or "none"


class RebalanceBooks(KafkaClients):
    """What is owned, fetched, paused and sought back, per partition (consumer thread;
    the loop's thread reads the fetch books while it consumes, the thread idle)."""

    def __init__(self, config: KafkaConfig) -> None:
        super().__init__(config)
        # partition -> (generation, id prefix of its records): all the fetch loop reads
        self._fetching: dict[TP, tuple[int, str]] = {}
        # Under auto_offset_reset latest: assigned partitions whose starting position is
        # not committed yet (the first record fetched from each commits it).
        self._starts_at_end = config.starts_at_the_end()
        self._unanchored: set[TP] = set()
        self._generation = 0
        # Generations, floors (lowest held offsets), commits and seeks back, per partition.
        self._ledger: CommitLedger[TP, AdvanceItem[KafkaDelivery]] = CommitLedger()
        self._owned = self._ledger.owned  # partition -> generation of its assignment
        self._assignment: frozenset[TP] = frozenset()  # snapshot of _owned, for the loop
        self._paused = False
        self._paused_parts: set[TP] = set()
        self._deferred_seeks: dict[TP, int] = {}
        # Written on the consumer thread, read on the loop while a batch is handed out:
        # partition -> (seek epoch, offset) of its latest seek back to a held record.
        self._seek_epoch = 0
        self._sought: dict[TP, tuple[int, int]] = {}
        # Partitions assigned during a consume on the loop's thread, named once their
        # topic ids come (the lookup is not waited for there): (partitions and the
        # generation of their assignment, the lookup's futures by topic, or its error).
        self._naming: list[tuple[list[tuple[TP, int]], Mapping[str, Any] | Exception]] = []
        self._on_loop = False  # a consume runs on the loop's thread (callbacks must not wait)

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        # Once per assignment, not per record: a topic deleted and recreated under the
        # same name comes back with a new id (and a rebalance).
        self._health.alive()
        topics = {p.topic for p in partitions}
        assigned: list[tuple[TP, int]] = []
        for p in partitions:
            self._generation += 1
            tp = tp_of(p)
            self._ledger.assign(tp, self._generation)
            assigned.append((tp, self._generation))
            if self._starts_at_end:
                self._unanchored.add(tp)
        self._assignment = frozenset(self._owned)
        if self._on_loop:
            # on the loop's thread, which must not wait: named (their records held back)
            # once the topic ids come, waited for on the consumer thread if need be
            self._naming.append((assigned, ask_topic_ids(self._admin, topics)))
        else:
            self._name(
                assigned,
                read_topic_ids(topics, ask_topic_ids(self._admin, topics), self.config.group_id),
            )
        log.info(
            "Kafka partitions assigned group=%s partitions=%s",
            self.config.group_id,
            names(tp_of(p) for p in partitions),
        )

    def _name(self, assigned: list[tuple[TP, int]], topic_ids: Mapping[str, str]) -> None:
        """Fetch the records of partitions still owned since this assignment, named
        by the cluster and their topic's id."""
        cluster = self._cluster_id
        for tp, generation in assigned:
            if self._owned.get(tp) == generation:
                prefix = id_prefix(cluster, tp[0], topic_ids.get(tp[0]), tp[1])
                self._fetching[tp] = (generation, prefix)

    def _name_assigned(self, *, wait: bool) -> bool:
        """Name the partitions assigned on the loop's thread; False (nothing named) when
        a topic id lookup is not done and ``wait`` is false (the loop's thread)."""
        if not wait:
            for _, lookup in self._naming:
                if not isinstance(lookup, Exception) and not all(f.done() for f in lookup.values()):
                    return False
        naming, self._naming = self._naming, []
        for assigned, lookup in naming:
            self._name(
                assigned,
                read_topic_ids({tp[0] for tp, _ in assigned}, lookup, self.config.group_id),
            )
        return True

    def _forget(self, partitions: list[Any]) -> list[TP]:
        gone = [tp_of(p) for p in partitions]
        for tp in gone:
            self._ledger.revoke(tp)
            self._fetching.pop(tp, None)
            self._unanchored.discard(tp)
            self._deferred_seeks.pop(tp, None)
            self._sought.pop(tp, None)
            self._paused_parts.discard(tp)
        self._assignment = frozenset(self._owned)
        return gone

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        gone = self._forget(partitions)
        log.info(
            "Kafka partitions revoked group=%s partitions=%s: their pending records leave the "
            "books without a commit (the new owner redelivers them)",
            self.config.group_id,
            names(gone),
        )

    def _on_lost(self, consumer: Any, partitions: list[Any]) -> None:
        gone = self._forget(partitions)
        log.warning(
            "Kafka partitions lost group=%s partitions=%s: their pending records leave the "
            "books without a commit",
            self.config.group_id,
            names(gone),
        )
