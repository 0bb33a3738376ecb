"""The commit path: what an advance commits, holds, seeks back or dead-letters.

``advance`` commits offset+1 of the last committable record of a lane; a failed or
unclaimed record holds its partition (nothing at or after it is committed, across
batches) and the partition is sought back to it, so that it comes again now; a
rejected record is dead-lettered (or, with no DLQ, committed past). The common case,
one owned partition all clean, is one commit with no planning. Consumer thread.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Sequence

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from acklane.core.connectors import LedgerEntry, verdict
from acklane.core.producer import AdvanceItem

from ._books import TP, RebalanceBooks, names, tp_of
from ._errors import KafkaAdvanceError
from ._health import AUTH_CODES, auth_error
from ._message import KafkaDelivery

__all__ = ["CommitPath"]

log = logging.getLogger("acklane.connectors.kafka")

# Commit errors that mean "the group is rebalancing away from you": the partition is
# (about to be) revoked, and its new owner redelivers from the last commit.
_REBALANCING = frozenset(
    {
        KafkaError.REBALANCE_IN_PROGRESS,
        KafkaError.ILLEGAL_GENERATION,
        KafkaError.UNKNOWN_MEMBER_ID,
        KafkaError.FENCED_INSTANCE_ID,
        KafkaError._ASSIGNMENT_LOST,
        KafkaError._STATE,
    }
)

_outcome_of = operator.attrgetter("outcome")


def _all_clean(batch: Sequence[AdvanceItem[KafkaDelivery]]) -> bool:
    """Whether every item's outcome ``is_clean``, asking each distinct outcome once.

    An engine shares one outcome object among events resolved alike (acklane's
    does), so a batch holds few: the pass over the batch is made in C.
    """
    outcomes = list(map(_outcome_of, batch))
    distinct = dict(zip(map(id, outcomes), outcomes, strict=True))
    return all(outcome.is_clean for outcome in distinct.values())


class CommitPath(RebalanceBooks):
    """Commits, holds, seeks back and dead-letter copies of what the engine advances."""

    def _advance(self, batch: Sequence[AdvanceItem[KafkaDelivery]]) -> None:
        if self._consumer is None:
            raise KafkaAdvanceError(f"{self.config.describe()}: the consumer is not connected")
        if self._all_clean_in_one_owned_lane(batch):
            last: KafkaDelivery = batch[-1].broker_payload
            self._commit([self._position(last, last.offset + 1)])
            return
        plan = self._ledger.plan(
            LedgerEntry(d.lane, d.offset, d.generation, verdict(item.outcome), item)
            for item in batch
            for d in (item.broker_payload,)
        )
        self.stats.skipped_revoked += plan.skipped_revoked
        for item in plan.held:
            self.stats.held += 1
            log.info(
                "Kafka record held group=%s record=%s acked=%d failed=%d: not committed, "
                "redelivering from it",
                self.config.group_id,
                item.broker_payload.message_id,
                item.outcome.acked,
                item.outcome.failed,
            )
        if plan.dead_letter:
            if self.config.dead_letter is not None:
                self._dead_letters.copy(plan.dead_letter, self.config.dead_letter)
            else:
                self._dead_letters.drop(plan.dead_letter)
        if plan.commits:
            self._commit(
                [self._position(item.broker_payload, to) for to, item in plan.commits.values()]
            )
        for tp, offset in plan.seeks.items():
            if tp in self._paused_parts:
                self._deferred_seeks[tp] = offset
            else:
                self._seek(tp, offset)

    def _all_clean_in_one_owned_lane(self, batch: Sequence[AdvanceItem[KafkaDelivery]]) -> bool:
        """The common case: one partition, owned since, not held, every record clean
        (its :func:`~acklane.core.connectors.verdict` is COMMIT: ``is_clean``)."""
        first: KafkaDelivery = batch[0].broker_payload
        last: KafkaDelivery = batch[-1].broker_payload
        lane = first.lane
        return (
            lane == last.lane
            and first.generation == last.generation
            and self._ledger.is_clear(lane, first.generation, last.offset)
            and _all_clean(batch)
        )

    @staticmethod
    def _position(delivery: KafkaDelivery, offset: int) -> TopicPartition:
        """``offset`` of the record's partition, with the record's leader epoch (KIP-320)."""
        topic, partition = delivery.lane
        epoch = delivery.message.leader_epoch()
        if epoch is None:
            return TopicPartition(topic, partition, offset)
        return TopicPartition(topic, partition, offset, leader_epoch=epoch)

    def _commit(self, offsets: list[TopicPartition]) -> None:
        try:
            result = self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if isinstance(error, KafkaError) and error.code() in _REBALANCING:
                self._skip_commit(offsets, error.str())
                return
            if isinstance(error, KafkaError) and error.code() in AUTH_CODES:
                raise auth_error(error, "committing offsets") from exc
            raise KafkaAdvanceError(
                f"commit of {names(tp_of(o) for o in offsets)} for {self.config.describe()} "
                f"failed: {exc}"
            ) from exc
        for tp in result or ():
            if tp.error is not None:
                if tp.error.code() in _REBALANCING:
                    self._skip_commit([tp], tp.error.str())
                    continue
                raise KafkaAdvanceError(
                    f"commit of {tp.topic}[{tp.partition}] at {tp.offset} for "
                    f"{self.config.describe()} failed: {tp.error.str()}"
                )
            self._ledger.committed_to(tp_of(tp), tp.offset)
        self.stats.committed += 1
        if self._health.unreachable is not None:
            self._health.alive()

    def _skip_commit(self, offsets: list[TopicPartition], why: str) -> None:
        self.stats.commit_skipped += 1
        log.warning(
            "Kafka commit skipped group=%s partitions=%s: %s (the group is rebalancing; the "
            "partition's next owner redelivers from its last commit)",
            self.config.group_id,
            names(tp_of(o) for o in offsets),
            why,
        )

    def _seek(self, tp: TP, offset: int) -> None:
        """Seek back to a held offset; records at or after it in batches fetched
        before now are stale (they come again) and are not handed out."""
        try:
            self._consumer.seek(TopicPartition(tp[0], tp[1], offset))
        except KafkaException as exc:
            raise KafkaAdvanceError(
                f"cannot seek {tp[0]}[{tp[1]}] back to held offset {offset} for redelivery: {exc}"
            ) from exc
        self._seek_epoch += 1
        self._sought[tp] = (self._seek_epoch, offset)
        self._ledger.sought(tp, offset)
        self.stats.sought_back += 1
