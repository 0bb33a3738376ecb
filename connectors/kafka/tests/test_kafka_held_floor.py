"""Kafka producer bookkeeping with a stand-in consumer.

The real-broker behaviour is in integration/tests/test_kafka_producer.py; this covers
what a broker cannot be made to do on cue: a held record that is gone from the log
(retention, compaction, DeleteRecords) when the partition is sought back to it, which
tansu cannot produce, and a seek back that lands while a batch is half handed out.
"""

from __future__ import annotations

from typing import Any

from confluent_kafka import TopicPartition

from acklane.connectors.kafka import KafkaConfig, KafkaDelivery, KafkaMessage, KafkaStreamProducer
from acklane.connectors.kafka._fetch import _Handout
from acklane.core.producer import AdvanceItem
from acklane.integration.testing import CLEAN, FAILED


class Record:
    def __init__(self, offset: int) -> None:
        self._offset = offset

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return "t"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def leader_epoch(self) -> None:
        return None


class StandInConsumer:
    """Records the commits and seeks; consume() hands out what the test queued."""

    def __init__(self) -> None:
        self.commits: list[list[tuple[int, int]]] = []
        self.seeks: list[tuple[int, int]] = []
        self.queued: list[Record] = []

    def commit(self, offsets: Any, asynchronous: bool) -> Any:
        self.commits.append([(o.partition, o.offset) for o in offsets])
        return offsets

    def seek(self, tp: Any) -> None:
        self.seeks.append((tp.partition, tp.offset))

    def consume(self, num_messages: int, timeout: float) -> list[Record]:
        out, self.queued = self.queued[:num_messages], self.queued[num_messages:]
        return out


def delivery(offset: int) -> KafkaDelivery:
    return KafkaDelivery(Record(offset), 1, ("t", 0), offset)


def test_a_held_record_gone_from_the_log_does_not_stop_the_partition_for_good() -> None:
    producer = KafkaStreamProducer(
        KafkaConfig(bootstrap_servers="127.0.0.1:9", topics=["t"], group_id="g")
    )
    consumer = StandInConsumer()
    producer._consumer = consumer
    producer._on_assign(consumer, [TopicPartition("t", 0)])
    producer._advance([AdvanceItem(delivery(0), CLEAN), AdvanceItem(delivery(1), FAILED)])
    assert consumer.seeks == [(0, 1)]
    assert consumer.commits == [[(0, 1)]]
    # offsets 1 and 2 were removed from the log: after the seek the consumer resumes at 3
    consumer.queued = [Record(3), Record(4)]
    _, fetched = producer._fetch(10, False)
    assert [r.offset for r in fetched] == [3, 4]
    producer._advance([AdvanceItem(delivery(3), CLEAN), AdvanceItem(delivery(4), CLEAN)])
    assert consumer.commits[-1] == [(0, 5)]


def test_a_held_record_that_comes_back_keeps_its_floor_until_resolved() -> None:
    producer = KafkaStreamProducer(
        KafkaConfig(bootstrap_servers="127.0.0.1:9", topics=["t"], group_id="g")
    )
    consumer = StandInConsumer()
    producer._consumer = consumer
    producer._on_assign(consumer, [TopicPartition("t", 0)])
    producer._advance([AdvanceItem(delivery(0), FAILED)])
    consumer.queued = [Record(0), Record(1)]
    producer._fetch(10, False)
    assert producer._ledger.floors == {("t", 0): 0}  # it came back: still held until resolved
    producer._advance([AdvanceItem(delivery(0), CLEAN), AdvanceItem(delivery(1), CLEAN)])
    assert consumer.commits[-1] == [(0, 2)] and producer._ledger.floors == {}


class LogConsumer(StandInConsumer):
    """One partition holding offsets 0..9; consume() reads on from where seek() put it."""

    def __init__(self) -> None:
        super().__init__()
        self.position = 0

    def consume(self, num_messages: int, timeout: float) -> list[Record]:
        out = [Record(o) for o in range(self.position, min(10, self.position + num_messages))]
        self.position += len(out)
        return out

    def seek(self, tp: Any) -> None:
        super().seek(tp)
        self.position = tp.offset

    def close(self) -> None:
        pass


class LogProducer(KafkaStreamProducer):
    def _connect(self) -> None:
        self._consumer = LogConsumer()
        self._on_assign(self._consumer, [TopicPartition("t", 0)])


async def test_records_of_a_batch_sought_back_while_it_is_handed_out_are_not_handed_out() -> None:
    producer = LogProducer(
        KafkaConfig(bootstrap_servers="127.0.0.1:9", topics=["t"], group_id="g", poll_timeout=0.01)
    )
    stream = producer.open_stream()
    try:
        raw0, delivery0 = await anext(stream)
        assert [raw0.offset, (await anext(stream))[0].offset] == [0, 1]  # of one batch of 10
        await producer.advance([AdvanceItem(delivery0, FAILED)])  # held: sought back to 0
        assert producer._consumer.seeks == [(0, 0)]
        # 2..9 of that batch are stale: the redelivery comes next, from the held record
        assert [(await anext(stream))[0].offset for _ in range(4)] == [0, 1, 2, 3]
        assert producer._outstanding == 5  # 1, then 0..3 again: the stale ones never counted
    finally:
        await stream.aclose()
        await producer.aclose()


async def test_a_run_taken_at_once_leaves_out_what_was_sought_back_since_its_fetch() -> None:
    # The engine takes a run whose watchers have room all at once (at_once()): the
    # records at or after a seek back made since the run was fetched are stale there
    # too, checked once for the run; the others count as outstanding.
    producer = LogProducer(
        KafkaConfig(bootstrap_servers="127.0.0.1:9", topics=["t"], group_id="g", poll_timeout=0.01)
    )
    records = [KafkaMessage(Record(o), 1, ("t", 0), o, "p/") for o in range(10)]
    fetched_in = producer._seek_epoch
    assert [r.offset for r, _ in _Handout(producer, records, fetched_in).at_once()] == list(
        range(10)
    )
    assert producer._outstanding == 10
    producer._sought[("t", 0)] = (fetched_in + 1, 4)  # a seek back to 4 after that fetch
    taken = list(_Handout(producer, records, fetched_in).at_once())
    assert [(r.offset, p.offset) for r, p in taken] == [(o, o) for o in range(4)]
    assert producer._outstanding == 14
    # a run fetched after that seek is current: all of it
    assert len(list(_Handout(producer, records, fetched_in + 1).at_once())) == 10
