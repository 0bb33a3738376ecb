"""A dead-letter copy must fit: what acklane adds is bounded, too small a DLQ topic is
reported at start, and a copy refused anyway fails the group with what to change.

Nothing is committed past a rejected record that was not dead-lettered: a copy that
cannot fit stops its partition, it is never dropped. tansu keeps the topic configs
given at creation (and reports only those) but does not enforce
``max.message.bytes``: the broker's refusal is played by a stand-in producer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaError, TopicPartition

from acklane.connectors.kafka import (
    KafkaAdvanceError,
    KafkaConfig,
    KafkaMessage,
    KafkaStreamProducer,
)
from acklane.connectors.kafka import _dlq as kafka_dlq
from acklane.connectors.kafka._dlq import DLQ_ADDED_MAX_BYTES, DLQ_GROUP_MAX_BYTES
from acklane.core.connectors.deadletter import REASON_MAX_BYTES, TRUNCATED_MARK, bounded_text
from acklane.core.producer import AdvanceItem, AdvanceOutcome
from acklane.integration.kafka import KafkaKit
from acklane.integration.testing import CLEAN, rejected

MakeConfig = Callable[..., KafkaConfig]
OpenStream = Callable[[KafkaConfig], Any]

ACKLANE_HEADERS = (
    "acklane.origin.topic",
    "acklane.origin.partition",
    "acklane.origin.offset",
    "acklane.origin.group",
    "acklane.reject.reason",
)


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


# -- what acklane adds to a copy ----------------------------------------------------------


async def test_the_reason_is_cut_to_its_bound_and_the_group_name_too(
    kafka_kit: KafkaKit, make_kafka_config: MakeConfig, open_kafka_stream: OpenStream
) -> None:
    topic, dlq = kafka_kit.new_topic(), kafka_kit.new_topic("dlq")
    kafka_kit.produce(topic, [b"bad"])
    group = KafkaKit.unique("g" * 400)
    config = make_kafka_config(topic, dead_letter=dlq, group_id=group)
    driver = open_kafka_stream(config)

    [(_, delivery)] = await driver.take(1)
    await driver.producer.advance([AdvanceItem(delivery, rejected("é" * 5000, "more"))])

    [copy] = kafka_kit.read(dlq, 1)
    added = {name: value for name, value in copy.headers() if name in ACKLANE_HEADERS}
    reason = added["acklane.reject.reason"]
    assert len(reason) <= REASON_MAX_BYTES and reason.endswith(TRUNCATED_MARK.encode())
    assert reason.decode("utf-8").startswith("é" * 100)  # never cut mid-character
    assert added["acklane.origin.group"] == bounded_text(group, DLQ_GROUP_MAX_BYTES).encode()
    assert len(added["acklane.origin.group"]) <= DLQ_GROUP_MAX_BYTES
    assert sum(len(n) + len(v) for n, v in added.items()) <= DLQ_ADDED_MAX_BYTES
    assert kafka_kit.committed(group, topic) == {0: 1}


async def test_a_rejection_without_reasons_says_how_many_watchers_rejected_it(
    kafka_kit: KafkaKit, make_kafka_config: MakeConfig, open_kafka_stream: OpenStream
) -> None:
    topic, dlq = kafka_kit.new_topic(), kafka_kit.new_topic("dlq")
    kafka_kit.produce(topic, [b"a", b"b"])
    driver = open_kafka_stream(make_kafka_config(topic, dead_letter=dlq))

    got = await driver.take(2)
    outcomes = [AdvanceOutcome(0, 0, 1), AdvanceOutcome(0, 0, 2, ("", ""))]
    await driver.producer.advance(
        [AdvanceItem(d, o) for (_, d), o in zip(got, outcomes, strict=True)]
    )

    reasons = [dict(c.headers())["acklane.reject.reason"] for c in kafka_kit.read(dlq, 2)]
    assert reasons == [b"rejected by 1 watcher", b"rejected by 2 watchers"]


# -- the check at start ----------------------------------------------------------------


async def test_a_dead_letter_topic_smaller_than_a_source_topic_is_reported_at_start(
    kafka_kit: KafkaKit,
    make_kafka_config: MakeConfig,
    open_kafka_stream: OpenStream,
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = kafka_kit.new_topic(config={"max.message.bytes": "1000000"})
    dlq = kafka_kit.new_topic("dlq", config={"max.message.bytes": "2000"})
    kafka_kit.produce(topic, [b"a"])
    driver = open_kafka_stream(make_kafka_config(topic, dead_letter=dlq))

    with caplog.at_level(logging.WARNING, logger="acklane.connectors.kafka"):
        await driver.take(1)

    [warning] = warnings_of(caplog)
    assert f"max.message.bytes of the DLQ topic {dlq} is 2000 bytes" in warning
    assert f"smaller than topic {topic}'s max.message.bytes 1000000" in warning
    assert f"at least {1_000_000 + DLQ_ADDED_MAX_BYTES}" in warning
    assert driver.producer._dead_letters.limit == 2000


async def test_a_dlq_producer_limit_smaller_than_a_source_topic_is_reported_at_start(
    kafka_kit: KafkaKit,
    make_kafka_config: MakeConfig,
    open_kafka_stream: OpenStream,
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = kafka_kit.new_topic(config={"max.message.bytes": "1000000"})
    dlq = kafka_kit.new_topic("dlq", config={"max.message.bytes": "2000000"})
    kafka_kit.produce(topic, [b"a"])
    config = make_kafka_config(
        topic, dead_letter=dlq, dead_letter_client={"message.max.bytes": 5000}
    )
    driver = open_kafka_stream(config)

    with caplog.at_level(logging.WARNING, logger="acklane.connectors.kafka"):
        await driver.take(1)

    [warning] = warnings_of(caplog)
    assert (
        "message.max.bytes of the dead-letter producer (dead_letter_client) is 5000 bytes"
        in warning
    )


async def test_a_dead_letter_topic_large_enough_starts_without_a_warning(
    kafka_kit: KafkaKit,
    make_kafka_config: MakeConfig,
    open_kafka_stream: OpenStream,
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = kafka_kit.new_topic(config={"max.message.bytes": "1000000"})
    dlq = kafka_kit.new_topic("dlq", config={"max.message.bytes": "1000000"})
    kafka_kit.produce(topic, [b"a"])
    driver = open_kafka_stream(make_kafka_config(topic, dead_letter=dlq))

    with caplog.at_level(logging.WARNING, logger="acklane.connectors.kafka"):
        await driver.take(1)

    assert warnings_of(caplog) == []


# -- a copy refused anyway ----------------------------------------------------------------


async def test_a_copy_the_dlq_producer_refuses_fails_the_group_naming_record_size_and_settings(
    kafka_kit: KafkaKit, make_kafka_config: MakeConfig, open_kafka_stream: OpenStream
) -> None:
    topic, dlq = kafka_kit.new_topic(), kafka_kit.new_topic("dlq")
    kafka_kit.produce(topic, [b"y" * 5000], key=b"k")
    config = make_kafka_config(
        topic, dead_letter=dlq, dead_letter_client={"message.max.bytes": 1000}
    )
    driver = open_kafka_stream(config)

    [(raw, delivery)] = await driver.take(1)
    with pytest.raises(KafkaAdvanceError) as info:
        await driver.producer.advance([AdvanceItem(delivery, rejected("no"))])

    text = str(info.value)
    assert f"cannot dead-letter {raw.message_id}: its copy is " in text
    size = int(text.split("its copy is ")[1].split(" bytes")[0])
    assert 5001 < size < 5001 + DLQ_ADDED_MAX_BYTES  # value, key and headers
    assert "message.max.bytes of 1000 bytes" in text
    assert f"max.message.bytes on the DLQ topic {dlq!r}" in text
    assert "message.max.bytes in dead_letter_client" in text
    assert driver.producer.stats.dead_letter_refused == 1
    assert driver.producer.counters()["dead_letter_refused"] == 1  # the metrics read these
    assert driver.producer.stats.dead_lettered == 0
    assert kafka_kit.committed(config.group_id, topic) == {0: None}


class Delivery:
    """What a Message answers to the producer's dead-letter path."""

    def __init__(self, offset: int, value: bytes) -> None:
        self._offset, self._value = offset, value

    def topic(self) -> str:
        return "orders"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def key(self) -> None:
        return None

    def value(self) -> bytes:
        return self._value

    def headers(self) -> None:
        return None

    def leader_epoch(self) -> None:
        return None


class RefusingProducer:
    """A DLQ producer whose broker refuses every copy as too large (in the delivery report)."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = settings
        self.reports: list[Any] = []

    def produce(self, topic: str, on_delivery: Any, **_: Any) -> None:
        self.reports.append(on_delivery)

    def flush(self, timeout: float) -> int:
        for report in self.reports:
            report(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), None)
        self.reports.clear()
        return 0

    def poll(self, timeout: float) -> int:
        return 0


class StandInConsumer:
    def __init__(self) -> None:
        self.commits: list[Any] = []

    def commit(self, offsets: Any, asynchronous: bool) -> Any:
        self.commits.append(offsets)
        return offsets


def test_a_copy_the_broker_refuses_fails_the_group_naming_the_topic_limit_and_counts_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[RefusingProducer] = []

    def producer(settings: dict[str, Any]) -> RefusingProducer:
        made.append(RefusingProducer(settings))
        return made[-1]

    monkeypatch.setattr(kafka_dlq, "Producer", producer)
    config = KafkaConfig(
        bootstrap_servers="127.0.0.1:9", topics=["orders"], group_id="g", dead_letter="orders.dlq"
    )
    kafka = KafkaStreamProducer(config)
    kafka._consumer = consumer = StandInConsumer()
    kafka._cluster_id = "c-1"
    kafka._on_assign(consumer, [TopicPartition("orders", 0)])
    kafka._dead_letters.limit = 2000  # read at start from the DLQ topic's max.message.bytes
    _, prefix = kafka._fetching[("orders", 0)]
    items = [
        AdvanceItem(KafkaMessage(Delivery(o, b"z" * 3000), 1, ("orders", 0), o, prefix), outcome)
        for o, outcome in [(0, CLEAN), (1, rejected("no")), (2, rejected("no"))]
    ]

    with pytest.raises(KafkaAdvanceError) as info:
        kafka._advance(items)

    text = str(info.value)
    assert text.startswith("cannot dead-letter kafka:c-1/orders/0/1: its copy is ")
    assert "the broker refused it: over the max.message.bytes of 2000 bytes of topic" in text
    assert "Raise max.message.bytes on the DLQ topic 'orders.dlq'" in text
    assert kafka.stats.dead_letter_refused == 2 and kafka.stats.dead_lettered == 0
    assert consumer.commits == []  # not even the clean record before them
    assert made[0].settings["batch.size"] == 2000  # copies batched together fit the topic too
