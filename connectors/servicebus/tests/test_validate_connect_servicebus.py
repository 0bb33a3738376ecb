"""``acklane validate --connect`` on Service Bus streams: what it finds, one line each.

Against acklane's Service Bus emulator, which checks SAS tokens as Azure does (CBS,
signed with the namespace's key): a queue that exists is peeked at (nothing is
locked or settled); a queue that does not exist, a key the namespace refuses, a
namespace that does not answer: one line each, naming the setting.

What ``acklane run`` does against such a stream (a refused key stops it; an
unreachable namespace is told once) is a rule of every connector:
``tests/test_conformance_run_errors.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from acklane.integration.emulator import Emulator, free_port
from acklane.integration.servicebus import ServiceBusEmulator
from acklane.integration.testing import stream_check, validate_json, write_pipeline


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
