"""The Schema Registry emulator, driven by confluent-kafka's own client, serializers and
deserializers only (conformance: what works here works against Confluent's registry)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("confluent_kafka.schema_registry")

from confluent_kafka.schema_registry import (
    Schema,
    SchemaReference,
    SchemaRegistryClient,
    SchemaRegistryError,
)
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.json_schema import (
    JSONDeserializer,
    JSONSerializer,
)
from confluent_kafka.serialization import MessageField, SerializationContext

from acklane.integration.emulator import Emulator
from acklane.integration.kafka import KafkaKit
from acklane.integration.schema_registry import LocalSchemaRegistry

ORDER = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [{"name": "id", "type": "string"}, {"name": "amount", "type": "double"}],
}


def _order(extra: list[dict[str, Any]] | None = None) -> Schema:
    schema = dict(ORDER, fields=[*ORDER["fields"], *(extra or [])])
    return Schema(json.dumps(schema), "AVRO")


@pytest.fixture
def client(schema_registry_emulator: Emulator) -> Iterator[SchemaRegistryClient]:
    c = SchemaRegistryClient(schema_registry_emulator.client_conf())  # type: ignore[attr-defined]
    yield c
    c.close()


def _fresh(client: SchemaRegistryClient) -> SchemaRegistryClient:
    """A client with empty caches: every answer below comes from the server."""
    return SchemaRegistryClient(client.config())


def test_register_look_up_and_read_back(client: SchemaRegistryClient) -> None:
    subject = KafkaKit.unique("orders") + "-value"
    schema_id = client.register_schema(subject, _order())
    other = _fresh(client)
    assert other.register_schema(subject, _order()) == schema_id  # the same: no new version
    # the same schema under another subject: the same id, that subject's version 1
    second = KafkaKit.unique("copy") + "-value"
    assert other.register_schema(second, _order()) == schema_id

    got = other.get_schema(schema_id)
    assert json.loads(got.schema_str) == ORDER and got.schema_type == "AVRO"
    assert subject in other.get_subjects()
    assert other.get_versions(subject) == [1]
    latest = other.get_latest_version(subject)
    assert (latest.schema_id, latest.version, latest.subject) == (schema_id, 1, subject)
    found = other.lookup_schema(subject, _order())
    assert (found.schema_id, found.version) == (schema_id, 1)
    assert sorted(other.get_subjects_by_schema_id(schema_id)) == sorted([subject, second])
    versions = other.get_schema_versions(schema_id)
    assert {(v.subject, v.version) for v in versions} == {(subject, 1), (second, 1)}
    assert set(other.get_schema_types()) == {"AVRO", "JSON", "PROTOBUF"}

    # a new version, with its own id
    v2 = other.register_schema(
        subject, _order([{"name": "note", "type": ["null", "string"], "default": None}])
    )
    assert v2 != schema_id
    assert _fresh(client).get_versions(subject) == [1, 2]
    assert _fresh(client).get_version(subject, 1).schema_id == schema_id
    assert _fresh(client).get_latest_version(subject).schema_id == v2


def test_errors_carry_confluents_codes(client: SchemaRegistryClient) -> None:
    subject = KafkaKit.unique("errors") + "-value"
    with pytest.raises(SchemaRegistryError) as unknown_id:
        client.get_schema(987_654)
    assert (unknown_id.value.http_status_code, unknown_id.value.error_code) == (404, 40403)
    with pytest.raises(SchemaRegistryError) as unknown_subject:
        client.get_latest_version(subject)
    assert unknown_subject.value.error_code == 40401
    with pytest.raises(SchemaRegistryError) as invalid:
        client.register_schema(
            subject,
            Schema(
                '{"type": "record", "name": "X", "fields": [{"name": "a", "type": "nosuch"}]}',
                "AVRO",
            ),
        )
    assert (invalid.value.http_status_code, invalid.value.error_code) == (422, 42201)
    client.register_schema(subject, _order())
    with pytest.raises(SchemaRegistryError) as not_there:
        _fresh(client).lookup_schema(subject, Schema('{"type": "string"}', "AVRO"))
    assert not_there.value.error_code == 40403
    with pytest.raises(SchemaRegistryError) as no_version:
        client.get_version(subject, 7)
    assert no_version.value.error_code == 40402


def test_compatibility_setting(client: SchemaRegistryClient) -> None:
    subject = KafkaKit.unique("compat") + "-value"
    assert client.get_compatibility() == "BACKWARD"
    assert client.set_compatibility(subject, "full")["compatibility"] == "FULL"  # type: ignore[index]
    assert client.get_compatibility(subject) == "FULL"
    assert client.get_config(subject).compatibility_level.value == "FULL"  # type: ignore[union-attr]
    client.delete_config(subject)
    with pytest.raises(SchemaRegistryError) as none:
        client.get_compatibility(subject)
    assert none.value.error_code == 40408
    with pytest.raises(SchemaRegistryError) as bad:
        client.set_compatibility(subject, "SIDEWAYS")
    assert bad.value.error_code == 42203


def test_delete_soft_then_permanent(client: SchemaRegistryClient) -> None:
    subject = KafkaKit.unique("gone") + "-value"
    schema_id = client.register_schema(subject, _order())
    client.register_schema(subject, _order([{"name": "n", "type": "int", "default": 0}]))
    assert client.delete_version(subject, 2) == 2
    assert _fresh(client).get_versions(subject) == [1]
    with pytest.raises(SchemaRegistryError):
        client.delete_subject(subject, permanent=True)  # not soft-deleted first
    assert client.delete_subject(subject) == [1]
    assert subject not in client.get_subjects()
    assert subject in client.get_subjects(deleted=True)
    assert _fresh(client).get_schema(schema_id).schema_str  # ids stay readable
    assert client.delete_subject(subject, permanent=True) == [1, 2]
    assert subject not in client.get_subjects(deleted=True)


def test_references(client: SchemaRegistryClient) -> None:
    base = KafkaKit.unique("money")
    client.register_schema(
        base,
        Schema(
            json.dumps(
                {
                    "type": "record",
                    "name": "Money",
                    "namespace": "shop",
                    "fields": [{"name": "cents", "type": "long"}],
                }
            ),
            "AVRO",
        ),
    )
    subject = KafkaKit.unique("priced") + "-value"
    priced = Schema(
        json.dumps(
            {
                "type": "record",
                "name": "Priced",
                "namespace": "shop",
                "fields": [{"name": "price", "type": "shop.Money"}],
            }
        ),
        "AVRO",
        [SchemaReference("shop.Money", base, 1)],
    )
    schema_id = client.register_schema(subject, priced)
    got = _fresh(client).get_schema(schema_id)
    assert [(r.name, r.subject, r.version) for r in got.references] == [("shop.Money", base, 1)]
    assert client._rest_client.get(f"subjects/{base}/versions/1/referencedby") == [schema_id]
    # the serializers resolve them through the registry
    ctx = SerializationContext("priced", MessageField.VALUE)
    deserializer = AvroDeserializer(_fresh(client))
    framed = b"\x00" + schema_id.to_bytes(4, "big") + b"\x90\x03"  # price.cents = 200
    assert deserializer(framed, ctx) == {"price": {"cents": 200}}


def test_avro_and_json_schema_serializers_round_trip(client: SchemaRegistryClient) -> None:
    topic = KafkaKit.unique("serde")
    ctx = SerializationContext(topic, MessageField.VALUE)
    avro = AvroSerializer(client, json.dumps(ORDER))
    framed = avro({"id": "o-1", "amount": 12.5}, ctx)
    assert framed is not None and framed[0] == 0
    assert f"{topic}-value" in client.get_subjects()
    assert AvroDeserializer(_fresh(client))(framed, ctx) == {"id": "o-1", "amount": 12.5}

    schema = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "Order",
        "type": "object",
        "properties": {"id": {"type": "string"}},
        "required": ["id"],
    }
    jtopic = KafkaKit.unique("jserde")
    jctx = SerializationContext(jtopic, MessageField.VALUE)
    framed_json = JSONSerializer(json.dumps(schema), client)({"id": "o-2"}, jctx)
    registered = _fresh(client).get_latest_version(f"{jtopic}-value")
    assert registered.schema.schema_type == "JSON"
    assert JSONDeserializer(None, schema_registry_client=_fresh(client))(framed_json, jctx) == {
        "id": "o-2"
    }


def test_protobuf_serializer_round_trip(client: SchemaRegistryClient) -> None:
    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer

    from acklane.integration.schema_samples import Order

    topic = KafkaKit.unique("pserde")
    ctx = SerializationContext(topic, MessageField.VALUE)
    serializer = ProtobufSerializer(Order, client, {"use.deprecated.format": False})
    framed = serializer(Order(id="o-3", amount=4.5), ctx)
    assert _fresh(client).get_latest_version(f"{topic}-value").schema.schema_type == "PROTOBUF"
    got = ProtobufDeserializer(Order, {"use.deprecated.format": False}, _fresh(client))(framed, ctx)
    assert (got.id, got.amount) == ("o-3", 4.5)


def test_basic_authentication() -> None:
    with LocalSchemaRegistry(user=("reg-user", "Reg1stryPass")) as registry:
        good = SchemaRegistryClient(registry.client_conf())
        assert good.get_subjects() == []
        bad = SchemaRegistryClient(
            {"url": registry.endpoint, "basic.auth.user.info": "reg-user:no"}
        )
        with pytest.raises(SchemaRegistryError) as refused:
            bad.get_subjects()
        assert refused.value.http_status_code == 401
        anonymous = SchemaRegistryClient({"url": registry.endpoint})
        with pytest.raises(SchemaRegistryError):
            anonymous.get_subjects()
