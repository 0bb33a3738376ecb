"""The Kafka producer hands a fetch out in runs of one partition (LaneBatch), with a
stand-in consumer holding real client messages; and its all-clean check."""

from __future__ import annotations

from typing import Any

from confluent_kafka import Message, TopicPartition

from acklane.connectors.kafka import KafkaConfig, KafkaMessage, KafkaStreamProducer
from acklane.connectors.kafka._commit import _all_clean
from acklane.core.producer import AdvanceItem, AdvanceOutcome, LaneBatch


class QueuedConsumer:
    """consume() hands out the queued messages (then nothing)."""

    def __init__(self, queued: list[Any]) -> None:
        self.queued = queued

    def consume(self, num_messages: int, timeout: float) -> list[Any]:
        out, self.queued = self.queued[:num_messages], self.queued[num_messages:]
        return out

    def close(self) -> None:
        pass


def _messages(*runs: tuple[int, range]) -> list[Any]:
    return [
        Message(topic="t", partition=p, offset=o, value=b"{}")
        for p, offsets in runs
        for o in offsets
    ]


class RunsProducer(KafkaStreamProducer):
    queued: list[Any] = []

    def _connect(self) -> None:
        self._consumer = QueuedConsumer(list(self.queued))
        self._on_assign(self._consumer, [TopicPartition("t", 0), TopicPartition("t", 1)])


async def test_a_fetch_is_handed_out_in_runs_of_one_partition() -> None:
    RunsProducer.queued = _messages((0, range(3)), (1, range(2)), (0, range(3, 4)))
    producer = RunsProducer(
        KafkaConfig(bootstrap_servers="127.0.0.1:9", topics=["t"], group_id="g", poll_timeout=0.01)
    )
    batches = producer.open_batches()
    try:
        got = []
        for _ in range(3):
            batch = await anext(batches)
            assert type(batch) is LaneBatch
            got.append((batch.lane, [(raw.offset, raw is payload) for raw, payload in batch.pairs]))
        assert got == [
            (("t", 0), [(0, True), (1, True), (2, True)]),
            (("t", 1), [(0, True), (1, True)]),
            (("t", 0), [(3, True)]),
        ]
        assert producer._outstanding == 6
    finally:
        await batches.aclose()
        await producer.aclose()


def test_all_clean_asks_each_distinct_outcome() -> None:
    clean = AdvanceOutcome(2, 0)
    items = [AdvanceItem(i, clean) for i in range(5)]
    assert _all_clean(items)
    assert not _all_clean([*items, AdvanceItem(9, AdvanceOutcome(1, 1))])
    assert not _all_clean([AdvanceItem(0, AdvanceOutcome(0, 0))])  # nobody acked it
    # equal outcomes that are distinct objects are each asked
    assert _all_clean([AdvanceItem(0, AdvanceOutcome(1, 0)), AdvanceItem(1, AdvanceOutcome(1, 0))])


def test_a_fetched_record_is_the_one_its_constructor_makes() -> None:
    """The fetch loop sets a plain record's fields itself (no constructor call per
    record): every slot as ``KafkaMessage(...)`` sets it, and it behaves the same."""
    producer = KafkaStreamProducer(
        KafkaConfig(bootstrap_servers="127.0.0.1:9", topics=["t"], group_id="g")
    )
    producer._cluster_id = "c"
    producer._on_assign(None, [TopicPartition("t", 0)])
    (message,) = _messages((0, range(5, 6)))
    _, (fetched,), starts = producer._runs(0, [message], anchor=False)
    assert starts == [0]
    generation, prefix = producer._fetching[("t", 0)]
    built = KafkaMessage(message, generation, ("t", 0), 5, prefix)
    assert type(fetched) is KafkaMessage
    for slot in KafkaMessage.__slots__:
        assert getattr(fetched, slot) == getattr(built, slot), slot
    assert fetched.message_id == built.message_id == f"{prefix}5"
    assert fetched.attributes == built.attributes == {}
    assert fetched.timestamp == built.timestamp
    assert fetched.json() == built.json() == {}
