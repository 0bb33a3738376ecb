"""The registry's compatibility levels, through confluent-kafka's SchemaRegistryClient only:
what it refuses here, Confluent's registry refuses (HTTP 409, error code 409)."""

from __future__ import annotations

import base64
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

from acklane.integration.emulator import Emulator
from acklane.integration.kafka import KafkaKit

INCOMPATIBLE = "Schema being registered is incompatible with an earlier schema for subject"


def _order(*extra: dict[str, Any], drop: str = "") -> Schema:
    fields = [{"name": "id", "type": "string"}, {"name": "amount", "type": "double"}]
    fields = [f for f in fields if f["name"] != drop] + list(extra)
    record = {"type": "record", "name": "Order", "namespace": "shop.compat", "fields": fields}
    return Schema(json.dumps(record), "AVRO")


NOTE = {"name": "note", "type": "string", "default": ""}  # a field with a default
NOTE_REQUIRED = {"name": "note", "type": "string"}  # the same, without one


@pytest.fixture
def client(schema_registry_emulator: Emulator) -> Iterator[SchemaRegistryClient]:
    c = SchemaRegistryClient(schema_registry_emulator.client_conf())  # type: ignore[attr-defined]
    yield c
    c.close()


def _subject(client: SchemaRegistryClient, level: str | None = None) -> str:
    subject = KafkaKit.unique("compat") + "-value"
    if level is not None:
        client.set_compatibility(subject, level)
    return subject


def _refused(client: SchemaRegistryClient, subject: str, schema: Schema) -> str:
    """Registering ``schema`` is refused as incompatible; the registry's message."""
    with pytest.raises(SchemaRegistryError) as refused:
        client.register_schema(subject, schema)
    assert (refused.value.http_status_code, refused.value.error_code) == (409, 409)
    assert refused.value.error_message.startswith(f'{INCOMPATIBLE} "{subject}"')
    return str(refused.value.error_message)


def _messages(client: SchemaRegistryClient, path: str, schema: Schema) -> dict[str, Any]:
    """A verbose compatibility test (the client's own request, with ?verbose=true)."""
    answer: dict[str, Any] = client._rest_client.post(
        f"compatibility/subjects/{path}?verbose=true", body=schema.to_dict()
    )
    return answer


def test_backward_by_default(client: SchemaRegistryClient) -> None:
    subject = _subject(client)
    assert client.get_compatibility() == "BACKWARD"
    first = client.register_schema(subject, _order())
    # the new schema reads the old one's records: a field with a default may come
    second = client.register_schema(subject, _order(NOTE))
    assert second != first
    assert client.get_versions(subject) == [1, 2]
    # a field the old records lack, with no default to fill it: refused, nothing registered
    message = _refused(client, subject, _order({"name": "currency", "type": "string"}))
    assert "READER_FIELD_MISSING_DEFAULT_VALUE" in message and "'currency'" in message
    # a field's type changed: refused too
    message = _refused(client, subject, _order(dict(NOTE, type="int", default=0)))
    assert "TYPE_MISMATCH" in message
    assert client.get_versions(subject) == [1, 2]
    # dropping a field the new schema no longer reads is backward compatible
    client.register_schema(subject, _order(NOTE, drop="amount"))
    assert client.get_versions(subject) == [1, 2, 3]


def test_none_lets_anything_through(client: SchemaRegistryClient) -> None:
    subject = _subject(client, "NONE")
    client.register_schema(subject, _order())
    client.register_schema(subject, _order(NOTE_REQUIRED))
    client.register_schema(subject, Schema('{"type": "string"}', "AVRO"))
    assert client.get_versions(subject) == [1, 2, 3]


def test_forward(client: SchemaRegistryClient) -> None:
    subject = _subject(client, "FORWARD")
    client.register_schema(subject, _order())
    # old readers skip a field they do not know: forward compatible even without a default
    client.register_schema(subject, _order(NOTE_REQUIRED))
    # but an old reader needs 'amount', which it has no default for
    message = _refused(client, subject, _order(NOTE_REQUIRED, drop="amount"))
    assert "READER_FIELD_MISSING_DEFAULT_VALUE" in message and "'amount'" in message
    # and it cannot read a double where it expects a string
    _refused(client, subject, _order(dict(NOTE_REQUIRED, type="double")))


def test_full(client: SchemaRegistryClient) -> None:
    subject = _subject(client, "FULL")
    client.register_schema(subject, _order())
    _refused(client, subject, _order(NOTE_REQUIRED))  # new readers lack a default
    _refused(client, subject, _order(drop="amount"))  # old readers lack a default
    client.register_schema(subject, _order(NOTE))  # with a default: both ways
    client.register_schema(subject, _order())  # removed again: version 1's, no new version
    # a promotion reads one way only: int -> long is backward, not forward
    count = {"name": "count", "type": "int", "default": 0}
    client.register_schema(subject, _order(count))
    _refused(client, subject, _order(dict(count, type="long")))
    assert client.get_versions(subject) == [1, 2, 3]


def test_transitive_compares_with_every_version(client: SchemaRegistryClient) -> None:
    # v1 has no note, v2 has one with a default, v3 requires it: v3 reads v2's records,
    # not v1's, so only the transitive level refuses it
    v3 = _order(NOTE_REQUIRED)
    plain, transitive = _subject(client, "BACKWARD"), _subject(client, "BACKWARD_TRANSITIVE")
    for subject in (plain, transitive):
        client.register_schema(subject, _order())
        client.register_schema(subject, _order(NOTE))
    message = _refused(client, transitive, v3)
    assert "{oldSchemaVersion: 1}" in message
    assert client.test_compatibility(transitive, v3) is True  # against the latest only
    assert client.test_compatibility(transitive, v3, version=1) is False
    assert client.test_compatibility_all_versions(transitive, v3) is False
    assert client.test_compatibility_all_versions(plain, v3) is True
    client.register_schema(plain, v3)
    assert client.get_versions(plain) == [1, 2, 3]
    client.set_compatibility(transitive, "BACKWARD")  # the subject's level, not kept forever
    client.register_schema(transitive, v3)
    assert client.get_versions(transitive) == [1, 2, 3]


def test_forward_and_full_transitive(client: SchemaRegistryClient) -> None:
    # v1 needs amount; v2 gives it a default; v3 drops it: v2 reads v3, v1 does not
    amount_default = {"name": "amount", "type": "double", "default": 0.0}
    for level in ("FORWARD_TRANSITIVE", "FULL_TRANSITIVE"):
        subject = _subject(client, level)
        client.register_schema(subject, _order())
        client.register_schema(subject, _order(amount_default, drop="amount"))
        message = _refused(client, subject, _order(drop="amount"))
        assert "{oldSchemaVersion: 1}" in message and f"compatibility: '{level}'" in message
        client.set_compatibility(subject, level.removesuffix("_TRANSITIVE"))
        client.register_schema(subject, _order(drop="amount"))
        assert client.get_versions(subject) == [1, 2, 3]


def test_the_subjects_level_overrides_the_global_one(client: SchemaRegistryClient) -> None:
    before = client.get_compatibility()
    loose, strict = _subject(client, "NONE"), _subject(client, "BACKWARD")
    inheriting = _subject(client)
    client.set_compatibility(level="FORWARD")
    try:
        for subject in (loose, strict, inheriting):
            client.register_schema(subject, _order())
        client.register_schema(loose, _order(NOTE_REQUIRED))  # NONE: anything
        _refused(client, strict, _order(NOTE_REQUIRED))  # BACKWARD, whatever the global
        client.register_schema(inheriting, _order(NOTE_REQUIRED))  # FORWARD, the global
        _refused(client, inheriting, _order(NOTE_REQUIRED, drop="amount"))
        client.delete_config(strict)  # back to the global level, FORWARD
        client.register_schema(strict, _order(NOTE_REQUIRED))
    finally:
        client.set_compatibility(level=before)


def test_test_compatibility(client: SchemaRegistryClient) -> None:
    subject = _subject(client)
    # no version yet: anything is compatible with nothing
    assert client.test_compatibility(subject, _order()) is True
    assert client.test_compatibility_all_versions(subject, _order()) is True
    client.register_schema(subject, _order())
    assert client.test_compatibility(subject, _order(NOTE)) is True
    assert client.test_compatibility(subject, _order(NOTE), version=1) is True
    assert client.test_compatibility(subject, _order(NOTE_REQUIRED)) is False
    assert client.test_compatibility_all_versions(subject, _order(NOTE_REQUIRED)) is False
    assert client.get_versions(subject) == [1]  # a test registers nothing

    refused = _messages(client, f"{subject}/versions/latest", _order(NOTE_REQUIRED))
    assert refused["is_compatible"] is False
    assert any("READER_FIELD_MISSING_DEFAULT_VALUE" in m for m in refused["messages"])
    assert "{oldSchemaVersion: 1}" in refused["messages"]
    passed = _messages(client, f"{subject}/versions", _order(NOTE))
    assert passed == {"is_compatible": True, "messages": []}

    with pytest.raises(SchemaRegistryError) as missing:
        client.test_compatibility(subject, _order(), version=7)
    assert (missing.value.http_status_code, missing.value.error_code) == (404, 40402)


def test_another_schema_type_is_incompatible(client: SchemaRegistryClient) -> None:
    subject = _subject(client)
    client.register_schema(subject, _order())
    _refused(client, subject, Schema('{"type": "object"}', "JSON"))
    client.set_compatibility(subject, "NONE")
    client.register_schema(subject, Schema('{"type": "object"}', "JSON"))


def test_deleted_versions_are_not_compared(client: SchemaRegistryClient) -> None:
    subject = _subject(client, "BACKWARD_TRANSITIVE")
    client.register_schema(subject, _order())
    client.register_schema(subject, _order(NOTE))
    client.delete_version(subject, 1)
    client.register_schema(subject, _order(NOTE_REQUIRED))  # v1, which lacked it, is gone
    assert client.get_versions(subject) == [2, 3]


def test_references_are_resolved_for_the_check(client: SchemaRegistryClient) -> None:
    money = KafkaKit.unique("money")
    client.register_schema(
        money,
        Schema(
            json.dumps(
                {
                    "type": "record",
                    "name": "Money",
                    "namespace": "compat",
                    "fields": [{"name": "cents", "type": "long"}],
                }
            ),
            "AVRO",
        ),
    )

    def priced(*extra: dict[str, Any]) -> Schema:
        record = {
            "type": "record",
            "name": "Priced",
            "namespace": "compat",
            "fields": [{"name": "price", "type": "compat.Money"}, *extra],
        }
        return Schema(json.dumps(record), "AVRO", [SchemaReference("compat.Money", money, 1)])

    subject = _subject(client)
    client.register_schema(subject, priced())
    client.register_schema(
        subject, priced({"name": "was", "type": ["null", "compat.Money"], "default": None})
    )
    message = _refused(client, subject, priced({"name": "tax", "type": "compat.Money"}))
    assert "'tax'" in message


def _json(required: list[str], **properties: Any) -> Schema:
    schema = {"type": "object", "properties": properties, "required": required}
    return Schema(json.dumps(schema), "JSON")


def test_json_schema_required_and_types(client: SchemaRegistryClient) -> None:
    subject = _subject(client)
    integer, number, text = {"type": "integer"}, {"type": "number"}, {"type": "string"}
    client.register_schema(subject, _json(["id"], id=text, amount=integer))
    # widened: every old document is still valid
    client.register_schema(subject, _json(["id"], id=text, amount=number))
    # a property newly required: old documents may lack it
    message = _refused(client, subject, _json(["id", "amount"], id=text, amount=number))
    assert "REQUIRED_ATTRIBUTE_ADDED" in message
    # a type narrowed back (not version 1's schema: that one would get its id back): old
    # documents may hold 2.5
    whole = dict(integer, description="whole units")
    assert "TYPE_NARROWED" in _refused(client, subject, _json(["id"], id=text, amount=whole))
    # no longer required: fine
    client.register_schema(subject, _json([], id=text, amount=number))
    assert client.get_versions(subject) == [1, 2, 3]

    forward = _subject(client, "FORWARD")
    client.register_schema(forward, _json(["id"], id=text))
    # old readers require id
    assert "REQUIRED_ATTRIBUTE_ADDED" in _refused(client, forward, _json([], id=text))


def _proto(**fields: int | str) -> Schema:
    """A Protobuf schema as confluent-kafka's serializer registers it (a base64
    FileDescriptorProto): package ``compat``, a message ``Money`` and a message
    ``Order`` with ``id`` (1, a string) and ``fields`` (name: a scalar type's number or
    ``"Money"``), numbered from 2 in order."""
    from google.protobuf import descriptor_pb2

    f = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(name="compat.proto", package="compat")
    file.syntax = "proto3"
    file.message_type.add(name="Money").field.add(
        name="cents", number=1, type=f.TYPE_INT64, label=f.LABEL_OPTIONAL
    )
    order = file.message_type.add(name="Order")
    order.field.add(name="id", number=1, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    for number, (name, type_) in enumerate(fields.items(), start=2):
        field = order.field.add(name=name, number=number, label=f.LABEL_OPTIONAL)
        if isinstance(type_, int):
            field.type = type_
        else:
            field.type, field.type_name = f.TYPE_MESSAGE, f".compat.{type_}"
    return Schema(base64.b64encode(file.SerializeToString()).decode(), "PROTOBUF")


def test_protobuf_field_kinds(client: SchemaRegistryClient) -> None:
    pytest.importorskip("google.protobuf")
    from google.protobuf.descriptor_pb2 import FieldDescriptorProto as F

    subject = _subject(client)
    client.register_schema(subject, _proto(amount=F.TYPE_INT32))
    client.register_schema(subject, _proto(amount=F.TYPE_INT64))  # the same encoding
    client.register_schema(subject, _proto(amount=F.TYPE_INT64, note=F.TYPE_STRING))
    message = _refused(client, subject, _proto(amount=F.TYPE_STRING))
    assert "FIELD_SCALAR_KIND_CHANGED" in message
    assert "FIELD_KIND_CHANGED" in _refused(client, subject, _proto(amount="Money"))
    assert client.get_versions(subject) == [1, 2, 3]
    client.set_compatibility(subject, "NONE")
    client.register_schema(subject, _proto(amount=F.TYPE_STRING))
