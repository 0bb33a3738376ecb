"""What librdkafka has buffered is consumed on the event loop's thread (no hand-off);
the consumer thread only waits (for records, a commit, a topic id lookup).

Stand-in consumers holding real client messages record where each call ran; the
last test is against the Kafka emulator.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Message, TopicPartition, Uuid

from acklane.connectors.kafka import KafkaConfig, KafkaStreamProducer
from acklane.core.producer import AdvanceItem
from acklane.integration.kafka import KafkaKit
from acklane.integration.testing import CLEAN

from .conftest import StreamDriver


def _messages(partition: int, offsets: range) -> list[Any]:
    return [Message(topic="t", partition=partition, offset=o, value=b"{}") for o in offsets]


class RecordingConsumer:
    """consume() hands out the queued messages (then nothing), noting the thread of each
    call and whether it was one that may wait; ``on_first`` runs inside the first call
    (as a rebalance callback runs inside consume)."""

    def __init__(self, queued: list[Any], on_first: Callable[[], None] | None = None) -> None:
        self.queued = queued
        self.on_first = on_first
        self.calls: list[tuple[str, bool, int]] = []  # (thread, may wait, records)

    def consume(self, num_messages: int, timeout: float) -> list[Any]:
        if self.on_first is not None:
            on_first, self.on_first = self.on_first, None
            on_first()
        out, self.queued = self.queued[:num_messages], self.queued[num_messages:]
        self.calls.append((threading.current_thread().name, timeout > 0, len(out)))
        if not out and timeout > 0:
            time.sleep(timeout)
        return out

    def commit(self, offsets: Any = None, asynchronous: bool = True) -> Any:
        return offsets

    def close(self) -> None:
        pass


class StandInProducer(KafkaStreamProducer):
    consumer: RecordingConsumer
    assign_at_connect = True

    def _connect(self) -> None:
        self._consumer = self.consumer
        self._cluster_id = "c-1"
        if self.assign_at_connect:
            self._on_assign(self._consumer, [TopicPartition("t", 0)])


def _config() -> KafkaConfig:
    return KafkaConfig(
        bootstrap_servers="127.0.0.1:9", topics=["t"], group_id="g", poll_timeout=0.05
    )


async def test_buffered_records_are_consumed_on_the_loop_and_waited_for_on_the_thread() -> None:
    producer = StandInProducer(_config())
    producer.consumer = consumer = RecordingConsumer(_messages(0, range(1200)))
    stream = producer.open_batches()
    loop_thread = threading.current_thread().name
    try:
        taken = 0
        while taken < 1200:
            batch = await anext(stream)
            pairs = list(batch.pairs)
            taken += len(pairs)
            await producer.advance([AdvanceItem(p, CLEAN) for _, p in pairs])
        pull = asyncio.ensure_future(anext(stream))
        await asyncio.sleep(0.2)  # nothing left: the stream waits on the consumer thread
        pull.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pull
    finally:
        await stream.aclose()
        await producer.aclose()
    fetched = [(thread == loop_thread, waits) for thread, waits, n in consumer.calls if n]
    assert fetched == [(True, False)] * 3  # 500 + 500 + 200, each taken on the loop, at once
    waits = [thread for thread, waits, _ in consumer.calls if waits]
    assert waits and all(thread != loop_thread for thread in waits)


class SlowAdmin:
    """Topic ids answered only when ``answer`` is set; notes where they were waited for."""

    def __init__(self) -> None:
        self.future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.waited_on: list[str] = []

    def describe_topics(self, topics: Any, request_timeout: float) -> dict[str, Any]:
        admin = self

        class Noted:
            def done(self) -> bool:
                return admin.future.done()

            def result(self, timeout: float | None = None) -> Any:
                admin.waited_on.append(threading.current_thread().name)
                return admin.future.result(timeout)

        return {t: Noted() for t in topics.topic_names}

    def answer(self, topic_id: Any) -> None:
        class Described:
            def __init__(self) -> None:
                self.topic_id = topic_id

        self.future.set_result(Described())


async def test_a_partition_assigned_during_a_loop_side_consume_waits_for_its_id_off_the_loop() -> (
    None
):
    admin = SlowAdmin()
    producer = StandInProducer(_config())
    producer.assign_at_connect = False
    producer._admin = admin
    loop_thread = threading.current_thread().name
    assigned_on: list[str] = []

    def rebalance() -> None:  # inside the consume, as librdkafka serves it
        assigned_on.append(threading.current_thread().name)
        producer._on_assign(producer._consumer, [TopicPartition("t", 0)])

    producer.consumer = RecordingConsumer(_messages(0, range(3)), on_first=rebalance)
    topic_id = Uuid(1, 2)
    threading.Timer(0.2, admin.answer, (topic_id,)).start()
    stream = producer.open_batches()
    try:
        batch = await anext(stream)
        records = [raw for raw, _ in batch.pairs]
    finally:
        await stream.aclose()
        await producer.aclose()
    assert assigned_on == [loop_thread]  # the first consume ran on the loop
    assert admin.waited_on and loop_thread not in admin.waited_on
    assert [r.message_id for r in records] == [f"kafka:c-1/t:{topic_id}/0/{o}" for o in range(3)]


async def test_a_commit_behind_a_waiting_consume_waits_one_slice_not_poll_timeout(
    kafka_kit: KafkaKit,
    make_kafka_config: Callable[..., KafkaConfig],
    open_kafka_stream: Callable[[KafkaConfig], StreamDriver],
) -> None:
    topic = kafka_kit.new_topic()
    kafka_kit.produce(topic, [b"a", b"b"])
    config = make_kafka_config(topic, poll_timeout=5.0)
    driver = open_kafka_stream(config)
    got = await driver.take(2)
    driver.pull_in_background()  # the topic is idle: the consumer thread waits for records
    await asyncio.sleep(0.3)
    started = time.monotonic()
    await driver.producer.advance([AdvanceItem(p, CLEAN) for _, p in got])
    assert time.monotonic() - started < 1.0  # not the 5 s poll_timeout
    assert kafka_kit.committed(config.group_id, topic) == {0: 2}
