"""Where a consumer group starts, and that it keeps that start across restarts.

Under ``auto_offset_reset: latest`` a partition with no committed offset starts at
the end of its log, resolved when the consumer first fetches it. A group that
restarted before its first commit there would resolve it again, at the new end,
and skip every record it had been holding: the connector commits the starting
position before it hands out the partition's first record.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from acklane.connectors.kafka import KafkaConfig
from acklane.core.producer import AdvanceItem, AdvanceOutcome
from acklane.integration.kafka import KafkaKit

MakeConfig = Callable[..., KafkaConfig]
OpenStream = Callable[[KafkaConfig], Any]


async def first_record_after_joining(driver: Any, kafka_kit: KafkaKit, topic: str) -> Any:
    """Produce one record at a time until the consumer gets one: it is then consuming.

    Records produced before ``latest`` is resolved are skipped, as they should be.
    """
    async with asyncio.timeout(30):
        for n in range(1000):
            await asyncio.to_thread(kafka_kit.produce, topic, [f"probe-{n}".encode()])
            try:
                [pair] = await driver.take(1, timeout=0.5)
            except TimeoutError:
                continue
            return pair
    raise AssertionError("the consumer never received a record")


async def test_under_latest_a_group_restarted_before_its_first_commit_gets_its_held_records_back(
    kafka_kit: KafkaKit, make_kafka_config: MakeConfig, open_kafka_stream: OpenStream
) -> None:
    topic = kafka_kit.new_topic()
    config = make_kafka_config(topic, auto_offset_reset="latest")
    first = open_kafka_stream(config)
    held = [await first_record_after_joining(first, kafka_kit, topic)]
    start = held[0][0].offset
    kafka_kit.produce(topic, [b"a", b"b"])
    held += await first.take(2)
    assert kafka_kit.committed(config.group_id, topic) == {0: start}  # before the hand-out

    await first.close()  # nothing advanced: the three records are still held
    second = open_kafka_stream(config)
    again = await second.take(3)

    assert [raw.offset for raw, _ in again] == [raw.offset for raw, _ in held]
    assert [raw.body for raw, _ in again][1:] == [b"a", b"b"]


async def test_under_latest_a_restarted_group_resumes_from_its_last_commit(
    kafka_kit: KafkaKit, make_kafka_config: MakeConfig, open_kafka_stream: OpenStream
) -> None:
    topic = kafka_kit.new_topic()
    config = make_kafka_config(topic, auto_offset_reset="latest")
    first = open_kafka_stream(config)
    probe = await first_record_after_joining(first, kafka_kit, topic)
    kafka_kit.produce(topic, [b"a", b"b"])
    got = [probe, *await first.take(2)]
    clean = AdvanceOutcome(acked=1, failed=0)
    await first.producer.advance([AdvanceItem(d, clean) for _, d in got[:2]])
    await first.close()

    second = open_kafka_stream(config)
    [(raw, _)] = await second.take(1)

    assert (raw.offset, raw.body) == (got[2][0].offset, b"b")
    assert kafka_kit.committed(config.group_id, topic) == {0: raw.offset}


async def test_under_earliest_fetching_commits_nothing(
    kafka_kit: KafkaKit, make_kafka_config: MakeConfig, open_kafka_stream: OpenStream
) -> None:
    topic = kafka_kit.new_topic()
    kafka_kit.produce(topic, [b"a", b"b"])
    config = make_kafka_config(topic)  # earliest: a restart starts again at the beginning
    driver = open_kafka_stream(config)

    await driver.take(2)

    assert driver.producer.stats.committed == 0
    assert kafka_kit.committed(config.group_id, topic) == {0: None}
