"""The Kafka producer against a real broker: one test per rule of its ack mapping.

The tests drive the producer like the engine does (pull from ``open_kafka_stream``,
hand resolved prefixes of one lane to ``advance``) and read the consumer group's
committed offsets back with a separate client.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest

from acklane.connectors.kafka import KafkaConfig
from acklane.core.producer import AdvanceItem, AdvanceOutcome
from acklane.integration.kafka import KafkaKit
from acklane.integration.testing import CLEAN, FAILED, UNCLAIMED, rejected

MakeConfig = Callable[..., KafkaConfig]
OpenStream = Callable[[KafkaConfig], Any]


def items(pairs: list[Any], *outcomes: AdvanceOutcome) -> list[AdvanceItem]:
    assert len(pairs) == len(outcomes)
    return [AdvanceItem(delivery, o) for (_, delivery), o in zip(pairs, outcomes, strict=True)]


async def test_clean_batch_is_committed_past_its_last_record(
    kafka_kit: KafkaKit, make_kafka_config: MakeConfig, open_kafka_stream: OpenStream
) -> None:
    topic = kafka_kit.new_topic()
    kafka_kit.produce(topic, [b"a", b"b", b"c"])
    config = make_kafka_config(topic)
    driver = open_kafka_stream(config)

    got = await driver.take(3)
    await driver.producer.advance(items(got, CLEAN, CLEAN, CLEAN))

    assert kafka_kit.committed(config.group_id, topic) == {0: 3}


async def test_failed_head_holds_the_partition_and_is_redelivered_in_the_same_session(
    kafka_kit: KafkaKit, make_kafka_config: MakeConfig, open_kafka_stream: OpenStream
) -> None:
    topic = kafka_kit.new_topic()
    kafka_kit.produce(topic, [b"a", b"b", b"c"])
    config = make_kafka_config(topic)
    driver = open_kafka_stream(config)

    got = await driver.take(3)
    await driver.producer.advance(items(got, FAILED, CLEAN, CLEAN))

    assert kafka_kit.committed(config.group_id, topic) == {0: None}
    again = await driver.take(3)
    assert [raw.offset for raw, _ in again] == [0, 1, 2]
    await driver.producer.advance(items(again, CLEAN, CLEAN, CLEAN))
    assert kafka_kit.committed(config.group_id, topic) == {0: 3}


async def test_held_floor_stops_a_later_batch_from_committing_over_it(
    kafka_kit: KafkaKit, make_kafka_config: MakeConfig, open_kafka_stream: OpenStream
) -> None:
    topic = kafka_kit.new_topic()
    kafka_kit.produce(topic, [b"a", b"b", b"c", b"d"])
    config = make_kafka_config(topic)
    driver = open_kafka_stream(config)
    got = await driver.take(4)

    await driver.producer.advance(items(got[:2], CLEAN, FAILED))
    await driver.producer.advance(items(got[2:], CLEAN, CLEAN))

    assert kafka_kit.committed(config.group_id, topic) == {0: 1}
    again = await driver.take(3)
    assert [raw.offset for raw, _ in again] == [1, 2, 3]
    await driver.producer.advance(items(again, CLEAN, CLEAN, CLEAN))
    assert kafka_kit.committed(config.group_id, topic) == {0: 4}


async def test_unclaimed_record_holds_the_partition_and_is_redelivered(
    kafka_kit: KafkaKit, make_kafka_config: MakeConfig, open_kafka_stream: OpenStream
) -> None:
    topic = kafka_kit.new_topic()
    kafka_kit.produce(topic, [b"a", b"b"])
    config = make_kafka_config(topic)
    driver = open_kafka_stream(config)

    got = await driver.take(2)
    await driver.producer.advance(items(got, CLEAN, UNCLAIMED))

    assert kafka_kit.committed(config.group_id, topic) == {0: 1}
    assert await driver.offsets(1) == [1]
    assert driver.producer.stats.held == 1


async def test_rejected_record_goes_to_the_dlq_with_origin_and_reason_headers_and_is_committed_past(
    kafka_kit: KafkaKit, make_kafka_config: MakeConfig, open_kafka_stream: OpenStream
) -> None:
    topic = kafka_kit.new_topic()
    dlq = kafka_kit.new_topic("dlq")
    kafka_kit.produce(topic, [b"good"])
    kafka_kit.produce(topic, [b"bad"], key=b"k1", headers=[("trace", b"t-1")])
    config = make_kafka_config(topic, dead_letter=dlq)
    driver = open_kafka_stream(config)

    got = await driver.take(2)
    await driver.producer.advance(items(got, CLEAN, rejected("not JSON", "too old")))

    assert kafka_kit.committed(config.group_id, topic) == {0: 2}
    [copy] = kafka_kit.read(dlq, 1)
    assert (copy.key(), copy.value()) == (b"k1", b"bad")
    headers = copy.headers()
    assert ("trace", b"t-1") in headers
    assert ("acklane.origin.topic", topic.encode()) in headers
    assert ("acklane.origin.partition", b"0") in headers
    assert ("acklane.origin.offset", b"1") in headers
    assert ("acklane.origin.group", config.group_id.encode()) in headers
    assert ("acklane.reject.reason", b"not JSON; too old") in headers
    assert driver.producer.stats.dead_lettered == 1
    counters = driver.producer.counters()  # what the metrics export
    assert (counters["dead_lettered"], counters["committed"], counters["dropped"]) == (1, 1, 0)


async def test_rejected_record_without_a_dlq_is_committed_past_and_counted_as_dropped(
    kafka_kit: KafkaKit, make_kafka_config: MakeConfig, open_kafka_stream: OpenStream
) -> None:
    topic = kafka_kit.new_topic()
    kafka_kit.produce(topic, [b"a", b"b"])
    config = make_kafka_config(topic)
    driver = open_kafka_stream(config)

    got = await driver.take(2)
    await driver.producer.advance(items(got, rejected("bad"), CLEAN))

    assert kafka_kit.committed(config.group_id, topic) == {0: 2}
    assert driver.producer.stats.dropped == 1


async def test_a_failed_record_wins_over_a_rejection_of_the_same_record(
    kafka_kit: KafkaKit, make_kafka_config: MakeConfig, open_kafka_stream: OpenStream
) -> None:
    topic = kafka_kit.new_topic()
    dlq = kafka_kit.new_topic("dlq")
    kafka_kit.produce(topic, [b"a"])
    config = make_kafka_config(topic, dead_letter=dlq)
    driver = open_kafka_stream(config)

    got = await driver.take(1)
    await driver.producer.advance(items(got, AdvanceOutcome(0, 1, 1, ("bad",))))

    assert kafka_kit.committed(config.group_id, topic) == {0: None}
    assert driver.producer.stats.dead_lettered == 0
    assert await driver.offsets(1) == [0]


async def test_each_partition_is_its_own_lane_and_a_hold_in_one_does_not_stop_another(
    kafka_kit: KafkaKit, make_kafka_config: MakeConfig, open_kafka_stream: OpenStream
) -> None:
    topic = kafka_kit.new_topic(partitions=2)
    kafka_kit.produce(topic, [b"p0-a", b"p0-b"], partition=0)
    kafka_kit.produce(topic, [b"p1-a", b"p1-b"], partition=1)
    config = make_kafka_config(topic)
    driver = open_kafka_stream(config)

    got = await driver.take(4)
    lanes: dict[Any, list[Any]] = {}
    for pair in got:
        lanes.setdefault(driver.producer.get_advance_lane(pair[1]), []).append(pair)
    assert set(lanes) == {(topic, 0), (topic, 1)}
    await driver.producer.advance(items(lanes[(topic, 0)], FAILED, CLEAN))
    await driver.producer.advance(items(lanes[(topic, 1)], CLEAN, CLEAN))

    assert kafka_kit.committed(config.group_id, topic, partitions=2) == {0: None, 1: 2}


async def test_message_id_and_raw_record_fields(
    kafka_kit: KafkaKit, make_kafka_config: MakeConfig, open_kafka_stream: OpenStream
) -> None:
    topic = kafka_kit.new_topic()
    kafka_kit.produce(topic, [b"{}"])
    kafka_kit.produce(
        topic, [json.dumps({"n": 1}).encode()], key=b"order-7", headers=[("kind", b"x")]
    )
    driver = open_kafka_stream(make_kafka_config(topic))

    [(_, first), (raw, delivery)] = await driver.take(2)

    named = f"kafka:{kafka_kit.cluster_id()}/{topic}:{kafka_kit.topic_id(topic)}"
    assert driver.producer.message_id(delivery) == f"{named}/0/1"
    assert driver.producer.message_id(first) == f"{named}/0/0"
    assert raw.message_id == f"{named}/0/1"
    assert (raw.topic, raw.partition, raw.offset) == (topic, 0, 1)
    assert raw.json() == {"n": 1}
    assert (raw.key, raw.key_bytes) == ("order-7", b"order-7")
    assert raw.attributes == {"kind": "x"}
    assert raw.headers == (("kind", b"x"),)
    assert isinstance(raw.timestamp, datetime)
    assert raw.publish_time == raw.timestamp
    assert raw.source == topic
    assert raw.native.offset() == 1
    assert not raw.tombstone


async def test_advance_after_a_revocation_skips_the_commit_without_error(
    kafka_kit: KafkaKit, make_kafka_config: MakeConfig, open_kafka_stream: OpenStream
) -> None:
    topic = kafka_kit.new_topic(partitions=2)
    kafka_kit.produce(topic, [b"a"], partition=0)
    kafka_kit.produce(topic, [b"b"], partition=1)
    config = make_kafka_config(topic)
    first = open_kafka_stream(config)
    got = await first.take(2)
    assert first.producer.assignment == frozenset({(topic, 0), (topic, 1)})

    second = open_kafka_stream(config)  # same group: the partitions are split
    second.pull_in_background()
    first.pull_in_background()
    async with asyncio.timeout(20):
        while len(first.producer.assignment) != 1 or len(second.producer.assignment) != 1:
            await asyncio.sleep(0.05)

    for pair in got:
        await first.producer.advance(items([pair], CLEAN))

    assert first.producer.stats.skipped_revoked == 2
    assert kafka_kit.committed(config.group_id, topic, partitions=2) == {0: None, 1: None}


async def test_fetching_pauses_at_max_outstanding_and_resumes_after_an_advance(
    kafka_kit: KafkaKit, make_kafka_config: MakeConfig, open_kafka_stream: OpenStream
) -> None:
    topic = kafka_kit.new_topic()
    kafka_kit.produce(topic, [b"a", b"b", b"c", b"d"])
    driver = open_kafka_stream(make_kafka_config(topic, max_outstanding=2))

    got = await driver.take(2)
    with pytest.raises(TimeoutError):
        await driver.take(1, timeout=0.3)  # the pull stays pending
    async with asyncio.timeout(10):
        while driver.producer.stats.paused == 0:
            await asyncio.sleep(0.02)

    await driver.producer.advance(items(got, CLEAN, CLEAN))
    assert await driver.offsets(2) == [2, 3]


async def test_record_held_while_fetching_is_paused_is_redelivered_after_resuming(
    kafka_kit: KafkaKit, make_kafka_config: MakeConfig, open_kafka_stream: OpenStream
) -> None:
    topic = kafka_kit.new_topic()
    kafka_kit.produce(topic, [b"a", b"b"])
    config = make_kafka_config(topic, max_outstanding=2)
    driver = open_kafka_stream(config)
    got = await driver.take(2)
    driver.pull_in_background()  # the stream is full: it pauses the consumer
    async with asyncio.timeout(10):
        while driver.producer.stats.paused == 0:
            await asyncio.sleep(0.02)

    await driver.producer.advance(items(got[:1], FAILED))
    [zero] = await driver.take(1)
    await driver.producer.advance(items(got[1:], CLEAN))  # behind the held record
    [one] = await driver.take(1)

    assert (zero[0].offset, one[0].offset) == (0, 1)
    assert kafka_kit.committed(config.group_id, topic) == {0: None}
    await driver.producer.advance(items([zero, one], CLEAN, CLEAN))
    assert kafka_kit.committed(config.group_id, topic) == {0: 2}


async def test_a_rejected_record_over_librdkafkas_default_size_still_reaches_the_dlq(
    kafka_kit: KafkaKit, make_kafka_config: MakeConfig, open_kafka_stream: OpenStream
) -> None:
    # Kafka brokers take records up to ~1 MiB (max.message.bytes 1048588), librdkafka's
    # producer refuses anything over message.max.bytes (1000000 by default): a record
    # in between would otherwise fail every advance, and its group forever.
    from confluent_kafka import Producer

    topic = kafka_kit.new_topic()
    dlq = kafka_kit.new_topic("dlq")
    big = b"x" * 1_030_000
    source = Producer(
        {"bootstrap.servers": kafka_kit.bootstrap_servers, "message.max.bytes": 2_000_000}
    )
    source.produce(topic, value=big, key=b"k")
    assert source.flush(10) == 0
    config = make_kafka_config(topic, dead_letter=dlq)
    driver = open_kafka_stream(config)

    got = await driver.take(1)
    await driver.producer.advance(items(got, rejected("too big to handle")))

    assert kafka_kit.committed(config.group_id, topic) == {0: 1}
    [copy] = kafka_kit.read(dlq, 1)
    assert copy.value() == big


async def test_a_dlq_copy_the_producer_refuses_fails_the_advance_naming_the_record(
    kafka_kit: KafkaKit, make_kafka_config: MakeConfig, open_kafka_stream: OpenStream
) -> None:
    from acklane.connectors.kafka import KafkaAdvanceError

    topic = kafka_kit.new_topic()
    dlq = kafka_kit.new_topic("dlq")
    kafka_kit.produce(topic, [b"ok", b"y" * 5000])
    config = make_kafka_config(
        topic, dead_letter=dlq, dead_letter_client={"message.max.bytes": 1000}
    )
    driver = open_kafka_stream(config)

    got = await driver.take(2)
    with pytest.raises(KafkaAdvanceError, match=rf"{topic}:\S+/0/1: .*message\.max\.bytes"):
        await driver.producer.advance(items(got, CLEAN, rejected("no")))

    assert kafka_kit.committed(config.group_id, topic) == {0: None}  # not even the clean one
