"""A field whose number now means another kind of value: three of Confluent's Protobuf rules.

Confluent's registry compares two Protobuf schemas message by message and field by
field number. This module applies the rules of that comparison that refuse a change
in every version of it (the verdict on a removed message, for one, changed between
versions, so it is not checked), for messages of the same full name and fields of
the same number in both schemas:

- ``FIELD_KIND_CHANGED``: the field was a scalar (an enum counts as one) and is a
  message or a map now, or the other way round;
- ``FIELD_SCALAR_KIND_CHANGED``: both scalars, but not of one of the groups whose
  encodings read each other (``int32``, ``int64``, ``uint32``, ``uint64``, ``bool``
  and enums; ``sint32``, ``sint64``; ``string``, ``bytes``; ``fixed32``,
  ``sfixed32``; ``fixed64``, ``sfixed64``; ``float``; ``double``); a map's key and
  value types are compared the same way;
- ``FIELD_NAMED_TYPE_CHANGED``: both messages, of two types the schemas define
  themselves, with another name (without the package).

Only schemas given as a serialized ``FileDescriptorProto`` in base64 (what
confluent-kafka's serializer registers) are read, with the ``protobuf`` package;
``.proto`` text, or no ``protobuf`` installed, is not checked. Fields added or
removed, names, labels, ``oneof``\\s, proto2 ``required`` fields, enums' values and
imported types are not compared either. The wording of the findings is acklane's.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["ProtobufIncompatibility", "incompatibilities", "parse"]

# FieldDescriptorProto.Type numbers (descriptor.proto)
_MESSAGE, _GROUP, _ENUM = 11, 10, 14
_SCALAR_GROUPS = {
    5: "GENERAL_NUMBER",  # int32
    3: "GENERAL_NUMBER",  # int64
    13: "GENERAL_NUMBER",  # uint32
    4: "GENERAL_NUMBER",  # uint64
    8: "GENERAL_NUMBER",  # bool
    _ENUM: "GENERAL_NUMBER",
    17: "SIGNED_NUMBER",  # sint32
    18: "SIGNED_NUMBER",  # sint64
    9: "STRING_OR_BYTES",  # string
    12: "STRING_OR_BYTES",  # bytes
    7: "FIXED32",  # fixed32
    15: "FIXED32",  # sfixed32
    6: "FIXED64",  # fixed64
    16: "FIXED64",  # sfixed64
    2: "FLOAT",
    1: "DOUBLE",
}
_DESCRIPTIONS = {
    "FIELD_KIND_CHANGED": "The kind of the field at path '{path}' in the {reader} schema "
    "does not match its kind in the {writer} schema",
    "FIELD_SCALAR_KIND_CHANGED": "The kind of a SCALAR field at path '{path}' in the {reader} "
    "schema does not match its kind in the {writer} schema",
    "FIELD_NAMED_TYPE_CHANGED": "The type of a MESSAGE field at path '{path}' in the {reader} "
    "schema does not match its type in the {writer} schema",
}


@dataclass(frozen=True)
class ProtobufIncompatibility:
    kind: str  # one of _DESCRIPTIONS' keys
    path: str  # "#/Order/3": the message (without the package) and the field's number

    def message(self, reader: str = "reader", writer: str = "writer") -> str:
        text = _DESCRIPTIONS[self.kind].format(path=self.path, reader=reader, writer=writer)
        return f"{{errorType:'{self.kind}', description:'{text}'}}"


def parse(text: str) -> Any | None:
    """The ``FileDescriptorProto`` a base64 schema holds; None when it is not one (a
    ``.proto`` text) or the ``protobuf`` package is not installed."""
    try:
        from google.protobuf import descriptor_pb2
        from google.protobuf.message import DecodeError
    except ImportError:
        return None
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    try:
        return descriptor_pb2.FileDescriptorProto.FromString(raw)
    except DecodeError:
        return None


def _messages(prefix: str, messages: Any) -> Iterator[tuple[str, Any]]:
    for message in messages:
        name = f"{prefix}.{message.name}" if prefix else str(message.name)
        yield name, message
        yield from _messages(name, message.nested_type)


class _File:
    def __init__(self, descriptor: Any) -> None:
        self.package = str(descriptor.package)
        # local name (without the package) -> DescriptorProto
        self.messages = dict(_messages("", descriptor.message_type))

    def local(self, type_name: str) -> str:
        name = type_name.lstrip(".")
        if self.package and name.startswith(self.package + "."):
            return name[len(self.package) + 1 :]
        return name

    def entry(self, field: Any) -> Any | None:
        """The map entry message a field is, if it is a map."""
        if field.type != _MESSAGE:
            return None
        found = self.messages.get(self.local(field.type_name))
        return found if found is not None and found.options.map_entry else None

    def kind(self, field: Any) -> str:
        if self.entry(field) is not None:
            return "MAP"
        return "MESSAGE" if field.type in (_MESSAGE, _GROUP) else "SCALAR"


def incompatibilities(reader: Any, writer: Any) -> list[ProtobufIncompatibility]:
    """What of the three rules the ``reader`` descriptor breaks against the ``writer``'s."""
    r, w = _File(reader), _File(writer)
    found: list[ProtobufIncompatibility] = []
    for name, r_message in r.messages.items():
        w_message = w.messages.get(name)
        if w_message is None or r_message.options.map_entry:
            continue
        w_fields = {f.number: f for f in w_message.field}
        for r_field in r_message.field:
            w_field = w_fields.get(r_field.number)
            if w_field is not None:
                found += _fields(r, w, r_field, w_field, f"#/{name}/{r_field.number}")
    return found


def _fields(r: _File, w: _File, rf: Any, wf: Any, path: str) -> list[ProtobufIncompatibility]:
    r_kind, w_kind = r.kind(rf), w.kind(wf)
    if r_kind != w_kind:
        return [ProtobufIncompatibility("FIELD_KIND_CHANGED", path)]
    if r_kind == "SCALAR":
        if _SCALAR_GROUPS.get(rf.type) != _SCALAR_GROUPS.get(wf.type):
            return [ProtobufIncompatibility("FIELD_SCALAR_KIND_CHANGED", path)]
        return []
    if r_kind == "MAP":
        r_entry, w_entry = r.entry(rf), w.entry(wf)  # both maps: both entries are there
        assert r_entry is not None and w_entry is not None
        found: list[ProtobufIncompatibility] = []
        r_parts = {f.number: f for f in r_entry.field}
        for w_part in w_entry.field:
            r_part = r_parts.get(w_part.number)
            if r_part is not None:
                found += _fields(r, w, r_part, w_part, path)
        return found
    r_type, w_type = r.local(rf.type_name), w.local(wf.type_name)
    if r_type in r.messages and w_type in w.messages and r_type != w_type:
        return [ProtobufIncompatibility("FIELD_NAMED_TYPE_CHANGED", path)]
    return []  # the same type, compared as a message of its own; or one imported
