"""``acklane emulator start``: the entities it creates (from options or a pipeline's
configuration, on the port the configuration reaches) and the settings it prints,
the fast Kafka client settings included."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from acklane.core.cli import app as cli
from acklane.integration.cli import FAST_KAFKA_CLIENT
from acklane.integration.emulator import free_port

EMULATOR = [sys.executable, "-m", "acklane.core.cli", "emulator", "start"]


class _Started:
    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.out: list[str] = []
        self.err: list[str] = []
        for stream, sink in ((proc.stdout, self.out), (proc.stderr, self.err)):
            threading.Thread(target=self._read, args=(stream, sink), daemon=True).start()

    @staticmethod
    def _read(stream: Any, sink: list[str]) -> None:
        for line in stream:
            sink.append(line)

    def ready(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while "Ctrl-C to stop" not in "".join(self.err):
            assert self.proc.poll() is None and time.monotonic() < deadline, "".join(self.err)
            time.sleep(0.05)


@pytest.fixture
def start() -> Iterator[Any]:
    started: list[_Started] = []

    def run(*args: str, env: dict[str, str] | None = None) -> _Started:
        proc = subprocess.Popen(
            [*EMULATOR, *args, "--backend", "local"],
            env={**os.environ, **(env or {})},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        one = _Started(proc)
        started.append(one)
        one.ready()
        return one

    yield run
    for one in started:
        one.proc.send_signal(signal.SIGTERM)
        assert one.proc.wait(timeout=30) == 0, "".join(one.err)


def _write(path: Path, streams: dict[str, Any]) -> Path:
    document = {
        "store": {"url": "sqlite:///unused.db"},
        "streams": streams,
        "watchers": [{"name": f"w-{name}", "stream": name} for name in streams],
    }
    path.write_text(json.dumps(document))
    return path


def test_kafka_from_a_configuration_listens_where_it_reaches_and_creates_its_topics(
    start: Any, tmp_path: Path
) -> None:
    from confluent_kafka.admin import AdminClient

    port = free_port()
    config = _write(
        tmp_path / "pipeline.yaml",
        {
            "orders": {
                "connector": "kafka",
                "bootstrap_servers": "${KAFKA_BOOTSTRAP_SERVERS}",
                "topics": ["orders", "^pattern-.*"],
                "group_id": "g",
                "dead_letter": "orders.dlq",
            }
        },
    )
    env = {"KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{port}"}
    started = start("kafka", "--config", str(config), "--topic", "extra", env=env)
    text = "".join(started.out)
    settings = yaml.safe_load(text)
    assert settings["bootstrap_servers"] == f"127.0.0.1:{port}"
    # the client settings that make the emulator's group joins quick, ready to paste
    assert settings["client"] == FAST_KAFKA_CLIENT
    assert settings["client"]["session.timeout.ms"] <= 6000
    assert "about half of session.timeout.ms" in text
    assert f"export KAFKA_BOOTSTRAP_SERVERS='127.0.0.1:{port}'" in text
    topics = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"}).list_topics(timeout=10)
    assert {"orders", "orders.dlq", "extra"} <= set(topics.topics)
    assert "is a pattern" in "".join(started.err)


def test_sqs_queues_get_their_dead_letter_queue_as_redrive_target(start: Any) -> None:
    from acklane.integration.sqs import sqs_client

    started = start("sqs", "--queue", "orders:orders-dlq", "--format", "json")
    settings = json.loads(started.out[0])
    client = sqs_client(settings)
    orders = client.get_queue_url(QueueName="orders")["QueueUrl"]
    dlq = client.get_queue_url(QueueName="orders-dlq")["QueueUrl"]
    attributes = client.get_queue_attributes(QueueUrl=orders, AttributeNames=["All"])["Attributes"]
    dlq_arn = client.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]
    assert json.loads(attributes["RedrivePolicy"])["deadLetterTargetArn"] == dlq_arn["QueueArn"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["sqs", "--topic", "t"], "--topic is for kafka, pubsub, servicebus, not sqs"),
        (["kafka", "--queue", "q"], "--queue is for sqs and servicebus, not kafka"),
        (["servicebus", "--queue", "a:b"], "expected NAME (or NAME:DLQ on sqs)"),
        (["kafka", "--subscription", "s:t"], "--subscription is for pubsub and servicebus"),
        (["nope"], "no emulator for broker 'nope'"),
    ],
)
def test_options_that_do_not_fit_the_broker_are_refused(args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli.app, ["emulator", "start", *args], env={"COLUMNS": "300"})
    assert result.exit_code == 2
    assert message in result.output


def test_a_configuration_without_the_broker_or_the_topic_of_a_subscription_is_refused(
    tmp_path: Path,
) -> None:
    pubsub = {
        "connector": "pubsub",
        "project": "p-1",
        "emulator_host": "127.0.0.1:8085",
        "subscription": "orders-sub",
    }
    config = _write(tmp_path / "pubsub.yaml", {"orders": pubsub})
    runner = CliRunner()
    result = runner.invoke(cli.app, ["emulator", "start", "kafka", "--config", str(config)])
    assert result.exit_code == 2 and "has no kafka stream" in result.output
    result = runner.invoke(
        cli.app, ["emulator", "start", "pubsub", "--config", str(config)], env={"COLUMNS": "300"}
    )
    assert result.exit_code == 2
    assert "add --topic TOPIC (or --subscription orders-sub:TOPIC)" in result.output


def test_the_schema_registry_listens_where_a_configuration_reaches_it(
    start: Any, tmp_path: Path
) -> None:
    from confluent_kafka.schema_registry import SchemaRegistryClient

    port = free_port()
    config = _write(
        tmp_path / "pipeline.yaml",
        {
            "orders": {
                "connector": "kafka",
                "bootstrap_servers": "127.0.0.1:9092",
                "topics": ["orders"],
                "group_id": "g",
                "value_format": "avro",
                "schema_registry": {"url": "${SCHEMA_REGISTRY_URL}"},
            }
        },
    )
    url = f"http://127.0.0.1:{port}"
    started = start("schema-registry", "--config", str(config), env={"SCHEMA_REGISTRY_URL": url})
    text = "".join(started.out)
    # the block to paste under a Kafka stream, and the variable the examples read
    assert yaml.safe_load(text) == {"schema_registry": {"url": url}}
    assert f"export SCHEMA_REGISTRY_URL='{url}'" in text
    assert SchemaRegistryClient({"url": url}).get_subjects() == []


def test_the_schema_registry_asks_for_the_user_given() -> None:
    from acklane.integration.schema_registry import LocalSchemaRegistry

    result = CliRunner().invoke(
        cli.app, ["emulator", "start", "kafka", "--user", "u:p"], env={"COLUMNS": "300"}
    )
    assert result.exit_code == 2 and "--user NAME:PASSWORD is for schema-registry" in result.stderr
    with LocalSchemaRegistry(user=("reg", "pw")) as registry:
        assert registry.client_settings() == {
            "url": registry.endpoint,
            "username": "reg",
            "password": "pw",
        }
