"""The Kafka emulator harness: the local tansu process, its health check, and the CLI."""

from __future__ import annotations

import importlib.util
import json
import signal
import socket
import subprocess
import sys

import pytest

from acklane.integration.emulator import Emulator, EmulatorError, emulator_for
from acklane.integration.kafka import TansuEmulator, kafka_metadata_brokers


def _listening(endpoint: str) -> bool:
    host, port = endpoint.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=0.5):
            return True
    except OSError:
        return False


def test_session_emulator_answers_a_metadata_request_naming_its_endpoint(
    kafka_emulator: Emulator,
) -> None:
    host, port = kafka_emulator.endpoint.rsplit(":", 1)
    assert kafka_metadata_brokers(host, int(port)) == [(host, int(port))]
    assert kafka_emulator.client_settings() == {"bootstrap_servers": kafka_emulator.endpoint}


def test_local_emulator_stop_ends_the_broker_process() -> None:
    emulator = TansuEmulator()
    emulator.start()
    endpoint = emulator.endpoint
    assert emulator.running and _listening(endpoint)

    emulator.stop()

    assert not emulator.running
    assert not _listening(endpoint)
    emulator.stop()  # a second stop is harmless


def test_a_tansu_override_that_is_not_executable_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ACKLANE_TANSU_BIN", "/nonexistent/tansu")
    with pytest.raises(EmulatorError, match="ACKLANE_TANSU_BIN"):
        TansuEmulator().start()


@pytest.mark.skipif(
    importlib.util.find_spec("testcontainers") is not None, reason="testcontainers is installed"
)
def test_docker_backend_without_testcontainers_says_what_to_install() -> None:
    with pytest.raises(EmulatorError, match=r"acklane-integration\[docker\]"):
        emulator_for("kafka", "docker").start()


def test_emulator_start_prints_the_connection_settings_and_stops_on_ctrl_c() -> None:
    command = ["start", "kafka", "--backend", "local", "--format", "json"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "acklane.integration.cli", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        settings = json.loads(proc.stdout.readline())
        assert settings["connector"] == "kafka"
        host, port = settings["bootstrap_servers"].rsplit(":", 1)
        assert kafka_metadata_brokers(host, int(port))

        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    assert proc.returncode == 0, err
    assert "stopped" in err
    assert not _listening(settings["bootstrap_servers"])
