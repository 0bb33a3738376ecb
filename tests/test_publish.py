"""``acklane publish CONFIG STREAM``: messages reach each broker as configured, read back
with the broker's own SDK on its emulator; the memory broker and the problems of a
command line are refused with a reason; secrets never appear in the output."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from acklane.core.cli import app as cli
from acklane.integration.emulator import Emulator
from acklane.integration.kafka import KafkaKit

ORDERS = ['{"id": 1, "amount": 150}', '{"id": 2, "amount": 20}', "not json at all"]


def _config(tmp_path: Path, block: dict[str, Any]) -> Path:
    path = tmp_path / "pipeline.yaml"
    document = {
        "store": {"url": f"sqlite:///{tmp_path / 'events.db'}"},
        "streams": {"orders": block},
        "watchers": [{"name": "audit", "stream": "orders"}],
    }
    path.write_text(json.dumps(document))  # JSON is YAML
    return path


def _publish(*args: str, input: str | None = None) -> Any:
    return CliRunner().invoke(cli.app, ["publish", *args], input=input)


def _orders_file(tmp_path: Path) -> Path:
    path = tmp_path / "orders.jsonl"
    path.write_text("\n".join(ORDERS) + "\n\n")  # an empty line is skipped
    return path


def test_kafka_records_carry_the_body_key_and_headers(kafka_kit: KafkaKit, tmp_path: Path) -> None:
    topic = kafka_kit.new_topic("publish")
    config = _config(
        tmp_path,
        {
            "connector": "kafka",
            "bootstrap_servers": kafka_kit.bootstrap_servers,
            "topics": [topic],
            "group_id": "g",
        },
    )
    file = _orders_file(tmp_path)
    result = _publish(
        str(config), "orders", "--file", str(file), "--key", "k1", "--attribute", "source=web"
    )
    assert result.exit_code == 0, result.output
    assert f"published 3 message(s) to kafka topic {topic}" in result.output
    records = kafka_kit.read(topic, 3)
    assert [r.value().decode() for r in records] == ORDERS
    assert {r.key() for r in records} == {b"k1"}
    assert {tuple(r.headers()) for r in records} == {(("source", b"web"),)}


def test_kafka_with_several_topics_needs_topic_and_envelopes_set_each_message(
    kafka_kit: KafkaKit, tmp_path: Path
) -> None:
    one, two = kafka_kit.new_topic("one"), kafka_kit.new_topic("two")
    block = {"connector": "kafka", "bootstrap_servers": kafka_kit.bootstrap_servers}
    config = _config(tmp_path, {**block, "topics": [one, two], "group_id": "g"})
    refused = _publish(str(config), "orders", "x")
    assert refused.exit_code == 2
    assert "name the one to publish to (--topic)" in refused.output
    lines = [
        {"body": {"id": 1}, "key": "a", "attributes": {"source": "mobile"}},
        {"body": "plain text"},
    ]
    text = "\n".join(json.dumps(line) for line in lines)
    result = _publish(
        str(config), "orders", "--topic", two, "--envelope", "--file", "-", input=text
    )
    assert result.exit_code == 0, result.output
    first, second = kafka_kit.read(two, 2)
    assert json.loads(first.value()) == {"id": 1}
    assert first.key() == b"a" and first.headers() == [("source", b"mobile")]
    assert second.value() == b"plain text" and second.key() is None


def test_sqs_messages_arrive_with_their_attributes_and_no_secret_is_printed(
    sqs_emulator: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from acklane.integration.sqs import sqs_client

    secret = f"planted-{uuid.uuid4().hex}"
    monkeypatch.setenv("PLANTED_AWS_SECRET", secret)
    settings = sqs_emulator.client_settings()
    client = sqs_client(settings)
    name = f"publish-{uuid.uuid4().hex[:8]}"
    url = client.create_queue(QueueName=name)["QueueUrl"]
    block = {
        "connector": "sqs",
        "endpoint_url": settings["endpoint_url"],
        "region": settings["region"],
        "aws_access_key_id": "testing",
        "aws_secret_access_key": "${PLANTED_AWS_SECRET}",
    }
    config = _config(tmp_path, {**block, "queue_name": name})
    result = _publish(str(config), "orders", *ORDERS, "-a", "source=web")
    assert result.exit_code == 0, result.output
    got = client.receive_message(
        QueueUrl=url, MaxNumberOfMessages=10, MessageAttributeNames=["All"], WaitTimeSeconds=2
    )["Messages"]
    assert sorted(m["Body"] for m in got) == sorted(ORDERS)
    assert {m["MessageAttributes"]["source"]["StringValue"] for m in got} == {"web"}
    # a standard queue has no key; a missing queue is one line, and neither shows the secret
    keyed = _publish(str(config), "orders", "x", "--key", "k")
    assert keyed.exit_code == 1 and "not FIFO" in keyed.output
    missing = _publish(str(_config(tmp_path, {**block, "queue_name": "nope"})), "orders", "x")
    assert missing.exit_code == 1 and "not found" in missing.output
    for output in (result.output, keyed.output, missing.output):
        assert secret not in output


def test_pubsub_messages_go_to_the_topic_of_the_subscription(
    pubsub_emulator: Emulator, tmp_path: Path
) -> None:
    from acklane.integration.pubsub import PubSubKit

    settings = pubsub_emulator.client_settings()

    async def scenario() -> list[Any]:
        async with PubSubKit(settings) as kit:
            topic = await kit.create_topic("publish")
            subscription = await kit.create_subscription(topic, ordering=True)
            block = {"connector": "pubsub", **settings, "subscription": subscription}
            config = _config(tmp_path, block)
            result = await asyncio.to_thread(
                _publish, str(config), "orders", *ORDERS, "--key", "k", "-a", "source=web"
            )
            assert result.exit_code == 0, result.output
            assert f"pubsub topic {topic}" in result.output
            return await kit.drain(subscription.rsplit("/", 1)[-1], expect=3)

    received = asyncio.run(scenario())
    assert sorted(r.message.data.decode() for r in received) == sorted(ORDERS)
    assert {r.message.ordering_key for r in received} == {"k"}
    assert {r.message.attributes["source"] for r in received} == {"web"}


def test_servicebus_messages_arrive_with_their_application_properties(
    servicebus_emulator: Any, tmp_path: Path
) -> None:
    from acklane.integration.servicebus import ServiceBusKit

    queue = servicebus_emulator.create_queue()
    connection = servicebus_emulator.client_settings()["connection_string"]
    config = _config(
        tmp_path, {"connector": "servicebus", "connection_string": connection, "queue": queue}
    )
    result = _publish(str(config), "orders", *ORDERS, "-a", "source=web")
    assert result.exit_code == 0, result.output
    assert "SAS_KEY_VALUE" not in result.output
    received = ServiceBusKit(connection).receive(queue, 3, wait=5)
    assert sorted(b"".join(m.body).decode() for m in received) == sorted(ORDERS)
    assert {m.application_properties[b"source"] for m in received} == {b"web"}
    keyed = _publish(str(config), "orders", "x", "--key", "k")
    assert keyed.exit_code == 1 and "session-enabled" in keyed.output


def test_the_memory_broker_unknown_streams_and_bad_input_are_refused(tmp_path: Path) -> None:
    config = _config(tmp_path, {"connector": "memory", "topics": ["orders"]})
    memory = _publish(str(config), "orders", "x")
    assert memory.exit_code == 2
    assert "lives inside the process that runs the pipeline" in memory.output
    unknown = _publish(str(config), "ordrs", "x")
    assert unknown.exit_code == 2 and "no stream named 'ordrs' (streams: orders)" in unknown.output
    both = _publish(str(config), "orders", "x", "--file", "f")
    assert both.exit_code == 2 and "not both" in both.output
    attribute = _publish(str(config), "orders", "x", "--attribute", "novalue")
    assert attribute.exit_code == 2 and "NAME=VALUE" in attribute.output
