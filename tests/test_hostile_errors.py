"""Errors that say what to do, when what acklane meets is not what it expects.

Each test runs the ``acklane`` command line as a process against a real obstacle
(a port another process holds, a server that is not what the configuration says,
a broker nobody answers at) and checks the error is one line that names the
obstacle and the way out, never a traceback or a flood of a client library's logs.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from acklane.integration.emulator import Emulator, brokers

ACKLANE = [sys.executable, "-m", "acklane.core.cli"]


def _acklane(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ACKLANE, *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port on 127.0.0.1 that this test listens on (another process, to the CLI)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server.getsockname()[1]


# -- emulators on a port that is taken ---------------------------------------------------


@pytest.mark.parametrize("broker", brokers())
def test_an_emulator_on_a_taken_port_names_the_port_and_the_option(
    broker: str, taken_port: int
) -> None:
    done = _acklane("emulator", "start", broker, "--backend", "local", "--port", str(taken_port))
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    [line] = _error_lines(done.stderr)
    assert f"port {taken_port} " in line and "in use" in line and "--port" in line


def test_a_kafka_emulator_already_running_is_a_port_in_use(kafka_emulator: Emulator) -> None:
    """Not ``TOPIC_ALREADY_EXISTS``: the new emulator's health check must not be answered
    by the broker already there (and the topics then created on it)."""
    port = kafka_emulator.endpoint.rsplit(":", 1)[1]
    done = _acklane("emulator", "start", "kafka", "--backend", "local", "--port", port)
    assert done.returncode == 1, done.stderr
    assert "TOPIC_ALREADY_EXISTS" not in done.stderr and "Traceback" not in done.stderr
    [line] = _error_lines(done.stderr)
    assert f"port {port} " in line and "in use" in line and "--port" in line


# -- a Service Bus stream that reaches another AMQP server -------------------------------

#: What an AMQP 0-9-1 broker (RabbitMQ) answers to a header it does not speak: its own.
AMQP_0_9_1 = b"AMQP\x00\x00\x09\x01"


@pytest.fixture
def rabbit_like_port() -> Iterator[int]:
    """A port where a server answers every AMQP header with AMQP 0-9-1's, then hangs up."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(2)
                with contextlib.suppress(OSError):
                    conn.recv(8)
                    conn.sendall(AMQP_0_9_1)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join(timeout=5)
    server.close()


def _servicebus_pipeline(tmp_path: Path, port: int) -> Path:
    path = tmp_path / "pipeline.yaml"
    document = {
        "store": {"url": f"sqlite:///{tmp_path / 'events.db'}"},
        "streams": {
            "orders": {
                "connector": "servicebus",
                "connection_string": (
                    f"Endpoint=sb://127.0.0.1:{port};SharedAccessKeyName=RootManageSharedAccessKey;"
                    "SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;"
                ),
                "queue": "orders",
            }
        },
        "watchers": [{"name": "audit", "stream": "orders"}],
    }
    path.write_text(json.dumps(document))
    return path


def _run_until(config: Path, needle: str, count: int, *options: str, timeout: float = 20) -> str:
    """``acklane [options] run config`` until ``needle`` appeared ``count`` times in its
    log (or ``timeout``), then SIGTERM; its whole log."""
    proc = subprocess.Popen(
        [*ACKLANE, "--log-format", "text", *options, "run", str(config)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    assert proc.stderr is not None
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr or ()), daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout
    while sum(needle in line for line in list(lines)) < count and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    reader.join(timeout=5)
    return "".join(lines)


def test_a_servicebus_stream_on_another_amqp_server_says_so_in_one_line(
    tmp_path: Path, rabbit_like_port: int
) -> None:
    log = _run_until(_servicebus_pipeline(tmp_path, rabbit_like_port), "Restarting watchers", 2)
    restarts = [line for line in log.splitlines() if "Restarting watchers" in line]
    assert len(restarts) == 2, log
    assert "Traceback" not in log and " azure." not in log, log
    # One line per fault: the connector and the manager do not tell it again beside
    # the runner's restart line (they did, as an ERROR and a WARNING of their own).
    loud = [line for line in log.splitlines() if " WARNING " in line or " ERROR " in line]
    faults = [line for line in loud if "not a Service Bus namespace" in line]
    backlog = [line for line in faults if "Reading the backlog" in line]
    assert len(faults) - len(backlog) == len(restarts), log
    told = restarts + [line for line in log.splitlines() if "Reading the backlog" in line]
    for line in told:
        assert "not a Service Bus namespace" in line and "AMQP 0-9-1" in line, line
        assert "connection_string" in line, line


def test_the_sdks_traceback_is_there_at_debug(tmp_path: Path, rabbit_like_port: int) -> None:
    debug = ("--log-level", "DEBUG", "--log-third-party", "DEBUG")
    config = _servicebus_pipeline(tmp_path, rabbit_like_port)
    log = _run_until(config, "Restarting watchers", 1, *debug)
    sdk = [
        line for line in log.splitlines() if " azure.servicebus." in line and "Traceback" in line
    ]
    assert sdk and all(" DEBUG azure.servicebus." in line for line in sdk), log


@pytest.mark.parametrize(
    "command",
    [
        ["publish", "{config}", "orders", "{{}}"],
        ["validate", "--connect", "{config}"],
        ["dlq", "list", "{config}", "orders"],
    ],
)
def test_the_other_commands_on_another_amqp_server_say_so_in_one_line(
    command: list[str], tmp_path: Path, rabbit_like_port: int
) -> None:
    config = _servicebus_pipeline(tmp_path, rabbit_like_port)
    done = _acklane(*(part.format(config=config) for part in command), timeout=30)
    assert done.returncode != 0, done.stdout + done.stderr
    output = done.stdout + done.stderr
    assert "Traceback" not in output and "Mismatching" not in output, output
    [line] = [line for line in output.splitlines() if "not a Service Bus namespace" in line]
    assert "connection_string" in line


# -- acklane publish to a Kafka nobody answers at ----------------------------------------


def test_publish_to_an_unreachable_kafka_is_one_line_naming_the_broker(tmp_path: Path) -> None:
    with socket.socket() as closed:  # bound, never listening: connections are refused
        closed.bind(("127.0.0.1", 0))
        servers = f"127.0.0.1:{closed.getsockname()[1]}"
        config = tmp_path / "pipeline.yaml"
        block = {
            "connector": "kafka",
            "bootstrap_servers": servers,
            "topics": ["orders"],
            "group_id": "g",
            "dead_letter_flush_timeout": 3,
        }
        config.write_text(
            json.dumps(
                {
                    "store": {"url": f"sqlite:///{tmp_path / 'events.db'}"},
                    "streams": {"orders": block},
                    "watchers": [{"name": "audit", "stream": "orders"}],
                }
            )
        )
        started = time.monotonic()
        done = _acklane("publish", str(config), "orders", '{"id": 1}', timeout=30)
        took = time.monotonic() - started
    assert done.returncode == 1, done.stderr
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert servers in lines[0] and "unreachable" in lines[0], lines[0]
    assert "_MSG_TIMED_OUT" not in lines[0]
    assert took < 3 + 10, took  # the stream's timeout, and the start of the process


# -- dependency floors above releases with well-known vulnerabilities -------------------

ROOT = Path(__file__).resolve().parent.parent

#: Distribution -> the lowest release its floor may admit: the first without a published
#: vulnerability (aiohttp: CVE-2026-69244 and CVE-2026-69243, request smuggling and an
#: out-of-bounds read in its C parser, fixed in 3.14.3; protobuf: CVE-2026-0994, a JSON
#: recursion limit bypassed, fixed in 6.33.5; grpcio: CVE-2024-7246, HPACK table
#: poisoning, fixed in 1.65.4).
FLOORS = {"aiohttp": "3.14.3", "protobuf": "6.33.5", "grpcio": "1.65.4"}

PYPROJECTS = [
    ROOT / "pyproject.toml",
    ROOT / "core" / "pyproject.toml",
    *sorted((ROOT / "connectors").glob("*/pyproject.toml")),
    ROOT / "integration" / "pyproject.toml",
    ROOT / "providers" / "airflow" / "pyproject.toml",
]


def _requirements(path: Path) -> Iterator[Requirement]:
    project = tomllib.loads(path.read_text())["project"]
    yield from (Requirement(text) for text in project.get("dependencies", ()))
    for extra in project.get("optional-dependencies", {}).values():
        yield from (Requirement(text) for text in extra)


def _floor(requirement: Requirement) -> Version | None:
    bounds = [
        Version(s.version)
        for s in requirement.specifier
        if s.operator in (">=", ">", "==", "~=", "===")
    ]
    return max(bounds, default=None)


def test_dependency_floors_admit_no_release_with_a_known_vulnerability() -> None:
    seen: set[str] = set()
    for path in PYPROJECTS:
        for requirement in _requirements(path):
            name = canonicalize_name(requirement.name)
            if name not in FLOORS:
                continue
            seen.add(name)
            floor = _floor(requirement)
            where = f"{path.relative_to(ROOT)}: {requirement}"
            assert floor is not None and floor >= Version(FLOORS[name]), where
    assert seen == set(FLOORS), f"not required anywhere any more: {set(FLOORS) - seen}"


def test_the_lock_holds_releases_above_the_floors() -> None:
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    locked = {canonicalize_name(p["name"]): p.get("version") for p in lock["package"]}
    for name, floor in FLOORS.items():
        assert Version(locked[name]) >= Version(floor), (name, locked[name])
