"""Errors that say what to do, when what acklane meets is not what it expects.

Each test runs the ``acklane`` command line as a process against a real obstacle
(a port another process holds, a server that is not what the configuration says,
a broker nobody answers at) and checks the error is one line that names the
obstacle and the way out, never a traceback or a flood of a client library's logs.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

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
