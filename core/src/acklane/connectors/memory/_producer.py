"""A consumer group of a :class:`MemoryBroker`, with Kafka's commit semantics."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Hashable, Mapping, Sequence
from typing import NamedTuple

from acklane.core.connectors import Action, CommitLedger, LedgerEntry, verdict
from acklane.core.connectors.deadletter import REJECT_REASON, log_origin, outcome_reason
from acklane.core.message import RawMessage
from acklane.core.producer import AdvanceItem, SharedStreamProducer

from ._broker import MemoryBroker, MemoryConsumer, MemoryGroupStats, MemoryRecord, TopicPartition
from ._config import MemoryConfig

__all__ = ["MemoryDelivery", "MemoryStreamProducer"]


class MemoryDelivery(NamedTuple):
    """The broker payload of one delivery: the record, and the seek epoch it was read in."""

    record: MemoryRecord
    epoch: int

    @property
    def tp(self) -> TopicPartition:
        return self.record.tp

    @property
    def offset(self) -> int:
        return self.record.offset


#: The memory broker has no rebalances: every partition is owned once, as this.
_GENERATION = 0


class MemoryStreamProducer(SharedStreamProducer[MemoryDelivery]):
    """One group's consumer of a :class:`MemoryBroker`, with Kafka's commit semantics.

    Lane = ``(topic, partition)``; what to commit, dead-letter, hold and seek back
    to is the :class:`~acklane.core.connectors.CommitLedger`'s plan, as for Kafka.
    """

    def __init__(self, config: MemoryConfig) -> None:
        self.config = config
        self._consumer: MemoryConsumer | None = None
        self._ledger: CommitLedger[TopicPartition, AdvanceItem[MemoryDelivery]] = CommitLedger()
        #: Seeks back to a held offset (``Action.SOUGHT_BACK``).
        self.sought_back = 0

    @property
    def broker(self) -> MemoryBroker:
        return MemoryBroker.get(self.config.broker)

    @property
    def stats(self) -> MemoryGroupStats:
        return self.broker.stats(self.config.group_id)

    def counters(self) -> Mapping[str, float]:
        s = self.stats
        return {
            Action.DELIVERED: s.delivered,
            Action.SOUGHT_BACK: self.sought_back,
            Action.DEAD_LETTERED: s.dead_lettered,
            Action.DROPPED: s.dropped,
        }

    def held_offsets(self) -> dict[TopicPartition, list[int]]:
        """The offset holding each partition back (its floor), for observability."""
        return {tp: [floor] for tp, floor in self._ledger.floors.items()}

    async def open_stream(self) -> AsyncIterator[tuple[RawMessage, MemoryDelivery]]:
        config = self.config
        consumer = self.broker.consumer(
            config.group_id, config.topics, partitions=config.partitions
        )
        self._consumer = consumer
        for tp in consumer.assignment:
            self._ledger.assign(tp, _GENERATION, consumer.position(tp))
        try:
            while True:
                batch = consumer.poll(config.batch_size)
                if not batch:
                    await consumer.wait(config.poll_interval)
                    continue
                epochs = consumer._epochs
                for record, epoch in batch:
                    if epoch != epochs[record.tp] and record.offset >= consumer.seek_offset(
                        record.tp
                    ):
                        continue  # sought back over it while it sat here: it comes again
                    message = RawMessage(
                        record.value,
                        record.headers,
                        record.key,
                        record.message_id,
                        None,
                        consumer.record_delivery(record),
                        record.topic,
                        record,
                    )
                    yield message, MemoryDelivery(record, epoch)
                # One batch at most between two turns of the event loop.
                await asyncio.sleep(0)
        finally:
            consumer.close()

    def get_advance_lane(self, broker_payload: MemoryDelivery) -> Hashable:
        return broker_payload.record.tp

    def message_id(self, broker_payload: MemoryDelivery) -> str | None:
        return broker_payload.record.message_id

    async def advance(self, batch: Sequence[AdvanceItem[MemoryDelivery]]) -> None:
        consumer = self._consumer
        if consumer is None:
            raise RuntimeError("advance() called before open_stream() opened the consumer")
        ledger = self._ledger
        plan = ledger.plan(
            LedgerEntry(p.record.tp, p.record.offset, _GENERATION, verdict(item.outcome), item)
            for item in batch
            for p in (item.broker_payload,)
        )
        if plan.commits:
            self._dead_letter(consumer, plan.dead_letter)
            commits = {tp: offset for tp, (offset, _) in plan.commits.items()}
            consumer.commit(commits)
            for tp, offset in commits.items():
                ledger.committed_to(tp, offset)
        # Seek unless a seek made after the held copy was read already covers it.
        to_seek = set()
        for item in plan.held:
            p = item.broker_payload
            if p.epoch == consumer.epoch(p.tp) or consumer.seek_offset(p.tp) > p.offset:
                to_seek.add(p.tp)
        for tp in to_seek:
            consumer.seek(tp, ledger.floors[tp])
        self.sought_back += len(to_seek)

    def _dead_letter(
        self, consumer: MemoryConsumer, items: Sequence[AdvanceItem[MemoryDelivery]]
    ) -> None:
        """Copy the rejected records the commit is about to pass to the DLQ, or count them."""
        if not items:
            return
        dlq = self.config.dead_letter
        if dlq is None:
            consumer.count(dropped=len(items))
            return
        for item in items:
            record = item.broker_payload.record
            headers = dict(record.headers)
            headers.update(log_origin(record.topic, record.partition, record.offset))
            headers[REJECT_REASON] = outcome_reason(item.outcome)
            consumer.broker.publish(dlq, record.value, record.key, headers)
        consumer.count(dead_lettered=len(items))

    async def aclose(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
