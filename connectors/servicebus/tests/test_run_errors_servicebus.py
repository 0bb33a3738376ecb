"""Service Bus streams acklane cannot use: ``validate --connect`` and ``acklane run``.

Against acklane's Service Bus emulator, which checks SAS tokens as Azure does (CBS,
signed with the namespace's key): a queue that exists is peeked at (nothing is
locked or settled); a queue that does not exist, a key the namespace refuses, a
namespace that does not answer: one line each, naming the setting. At run time the
refused key stops acklane (exit 1, one ERROR line, no traceback), and an
unreachable namespace is told once while the stream waits for it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from acklane.integration.emulator import Emulator, free_port
from acklane.integration.servicebus import ServiceBusEmulator
from acklane.integration.testing import AcklaneRun, stream_check, validate_json, write_pipeline


@pytest.fixture
def bus(servicebus_emulator: Emulator) -> ServiceBusEmulator:
    assert isinstance(servicebus_emulator, ServiceBusEmulator)
    return servicebus_emulator


def _pipeline(tmp_path: Path, connection_string: str, queue: str) -> Path:
    stream = f'connection_string: "{connection_string}"\nqueue: {queue}\nmax_wait_time: 1\n'
    return write_pipeline(tmp_path, "servicebus", stream)


def _wrong_key(connection_string: str) -> str:
    parts = [
        "SharedAccessKey=NotTheKey123" if p.startswith("SharedAccessKey=") else p
        for p in connection_string.split(";")
    ]
    return ";".join(parts)


def _unreachable(connection_string: str) -> str:
    parts = [
        f"Endpoint=sb://127.0.0.1:{free_port()}" if p.startswith("Endpoint=") else p
        for p in connection_string.split(";")
    ]
    return ";".join(parts)


def _check(cfg: Path) -> tuple[int, dict[str, Any]]:
    code, document = validate_json(cfg, "--connect")
    check = stream_check(document)
    assert check["setting"] == "streams.orders"
    return code, check


def test_connect_peeks_at_a_queue_and_changes_nothing(
    tmp_path: Path, bus: ServiceBusEmulator
) -> None:
    queue = bus.create_queue()
    code, check = _check(_pipeline(tmp_path, bus.connection_string, queue))
    assert code == 0, check
    assert check["status"] == "ok"
    assert f"{queue} readable (no message waiting)" in check["detail"]
    assert "SharedAccessKey" not in json.dumps(check)


def test_connect_names_a_queue_that_does_not_exist(tmp_path: Path, bus: ServiceBusEmulator) -> None:
    code, check = _check(_pipeline(tmp_path, bus.connection_string, "no-such-queue"))
    assert code == 3
    assert "no such entity no-such-queue (queue)" in check["detail"]


def test_connect_with_a_key_the_namespace_refuses(tmp_path: Path, bus: ServiceBusEmulator) -> None:
    queue = bus.create_queue()
    code, check = _check(_pipeline(tmp_path, _wrong_key(bus.connection_string), queue))
    assert code == 3
    assert "Service Bus authentication failed" in check["detail"]
    assert "streams.orders.connection_string" in check["detail"]
    assert "NotTheKey123" not in json.dumps(check)


def test_connect_to_a_namespace_that_does_not_answer(
    tmp_path: Path, bus: ServiceBusEmulator
) -> None:
    code, check = _check(_pipeline(tmp_path, _unreachable(bus.connection_string), "q"))
    assert code == 3
    assert "cannot reach namespace" in check["detail"]
    assert "(connection_string)" in check["detail"]


def test_run_with_a_refused_key_stops_with_exit_1_and_one_line(
    tmp_path: Path, bus: ServiceBusEmulator
) -> None:
    queue = bus.create_queue()
    with AcklaneRun(_pipeline(tmp_path, _wrong_key(bus.connection_string), queue)) as run:
        code = run.finish(timeout=120)  # it stops by itself
    out, errors = run.output, run.errors
    assert code == 1, out
    assert len(errors) == 1, out
    assert "stream orders: Service Bus authentication failed" in errors[0]
    assert "streams.orders.connection_string" in errors[0]
    assert "NotTheKey123" not in out
    assert "Traceback" not in out


def test_run_with_an_unreachable_namespace_tells_it_once(
    tmp_path: Path, bus: ServiceBusEmulator
) -> None:
    with AcklaneRun(_pipeline(tmp_path, _unreachable(bus.connection_string), "q")) as run:
        run.wait_for("Service Bus namespace unreachable")
        time.sleep(5)  # more tries meanwhile: none told again
        code = run.stop()
    out = run.output
    assert code == 0, out
    assert out.count("Service Bus namespace unreachable") == 1, out
    assert "Traceback" not in out
    assert "Restarting watchers" not in out
