"""Schema Registry bodies on Kafka: what decoding costs per message, against JSON.

The same order (``id``, ``amount``, ``customer``, plus ``--pad`` characters of a
``note`` text field in every format) is framed five ways and decoded the way a Kafka
stream's records are (``KafkaMessage`` for JSON, the per-stream record class of
``value_format`` for the others) from confluent-kafka ``Message`` objects, with the
registry emulator holding the schemas (fetched once; every decode after the first is
the client's cache):

- ``json``: ``value_format: json`` (the default): ``json.loads`` of the body;
- ``avro``, ``protobuf``, ``json_schema``: confluent-kafka's deserializers through its
  ``SchemaRegistryClient``, then acklane's JSON-friendly copy (Avro) or the proto3 JSON
  mapping (Protobuf);
- ``avro (deserializer alone)``: confluent-kafka's ``AvroDeserializer`` called on the
  framed bytes, nothing else (no record, no filter);
- ``avro (fastavro alone)``: ``fastavro.schemaless_reader`` on the same bytes, the
  floor of any Avro decoder in Python (no registry, no framing, no rules).

Each row is one record made from a client ``Message``, its ``json()`` and a declarative
filter on it (``match amount
> 100``, ``emit`` three fields), in one thread, no broker: the cost a watcher's
first look at a body adds to the engine's per-message work (``bench/kafka.py``
measures that work). Best of ``--repeat`` runs; µs/message and the ratio to JSON in
the same run.

    uv run python bench/avro.py
    uv run python bench/avro.py --messages 50000 --pad 1000
"""

from __future__ import annotations

import argparse
import io
import json
import time
from collections.abc import Callable
from typing import Any

import fastavro
from confluent_kafka import Message
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from acklane.connectors.kafka import KafkaConfig, KafkaMessage
from acklane.connectors.kafka._formats import record_type
from acklane.core.pipeline.filters import compile_filter
from acklane.integration.schema_registry import LocalSchemaRegistry
from acklane.integration.schema_samples import ORDER_AVRO, ORDER_JSON_SCHEMA, Order

FILTER = {
    "match": {"body.amount": {"gt": 100}},
    "emit": {"id": "body.id", "amount": "body.amount", "customer": "body.customer"},
}
TOPIC = "bench-orders"


def _schemas() -> tuple[dict[str, Any], dict[str, Any]]:
    """The sample schemas with a ``note`` string field (the padding)."""
    avro = dict(ORDER_AVRO, fields=[*ORDER_AVRO["fields"], {"name": "note", "type": "string"}])
    jsonschema = json.loads(json.dumps(ORDER_JSON_SCHEMA))
    jsonschema["properties"]["note"] = {"type": "string"}
    return avro, jsonschema


def _frames(registry: LocalSchemaRegistry, pad: int) -> dict[str, tuple[bytes, dict[str, Any]]]:
    """format -> (the framed value, the stream fields that decode it)."""

    client = SchemaRegistryClient(registry.client_conf())
    avro, jsonschema = _schemas()
    order = {"id": "o-1", "amount": 250.0, "customer": "c-1", "note": "x" * pad}
    out: dict[str, tuple[bytes, dict[str, Any]]] = {"json": (json.dumps(order).encode(), {})}
    ctx = SerializationContext(TOPIC, MessageField.VALUE)
    out["avro"] = (
        AvroSerializer(client, json.dumps(avro))(order, ctx) or b"",
        {"value_format": "avro"},
    )
    js_ctx = SerializationContext(TOPIC + "-js", MessageField.VALUE)
    out["json_schema"] = (
        JSONSerializer(json.dumps(jsonschema), client)(order, js_ctx) or b"",
        {"value_format": "json_schema"},
    )
    # Protobuf's sample Order has no note: the padding goes into customer
    pb_ctx = SerializationContext(TOPIC + "-pb", MessageField.VALUE)
    padded = Order(id="o-1", amount=250.0, customer="c-1" + "x" * pad)
    out["protobuf"] = (
        ProtobufSerializer(Order, client, {"use.deprecated.format": False})(padded, pb_ctx) or b"",
        {
            "value_format": "protobuf",
            "value_message_class": "acklane.integration.schema_samples:Order",
        },
    )
    return out


def _per_message(make: Callable[[int], Any], decode: Callable[[Any], Any], n: int) -> float:
    """µs per ``decode(make(i))``: each record made, decoded and dropped in turn (as the
    engine drops a record once it is advanced), so no row keeps thousands alive."""
    start = time.perf_counter()
    for i in range(n):
        decode(make(i))
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--pad", type=int, default=100, help="characters of padding")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    flt = compile_filter(FILTER, label="bench")
    with LocalSchemaRegistry() as registry:
        frames = _frames(registry, args.pad)
        avro_schema = fastavro.parse_schema(_schemas()[0])
        payload = frames["avro"][0][5:]  # past the magic byte and the schema id

        def read_avro(data: io.BytesIO) -> Any:
            return fastavro.schemaless_reader(data, avro_schema, None)

        deserializer = AvroDeserializer(SchemaRegistryClient(registry.client_conf()))
        framed = frames["avro"][0]
        context = SerializationContext(TOPIC, MessageField.VALUE)

        rows: dict[str, list[float]] = {}
        for _ in range(args.repeat):
            for fmt, (value, fields) in frames.items():
                config = KafkaConfig(
                    bootstrap_servers="127.0.0.1:9",
                    topics=[TOPIC],
                    group_id="g",
                    schema_registry={"url": registry.endpoint} if fields else None,
                    **fields,
                )
                cls = record_type(config)
                topic = TOPIC if fmt != "json_schema" else TOPIC + "-js"
                topic = topic if fmt != "protobuf" else TOPIC + "-pb"

                def make(
                    i: int, cls: type[KafkaMessage] = cls, value: bytes = value, topic: str = topic
                ) -> Any:
                    m = Message(topic=topic, partition=0, offset=i, value=value)
                    return cls(m, 1, (topic, 0), i, f"kafka:c/{topic}/0/")

                make(0).json()  # the schema fetched and cached, the deserializer warmed
                rows.setdefault(fmt, []).append(_per_message(make, flt.evaluate, args.messages))
            rows.setdefault("avro (deserializer alone)", []).append(
                _per_message(lambda _i: framed, lambda b: deserializer(b, context), args.messages)
            )
            rows.setdefault("avro (fastavro alone)", []).append(
                _per_message(lambda _i: io.BytesIO(payload), read_avro, args.messages)
            )
    base = min(rows["json"])
    print(f"{args.messages} messages, --pad {args.pad}, best of {args.repeat}")
    print(f"{'format':<24} {'us/message':>10} {'x json':>8} {'bytes':>6}")
    for fmt, times in rows.items():
        best = min(times)
        size = len(frames[fmt][0]) if fmt in frames else len(frames["avro"][0])
        print(f"{fmt:<24} {best:>10.2f} {best / base:>8.1f} {size:>6}")


if __name__ == "__main__":
    main()
