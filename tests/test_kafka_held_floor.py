"""Kafka producer bookkeeping with a stand-in consumer (the emulator cannot delete records).

The real-broker behaviour is in integration/tests/test_kafka_producer.py; this covers a
held record that is gone from the log (retention, compaction, DeleteRecords) when the
partition is sought back to it, which tansu cannot produce.
"""

from __future__ import annotations

from typing import Any

from acklane.connectors.kafka import KafkaConfig, KafkaDelivery, KafkaStreamProducer
from acklane.core.producer import AdvanceItem, AdvanceOutcome

CLEAN = AdvanceOutcome(1, 0)
FAILED = AdvanceOutcome(1, 1)


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
    producer._owned = {("t", 0): 1}
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
    producer._owned = {("t", 0): 1}
    producer._advance([AdvanceItem(delivery(0), FAILED)])
    consumer.queued = [Record(0), Record(1)]
    producer._fetch(10, False)
    assert producer._floor == {("t", 0): 0}  # it came back: still held until resolved
    producer._advance([AdvanceItem(delivery(0), CLEAN), AdvanceItem(delivery(1), CLEAN)])
    assert consumer.commits[-1] == [(0, 2)] and producer._floor == {}
