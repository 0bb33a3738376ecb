"""acklane's own HTTP endpoints and what leaves the process by observation, against
hostile or careless input: slow clients of /healthz, secrets in metric labels, in
dead-letter reasons and in span attributes, a busy metrics port.

Real parts throughout: the metrics server on a real socket, raw TCP clients, the
memory broker (its dead-letter copies carry the same header every connector builds,
:func:`acklane.core.connectors.deadletter.outcome_reason`), SQLite, and the
OpenTelemetry SDK's in-memory exporter.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry
from runner_harness import all_committed, run_until

from acklane.connectors.memory import MemoryBroker
from acklane.core import RawMessage, reject_shared_stream_event
from acklane.core.config import ConfigError, MetricsSettings, TracingSettings, parse_config
from acklane.core.connectors.deadletter import REJECT_REASON
from acklane.core.observe import metrics as metrics_module
from acklane.core.observe import tracing
from acklane.core.observe.metrics import start_metrics_server
from acklane.core.observe.redact import remember
from acklane.core.pipeline import runner as runner_module
from acklane.core.pipeline.runner import Runner

pytestmark = pytest.mark.usefixtures("tracing_off")

#: A secret registered the way loading a configuration registers one.
REGISTERED = "tok-registered-8f2c1d77"
#: The password of a connection URL no configuration named (a credential shape).
URL_PASSWORD = "pw-in-url-3b7e90"
LEAKY_URL = f"postgresql://app:{URL_PASSWORD}@db.internal:5432/orders"


def leaky(message: RawMessage) -> Any:
    """A filter whose errors and reasons quote what they should not
    (``test_hostile_endpoints:leaky``): ``raise`` fails, ``reject`` rejects."""
    body = message.json()
    if body.get("raise"):
        raise ConnectionError(f"cannot reach {LEAKY_URL} with token {REGISTERED}")
    if body.get("reject"):
        reject_shared_stream_event(f"lookup at {LEAKY_URL} refused token={REGISTERED}")
    return {"id": body["id"]}


def _pipeline(db: Path, broker: str, *, extra: str = "") -> Any:
    text = textwrap.dedent(
        f"""\
        engine:
          restart_backoff_initial: 0.02
          restart_backoff_max: 0.1
          shutdown_timeout: 5
          progress_interval: 0
        store: {{url: "sqlite:///{db}", retention: null}}
        streams:
          orders:
            connector: memory
            broker: {json.dumps(broker)}
            topics: [orders]
            group_id: g
            partitions: 1
            dead_letter: orders.dlq
            poll_interval: 0.02
            max_attempts: 1
        watchers:
          - {{name: w, stream: orders, filter: {{function: "test_hostile_endpoints:leaky"}}}}
        """
    )
    return parse_config(text + textwrap.dedent(extra), source="hostile.yaml")


def _in_memory_spans(monkeypatch: pytest.MonkeyPatch) -> InMemorySpanExporter:
    """The runner's tracer exports to the SDK's in-memory exporter."""
    exporter = InMemorySpanExporter()
    real = tracing.start_tracing

    def start(settings: TracingSettings | None, env: Any = None, **_: Any) -> Any:
        return real(settings, env, exporter=exporter)

    monkeypatch.setattr(runner_module, "start_tracing", start)
    return exporter


def _get(url: str, timeout: float = 10) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


# -- reject and poison reasons: dead-letter headers and span attributes


async def test_reject_and_poison_reasons_leave_the_process_redacted(
    tmp_path: Path, broker: MemoryBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    exporter = _in_memory_spans(monkeypatch)
    remember([REGISTERED])
    broker.publish("orders", b'{"id": 1, "raise": true}', partition=0)
    broker.publish("orders", b'{"id": 2, "reject": true}', partition=0)
    broker.publish("orders", b'{"id": 3}', partition=0)
    cfg = _pipeline(tmp_path / "e.db", broker.name, extra="tracing: {enabled: true}\n")
    runner = Runner(cfg, handle_signals=False)
    await run_until(runner, lambda: all_committed(broker))

    poison, rejected = broker.records("orders.dlq")
    reasons = [poison.headers[REJECT_REASON], rejected.headers[REJECT_REASON]]
    assert reasons[0].startswith("poison: failed 1 time; last error: watcher w: ConnectionError")
    assert "lookup at postgresql://app:***@db.internal:5432/orders" in reasons[1]
    exported = [
        str(value)
        for span in exporter.get_finished_spans()
        for attrs in [span.attributes or {}, *(e.attributes or {} for e in span.events)]
        for name, value in attrs.items()
        if name == "acklane.reason"
    ]
    assert len(exported) >= 2, exported  # the rejected message's span and its event
    for text in reasons + exported:
        assert REGISTERED not in text and URL_PASSWORD not in text, text
        assert "***" in text


# -- /metrics labels


async def test_metric_labels_are_redacted_as_logs_are(tmp_path: Path) -> None:
    # a stream whose broker is named by a URL with a password: the password is in the
    # stream's key, which labels every per-group series
    name = f"memory://app:{URL_PASSWORD}@h-{uuid.uuid4().hex[:8]}"
    broker = MemoryBroker.get(name)
    broker.create_topic("orders", 1)
    try:
        broker.publish("orders", b'{"id": 1}', partition=0)
        runner = Runner(_pipeline(tmp_path / "e.db", name), handle_signals=False)
        server = start_metrics_server(0, runner, CollectorRegistry(), addr="127.0.0.1")
        task = asyncio.create_task(runner.run())
        try:
            async with asyncio.timeout(15):
                while not all_committed(broker):
                    await asyncio.sleep(0.02)
            status, body = await asyncio.to_thread(_get, f"http://127.0.0.1:{server.port}/metrics")
        finally:
            runner.request_stop()
            await task
            server.close()
    finally:
        MemoryBroker.remove(name)
    assert status == 200
    assert "acklane_events_broadcast_total{" in body
    assert URL_PASSWORD not in body
    assert "memory://app:***@h-" in body


# -- slow clients of the endpoints

#: What a slow or hostile client sends: a request without the blank line that ends it.
HALF_REQUEST = b"GET /healthz HTTP/1.1\r\nHost: acklane\r\n"


def _bare_runner(db: Path, broker: str) -> Runner:
    """A runner that is not started: its probes answer (alive, not ready) all the same."""
    return Runner(_pipeline(db, broker), handle_signals=False)


def _slow_clients(port: int, count: int) -> list[socket.socket]:
    clients = []
    for _ in range(count):
        client = socket.create_connection(("127.0.0.1", port), timeout=10)
        client.sendall(HALF_REQUEST)
        clients.append(client)
    return clients


async def test_healthz_answers_beside_1000_slow_clients_and_a_half_request_is_dropped(
    tmp_path: Path, broker: MemoryBroker
) -> None:
    server = start_metrics_server(
        0, _bare_runner(tmp_path / "e.db", broker.name), CollectorRegistry()
    )
    clients: list[socket.socket] = []
    try:
        # this host only, unless the configuration's metrics.host says otherwise
        assert server.host == "127.0.0.1"
        assert MetricsSettings(port=9464).host == server.host
        clients = await asyncio.to_thread(_slow_clients, server.port, 1000)
        async with asyncio.timeout(5):
            status, body = await asyncio.to_thread(
                _get, f"http://127.0.0.1:{server.port}/healthz", 5
            )
        assert status == 200 and json.loads(body)["status"] == "alive"
        # the first slow client is dropped once its few seconds to send a request are up
        first = clients[0]
        first.settimeout(metrics_module.REQUEST_TIMEOUT + 5)
        with contextlib.suppress(ConnectionResetError):  # dropped with a reset: an abort
            assert first.recv(1) == b""
    finally:
        for client in clients:
            client.close()
        server.close()


SERVE_WITH_FEW_DESCRIPTORS = """\
import resource, sys
from prometheus_client import CollectorRegistry
from acklane.core.config import parse_config
from acklane.core.observe import metrics as metrics_module
from acklane.core.observe.metrics import start_metrics_server
from acklane.core.pipeline.runner import Runner

resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
cfg = parse_config(sys.argv[1], source="few.yaml")
server = start_metrics_server(0, Runner(cfg, handle_signals=False), CollectorRegistry())
print(server.port, server.limit, flush=True)
sys.stdin.read()
server.close()
"""


def test_healthz_answers_behind_1000_slow_clients_with_256_file_descriptors(
    tmp_path: Path, broker: MemoryBroker
) -> None:
    text = textwrap.dedent(
        f"""\
        store: {{url: "sqlite:///{tmp_path / "e.db"}"}}
        streams: {{orders: {{connector: memory, broker: {broker.name}, topics: [orders]}}}}
        watchers: [{{name: w, stream: orders, filter: {{emit: {{id: body.id}}}}}}]
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE_WITH_FEW_DESCRIPTORS, text],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    clients: list[socket.socket] = []
    try:
        assert proc.stdout is not None
        port, limit = map(int, proc.stdout.readline().split())
        assert limit == 64  # a quarter of the descriptors: the rest stay the engine's
        clients = _slow_clients(port, 1000)
        status, body = _get(f"http://127.0.0.1:{port}/healthz", 5)
        assert status == 200 and json.loads(body)["status"] == "alive"
    finally:
        for client in clients:
            client.close()
        _, err = proc.communicate(timeout=30)
    # the server never ran out of descriptors (asyncio would log each failed accept)
    assert "Too many open files" not in err, err


# -- metrics.port: busy, or left to a variable


def test_a_busy_metrics_port_stops_acklane_run_with_one_line_naming_port_and_setting(
    tmp_path: Path, broker: MemoryBroker
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cfg = tmp_path / "pipeline.yaml"
        cfg.write_text(
            textwrap.dedent(
                f"""\
                store: {{url: "sqlite:///{tmp_path / "e.db"}"}}
                metrics: {{port: {port}}}
                streams: {{orders: {{connector: memory, broker: {broker.name}, topics: [orders]}}}}
                watchers: [{{name: w, stream: orders}}]
                """
            )
        )
        proc = subprocess.run(
            [sys.executable, "-m", "acklane.core.cli", "run", str(cfg)],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "ACKLANE_LOG_FORMAT": "text", "COLUMNS": "200"},
        )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    (line,) = [line for line in out.splitlines() if " ERROR " in line]
    assert f"metrics.port {port}: cannot listen on 127.0.0.1:{port}" in line
    assert "Address already in use" in line
    assert "Traceback" not in out


def test_an_empty_or_null_variable_leaves_an_optional_setting_off() -> None:
    text = textwrap.dedent(
        """\
        metrics:
          port: ${METRICS_PORT:-null}
          host: ${METRICS_HOST:-127.0.0.1}
        streams:
          orders:
            connector: memory
            topics: [orders]
            dead_letter: ${DLQ:-}
        watchers: [{name: w, stream: orders}]
        """
    )

    def load(**env: str) -> Any:
        return parse_config(text, source="m.yaml", env=env)

    assert load().metrics.port is None  # the default names YAML's null: no endpoints
    assert load(METRICS_PORT="").metrics.port is None  # set but empty: the same
    assert load(METRICS_PORT="~").metrics.port is None
    assert load(METRICS_PORT="9464", METRICS_HOST="0.0.0.0").metrics.port == 9464
    assert load().streams["orders"].config.dead_letter is None
    # quoted, the value is the text itself, as YAML reads "null"
    with pytest.raises(ConfigError) as caught:
        parse_config(text.replace("${METRICS_PORT:-null}", '"${METRICS_PORT:-null}"'), env={})
    assert "metrics.port" in str(caught.value)


async def test_a_malformed_request_gets_400_and_is_no_error_in_the_log(
    tmp_path: Path, broker: MemoryBroker, caplog: pytest.LogCaptureFixture
) -> None:
    server = start_metrics_server(
        0, _bare_runner(tmp_path / "e.db", broker.name), CollectorRegistry()
    )

    def send(data: bytes) -> bytes:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as client:
            client.sendall(data)
            return client.recv(4096)

    try:
        caplog.set_level(logging.INFO)
        tls_hello = await asyncio.to_thread(send, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\r\n\r\n")
        overlong = await asyncio.to_thread(send, b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\n\r\n")
    finally:
        server.close()
    assert tls_hello.startswith(b"HTTP/1.0 400") and overlong.startswith(b"HTTP/1.0 400")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.records
