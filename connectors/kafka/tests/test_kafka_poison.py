"""The poison policy on real Kafka (the session's emulator): Kafka counts no deliveries,
so the count of failed attempts is acklane's, kept in the store, and a restart of the
runner does not reset it.

That a poison message is dead-lettered after ``max_attempts`` with its last error, and
the others processed, is a rule of every connector: ``tests/test_conformance.py``.
The filter is the docs' own example (``function: mypipeline.filters:big_orders``),
written beside the pipeline file as a user would: ``{"id": 2}`` has no ``amount``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path

from acklane.core.config import AcklaneConfig
from acklane.core.connectors.deadletter import REJECT_REASON
from acklane.core.pipeline.runner import Runner
from acklane.integration.kafka import KafkaKit
from acklane.integration.testing import ORDERS, fired_ids, poison_pipeline, run_until

FILTERS = """\
from acklane.core import RawMessage, reject_shared_stream_event


def big_orders(message: RawMessage):
    order = message.json()
    if order.get("valid") is False:
        reject_shared_stream_event("invalid order")
        return None
    return {"id": order["id"]} if order["amount"] > 100 else None
"""

REASON = "poison: failed {n} times; last error: watcher big-orders: KeyError: 'amount'"


def pipeline(
    tmp_path: Path,
    kafka_kit: KafkaKit,
    topic: str,
    dlq: str,
    group: str,
    *,
    max_attempts: int,
    backoff: float = 0.05,
) -> AcklaneConfig:
    stream = f"""\
        bootstrap_servers: {kafka_kit.bootstrap_servers}
        topics: [{topic}]
        group_id: {group}
        dead_letter: {dlq}
        poll_timeout: 0.05
        max_attempts: {max_attempts}
        client:
          session.timeout.ms: {KafkaKit.FAST_GROUP["session.timeout.ms"]}
          heartbeat.interval.ms: {KafkaKit.FAST_GROUP["heartbeat.interval.ms"]}
          fetch.wait.max.ms: {KafkaKit.FAST_GROUP["fetch.wait.max.ms"]}
        """
    return poison_pipeline(
        tmp_path, "kafka", stream, package="kafkapoison", filters=FILTERS, backoff=backoff
    )


def orders(kafka_kit: KafkaKit, topic: str) -> None:
    kafka_kit.produce(topic, [json.dumps(b).encode() for b in ORDERS], partition=0)


def committed_to(
    kafka_kit: KafkaKit, group: str, topic: str, end: int
) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        offsets = await asyncio.to_thread(kafka_kit.committed, group, topic, 1)
        return offsets == {0: end}

    return check


def failures(runner: Runner) -> int:
    return sum(b.failures for b in runner.poison.streams().values())


async def test_the_attempt_count_of_a_kafka_record_survives_a_restart_of_the_runner(
    tmp_path: Path, kafka_kit: KafkaKit
) -> None:
    # Kafka counts no deliveries: the count is acklane's, in the store
    topic, dlq, group = kafka_kit.new_topic(), kafka_kit.new_topic("dlq"), kafka_kit.unique("g")
    orders(kafka_kit, topic)
    # a long backoff: the first runner is stopped while it waits to restart
    slow = pipeline(tmp_path, kafka_kit, topic, dlq, group, max_attempts=3, backoff=5.0)
    first = Runner(slow, handle_signals=False)
    await run_until(first, lambda: failures(first) >= 1)
    assert failures(first) == 1
    assert await asyncio.to_thread(kafka_kit.read, dlq, 1, timeout=1.0) == []

    second = Runner(
        pipeline(tmp_path, kafka_kit, topic, dlq, group, max_attempts=3), handle_signals=False
    )
    await run_until(second, committed_to(kafka_kit, group, topic, 4))
    assert failures(second) == 2  # 1 + 2 = max_attempts, then dead-lettered
    [copy] = await asyncio.to_thread(kafka_kit.read, dlq, 1)
    headers = {name: (value or b"").decode() for name, value in copy.headers() or []}
    assert headers[REJECT_REASON] == REASON.format(n=3)
    assert await fired_ids(tmp_path / "events.db") == [1, 3]
