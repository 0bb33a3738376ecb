"""Every pipeline of ``examples/`` works as its header says, against the emulator it starts.

For each broker's example, the test runs the ``uv run acklane ...`` commands of
the file's header, in order and as written (with this environment's ``acklane``
instead of ``uv run acklane``, from the repository's root): ``emulator start``
(kept running), ``publish`` of ``examples/orders.jsonl``, ``run`` until the
trigger events of the four orders are stored and the poison order is in the
dead-letter destination with acklane's reason (read back with the broker's SDK),
then SIGTERM (exit 0), and ``events list``. The only change: the example's
address variable (``KAFKA_BOOTSTRAP_SERVERS``...) points at a free port, which
``emulator start --config`` listens on. The local backend unless
``ACKLANE_EMULATOR_BACKEND=docker`` (then the variables the emulator prints).

``examples/pipeline.yaml`` (the in-process memory broker) validates, runs until
SIGTERM, and ``acklane publish`` to it fails with the reason.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from acklane.core.connectors.deadletter import REJECT_REASON
from acklane.core.events import EventStore
from acklane.core.observe.redact import MASK
from acklane.integration.cli import example_environment
from acklane.integration.emulator import BACKEND_ENV, free_port

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
ACKLANE = [sys.executable, "-m", "acklane.core.cli"]
BROKERS = ("kafka", "sqs", "pubsub", "servicebus")

#: examples/orders.jsonl: four orders; big-orders fires on 2, rejects the 4th
#: (a negative amount); online-orders and order-audit fire on all 4.
EXPECTED_EVENTS = 10
POISON_ID = 4


def _header(example: Path) -> str:
    """A file's comment header as text, continued lines (``\\``) joined."""
    return "\n".join(
        line.removeprefix("#").strip()
        for line in example.read_text().splitlines()
        if line.startswith("#")
    ).replace("\\\n", " ")


def header_commands(example: Path) -> list[list[str]]:
    """The ``uv run acklane ...`` commands of a file's comment header, as argument lists."""
    text = _header(example)
    return [shlex.split(m.group(1)) for m in re.finditer(r"uv run acklane (.+)", text)]


def emulator_backend() -> str:
    """Where the examples' emulators run: ``local`` processes, or ``docker`` when asked."""
    return "docker" if os.environ.get(BACKEND_ENV, "").strip().lower() == "docker" else "local"


def address_environment(broker: str, port: int) -> dict[str, str]:
    """The example's address variable, set to ``port`` on this machine."""
    if broker == "kafka":
        return {"KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{port}"}
    if broker == "sqs":
        return {"SQS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
    if broker == "pubsub":
        return {"PUBSUB_EMULATOR_HOST": f"127.0.0.1:{port}"}
    from acklane.integration.servicebus import connection_string

    return {"SERVICEBUS_CONNECTION_STRING": connection_string("127.0.0.1", port)}


class Lines:
    """A subprocess stream read by a thread, so waits can time out."""

    def __init__(self, stream: Any) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            self.lines.append(line)

    def text(self) -> str:
        return "".join(self.lines)

    def wait_for(self, needle: str, proc: subprocess.Popen[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.text():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{needle!r} never printed:\n{self.text()}")
            time.sleep(0.05)


def stop(proc: subprocess.Popen[str], timeout: float = 45) -> int:
    """SIGTERM, and the exit code (killed after ``timeout``)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
    return proc.returncode


@pytest.fixture
def background() -> Iterator[Callable[..., tuple[subprocess.Popen[str], Lines, Lines]]]:
    """Start a process (stdout and stderr read by threads); SIGTERMed after the test."""
    procs: list[subprocess.Popen[str]] = []

    def start(
        command: list[str], env: dict[str, str], cwd: Path = ROOT
    ) -> tuple[subprocess.Popen[str], Lines, Lines]:
        proc = subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        return proc, Lines(proc.stdout), Lines(proc.stderr)

    yield start
    for proc in procs:
        stop(proc, timeout=20)


def stored_events(db: Path, pipeline: str = "default") -> list[Any]:
    """``pipeline``'s stored events (each example names its own)."""

    async def read() -> list[Any]:
        async with EventStore(f"sqlite:///{db}", pipeline=pipeline) as store:
            return list(await store.list_events(limit=1000))

    return asyncio.run(read()) if db.exists() else []


# -- what each broker's dead-letter destination holds: (body, everything else as text)


def _kafka_dead_letters(settings: dict[str, Any]) -> list[tuple[bytes, str]]:
    from acklane.integration.kafka import KafkaKit

    kit = KafkaKit(settings["bootstrap_servers"])
    try:
        records = kit.read("orders.dlq", 1, timeout=2)
    finally:
        kit.close()
    return [(r.value(), repr(r.headers())) for r in records]


def _sqs_dead_letters(settings: dict[str, Any]) -> list[tuple[bytes, str]]:
    from acklane.integration.sqs import sqs_client

    client = sqs_client(settings)
    try:
        url = client.get_queue_url(QueueName="orders-dlq")["QueueUrl"]
        got = client.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, MessageAttributeNames=["All"], WaitTimeSeconds=1
        )
    finally:
        client.close()
    return [
        (m["Body"].encode(), json.dumps(m.get("MessageAttributes", {})))
        for m in got.get("Messages", [])
    ]


def _pubsub_dead_letters(settings: dict[str, Any]) -> list[tuple[bytes, str]]:
    from acklane.integration.pubsub import PubSubKit

    async def pull() -> list[tuple[bytes, str]]:
        async with PubSubKit(settings) as kit:
            got = await kit.drain("orders-rejected-read", expect=1, within=2)
            return [(r.message.data, json.dumps(dict(r.message.attributes))) for r in got]

    return asyncio.run(pull())


def _servicebus_dead_letters(settings: dict[str, Any]) -> list[tuple[bytes, str]]:
    from acklane.integration.servicebus import ServiceBusKit

    peeked = ServiceBusKit(settings["connection_string"]).peek_dead_letters("orders")
    return [
        (
            b"".join(m.body),
            f"{m.dead_letter_reason} {m.dead_letter_error_description} {m.application_properties}",
        )
        for m in peeked
    ]


DEAD_LETTERS: dict[str, Callable[[dict[str, Any]], list[tuple[bytes, str]]]] = {
    "kafka": _kafka_dead_letters,
    "sqs": _sqs_dead_letters,
    "pubsub": _pubsub_dead_letters,
    "servicebus": _servicebus_dead_letters,
}


def _pipelines() -> list[Path]:
    """Every example pipeline (its test cases, ``*.tests.yaml``, are not pipelines)."""
    return sorted(p for p in EXAMPLES.rglob("*.yaml") if not p.name.endswith(".tests.yaml"))


def test_every_example_pipeline_has_its_test() -> None:
    examples = {p.name for p in EXAMPLES.glob("*.yaml") if not p.name.endswith(".tests.yaml")}
    assert examples == {f"{b}.yaml" for b in BROKERS} | {"pipeline.yaml"}


@pytest.mark.parametrize("example", _pipelines(), ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_the_example_passes_its_test_cases(example: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``acklane test`` on each example pipeline, with the cases beside it (no broker;
    in this process: the command is the same, a process per example would only add
    its start-up)."""
    from typer.testing import CliRunner

    from acklane.core.cli.app import app

    cases = example.with_name(example.name.removesuffix(".yaml") + ".tests.yaml")
    assert cases.is_file(), f"{example} has no test cases ({cases.name})"
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("AIRFLOW_PASSWORD", "only-for-acklane-test")  # sinks/kafka-airflow.yaml
    done = CliRunner().invoke(app, ["test", str(example.relative_to(ROOT))])
    assert done.exit_code == 0, done.output
    lines = done.stdout.splitlines()
    count = len(yaml.safe_load(cases.read_text())["cases"])
    assert sum(line.endswith(" PASSED") for line in lines) == count, done.stdout
    assert f"{count} passed in " in lines[-1], done.stdout


@pytest.mark.parametrize("broker", BROKERS)
def test_the_example_runs_as_its_header_says(
    broker: str,
    tmp_path: Path,
    background: Callable[..., tuple[subprocess.Popen[str], Lines, Lines]],
) -> None:
    example = EXAMPLES / f"{broker}.yaml"
    commands = header_commands(example)
    assert [c[:2] for c in commands] == [
        ["emulator", "start"],
        ["publish", f"examples/{broker}.yaml"],
        ["run", f"examples/{broker}.yaml"],
        ["events", "list"],
    ], commands
    db = tmp_path / "events.db"
    pipeline = str(yaml.safe_load(example.read_text())["pipeline"])
    env = {
        **os.environ,
        "ACKLANE_STORE_URL": f"sqlite:///{db}",
        "COLUMNS": "200",
        **address_environment(broker, free_port()),
    }

    # 1. the emulator, on the port the example's address variable names
    start = [*commands[0], "--backend", emulator_backend()]
    emulator, out, err = background([*ACKLANE, *start], env)
    err.wait_for("Ctrl-C to stop", emulator, timeout=120)
    settings: dict[str, Any] = yaml.safe_load(out.text())
    assert settings["connector"] == broker
    # A value of the configuration's that is a secret (the Service Bus connection string)
    # is masked in every output, this one included: the configuration has it already.
    printed = {k: v for k, v in example_environment(broker, settings).items() if v != MASK}
    if emulator_backend() == "local":  # it listens where the configuration reaches
        for name in address_environment(broker, 0):
            assert printed.get(name, env[name]) == env[name], out.text()
    env.update(printed)
    if settings.get("connection_string") == MASK:
        settings["connection_string"] = env["SERVICEBUS_CONNECTION_STRING"]

    # 2. publish the orders
    published = subprocess.run(
        [*ACKLANE, *commands[1]], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert published.returncode == 0, published.stdout + published.stderr
    assert "published 4 message(s)" in published.stdout

    # 3. run until the events are stored and the poison order is dead-lettered
    runner, _, run_err = background([*ACKLANE, *commands[2]], env)
    deadline = time.monotonic() + 120
    dead: list[tuple[bytes, str]] = []
    while True:
        assert runner.poll() is None, f"acklane run exited early:\n{run_err.text()}"
        assert time.monotonic() < deadline, (
            f"{len(stored_events(db, pipeline))} events, dead letters {dead}:\n{run_err.text()}"
        )
        if len(stored_events(db, pipeline)) >= EXPECTED_EVENTS:
            dead += DEAD_LETTERS[broker](settings)
            if dead:
                break
        time.sleep(0.3)
    assert stop(runner) == 0, run_err.text()
    events = stored_events(db, pipeline)
    assert len(events) == EXPECTED_EVENTS
    assert sorted(e.trigger_id for e in events).count("big-orders") == 2
    [(body, rest)] = dead
    assert json.loads(body)["id"] == POISON_ID
    assert "reject rule matched: body.amount lt 0" in rest, rest
    if broker != "servicebus":  # Service Bus keeps the reason in the message's own field
        assert REJECT_REASON in rest

    # 4. the events, as the header lists them
    listed = subprocess.run(
        [*ACKLANE, *commands[3], "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listed.returncode == 0, listed.stderr
    assert len(listed.stdout.splitlines()) == EXPECTED_EVENTS


def test_the_memory_example_runs_but_cannot_be_published_to(
    tmp_path: Path, background: Callable[..., tuple[subprocess.Popen[str], Lines, Lines]]
) -> None:
    example = EXAMPLES / "pipeline.yaml"
    assert [c[0] for c in header_commands(example)] == ["validate", "run"]
    env = {**os.environ, "ACKLANE_STORE_URL": f"sqlite:///{tmp_path / 'events.db'}"}
    for command in header_commands(example)[:1]:
        done = subprocess.run([*ACKLANE, *command], cwd=ROOT, env=env, capture_output=True)
        assert done.returncode == 0, done.stderr
    refused = subprocess.run(
        [*ACKLANE, "publish", "examples/pipeline.yaml", "orders", '{"id": 1}'],
        cwd=ROOT,
        env={**env, "COLUMNS": "300"},
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 2
    assert "lives inside the process that runs the" in refused.stderr
    assert "examples/kafka.yaml" in refused.stderr
    runner, _, err = background([*ACKLANE, *header_commands(example)[1]], env)
    err.wait_for("Shared stream group started", runner, timeout=60)
    assert stop(runner) == 0, err.text()


# -- the sinks' examples ------------------------------------------------------------------

SINK_EXAMPLES = EXAMPLES / "sinks"


def header_steps(example: Path) -> list[list[str]]:
    """The ``uv run acklane ...`` and ``uv run python ...`` commands of a file's header."""
    text = _header(example)
    return [
        shlex.split(m.group(0).removeprefix("uv run "))
        for m in re.finditer(r"uv run (acklane|python) (.+)", text)
    ]


def test_the_webhook_sink_example_runs_as_its_header_says(
    tmp_path: Path, background: Callable[..., tuple[subprocess.Popen[str], Lines, Lines]]
) -> None:
    example = SINK_EXAMPLES / "webhook.yaml"
    steps = header_steps(example)
    assert [s[:3] for s in steps] == [
        ["acklane", "emulator", "start"],
        ["python", "examples/sinks/webhook_receiver.py", "--port"],
        ["acklane", "publish", "examples/sinks/webhook.yaml"],
        ["acklane", "run", "examples/sinks/webhook.yaml"],
        ["acklane", "sinks", "status"],
    ], steps
    port = free_port()
    env = {
        **os.environ,
        "ACKLANE_STORE_URL": f"sqlite:///{tmp_path / 'events.db'}",
        "COLUMNS": "200",
        "WEBHOOK_URL": f"http://127.0.0.1:{port}/orders",
        **address_environment("kafka", free_port()),
    }

    def command(step: list[str]) -> list[str]:
        if step[0] == "acklane":
            return [*ACKLANE, *step[1:]]
        return [sys.executable, *step[1:]]

    emulator, _, err = background([*command(steps[0]), "--backend", emulator_backend()], env)
    err.wait_for("Ctrl-C to stop", emulator, timeout=120)
    receiver_step = [*steps[1][:-1], str(port)]  # the header's port, taken free here
    receiver, received, _ = background(command(receiver_step), env)
    received.wait_for("listening on", receiver, timeout=30)
    published = subprocess.run(
        command(steps[2]), cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert published.returncode == 0, published.stdout + published.stderr
    runner, _, run_err = background(command(steps[3]), env)
    try:
        received.wait_for("event ev_", receiver, timeout=120)
        deadline = time.monotonic() + 60
        while received.text().count("event ev_") < 2:  # the two orders above 100
            assert time.monotonic() < deadline and runner.poll() is None, run_err.text()
            time.sleep(0.2)
    finally:
        assert stop(runner) == 0, run_err.text()
    lines = [line for line in received.text().splitlines() if line.startswith("event ")]
    assert sorted(json.loads(line.split(": ", 1)[1])["amount"] for line in lines) == [150, 420]
    status = subprocess.run(
        [*command(steps[4]), "--format", "json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert status.returncode == 0, status.stderr
    (doc,) = [json.loads(line) for line in status.stdout.splitlines()]
    assert (doc["sink"], doc["delivered"], doc["lag"], doc["parked"]) == ("orders-hook", 2, 0, 0)
