"""``acklane validate --connect`` for Kafka streams, against the emulator (tansu).

Good: the cluster answers, the topics and the DLQ topic exist. Bad: a topic that
does not exist (named with its field), a closed port (bootstrap_servers), a SASL
login the broker refuses (the SASL fields to check, the password never printed).
Offline (no --connect): an ``ssl_*_location`` file that does not exist, a Protobuf
message class that does not import.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from acklane.integration.emulator import free_port
from acklane.integration.kafka import KafkaKit
from acklane.integration.testing import stream_check, validate_json, write_pipeline


def _validate(tmp_path: Path, stream: str, *options: str) -> tuple[int, dict[str, Any]]:
    code, document = validate_json(write_pipeline(tmp_path, "kafka", stream), *options)
    return code, document


def _stream_check(document: dict[str, Any]) -> dict[str, Any]:
    check = stream_check(document)
    assert check["setting"] == "streams.orders"
    return check


def test_a_reachable_cluster_with_its_topics(tmp_path: Path, kafka_kit: KafkaKit) -> None:
    topic, dlq = kafka_kit.new_topic("orders"), kafka_kit.new_topic("dlq")
    code, document = _validate(
        tmp_path,
        f"bootstrap_servers: {kafka_kit.bootstrap_servers}\ntopics: [{topic}]\n"
        f"group_id: g\ndead_letter: {dlq}\n",
        "--connect",
    )
    assert code == 0, document
    check = _stream_check(document)
    assert check["status"] == "ok"
    assert f"cluster {kafka_kit.cluster_id()}" in check["detail"]
    assert f"topics {topic}, {dlq} exist" in check["detail"]


def test_a_missing_topic_is_named_with_its_field(tmp_path: Path, kafka_kit: KafkaKit) -> None:
    topic = kafka_kit.new_topic("orders")
    code, document = _validate(
        tmp_path,
        f"bootstrap_servers: {kafka_kit.bootstrap_servers}\ntopics: [{topic}]\n"
        "group_id: g\ndead_letter: no-such-dlq-topic\n",
        "--connect",
    )
    assert code == 3, document
    check = _stream_check(document)
    assert check["status"] == "failed"
    assert "no such topic: 'no-such-dlq-topic' (dead_letter)" in check["detail"]


def test_a_closed_port_names_bootstrap_servers(tmp_path: Path) -> None:
    port = free_port()
    code, document = _validate(
        tmp_path,
        f"bootstrap_servers: 127.0.0.1:{port}\ntopics: [orders]\ngroup_id: g\n",
        "--connect",
    )
    assert code == 3, document
    detail = _stream_check(document)["detail"]
    assert f"no answer from the brokers at 127.0.0.1:{port}" in detail
    assert "(bootstrap_servers)" in detail
    assert "Connection refused" in detail


def test_a_refused_sasl_login(tmp_path: Path, refused_sasl_stream: str) -> None:
    code, document = _validate(tmp_path, refused_sasl_stream, "--connect")
    assert code == 3, document
    detail = _stream_check(document)["detail"]
    assert "Kafka authentication failed" in detail
    assert "streams.orders.sasl_password" in detail
    assert "Secr3tSasl" not in json.dumps(document)


def test_a_missing_certificate_file_is_found_offline(tmp_path: Path) -> None:
    code, document = _validate(
        tmp_path,
        f"""\
        bootstrap_servers: 127.0.0.1:9092
        topics: [orders]
        group_id: g
        security_protocol: SSL
        ssl_ca_location: {tmp_path}/no-such-ca.pem
        """,
    )
    assert code == 2, document
    (problem,) = document["problems"]
    assert problem["field"] == "streams.orders.ssl_ca_location"
    assert problem["line"] == 9  # the line of ssl_ca_location
    assert "no such file" in problem["message"]


def test_a_protobuf_message_class_that_does_not_import_is_found_offline(tmp_path: Path) -> None:
    code, document = _validate(
        tmp_path,
        """\
        bootstrap_servers: 127.0.0.1:9092
        topics: [orders]
        group_id: g
        value_format: protobuf
        value_message_class: no_such_module_pb2:Order
        schema_registry: {url: "http://127.0.0.1:8081"}
        """,
    )
    assert code == 2, document
    (problem,) = document["problems"]
    assert problem["field"] == "streams.orders.value_message_class"
    assert "cannot import no_such_module_pb2" in problem["message"]
