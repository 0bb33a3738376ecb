"""``examples/pubsub.yaml`` and ``examples/servicebus.yaml`` work as their headers say.

Each test follows its example's header: ``acklane emulator start BROKER --port P``
with the entities it names (the CLI, the launcher it uses, as a subprocess), the
environment variables the example reads, ``acklane validate``, then ``acklane run``
until the first trigger events are stored, and SIGTERM: it must exit 0. The local
backend unless ``ACKLANE_EMULATOR_BACKEND=docker``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
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

from acklane.core.events import EventStore
from acklane.integration.emulator import BACKEND_ENV, free_port

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ACKLANE = [sys.executable, "-m", "acklane.core.cli"]

ORDERS = [
    {"type": "order.created", "id": 1, "amount": 150},
    {"type": "order.created", "id": 2, "amount": 20},
    {"type": "order.created", "id": 3, "amount": 420},
]


def _header_commands(example: Path) -> list[list[str]]:
    """The ``uv run acklane ...`` commands of the example's header, as argument lists."""
    text = "\n".join(
        line.removeprefix("#").strip()
        for line in example.read_text().splitlines()
        if line.startswith("#")
    ).replace("\\\n", " ")
    commands = []
    for match in re.finditer(r"uv run acklane (.+)", text):
        commands.append(match.group(1).split())
    return commands


def _emulator_command(example: Path, broker: str, port: int) -> list[str]:
    start = [c for c in _header_commands(example) if c[:3] == ["emulator", "start", broker]]
    assert len(start) == 1, f"{example.name}: one 'acklane emulator start {broker}' expected"
    args = start[0]
    args[args.index("--port") + 1] = str(port)  # the header's port may be taken here
    backend = "docker" if os.environ.get(BACKEND_ENV, "").strip().lower() == "docker" else "local"
    return [*ACKLANE, *args, "--backend", backend]


class _Lines:
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


@pytest.fixture
def started_emulator() -> Iterator[Callable[[list[str]], dict[str, Any]]]:
    """Run ``acklane emulator start ...``; the settings it printed. Stopped after the test."""
    procs: list[subprocess.Popen[str]] = []

    def start(command: list[str]) -> dict[str, Any]:
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        out, err = _Lines(proc.stdout), _Lines(proc.stderr)
        err.wait_for("Ctrl-C to stop", proc, timeout=90)
        settings: dict[str, Any] = yaml.safe_load(out.text())
        return settings

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)


def _stored(db: Path) -> int:
    async def count() -> int:
        async with EventStore(f"sqlite:///{db}") as store:
            return len(await store.list_events(limit=1000))

    return asyncio.run(count()) if db.exists() else 0


def _validate_and_run(example: Path, env: dict[str, str], db: Path, expect: int) -> None:
    validated = subprocess.run(
        [*ACKLANE, "validate", str(example)], env=env, capture_output=True, text=True, timeout=60
    )
    assert validated.returncode == 0, validated.stdout + validated.stderr
    proc = subprocess.Popen(
        [*ACKLANE, "run", str(example)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output = _Lines(proc.stdout)
    try:
        deadline = time.monotonic() + 60
        while _stored(db) < expect:
            assert proc.poll() is None, f"acklane run exited early:\n{output.text()}"
            assert time.monotonic() < deadline, f"no trigger events stored:\n{output.text()}"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=45) == 0, output.text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)


def _env(tmp_path: Path, **extra: str) -> tuple[dict[str, str], Path]:
    db = tmp_path / "events.db"
    env = {**os.environ, "ACKLANE_STORE_URL": f"sqlite:///{db}", "COLUMNS": "200", **extra}
    return env, db


def test_the_pubsub_example_runs_against_the_emulator_its_header_starts(
    tmp_path: Path, started_emulator: Callable[[list[str]], dict[str, Any]]
) -> None:
    example = EXAMPLES / "pubsub.yaml"
    settings = started_emulator(_emulator_command(example, "pubsub", free_port()))
    assert settings["connector"] == "pubsub"
    env, db = _env(
        tmp_path,
        PUBSUB_EMULATOR_HOST=settings["emulator_host"],
        PUBSUB_PROJECT=settings["project"],
    )

    async def publish() -> None:
        from acklane.integration.pubsub import PubSubKit

        async with PubSubKit(settings) as kit:
            await kit.publish(
                "orders", [json.dumps(o) for o in ORDERS], attributes={"source": "web"}
            )

    asyncio.run(publish())
    # every order: audit and online-orders; 2 of them over 100: big-orders
    _validate_and_run(example, env, db, expect=2 * len(ORDERS) + 2)


def test_the_servicebus_example_runs_against_the_emulator_its_header_starts(
    tmp_path: Path, started_emulator: Callable[[list[str]], dict[str, Any]]
) -> None:
    from acklane.integration.servicebus import ServiceBusKit

    example = EXAMPLES / "servicebus.yaml"
    settings = started_emulator(_emulator_command(example, "servicebus", free_port()))
    assert settings["connector"] == "servicebus"
    env, db = _env(tmp_path, SERVICEBUS_CONNECTION_STRING=settings["connection_string"])
    ServiceBusKit(settings["connection_string"]).send(
        "orders", [json.dumps(o) for o in ORDERS], properties={"source": "web"}
    )
    _validate_and_run(example, env, db, expect=2 * len(ORDERS) + 2)
