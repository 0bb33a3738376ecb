"""Sample schemas for tests, benchmarks and the docs: one order, in each registry format.

``ORDER_AVRO`` (an Avro record), ``ORDER_JSON_SCHEMA`` (a JSON Schema) and ``Order``,
a generated Protobuf message class (``acklane.integration.schema_samples:Order``, the
``message_class`` a stream's Protobuf format names). ``Order`` is built from its
descriptor at import, so no ``protoc`` is needed; its ``.proto`` would read::

    syntax = "proto3";
    package acklane.samples;
    message Order { string id = 1; double amount = 2; string customer = 3; }
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["ORDER_AVRO", "ORDER_JSON_SCHEMA", "Order", "order_avro_text"]

ORDER_AVRO: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "namespace": "acklane.samples",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "customer", "type": "string", "default": ""},
    ],
}

ORDER_JSON_SCHEMA: dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "Order",
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "amount": {"type": "number"},
        "customer": {"type": "string"},
    },
    "required": ["id", "amount"],
}


def order_avro_text() -> str:
    """``ORDER_AVRO`` as the schema text a registry stores."""
    return json.dumps(ORDER_AVRO)


def _order_class() -> Any:
    from google.protobuf import descriptor_pb2, descriptor_pool
    from google.protobuf.message_factory import GetMessageClass

    name = "acklane/samples/order.proto"
    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName(name)
    except KeyError:
        proto = descriptor_pb2.FileDescriptorProto(
            name=name, package="acklane.samples", syntax="proto3"
        )
        message = proto.message_type.add(name="Order")
        field = descriptor_pb2.FieldDescriptorProto
        for number, (field_name, kind) in enumerate(
            [
                ("id", field.TYPE_STRING),
                ("amount", field.TYPE_DOUBLE),
                ("customer", field.TYPE_STRING),
            ],
            start=1,
        ):
            message.field.add(name=field_name, number=number, type=kind, label=field.LABEL_OPTIONAL)
        pool.AddSerializedFile(proto.SerializeToString())
    return GetMessageClass(pool.FindMessageTypeByName("acklane.samples.Order"))


#: The generated Protobuf class of an order (needs ``protobuf``).
Order: Any = _order_class()
