"""OpenTelemetry tracing end to end: the memory broker, the SQLite store, a real webhook
receiver and a real OTLP/HTTP receiver; spans read from the SDK's in-memory exporter or
decoded from the protobuf requests the receiver got."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from runner_harness import all_committed, run_until

from acklane.connectors.memory import MemoryBroker
from acklane.core.config import ConfigError, TracingSettings, parse_config
from acklane.core.observe import tracing
from acklane.core.pipeline import runner as runner_module
from acklane.core.pipeline.runner import Runner

pytestmark = pytest.mark.usefixtures("tracing_off")

# an upstream producer's span: what a message's traceparent header names
UPSTREAM_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
UPSTREAM_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{UPSTREAM_TRACE}-{UPSTREAM_SPAN}-01"
TOKEN = "otlp-token-7f3a9c2e1b"
#: The events of a watcher's verdict on a message's span.
VERDICTS = ("acklane.fired", "acklane.acked", "acklane.rejected", "acklane.failed")


def _config(db: Path, broker: str, *, extra: str = "", sinks: str = "") -> Any:
    text = textwrap.dedent(
        f"""\
        engine: {{ack_timeout: 5, shutdown_timeout: 5, progress_interval: 0}}
        store: {{url: "sqlite:///{db}"}}
        streams:
          orders:
            connector: memory
            broker: {broker}
            topics: [orders]
            group_id: g
            partitions: 1
            dead_letter: orders.dlq
            poll_interval: 0.02
        watchers:
          - name: big
            stream: orders
            filter:
              reject: {{body.amount: {{lt: 0}}}}
              match: {{body.amount: {{gt: 50}}}}
              emit: {{id: body.id}}
            {"sinks: [hook]" if sinks else ""}
          - name: all
            stream: orders
            filter: {{emit: {{id: body.id}}}}
        """
    )
    return parse_config(text + textwrap.dedent(sinks) + textwrap.dedent(extra), source="t.yaml")


def _publish(broker: MemoryBroker) -> None:
    broker.publish(
        "orders", json.dumps({"id": 1, "amount": 100}).encode(), "k", {"traceparent": TRACEPARENT}
    )
    broker.publish("orders", json.dumps({"id": 2, "amount": 10}).encode(), "k")
    broker.publish("orders", json.dumps({"id": 3, "amount": -5}).encode(), "k")


def _in_memory(monkeypatch: pytest.MonkeyPatch) -> InMemorySpanExporter:
    """The runner's tracer exports to the SDK's in-memory exporter."""
    exporter = InMemorySpanExporter()
    real = tracing.start_tracing

    def start(settings: TracingSettings | None, env: Any = None, **_: Any) -> Any:
        return real(settings, env, exporter=exporter)

    monkeypatch.setattr(runner_module, "start_tracing", start)
    return exporter


def _by_name(spans: tuple[ReadableSpan, ...], prefix: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name.startswith(prefix)]


def _attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


async def test_one_span_per_message_with_its_watchers_stored_events_and_outcome(
    tmp_path: Path, broker: MemoryBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    exporter = _in_memory(monkeypatch)
    cfg = _config(tmp_path / "e.db", broker.name, extra="tracing: {enabled: true}\n")
    _publish(broker)
    runner = Runner(cfg, handle_signals=False)
    await run_until(runner, lambda: all_committed(broker, topic="orders"))
    spans = exporter.get_finished_spans()
    messages = _by_name(spans, "process ")
    assert len(messages) == 3, [s.name for s in spans]
    by_id = {}
    for span in messages:
        attrs = _attrs(span)
        assert span.name == "process orders"
        assert attrs["acklane.broker"] == "memory"
        assert attrs["acklane.stream"] == "orders"
        assert attrs["messaging.system"] == "memory"
        assert attrs["acklane.message_id"].startswith("memory:")
        by_id[attrs["acklane.message_id"].rsplit("/", 1)[-1]] = span
    first, second, third = by_id["0"], by_id["1"], by_id["2"]
    # the traceparent header made the message's span a child of the producer's span
    assert first.context is not None and first.parent is not None
    assert format(first.context.trace_id, "032x") == UPSTREAM_TRACE
    assert format(first.parent.span_id, "016x") == UPSTREAM_SPAN
    assert second.parent is None  # no header: a new trace
    assert [_attrs(s)["acklane.outcome"] for s in (first, second, third)] == [
        "acked",
        "acked",
        "rejected",
    ]
    assert "reject rule matched" in _attrs(third)["acklane.reason"]
    # one event per stored trigger event, naming its watcher
    assert sorted(_watchers(first, "acklane.stored")) == ["all", "big"]
    assert _watchers(second, "acklane.stored") == ["all"]
    # one event per watcher's verdict, on the message's span
    verdicts = {
        (name, str((e.attributes or {})["acklane.watcher"])): e.name.removeprefix("acklane.")
        for name, span in (("0", first), ("1", second), ("2", third))
        for e in span.events
        if e.name in VERDICTS
    }
    assert verdicts == {
        ("0", "big"): "fired",
        ("0", "all"): "fired",
        ("1", "big"): "acked",
        ("1", "all"): "fired",
        ("2", "big"): "rejected",
        ("2", "all"): "fired",
    }
    assert len(spans) == 3  # one span per message, nothing else


def _watchers(span: ReadableSpan, event: str) -> list[str]:
    return [str((e.attributes or {})["acklane.watcher"]) for e in span.events if e.name == event]


# -- the webhook sink passes the context on ---------------------------------------------


@pytest.fixture
async def hook() -> AsyncIterator[tuple[str, list[web.Request]]]:
    seen: list[web.Request] = []

    async def handle(request: web.Request) -> web.Response:
        await request.read()
        seen.append(request)
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/hook", handle)
    app_runner = web.AppRunner(app)
    await app_runner.setup()
    site = web.TCPSite(app_runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}/hook", seen
    finally:
        await app_runner.cleanup()


async def test_the_webhook_sink_sends_the_delivery_span_as_traceparent(
    tmp_path: Path,
    broker: MemoryBroker,
    monkeypatch: pytest.MonkeyPatch,
    hook: tuple[str, list[web.Request]],
) -> None:
    url, seen = hook
    exporter = _in_memory(monkeypatch)
    sinks = f"""\
        sinks:
          - {{name: hook, kind: webhook, url: "{url}", backoff_initial: 0.05}}
        """
    cfg = _config(tmp_path / "e.db", broker.name, extra="tracing: {enabled: true}\n", sinks=sinks)
    _publish(broker)
    runner = Runner(cfg, handle_signals=False)
    await run_until(runner, lambda: all_committed(broker) and len(seen) >= 1)
    assert len(seen) == 1  # only message 1 fires `big`, the watcher with the sink
    header = seen[0].headers["traceparent"]
    version, trace_id, span_id, flags = header.split("-")
    assert (version, trace_id, flags) == ("00", UPSTREAM_TRACE, "01")
    spans = exporter.get_finished_spans()
    (deliver,) = _by_name(spans, "deliver hook")
    assert format(deliver.context.span_id, "016x") == span_id
    message = next(
        s for s in _by_name(spans, "process ") if format(s.context.trace_id, "032x") == trace_id
    )
    assert deliver.parent is not None and deliver.parent.span_id == message.context.span_id
    attrs = _attrs(deliver)
    assert attrs["acklane.sink"] == "hook" and attrs["acklane.outcome"] == "delivered"
    assert attrs["acklane.event_id"] == seen[0].headers["Idempotency-Key"]


# -- a real OTLP/HTTP receiver -----------------------------------------------------------


@pytest.fixture
async def collector() -> AsyncIterator[tuple[str, list[tuple[dict[str, str], Any]]]]:
    """An OTLP/HTTP receiver: decodes each POST /v1/traces as ExportTraceServiceRequest."""
    got: list[tuple[dict[str, str], Any]] = []

    async def handle(request: web.Request) -> web.Response:
        message = ExportTraceServiceRequest()
        message.ParseFromString(await request.read())
        got.append((dict(request.headers), message))
        return web.Response(body=b"", content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", handle)
    app_runner = web.AppRunner(app)
    await app_runner.setup()
    site = web.TCPSite(app_runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", got
    finally:
        await app_runner.cleanup()


async def test_spans_reach_a_real_otlp_http_receiver_with_the_configured_headers(
    tmp_path: Path,
    broker: MemoryBroker,
    collector: tuple[str, list[tuple[dict[str, str], Any]]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    endpoint, got = collector
    extra = f"""\
        tracing:
          enabled: true
          exporter: otlp
          endpoint: "{endpoint}"
          service_name: orders-pipeline
          headers: {{authorization: "Bearer {TOKEN}"}}
        """
    cfg = _config(tmp_path / "e.db", broker.name, extra=extra)
    _publish(broker)
    caplog.set_level(logging.INFO, logger="acklane")
    runner = Runner(cfg, handle_signals=False)
    await run_until(runner, lambda: all_committed(broker))
    # the runner's stop exported what was left (the exporter posts from its thread)
    async with asyncio.timeout(10):
        while not got:
            await asyncio.sleep(0.05)
    assert all(headers.get("Authorization") == f"Bearer {TOKEN}" for headers, _ in got)
    spans = []
    for _, request in got:
        for resource_spans in request.resource_spans:
            resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            assert resource["service.name"] == "orders-pipeline"
            for scope in resource_spans.scope_spans:
                spans.extend(scope.spans)
    messages = [s for s in spans if s.name == "process orders"]
    assert len(messages) == 3
    traced = [s for s in messages if s.trace_id.hex() == UPSTREAM_TRACE]
    assert len(traced) == 1 and traced[0].parent_span_id.hex() == UPSTREAM_SPAN
    outcomes = sorted(
        a.value.string_value for s in messages for a in s.attributes if a.key == "acklane.outcome"
    )
    assert outcomes == ["acked", "acked", "rejected"]
    assert len([e for s in messages for e in s.events if e.name in VERDICTS]) == 6
    # the start-up line names the endpoint, never the header's token
    lines = [r.getMessage() for r in caplog.records if "Tracing on" in r.getMessage()]
    assert lines and endpoint in lines[0]
    assert TOKEN not in caplog.text


# -- configuration -------------------------------------------------------------------------


def test_tracing_is_off_unless_enabled_or_named_by_otel_traces_exporter() -> None:
    on = TracingSettings(enabled=True)
    assert tracing.enabled_by(None, {}) is None
    assert tracing.enabled_by(TracingSettings(), {}) is None
    assert tracing.enabled_by(on, {}) == "otlp"
    assert tracing.enabled_by(on, {"OTEL_TRACES_EXPORTER": "console"}) == "console"
    assert tracing.enabled_by(TracingSettings(), {"OTEL_TRACES_EXPORTER": "otlp"}) == "otlp"
    assert tracing.enabled_by(TracingSettings(), {"OTEL_TRACES_EXPORTER": "none"}) is None
    assert tracing.enabled_by(TracingSettings(exporter="console"), {}) == "console"
    off = TracingSettings(enabled=False)
    assert tracing.enabled_by(off, {"OTEL_TRACES_EXPORTER": "otlp"}) is None
    assert tracing.enabled_by(on, {"OTEL_SDK_DISABLED": "true"}) is None


def test_a_bad_tracing_block_names_the_file_line_and_field() -> None:
    text = textwrap.dedent(
        """\
        streams:
          orders: {connector: memory, topics: [orders]}
        watchers:
          - {name: w, stream: orders}
        tracing:
          enabled: true
          endpoint: localhost:4318
          sample_ratio: 2
          exporter: jaeger
        """
    )
    with pytest.raises(ConfigError) as caught:
        parse_config(text, source="t.yaml")
    problems = {(p.line, p.path) for p in caught.value.problems}
    assert (7, "tracing.endpoint") in problems
    assert (8, "tracing.sample_ratio") in problems
    assert (9, "tracing.exporter") in problems


def test_otlp_header_values_are_secrets_in_output() -> None:
    text = textwrap.dedent(
        f"""\
        streams:
          orders: {{connector: memory, topics: [orders]}}
        watchers:
          - {{name: w, stream: orders}}
        tracing:
          endpoint: "http://collector:4318"
          headers: {{x-honeycomb-team: "{TOKEN}"}}
        """
    )
    cfg = parse_config(text, source="t.yaml")
    assert TOKEN in cfg.secrets
    assert TOKEN not in repr(cfg.tracing)


def test_otlp_headers_from_the_environment_are_masked() -> None:
    env = {"OTEL_EXPORTER_OTLP_HEADERS": f"api-key={TOKEN},x-other=plain-value-123"}
    tracer = tracing.start_tracing(TracingSettings(enabled=True), env)
    assert tracer is not None
    try:
        from acklane.core.observe.redact import redact

        assert TOKEN not in redact(f"export failed with header api-key {TOKEN}")
    finally:
        tracer.shutdown()


def test_tracing_off_imports_no_opentelemetry(tmp_path: Path) -> None:
    """A pipeline run without tracing (and its sinks) never imports OpenTelemetry."""
    script = textwrap.dedent(
        f"""\
        import asyncio, json, sys
        from acklane.connectors.memory import MemoryBroker
        from acklane.core.config import parse_config
        from acklane.core.pipeline.runner import Runner
        broker = MemoryBroker.get("tracing-off")
        broker.create_topic("orders", 1)
        broker.publish("orders", b'{{"id": 1}}', "k", {{"traceparent": "{TRACEPARENT}"}})
        cfg = parse_config('''
        store: {{url: "sqlite:///{tmp_path / "off.db"}"}}
        streams:
          orders: {{connector: memory, broker: tracing-off, topics: [orders], group_id: g,
                    poll_interval: 0.02}}
        watchers:
          - {{name: w, stream: orders, sinks: [f]}}
        sinks:
          - {{name: f, kind: function, function: "builtins:print"}}
        ''')
        async def main():
            runner = Runner(cfg, handle_signals=False)
            task = asyncio.create_task(runner.run())
            while broker.committed("g", "orders", 0) < 1:
                await asyncio.sleep(0.02)
            runner.request_stop()
            await task
        asyncio.run(main())
        loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
        print(json.dumps(loaded))
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


async def test_the_function_sink_calls_the_function_in_its_delivery_span(
    tmp_path: Path, broker: MemoryBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sink_functions

    sink_functions.TRACED.clear()
    exporter = _in_memory(monkeypatch)
    sinks = """\
        sinks:
          - {name: hook, kind: function, function: "sink_functions:record_trace"}
        """
    cfg = _config(tmp_path / "e.db", broker.name, extra="tracing: {enabled: true}\n", sinks=sinks)
    _publish(broker)
    runner = Runner(cfg, handle_signals=False)
    await run_until(runner, lambda: all_committed(broker) and bool(sink_functions.TRACED))
    (context,) = sink_functions.TRACED
    (deliver,) = _by_name(exporter.get_finished_spans(), "deliver hook")
    assert deliver.context is not None
    assert getattr(context, "span_id", None) == deliver.context.span_id
    assert format(deliver.context.trace_id, "032x") == UPSTREAM_TRACE


def test_tracing_on_without_the_extra_is_a_problem_at_its_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # OpenTelemetry is installed here: only the loader's own check can say it is not
    from acklane.core.config import _checks

    monkeypatch.setattr(_checks, "_tracing_installed", lambda: False)
    text = textwrap.dedent(
        """\
        streams:
          orders: {connector: memory, topics: [orders]}
        watchers:
          - {name: w, stream: orders}
        tracing:
          enabled: true
        """
    )
    with pytest.raises(ConfigError) as caught:
        parse_config(text, source="t.yaml", env={})
    (problem,) = caught.value.problems
    assert (problem.line, problem.path) == (5, "tracing")
    assert 'pip install "acklane[tracing]"' in problem.message
    # off, or on by nothing: no problem
    parse_config(text.replace("enabled: true", "enabled: false"), source="t.yaml", env={})


async def test_a_sampled_out_parent_and_the_sample_ratio_drop_messages_before_any_span(
    tmp_path: Path, broker: MemoryBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A traceparent flagged not sampled is followed (no span); with sample_ratio 0 a
    message without one gets none either; a sampled parent is recorded whatever the
    ratio."""
    exporter = _in_memory(monkeypatch)
    cfg = _config(
        tmp_path / "e.db", broker.name, extra="tracing: {enabled: true, sample_ratio: 0}\n"
    )
    unsampled = f"00-{UPSTREAM_TRACE}-{UPSTREAM_SPAN}-00"
    broker.publish("orders", b'{"id": 1, "amount": 1}', "k", {"traceparent": unsampled})
    broker.publish("orders", b'{"id": 2, "amount": 1}', "k")
    broker.publish("orders", b'{"id": 3, "amount": 1}', "k", {"Traceparent": TRACEPARENT})
    broker.publish("orders", b'{"id": 4, "amount": 1}', "k", {"traceparent": "00-garbage"})
    runner = Runner(cfg, handle_signals=False)
    await run_until(runner, lambda: all_committed(broker))
    (span,) = exporter.get_finished_spans()  # the sampled parent's only (any case)
    assert format(span.context.trace_id, "032x") == UPSTREAM_TRACE
    assert _attrs(span)["acklane.message_id"].endswith("/2")
