"""The Protobuf rules the registry emulator checks (acklane.integration._protobuf_compat)."""

from __future__ import annotations

import base64
from typing import Any

import pytest

descriptor_pb2 = pytest.importorskip("google.protobuf.descriptor_pb2")

from acklane.integration._protobuf_compat import incompatibilities, parse  # noqa: E402

F = descriptor_pb2.FieldDescriptorProto
#: a field's type: a scalar's number, or a type this file defines
Type = int | str


def order_file(**fields: tuple[int, Type]) -> str:
    """A base64 ``FileDescriptorProto`` (as confluent-kafka registers it) of package
    ``compat`` with a message ``Order`` holding ``fields`` (name: (number, type)),
    beside a message ``Money``, a message ``Other``, an enum ``Status`` and, inside
    ``Order``, map entries ``TagsEntry`` (string to int32) and ``NotesEntry`` (string
    to string)."""
    file = descriptor_pb2.FileDescriptorProto(
        name="compat/order.proto", package="compat", syntax="proto3"
    )
    for name in ("Money", "Other"):
        file.message_type.add(name=name).field.add(
            name="cents", number=1, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL
        )
    file.enum_type.add(name="Status").value.add(name="NEW", number=0)
    order = file.message_type.add(name="Order")
    for entry, value in (("TagsEntry", F.TYPE_INT32), ("NotesEntry", F.TYPE_STRING)):
        nested = order.nested_type.add(name=entry)
        nested.options.map_entry = True
        nested.field.add(name="key", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
        nested.field.add(name="value", number=2, type=value, label=F.LABEL_OPTIONAL)
    for name, (number, type_) in fields.items():
        field = order.field.add(name=name, number=number, label=F.LABEL_OPTIONAL)
        if isinstance(type_, int):
            field.type = type_
        elif type_ == "Status":
            field.type, field.type_name = F.TYPE_ENUM, ".compat.Status"
        else:
            field.type, field.type_name = F.TYPE_MESSAGE, f".compat.{type_}"
            if type_.endswith("Entry"):
                field.label, field.type_name = F.LABEL_REPEATED, f".compat.Order.{type_}"
    return base64.b64encode(file.SerializeToString()).decode()


def _found(reader: str, writer: str) -> list[tuple[str, str]]:
    r, w = parse(reader), parse(writer)
    assert r is not None and w is not None
    return [(i.kind, i.path) for i in incompatibilities(r, w)]


AMOUNT = "#/Order/2"
CASES: list[tuple[str, Type, Type, list[tuple[str, str]]]] = [
    ("the same", F.TYPE_INT32, F.TYPE_INT32, []),
    ("int32 to int64", F.TYPE_INT64, F.TYPE_INT32, []),
    ("uint64 to bool", F.TYPE_BOOL, F.TYPE_UINT64, []),
    ("int32 to an enum", "Status", F.TYPE_INT32, []),
    ("string to bytes", F.TYPE_BYTES, F.TYPE_STRING, []),
    ("fixed32 to sfixed32", F.TYPE_SFIXED32, F.TYPE_FIXED32, []),
    ("int32 to string", F.TYPE_STRING, F.TYPE_INT32, [("FIELD_SCALAR_KIND_CHANGED", AMOUNT)]),
    ("int32 to sint32", F.TYPE_SINT32, F.TYPE_INT32, [("FIELD_SCALAR_KIND_CHANGED", AMOUNT)]),
    ("float to double", F.TYPE_DOUBLE, F.TYPE_FLOAT, [("FIELD_SCALAR_KIND_CHANGED", AMOUNT)]),
    ("fixed32 to fixed64", F.TYPE_FIXED64, F.TYPE_FIXED32, [("FIELD_SCALAR_KIND_CHANGED", AMOUNT)]),
    ("a scalar to a message", "Money", F.TYPE_INT64, [("FIELD_KIND_CHANGED", AMOUNT)]),
    ("a message to a scalar", F.TYPE_INT64, "Money", [("FIELD_KIND_CHANGED", AMOUNT)]),
    ("a message to another", "Other", "Money", [("FIELD_NAMED_TYPE_CHANGED", AMOUNT)]),
    ("a map to a scalar", F.TYPE_INT32, "TagsEntry", [("FIELD_KIND_CHANGED", AMOUNT)]),
    ("a map's values", "NotesEntry", "TagsEntry", [("FIELD_SCALAR_KIND_CHANGED", AMOUNT)]),
]


@pytest.mark.parametrize(
    ("reader", "writer", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_a_field_of_the_same_number(reader: Type, writer: Type, expected: Any) -> None:
    new = order_file(id=(1, F.TYPE_STRING), amount=(2, reader))
    old = order_file(id=(1, F.TYPE_STRING), amount=(2, writer))
    assert _found(new, old) == expected


def test_fields_added_removed_or_renamed_are_not_compared() -> None:
    old = order_file(id=(1, F.TYPE_STRING), amount=(2, F.TYPE_INT32))
    assert _found(order_file(id=(1, F.TYPE_STRING)), old) == []
    assert _found(order_file(key=(1, F.TYPE_STRING), total=(2, F.TYPE_INT64)), old) == []
    assert _found(order_file(id=(1, F.TYPE_STRING), note=(3, F.TYPE_DOUBLE)), old) == []


def test_only_serialized_descriptors_are_read() -> None:
    assert parse('syntax = "proto3"; message Order { int32 id = 1; }') is None
    assert parse(order_file(id=(1, F.TYPE_STRING))) is not None


def test_the_message_says_where() -> None:
    r = parse(order_file(amount=(2, F.TYPE_STRING)))
    w = parse(order_file(amount=(2, F.TYPE_INT32)))
    (found,) = incompatibilities(r, w)
    assert found.message("new", "old") == (
        "{errorType:'FIELD_SCALAR_KIND_CHANGED', description:'The kind of a SCALAR field at "
        "path '#/Order/2' in the new schema does not match its kind in the old schema'}"
    )
