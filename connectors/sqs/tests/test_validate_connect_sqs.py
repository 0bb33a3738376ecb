"""``acklane validate --connect`` on SQS streams: what it finds, one line each, naming the
setting.

Against moto's server (the session's emulator), and a second moto server started
here with its IAM checks on (``INITIAL_NO_AUTH_ACTION_COUNT=0``): it answers keys it
does not know with ``InvalidClientTokenId``, as AWS does. The queue and its
dead-letter queue readable; a dead-letter queue that does not exist, refused keys, an
endpoint that does not answer.

What ``acklane run`` does against such a stream (refused keys stop it; an
unreachable endpoint is told once) is a rule of every connector:
``tests/test_conformance_run_errors.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from acklane.integration.emulator import Emulator, free_port, wait_for_port
from acklane.integration.sqs import sqs_client
from acklane.integration.testing import stream_check, validate_json, write_pipeline


@pytest.fixture(scope="module")
def strict_moto() -> Iterator[str]:
    """A moto server that checks credentials: its endpoint URL."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env={**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "0"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port("127.0.0.1", port, 60)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture
def queues(sqs_emulator: Emulator) -> dict[str, str]:
    client = sqs_client(sqs_emulator.client_settings())
    suffix = str(time.monotonic_ns())
    return {
        "queue": client.create_queue(QueueName=f"orders-{suffix}")["QueueUrl"],
        "dlq": client.create_queue(QueueName=f"orders-dlq-{suffix}")["QueueUrl"],
    }


def _pipeline(tmp_path: Path, stream: str) -> Path:
    return write_pipeline(tmp_path, "sqs", stream)


def _stream(endpoint: str, queue: str, key: str = "testing", extra: str = "") -> str:
    return (
        f"queue_url: {queue}\nendpoint_url: {endpoint}\nregion: us-east-1\n"
        f"aws_access_key_id: {key}\naws_secret_access_key: WrongSecret123\n"
        f"wait_time_seconds: 1\n{extra}"
    )


def _check(tmp_path: Path, stream: str) -> tuple[int, dict[str, Any]]:
    code, document = validate_json(_pipeline(tmp_path, stream), "--connect")
    return code, stream_check(document)


def test_connect_to_a_queue_and_its_dead_letter_queue(
    tmp_path: Path, sqs_emulator: Emulator, queues: dict[str, str]
) -> None:
    endpoint = sqs_emulator.client_settings()["endpoint_url"]
    stream = _stream(endpoint, queues["queue"], extra=f"dead_letter: {queues['dlq']}\n")
    code, check = _check(tmp_path, stream)
    assert code == 0, check
    assert check["status"] == "ok"
    assert "readable; dead-letter queue" in check["detail"]


def test_connect_names_a_missing_dead_letter_queue(
    tmp_path: Path, sqs_emulator: Emulator, queues: dict[str, str]
) -> None:
    endpoint = sqs_emulator.client_settings()["endpoint_url"]
    missing = queues["dlq"] + "-gone"
    stream = _stream(endpoint, queues["queue"], extra=f"dead_letter: {missing}\n")
    code, check = _check(tmp_path, stream)
    assert code == 3
    assert f"no such queue {missing} (dead_letter)" in check["detail"]


def test_connect_with_keys_aws_does_not_know(tmp_path: Path, strict_moto: str) -> None:
    code, check = _check(
        tmp_path, _stream(strict_moto, f"{strict_moto}/123456789012/q", "AKIAWRONG0KEY")
    )
    assert code == 3
    assert "SQS authentication failed" in check["detail"]
    assert "InvalidClientTokenId" in check["detail"]
    assert "streams.orders.aws_access_key_id" in check["detail"]
    assert "WrongSecret123" not in json.dumps(check)


def test_connect_to_an_endpoint_that_does_not_answer(tmp_path: Path) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    code, check = _check(tmp_path, _stream(endpoint, f"{endpoint}/123456789012/q"))
    assert code == 3
    assert "cannot reach the SQS endpoint (endpoint_url, region)" in check["detail"]
