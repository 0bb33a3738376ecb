"""Tracing on every broker: a message published with a W3C ``traceparent`` (a Kafka
header, an SQS message attribute, a Pub/Sub attribute, a Service Bus application
property, through the connector's own publisher) is processed under a span that is a
child of the producer's span; one without gets a trace of its own. Spans are read from
the SDK's in-memory exporter."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from acklane.connectors.memory import MemoryBroker
from acklane.core.config import TracingSettings, load_config, parse_config
from acklane.core.connectors import OutgoingMessage
from acklane.core.observe import tracing
from acklane.core.pipeline import runner as runner_module
from acklane.core.pipeline.runner import Runner
from acklane.integration.kafka import KafkaKit
from acklane.integration.kits import KITS, BrokerKit
from acklane.integration.testing import run_until, write_pipeline

# the memory broker cannot be published to from outside (core/tests/test_tracing.py
# covers it through MemoryBroker.publish)
pytestmark = [
    pytest.mark.filterwarnings("ignore:The return_immediately flag:DeprecationWarning"),
    pytest.mark.kit_brokers(*sorted(k for k in KITS if k != "memory")),
]

UPSTREAM_TRACE = "0af7651916cd43dd8448eb211c80319c"
UPSTREAM_SPAN = "b7ad6b7169203331"


@pytest.fixture
def exporter(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    real = tracing.start_tracing

    def start(settings: TracingSettings | None, env: Any = None, **_: Any) -> Any:
        return real(settings, env, exporter=exporter)

    monkeypatch.setattr(runner_module, "start_tracing", start)
    yield exporter
    tracing.install(None)


async def test_the_traceparent_of_a_message_parents_its_span(
    tmp_path: Path, kit: BrokerKit, exporter: InMemorySpanExporter
) -> None:
    source = await kit.create()
    path = write_pipeline(tmp_path, kit.connector, kit.stream_yaml(source))
    path.write_text(path.read_text() + "tracing: {enabled: true}\n")
    config = load_config(path)
    stream = config.streams["orders"]
    traceparent = f"00-{UPSTREAM_TRACE}-{UPSTREAM_SPAN}-01"
    async with stream.connector.publisher(stream.config) as publisher:
        await publisher.send(
            [
                OutgoingMessage(
                    json.dumps({"id": 1}).encode(), attributes={"traceparent": traceparent}
                ),
                OutgoingMessage(json.dumps({"id": 2}).encode()),
            ]
        )

    def processed() -> list[Any]:
        return [s for s in exporter.get_finished_spans() if s.name == "process orders"]

    await run_until(Runner(config, handle_signals=False), lambda: len(processed()) >= 2)
    spans = processed()
    assert len(spans) == 2
    traced = [s for s in spans if format(s.context.trace_id, "032x") == UPSTREAM_TRACE]
    assert len(traced) == 1
    (span,) = traced
    assert span.parent is not None and format(span.parent.span_id, "016x") == UPSTREAM_SPAN
    attrs = dict(span.attributes or {})
    assert attrs["acklane.broker"] == kit.connector
    assert attrs["acklane.outcome"] == "acked"
    assert attrs["acklane.message_id"]
    (other,) = [s for s in spans if s is not span]
    assert other.parent is None


async def test_the_broker_sink_sends_the_delivery_span_as_a_header(
    tmp_path: Path, kafka_kit: KafkaKit, exporter: InMemorySpanExporter
) -> None:
    """A memory stream's event, delivered by a broker sink to Kafka: the record carries
    the delivery span's traceparent, in the trace of the message's own traceparent."""
    name = f"tracing-{uuid.uuid4().hex[:8]}"
    memory = MemoryBroker.get(name)
    memory.create_topic("orders", 1)
    topic = kafka_kit.new_topic("traced")
    text = f"""\
store: {{url: "sqlite:///{tmp_path / "e.db"}"}}
tracing: {{enabled: true}}
streams:
  orders: {{connector: memory, broker: {name}, topics: [orders], group_id: g,
            poll_interval: 0.02}}
  out: {{connector: kafka, bootstrap_servers: "{kafka_kit.bootstrap_servers}",
         topics: [{topic}], group_id: unused}}
sinks:
  - {{name: to-kafka, kind: broker, stream: out}}
watchers:
  - {{name: all, stream: orders, sinks: [to-kafka]}}
"""
    config = parse_config(text, source="t.yaml")
    traceparent = f"00-{UPSTREAM_TRACE}-{UPSTREAM_SPAN}-01"
    memory.publish("orders", b'{"id": 1}', "k", {"traceparent": traceparent})

    def delivered() -> list[Any]:
        return [s for s in exporter.get_finished_spans() if s.name == "deliver to-kafka"]

    try:
        await run_until(Runner(config, handle_signals=False), lambda: bool(delivered()))
    finally:
        MemoryBroker.remove(name)
    (record,) = await asyncio.to_thread(kafka_kit.read, topic, 1)
    headers = {k: (v or b"").decode() for k, v in record.headers() or []}
    _, trace_id, span_id, _ = headers["traceparent"].split("-")
    assert trace_id == UPSTREAM_TRACE
    (span,) = delivered()
    assert format(span.context.span_id, "016x") == span_id
    assert dict(span.attributes or {})["acklane.outcome"] == "delivered"
    assert headers["acklane-event-id"] == dict(span.attributes or {})["acklane.event_id"]
