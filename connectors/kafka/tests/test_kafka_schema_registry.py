"""Kafka bodies framed for a Schema Registry, end to end: Avro and Protobuf records
published with ``acklane publish`` to the Kafka emulator, their schemas in the registry
emulator, become trigger events through ``acklane run``; a record whose schema id the
registry does not know lands in the dead-letter topic with its reason, bytes intact.
Plus the unit behaviour of the decoding records (confluent-kafka ``Message`` objects,
the real deserializers and registry)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Message
from typer.testing import CliRunner

from acklane.connectors.kafka import KafkaConfig
from acklane.connectors.kafka._formats import (
    RegistryMessage,
    SchemaRegistryUnavailable,
    record_type,
)
from acklane.connectors.kafka._message import _UNSET, KafkaMessage
from acklane.core.cli.app import app
from acklane.core.connectors.deadletter import REJECT_REASON
from acklane.core.events import EventStore
from acklane.core.message import BodyDecodeError
from acklane.integration.emulator import Emulator
from acklane.integration.kafka import KafkaKit
from acklane.integration.schema_registry import LocalSchemaRegistry
from acklane.integration.schema_samples import ORDER_AVRO, Order
from acklane.integration.testing import AcklaneRun

pytest.importorskip("fastavro")

UNKNOWN_ID = 987_654
ORDERS = [
    {"id": "o-1", "amount": 250.0, "customer": "c-1"},
    {"id": "o-2", "amount": 5.0, "customer": "c-2"},
    {"id": "o-3", "amount": 120.5, "customer": "c-3"},
]


def _stream(kit: KafkaKit, registry: Emulator, topic: str, fmt: str) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "connector": "kafka",
        "bootstrap_servers": kit.bootstrap_servers,
        "topics": [topic],
        "group_id": KafkaKit.unique("group"),
        "dead_letter": f"{topic}.dlq",
        "poll_timeout": 0.05,
        "client": dict(KafkaKit.FAST_GROUP),
        "value_format": fmt,
        "schema_registry": registry.client_settings(),
    }
    if fmt == "protobuf":
        fields["value_message_class"] = "acklane.integration.schema_samples:Order"
    return fields


def _publish(config: Path, stream: str, lines: list[str], *options: str) -> None:
    """``acklane publish CONFIG STREAM [options] LINES...``, in this process."""
    result = CliRunner().invoke(app, ["publish", str(config), stream, *options, *lines])
    assert result.exit_code == 0, result.output


def _stored(db: Path) -> list[tuple[str, dict[str, Any]]]:
    """The (watcher, payload) of every stored event, sorted."""

    async def read() -> list[tuple[str, dict[str, Any]]]:
        async with EventStore(f"sqlite:///{db}") as store:
            events = await store.list_events(limit=100)
        return sorted(((e.trigger_id, e.payload) for e in events), key=json.dumps)

    return asyncio.run(read()) if db.exists() else []


def test_avro_and_protobuf_records_become_events_and_an_unknown_schema_id_is_dead_lettered(
    tmp_path: Path, kafka_kit: KafkaKit, schema_registry_emulator: Emulator
) -> None:
    avro_topic, proto_topic = KafkaKit.unique("avro-orders"), KafkaKit.unique("proto-orders")
    avro_dlq, proto_dlq = f"{avro_topic}.dlq", f"{proto_topic}.dlq"
    for topic in (avro_topic, proto_topic, avro_dlq, proto_dlq):
        kafka_kit.create_topic(topic)
    db = tmp_path / "events.db"
    config = tmp_path / "pipeline.yaml"
    big = {
        "match": {"body.amount": {"gt": 100}},
        "emit": {"id": "body.id", "amount": "body.amount", "customer": "body.customer"},
    }
    watchers = [
        {"name": "big-avro", "stream": "avro", "filter": big},
        {"name": "big-proto", "stream": "proto", "filter": big},
    ]
    streams = {
        "avro": _stream(kafka_kit, schema_registry_emulator, avro_topic, "avro"),
        "proto": _stream(kafka_kit, schema_registry_emulator, proto_topic, "protobuf"),
    }
    document = {
        "store": {"url": f"sqlite:///{db}"},
        "streams": streams,
        "watchers": watchers,
        "engine": {"shutdown_timeout": 5},
    }
    config.write_text(json.dumps(document))  # JSON is YAML
    schema = tmp_path / "order.avsc"
    schema.write_text(json.dumps(ORDER_AVRO))
    lines = [json.dumps(o) for o in ORDERS]
    _publish(config, "avro", lines, "--schema", str(schema))
    _publish(config, "proto", lines)
    broken = b"\x00" + UNKNOWN_ID.to_bytes(4, "big") + b"\x06o-9"
    kafka_kit.produce(avro_topic, [broken])

    expected = [
        ("big-avro", {"id": "o-1", "amount": 250.0, "customer": "c-1"}),
        ("big-avro", {"id": "o-3", "amount": 120.5, "customer": "c-3"}),
        ("big-proto", {"id": "o-1", "amount": 250.0, "customer": "c-1"}),
        ("big-proto", {"id": "o-3", "amount": 120.5, "customer": "c-3"}),
    ]
    with AcklaneRun(config) as run:
        deadline = time.monotonic() + 60
        while _stored(db) != expected and time.monotonic() < deadline:
            time.sleep(0.2)
        copies = kafka_kit.read(avro_dlq, 1, timeout=30)
        assert run.stop() == 0, run.output
    assert _stored(db) == expected, run.output
    [copy] = copies
    assert copy.value() == broken  # the original bytes
    reason = dict(copy.headers() or [])[REJECT_REASON].decode()
    assert f"schema id {UNKNOWN_ID}" in reason and "not found" in reason.lower(), reason
    assert kafka_kit.committed(streams["avro"]["group_id"], avro_topic) == {0: 4}
    assert kafka_kit.committed(streams["proto"]["group_id"], proto_topic) == {0: 3}


# -- the records, unit by unit (real deserializers, the registry emulator) -----------------


def _config(registry: Emulator, **fields: Any) -> KafkaConfig:
    return KafkaConfig(
        bootstrap_servers="127.0.0.1:9",
        topics=["orders"],
        group_id="g",
        schema_registry=registry.client_settings(),
        **fields,
    )


def _record(cls: type[KafkaMessage], value: bytes | None, key: bytes | None = None) -> Any:
    message = Message(topic="orders", partition=0, offset=7, value=value, key=key)
    return cls(message, 1, ("orders", 0), 7, "kafka:c/orders/0/")


def _avro(registry: Emulator, document: dict[str, Any], subject: str = "orders-value") -> bytes:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = SchemaRegistryClient(registry.client_conf())  # type: ignore[attr-defined]
    framed = AvroSerializer(client, json.dumps(ORDER_AVRO))(
        document, SerializationContext(subject.rsplit("-", 1)[0], MessageField.VALUE)
    )
    assert framed is not None
    return framed


def test_json_streams_keep_plain_records(schema_registry_emulator: Emulator) -> None:
    plain = KafkaConfig(bootstrap_servers="127.0.0.1:9", topics=["orders"], group_id="g")
    assert record_type(plain) is KafkaMessage  # no decoding, no cost


def test_an_avro_value_decodes_once_into_the_body(schema_registry_emulator: Emulator) -> None:
    cls = record_type(_config(schema_registry_emulator, value_format="avro"))
    assert issubclass(cls, RegistryMessage)
    framed = _avro(schema_registry_emulator, {"id": "o-1", "amount": 3.5, "customer": "c"})
    record = _record(cls, framed, b"k-1")
    assert record.json() == {"id": "o-1", "amount": 3.5, "customer": "c"}
    assert record.json() is record.json()  # decoded once, shared by the watchers
    assert record.body == framed and record.key == "k-1"
    assert record.message_id == "kafka:c/orders/0/7"


def test_undecodable_values_raise_the_reason(schema_registry_emulator: Emulator) -> None:
    cls = record_type(_config(schema_registry_emulator, value_format="avro"))
    unknown = _record(cls, b"\x00" + UNKNOWN_ID.to_bytes(4, "big") + b"\x02")
    with pytest.raises(BodyDecodeError, match=f"schema id {UNKNOWN_ID}.*not found"):
        unknown.json()
    with pytest.raises(BodyDecodeError, match="no Confluent framing"):
        _record(cls, b'{"id": "plain json"}').json()
    framed = _avro(schema_registry_emulator, {"id": "o-1", "amount": 3.5, "customer": "c"})
    with pytest.raises(BodyDecodeError, match="is not Avro"):
        _record(cls, framed[:7]).json()  # cut short


def test_a_protobuf_key_and_value(schema_registry_emulator: Emulator) -> None:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = SchemaRegistryClient(schema_registry_emulator.client_conf())  # type: ignore[attr-defined]
    serialize = ProtobufSerializer(Order, client, {"use.deprecated.format": False})
    topic = KafkaKit.unique("pk")
    value = serialize(Order(id="o-5", amount=0.0), SerializationContext(topic, MessageField.VALUE))
    key = serialize(Order(id="k-5"), SerializationContext(topic, MessageField.KEY))
    cls = record_type(
        _config(
            schema_registry_emulator,
            value_format="protobuf",
            value_message_class="acklane.integration.schema_samples:Order",
            key_format="protobuf",
            key_message_class="acklane.integration.schema_samples:Order",
        )
    )
    message = Message(topic=topic, partition=0, offset=1, value=value, key=key)
    record = cls(message, 1, (topic, 0), 1, None)
    # fields at their default value are there (amount 0.0, customer "")
    assert record.json() == {"id": "o-5", "amount": 0.0, "customer": ""}
    assert record.decoded_key == {"id": "k-5", "amount": 0.0, "customer": ""}
    assert json.loads(record.key) == record.decoded_key


def test_an_unreachable_registry_is_a_failed_attempt_not_a_rejection() -> None:
    from acklane.integration.emulator import free_port

    config = KafkaConfig(
        bootstrap_servers="127.0.0.1:9",
        topics=["orders"],
        group_id="g",
        value_format="avro",
        schema_registry={
            "url": f"http://127.0.0.1:{free_port()}",
            "timeout": 1,
            "client": {"max.retries": 0},
        },
    )
    record = _record(record_type(config), b"\x00\x00\x00\x00\x01\x02")
    with pytest.raises(SchemaRegistryUnavailable, match="did not answer"):
        record.json()


def test_config_errors_say_what_is_missing() -> None:
    base = {"bootstrap_servers": "127.0.0.1:9", "topics": ["t"], "group_id": "g"}
    with pytest.raises(ValueError, match="need a schema_registry block"):
        KafkaConfig(**base, value_format="avro")
    with pytest.raises(ValueError, match="value_message_class"):
        KafkaConfig(**base, value_format="protobuf", schema_registry={"url": "http://h:1"})
    with pytest.raises(ValueError, match="module:Class"):
        KafkaConfig(
            **base,
            value_format="protobuf",
            value_message_class="not a class",
            schema_registry={"url": "http://h:1"},
        )
    with pytest.raises(ValueError, match="password is required"):
        KafkaConfig(
            **base, value_format="avro", schema_registry={"url": "http://h:1", "username": "u"}
        )


def test_the_consumer_thread_fetches_each_new_schema_before_the_loop_needs_it() -> None:
    from acklane.connectors.kafka._formats import prefetcher

    with LocalSchemaRegistry() as registry:
        cls = record_type(_config(registry, value_format="avro"))
        prefetch = prefetcher(cls)
        assert prefetch is not None
        framed = _avro(registry, {"id": "o-1", "amount": 3.5, "customer": "c"})
        first, second = _record(cls, framed), _record(cls, framed)
        unknown = _record(cls, b"\x00" + UNKNOWN_ID.to_bytes(4, "big") + b"\x02")
        prefetch([first, second, unknown])
        assert first._value == {"id": "o-1", "amount": 3.5, "customer": "c"}
        assert second._value is _UNSET  # its schema id was seen: decoded when asked
        assert isinstance(unknown._value, BodyDecodeError)  # its rejection is ready
    # the registry is gone: the schema comes from the client's cache
    assert second.json() == first.json()
    assert prefetcher(KafkaMessage) is None


def test_publish_refuses_a_schema_for_a_plain_stream_and_a_body_that_is_not_json(
    tmp_path: Path,
) -> None:
    schema = tmp_path / "order.avsc"
    schema.write_text(json.dumps(ORDER_AVRO))
    stream = {"connector": "kafka", "bootstrap_servers": "127.0.0.1:9", "topics": ["t"]}
    stream["group_id"] = "g"
    document = {
        "store": {"url": f"sqlite:///{tmp_path / 'e.db'}"},
        "streams": {
            "plain": stream,
            "avro": {
                **stream,
                "group_id": "g2",
                "value_format": "avro",
                "schema_registry": {"url": "http://h:1"},
            },
        },
        "watchers": [{"name": "w", "stream": "plain"}, {"name": "a", "stream": "avro"}],
    }
    config = tmp_path / "p.yaml"
    config.write_text(json.dumps(document))
    plain = CliRunner().invoke(
        app, ["publish", str(config), "plain", "--schema", str(schema), "{}"]
    )
    assert plain.exit_code == 2 and "no schema to encode with" in plain.output, plain.output
    avro = CliRunner().invoke(
        app, ["publish", str(config), "avro", "--schema", str(schema), "not json"]
    )
    assert avro.exit_code == 1, avro.output
    assert "message 1 could not be encoded (avro)" in avro.output
    assert "written as JSON" in avro.output


def test_avro_types_json_cannot_hold_become_text(schema_registry_emulator: Emulator) -> None:
    import datetime
    import decimal
    import uuid

    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    schema = {
        "type": "record",
        "name": "Typed",
        "fields": [
            {"name": "raw", "type": "bytes"},
            {
                "name": "price",
                "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2},
            },
            {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
            {"name": "tags", "type": {"type": "array", "items": "bytes"}},
        ],
    }
    topic = KafkaKit.unique("typed")
    client = SchemaRegistryClient(schema_registry_emulator.client_conf())  # type: ignore[attr-defined]
    ref = uuid.UUID("12345678-1234-5678-1234-567812345678")
    at = datetime.datetime(2026, 12, 2, 1, 2, 3, tzinfo=datetime.UTC)
    framed = AvroSerializer(client, json.dumps(schema))(
        {
            "raw": b"\x00\xff",
            "price": decimal.Decimal("12.34"),
            "at": at,
            "ref": ref,
            "tags": [b"a"],
        },
        SerializationContext(topic, MessageField.VALUE),
    )
    cls = record_type(_config(schema_registry_emulator, value_format="avro"))
    record = cls(Message(topic=topic, partition=0, offset=1, value=framed), 1, (topic, 0), 1)
    body = record.json()
    json.dumps(body)  # every value fits in an event
    assert body == {
        "raw": "AP8=",
        "price": "12.34",
        "at": "2026-12-02T01:02:03+00:00",
        "ref": str(ref),
        "tags": ["YQ=="],
    }


def test_a_json_schema_value_is_validated(schema_registry_emulator: Emulator) -> None:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.json_schema import JSONSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from acklane.integration.schema_samples import ORDER_JSON_SCHEMA

    topic = KafkaKit.unique("js")
    client = SchemaRegistryClient(schema_registry_emulator.client_conf())  # type: ignore[attr-defined]
    framed = JSONSerializer(json.dumps(ORDER_JSON_SCHEMA), client)(
        {"id": "o-1", "amount": 2}, SerializationContext(topic, MessageField.VALUE)
    )
    assert framed is not None
    cls = record_type(_config(schema_registry_emulator, value_format="json_schema"))

    def record(value: bytes) -> Any:
        return cls(Message(topic=topic, partition=0, offset=1, value=value), 1, (topic, 0), 1)

    assert record(framed).json() == {"id": "o-1", "amount": 2}
    # the same frame around a document its schema refuses (no amount)
    with pytest.raises(BodyDecodeError, match="is not JSON Schema"):
        record(framed[:5] + b'{"id": "o-2"}').json()
