"""How far behind a stream is: backlog probes, their metrics, /readyz and progress lines.

- unit: the monitor keeps the last figures (and their age) when a read fails, tells each
  error once, and the three views (metrics, /readyz, progress) show the same figure;
- Kafka on tansu: per partition, log end minus committed offset; the emulator's
  high-water mark is the last batch's first offset + 1 (shown here), which
  ``lag_end_offsets: last_batch`` corrects by reading the last batch;
- SQS on moto: visible, in flight and delayed counts;
- a real Runner on Kafka: the lag read before the group joins falls to 0 once the
  records are committed, in /metrics, /readyz and the last progress line.
"""

from __future__ import annotations

import asyncio
import json
import logging
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from endpoint_harness import http_get, probe_until
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from acklane.connectors.kafka import KafkaConfig, KafkaConnector
from acklane.connectors.sqs import SqsConfig, SqsConnector
from acklane.core.config import parse_config
from acklane.core.observe.lag import Backlog, BacklogProbe, LagMonitor
from acklane.core.observe.metrics import start_metrics_server
from acklane.core.observe.progress import StreamProgress
from acklane.core.pipeline.runner import Runner
from acklane.integration.emulator import Emulator
from acklane.integration.kafka import KafkaKit
from acklane.integration.sqs import SqsQueues

# ------------------------------------------------------------------ the monitor


class _Probe(BacklogProbe):
    broker = "test"

    def __init__(self) -> None:
        self.answers: list[Sequence[Backlog] | Exception] = []
        self.closed = False

    async def read(self) -> Sequence[Backlog]:
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def aclose(self) -> None:
        self.closed = True


async def test_a_failed_read_keeps_the_last_figures_and_is_told_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    monitor = LagMonitor(clock=lambda: now[0])
    probe = _Probe()
    entry = monitor.add("k", "orders", "kt", probe)
    assert entry.total is None and entry.detail() == {"broker": "test"}

    probe.answers = [
        [Backlog("t/0", 3), Backlog("t/1", 4)],
        OSError("refused"),
        OSError("refused"),
        [Backlog("t/0", 0), Backlog("t/1", 1)],
    ]
    await monitor.read_once()
    assert entry.total == 7 and entry.error is None
    caplog.set_level(logging.INFO, logger="acklane.core.observe.lag")
    now[0] += 5
    await monitor.read_once()
    await monitor.read_once()
    assert entry.total == 7  # the last figures, kept
    assert entry.error == "OSError: refused" and entry.failures == 2
    assert entry.age(now[0]) == 5
    await monitor.read_once()
    assert entry.total == 1 and entry.error is None
    told = [r.getMessage() for r in caplog.records]
    assert told == [
        "Reading the backlog of stream orders failed: OSError: refused",
        "Reading the backlog of stream orders works again",
    ]
    detail = entry.detail()
    assert detail["total"] == 1 and detail["partitions"] == {"t/0": 0, "t/1": 1}
    await monitor.aclose()
    assert probe.closed


async def test_a_read_that_hangs_times_out() -> None:
    class Hangs(_Probe):
        async def read(self) -> Sequence[Backlog]:
            await asyncio.sleep(60)
            return []

    monitor = LagMonitor()
    entry = monitor.add("k", "orders", "kt", Hangs())
    await monitor.read_once(read_timeout=0.05)
    assert entry.error == "no answer within 0.05s" and entry.total is None


def test_the_progress_line_carries_the_lag() -> None:
    line = StreamProgress("orders", "k").line("polling", 340.0)
    assert line.endswith("restarts=0 lag=340 state=polling")
    assert "lag=" not in StreamProgress("orders", "k").line("polling")


# ------------------------------------------------------------------ Kafka


def _produce_one_batch(servers: str, topic: str, partition: int, n: int) -> None:
    """``n`` records in one record batch (linger: one produce request)."""
    producer = Producer({"bootstrap.servers": servers, "linger.ms": 200})
    for i in range(n):
        producer.produce(topic, value=json.dumps({"id": i}).encode(), partition=partition)
    assert producer.flush(15) == 0


def _commit(servers: str, group: str, topic: str, partition: int, offset: int) -> None:
    consumer = Consumer({"bootstrap.servers": servers, "group.id": group})
    try:
        consumer.commit(offsets=[TopicPartition(topic, partition, offset)], asynchronous=False)
    finally:
        consumer.close()


async def test_kafka_lag_is_log_end_minus_committed_per_partition(kafka_kit: KafkaKit) -> None:
    servers = kafka_kit.bootstrap_servers
    topic = kafka_kit.new_topic("lag", partitions=3)
    group = KafkaKit.unique("g")
    _produce_one_batch(servers, topic, 0, 10)
    _produce_one_batch(servers, topic, 1, 5)
    kafka_kit.produce(topic, [b"{}"], partition=1)  # a batch of one after it
    await asyncio.to_thread(_commit, servers, group, topic, 0, 4)

    def probe(**fields: Any) -> BacklogProbe:
        return KafkaConnector.backlog_probe(
            KafkaConfig(bootstrap_servers=servers, topics=[topic], group_id=group, **fields)
        )

    # What tansu reports: each partition's end is its last batch's first offset + 1.
    broker = probe()
    try:
        figures = {b.partition: b.lag for b in await broker.read()}
    finally:
        await broker.aclose()
    assert figures == {f"{topic}/0": 0, f"{topic}/1": 6, f"{topic}/2": 0}  # 0: 1 - 4, clamped

    read = probe(lag_end_offsets="last_batch")
    try:
        figures = {b.partition: b.lag for b in await read.read()}
        assert figures == {f"{topic}/0": 6, f"{topic}/1": 6, f"{topic}/2": 0}
        # a group that starts at the end counts nothing it has not committed
        latest = probe(lag_end_offsets="last_batch", auto_offset_reset="latest")
        try:
            assert sum(b.lag for b in await latest.read()) == 6  # partition 0's commit only
        finally:
            await latest.aclose()
        kafka_kit.produce(topic, [b"{}"] * 3, partition=2)
        figures = {b.partition: b.lag for b in await read.read()}
        assert figures[f"{topic}/2"] == 3
    finally:
        await read.aclose()
    # nothing was committed by the probes: the group's offsets are as the test set them
    assert kafka_kit.committed(group, topic, 3) == {0: 4, 1: None, 2: None}


async def test_kafka_lag_names_a_missing_topic(kafka_kit: KafkaKit) -> None:
    probe = KafkaConnector.backlog_probe(
        KafkaConfig(
            bootstrap_servers=kafka_kit.bootstrap_servers,
            topics=[KafkaKit.unique("absent")],
            group_id="g",
        )
    )
    try:
        with pytest.raises(LookupError, match="no such topic"):
            await probe.read()
    finally:
        await probe.aclose()


# ------------------------------------------------------------------ SQS


async def test_sqs_backlog_is_visible_in_flight_and_delayed(sqs_emulator: Emulator) -> None:
    settings = sqs_emulator.client_settings()
    async with SqsQueues(settings) as queues:
        url = await queues.create("lag")
        await queues.send(url, [f'{{"id": {i}}}' for i in range(5)])
        await queues.client.send_message(QueueUrl=url, MessageBody="{}", DelaySeconds=60)
        assert len(await queues.receive(url, max_messages=2, visibility_timeout=60)) == 2
        probe = SqsConnector.backlog_probe(SqsConfig(queue_url=url, **settings))
        try:
            (backlog,) = await probe.read()
        finally:
            await probe.aclose()
        assert backlog.partition == url.rsplit("/", 1)[-1]
        assert backlog.lag == 3
        assert dict(backlog.states) == {"visible": 3, "in_flight": 2, "delayed": 1}


# ------------------------------------------------------------------ a real runner


def _documented() -> set[str]:
    """The metric names of docs/operations.md's lag table."""
    docs = Path(__file__).resolve().parents[1] / "docs" / "operations.md"
    return {
        line.split("`")[1]
        for line in docs.read_text().splitlines()
        if line.startswith("| `acklane_stream_")
    }


def _lag_series(text: str) -> dict[tuple[str, str, str], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        if family.name == "acklane_stream_lag":
            for s in family.samples:
                out[(s.labels["broker"], s.labels["stream"], s.labels["partition"])] = s.value
    return out


async def test_a_running_pipeline_shows_its_kafka_lag_falling_to_zero(
    kafka_kit: KafkaKit, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    servers = kafka_kit.bootstrap_servers
    topic = kafka_kit.new_topic("lagrun", partitions=2)
    _produce_one_batch(servers, topic, 0, 20)
    _produce_one_batch(servers, topic, 1, 10)
    client = json.dumps(KafkaKit.FAST_GROUP)
    config = parse_config(
        textwrap.dedent(
            f"""\
            engine: {{shutdown_timeout: 5, progress_interval: 0.2, lag_interval: 0.1}}
            store: {{url: "sqlite:///{tmp_path / "e.db"}", retention: null}}
            streams:
              orders:
                connector: kafka
                bootstrap_servers: {servers}
                topics: [{topic}]
                group_id: {KafkaKit.unique("g")}
                poll_timeout: 0.05
                lag_end_offsets: last_batch
                client: {client}
            watchers:
              - {{name: w, stream: orders}}
            """
        ),
        source="lag.yaml",
    )
    caplog.set_level(logging.INFO, logger="acklane.core.observe.progress")
    runner = Runner(config, handle_signals=False)
    server = start_metrics_server(0, runner, CollectorRegistry(), addr="127.0.0.1")
    task = asyncio.create_task(runner.run())
    seen: list[float] = []

    def lag_falls_to_zero(status: int, body: str) -> bool:
        series = _lag_series(body)
        if series:
            seen.append(sum(series.values()))
        return bool(series) and seen[-1] == 0

    try:
        _, body = await probe_until(server.port, "/metrics", lag_falls_to_zero, timeout=60)
        assert set(_lag_series(body)) == {
            ("kafka", "orders", f"{topic}/0"),
            ("kafka", "orders", f"{topic}/1"),
        }
        assert seen[0] == 30  # read at start, before the group joined
        families = list(text_string_to_metric_families(body))
        scraped = {f.name for f in families} | {s.name for f in families for s in f.samples}
        assert _documented() <= scraped  # docs/operations.md's table
        _, ready = await asyncio.to_thread(http_get, server.port, "/readyz")
        lag = json.loads(ready)["streams"]["orders"]["lag"]
        assert lag["broker"] == "kafka" and lag["total"] == 0
        assert lag["partitions"] == {f"{topic}/0": 0, f"{topic}/1": 0}
    finally:
        runner.request_stop()
        async with asyncio.timeout(30):
            await task
        server.close()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("progress")]
    assert lines and "lag=0 " in lines[-1]


# ------------------------------------------------------------------ Service Bus


async def test_servicebus_backlog_is_counted_by_peeking(servicebus_emulator: Emulator) -> None:
    from acklane.connectors.servicebus import ServiceBusConfig, ServiceBusConnector
    from acklane.integration.servicebus import ServiceBusEmulator, ServiceBusKit

    assert isinstance(servicebus_emulator, ServiceBusEmulator)
    bus = servicebus_emulator
    queue = bus.create_queue(lock_duration=30, max_delivery_count=1)
    kit = ServiceBusKit(bus.connection_string)
    await asyncio.to_thread(kit.send, queue, [f'{{"id": {i}}}' for i in range(7)])
    probe = ServiceBusConnector.backlog_probe(
        ServiceBusConfig(connection_string=bus.connection_string, queue=queue)
    )
    try:
        (backlog,) = await probe.read()
        assert (backlog.partition, backlog.lag) == (queue, 7)
        assert dict(backlog.states) == {"messages": 7, "dead_letter": 0}
        # two received and completed: 5 left; nothing the probe did settled anything
        assert len(await asyncio.to_thread(kit.receive, queue, 2)) == 2
        (backlog,) = await probe.read()
        assert backlog.lag == 5
        assert bus.counts(queue)["messages"] == 5
    finally:
        await probe.aclose()


async def test_closing_a_kafka_probe_does_not_wait_for_a_read_in_progress() -> None:
    from acklane.integration.emulator import free_port

    probe = KafkaConnector.backlog_probe(
        KafkaConfig(bootstrap_servers=f"127.0.0.1:{free_port()}", topics=["t"], group_id="g")
    )
    reading = asyncio.ensure_future(probe.read())  # nobody answers: 5 s to time out
    await asyncio.sleep(0.3)
    reading.cancel()
    started = asyncio.get_running_loop().time()
    await probe.aclose()
    assert asyncio.get_running_loop().time() - started < 1
    with pytest.raises(asyncio.CancelledError):
        await reading


def test_the_connectors_without_figures_say_so() -> None:
    from acklane.connectors.servicebus import ServiceBusConfig
    from acklane.core.connectors import load_connector

    sessions = ServiceBusConfig(
        connection_string="Endpoint=sb://h/;SharedAccessKeyName=k;SharedAccessKey=v",
        queue="q",
        sessions=True,
    )
    assert load_connector("servicebus").backlog_probe(sessions) is None
    pubsub = load_connector("pubsub")
    config = pubsub.config_model.model_validate(
        {"project": "proj", "subscription": "orders", "emulator_host": "127.0.0.1:1"}
    )
    assert pubsub.backlog_probe(config) is None
