"""Kafka values and keys framed for a Confluent Schema Registry, decoded for filters.

A stream with ``value_format: avro | protobuf | json_schema`` (or such a
``key_format``) hands its watchers records whose ``json()``, the body that filters'
paths read, is the decoded record, made by confluent-kafka's own deserializers
through its ``SchemaRegistryClient`` (schemas cached by the client, per schema id).
Nothing here runs for a stream without them: its records stay
:class:`~acklane.connectors.kafka.KafkaMessage` and cost what they did.

A value that cannot be decoded (no Confluent framing, a schema id the registry does
not know, bytes that do not match the schema) raises
:class:`~acklane.core.message.BodyDecodeError` with the reason, which a filter turns
into a rejection: the record is dead-lettered with its original bytes. A registry
that does not answer (connection refused, a 5xx) is not the record's fault: it raises
:class:`SchemaRegistryUnavailable`, a failed attempt that the engine retries (and
counts toward ``max_attempts``).

The decoded record is made JSON-friendly where the format's own types are not:
Avro ``bytes`` become base64 text, decimals text, dates and times ISO 8601 text, UUIDs
text; Protobuf messages become their proto3 JSON mapping (field names as in the
``.proto``, fields at their default value included, 64-bit integers as text).
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import decimal
import json
import uuid
from collections.abc import Callable
from typing import Any, ClassVar

from acklane.core.errors import AcklaneError, ConnectorError
from acklane.core.message import BodyDecodeError
from acklane.core.redact import redact_url

from ._config import REGISTRY_FORMATS, KafkaConfig, SchemaRegistrySettings
from ._message import _UNSET, KafkaMessage

__all__ = [
    "Formats",
    "RegistryMessage",
    "SchemaRegistryUnavailable",
    "load_message_class",
    "prefetcher",
    "record_type",
    "registry_client",
]

#: What each format's deserializer needs, and the extra that brings it.
_EXTRAS = {"avro": "avro", "protobuf": "protobuf", "json_schema": "json-schema"}
_LABEL = {"avro": "Avro", "protobuf": "Protobuf", "json_schema": "JSON Schema"}


class SchemaRegistryUnavailable(ConnectorError, RuntimeError):
    """The Schema Registry did not answer; the record is retried, not rejected."""


def _missing(fmt: str, exc: ImportError) -> AcklaneError:
    extra = _EXTRAS[fmt]
    return AcklaneError(
        f"value/key format {fmt} needs {exc.name or 'a module'}, not installed: "
        f'pip install "acklane-kafka[{extra}]" (with acklane: "acklane[kafka-{extra}]")'
    )


def registry_client(settings: SchemaRegistrySettings) -> Any:
    """confluent-kafka's ``SchemaRegistryClient`` on ``settings``."""
    try:
        from confluent_kafka.schema_registry import SchemaRegistryClient
    except ImportError as exc:
        raise _missing("avro", exc) from None
    return SchemaRegistryClient(settings.client_conf())


def load_message_class(spec: str) -> Any:
    """The class ``module:Class`` names (``Class`` may be dotted: ``Outer.Inner``)."""
    from acklane.core.config import import_user_module

    module_name, _, attribute = spec.partition(":")
    try:
        found: Any = import_user_module(module_name)
    except ImportError as exc:
        raise AcklaneError(f"message class {spec}: cannot import {module_name}: {exc}") from exc
    for part in attribute.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise AcklaneError(f"message class {spec}: {module_name} has no {attribute}") from None
    if not hasattr(found, "DESCRIPTOR"):
        raise AcklaneError(f"message class {spec} is not a generated Protobuf message class")
    return found


# -- JSON-friendly values ----------------------------------------------------------------

_NATIVE = frozenset({str, int, float, bool, type(None)})


def _plain(value: Any) -> Any:
    """``value`` with what JSON cannot hold turned into text (the same object if none)."""
    kind = type(value)
    if kind in _NATIVE:
        return value
    if kind is dict:
        for item in value.values():
            if type(item) not in _NATIVE:
                return {k: _plain(v) for k, v in value.items()}
        return value
    if kind is list:
        return [_plain(v) for v in value]
    if kind is tuple and len(value) == 2 and type(value[0]) is str:
        return _plain(value[1])  # a union branch with its record name
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal | uuid.UUID):
        return str(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return str(value)


# -- one side (value or key) of a stream's records ---------------------------------------


class _Side:
    """How one side of the records is decoded: its deserializer and what to make of it.

    ``seen`` holds the frames (magic byte and schema id) decoded once already: their
    schema is in the client's cache, so decoding another of them makes no request.
    """

    __slots__ = ("deserialize", "field", "fmt", "plain", "seen")

    def __init__(self, fmt: str, field: Any, client: Any, message_class: str | None) -> None:
        self.fmt = fmt
        self.field = field
        self.seen: set[bytes] = set()
        self.deserialize: Callable[[bytes, Any], Any]
        self.plain: Callable[[Any], Any]
        try:
            if fmt == "avro":
                from confluent_kafka.schema_registry.avro import AvroDeserializer

                self.deserialize = AvroDeserializer(client)
                self.plain = _plain
            elif fmt == "protobuf":
                from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
                from google.protobuf.json_format import MessageToDict

                assert message_class is not None  # the config requires it
                cls = load_message_class(message_class)
                self.deserialize = ProtobufDeserializer(
                    cls, {"use.deprecated.format": False}, schema_registry_client=client
                )
                self.plain = lambda m: MessageToDict(
                    m, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
                )
            else:
                from confluent_kafka.schema_registry.json_schema import JSONDeserializer

                self.deserialize = JSONDeserializer(None, schema_registry_client=client)
                self.plain = _plain
        except ImportError as exc:
            raise _missing(fmt, exc) from None


def _unavailable(exc: Exception) -> bool:
    """Whether a deserializer's error is the registry's (unreachable, 5xx), not the data's."""
    status = getattr(exc, "http_status_code", None)
    if isinstance(status, int):
        return status >= 500 or status in (401, 403, 408, 429)
    name = type(exc).__name__
    return isinstance(exc, OSError | TimeoutError) or name.endswith(
        ("ConnectError", "TimeoutException", "ConnectTimeout", "ReadTimeout", "NetworkError")
    )


class Formats:
    """The decoding of one stream's records: its registry client and its two sides."""

    def __init__(self, config: KafkaConfig) -> None:
        from confluent_kafka.serialization import MessageField, SerializationContext

        assert config.schema_registry is not None  # the config requires it with a format
        self.registry = config.schema_registry
        self._where = ",".join(redact_url(u) for u in self.registry.url.split(","))
        self.client = registry_client(config.schema_registry)
        self._context = SerializationContext
        self.value = (
            _Side(config.value_format, MessageField.VALUE, self.client, config.value_message_class)
            if config.value_format in REGISTRY_FORMATS
            else None
        )
        self.key = (
            _Side(config.key_format, MessageField.KEY, self.client, config.key_message_class)
            if config.key_format in REGISTRY_FORMATS
            else None
        )

    def decode(self, side: _Side, record: KafkaMessage, data: bytes | None, what: str) -> Any:
        """``data`` (one side of ``record``) decoded, or BodyDecodeError with the reason."""
        if data is None:
            return None  # a tombstone, or no key
        message = record.message
        context = self._context(record.topic, side.field, message.headers())
        try:
            decoded = side.deserialize(data, context)
        except Exception as exc:
            reason = str(exc) or type(exc).__name__
            if _unavailable(exc):
                raise SchemaRegistryUnavailable(
                    f"message {record.message_id}: the Schema Registry at {self._where} "
                    f"did not answer for its {what}: {reason}"
                ) from exc
            raise BodyDecodeError(
                f"message {record.message_id} {what} is not {_LABEL[side.fmt]} framed for the "
                f"Schema Registry ({_schema_id(data)}): {reason}"
            ) from exc
        side.seen.add(data[:5])
        return side.plain(decoded)

    def prefetch(self, records: list[KafkaMessage]) -> None:
        """Decode now (on the consumer thread) each record whose schema id was not seen.

        Its schema is then fetched here, off the event loop, and cached by the client:
        the records after it with the same id decode on the loop without a request.
        A record whose id the registry does not know is decoded here too (its
        rejection is then ready); one whose registry does not answer is left to
        fail when a filter asks for it.
        """
        value = self.value
        if value is None:
            return
        seen = value.seen
        for record in records:
            data = record._message.value()
            if data is None or data[:5] in seen:
                continue
            with contextlib.suppress(BodyDecodeError, SchemaRegistryUnavailable):
                record.json()


def _schema_id(data: bytes) -> str:
    """What a Confluent frame says its schema is, for a reason."""
    if len(data) < 5 or data[0] != 0:
        return "no Confluent framing: the first byte is not 0" if data else "empty"
    return f"schema id {int.from_bytes(data[1:5], 'big')}"


class RegistryMessage(KafkaMessage):
    """A Kafka record of a stream whose values or keys are framed for a Schema Registry.

    ``json()`` (the body filters read) is the decoded value, ``key`` the decoded key
    (text as it is, else its JSON) and ``decoded_key`` the decoded key itself; each is
    decoded once, when first asked for. ``body`` stays the original bytes, and so does
    the dead-letter copy. The class is made per stream (:func:`record_type`) with that
    stream's :class:`Formats`.
    """

    __slots__ = ("_key", "_value")
    formats: ClassVar[Formats]

    def __init__(
        self,
        message: Any,
        generation: int,
        lane: tuple[str, int],
        offset: int,
        prefix: str | None = None,
    ) -> None:
        super().__init__(message, generation, lane, offset, prefix)
        self._value: Any = _UNSET
        self._key: Any = _UNSET

    def __copy__(self) -> RegistryMessage:
        return type(self)(self._message, self._generation, self._lane, self._offset, self._prefix)

    def _decoded(self, slot: str, side: _Side, data: bytes | None, what: str) -> Any:
        got = getattr(self, slot)
        if got is _UNSET:
            try:
                got = self.formats.decode(side, self, data, what)
            except BodyDecodeError as exc:
                got = exc  # every watcher gets the same reason, decoded once
            setattr(self, slot, got)
        if isinstance(got, BodyDecodeError):
            raise got
        return got

    def json(self) -> Any:
        """The decoded value (and the key decoded first, so a bad key rejects it too)."""
        formats = self.formats
        if formats.key is not None:
            self._decoded("_key", formats.key, self._message.key(), "key")
        if formats.value is None:
            return super().json()
        return self._decoded("_value", formats.value, self._message.value(), "value")

    @property
    def decoded_key(self) -> Any:
        """The decoded key (None without one); raises BodyDecodeError if it does not decode."""
        side = self.formats.key
        if side is None:
            return super().key
        return self._decoded("_key", side, self._message.key(), "key")

    @property
    def key(self) -> str | None:  # type: ignore[override]
        if self.formats.key is None:
            return super().key
        decoded = self.decoded_key
        if decoded is None or isinstance(decoded, str):
            return decoded
        return json.dumps(decoded, separators=(",", ":"), sort_keys=True)


def record_type(config: KafkaConfig) -> type[KafkaMessage]:
    """The class of a stream's records: :class:`KafkaMessage` unless it decodes formats."""
    if not config.decodes():
        return KafkaMessage
    formats = Formats(config)
    return type("RegistryMessage", (RegistryMessage,), {"__slots__": (), "formats": formats})


def prefetcher(record: type[KafkaMessage]) -> Callable[[list[KafkaMessage]], None] | None:
    """What the consumer thread calls on each fetch (None: nothing, a plain stream)."""
    formats: Formats | None = getattr(record, "formats", None)
    return None if formats is None or formats.value is None else formats.prefetch


# -- encoding, for `acklane publish` -------------------------------------------------------


class Encoder:
    """Frames JSON bodies (and keys) for the registry, as a stream's formats say.

    With a schema (``acklane publish --schema``), confluent-kafka's serializer
    registers it under the subject (``<topic>-value``, ``<topic>-key``) if new; without
    one it encodes with the subject's latest version. Protobuf encodes with the
    stream's message class (its schema is the class's). Raises ValueError with the
    reason when a body does not fit.
    """

    def __init__(
        self, config: KafkaConfig, value_schema: str | None, key_schema: str | None
    ) -> None:
        from confluent_kafka.serialization import MessageField, SerializationContext

        assert config.schema_registry is not None
        self._context = SerializationContext
        client = registry_client(config.schema_registry)
        self.value = _serializer(
            "value", config.value_format, config.value_message_class, value_schema, client
        )
        self.key = _serializer(
            "key", config.key_format, config.key_message_class, key_schema, client
        )
        self._fields = (MessageField.VALUE, MessageField.KEY)

    def encode(
        self, topic: str, value: bytes, key: str | None, headers: Any
    ) -> tuple[bytes, bytes | str | None]:
        """The framed value and key of one message."""
        value_field, key_field = self._fields
        if self.value is not None:
            value = self.value(value, self._context(topic, value_field, headers))
        framed_key: bytes | str | None = key
        if self.key is not None and key is not None:
            framed_key = self.key(key.encode(), self._context(topic, key_field, headers))
        return value, framed_key


def _serializer(
    side: str, fmt: str, message_class: str | None, schema: str | None, client: Any
) -> Callable[[bytes, Any], bytes] | None:
    if fmt not in REGISTRY_FORMATS:
        if schema is not None:
            raise ValueError(
                f"--{'key-' if side == 'key' else ''}schema: the stream's "
                f"{side}_format is {fmt}, not one framed for a Schema Registry"
            )
        return None
    conf = {"auto.register.schemas": schema is not None, "use.latest.version": schema is None}
    try:
        if fmt == "protobuf":
            from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
            from google.protobuf import json_format

            if schema is not None:
                raise ValueError(
                    f"{side}_format protobuf encodes with {side}_message_class's own schema: "
                    "leave out --schema"
                )
            assert message_class is not None
            cls = load_message_class(message_class)
            protobuf = ProtobufSerializer(
                cls, client, {"use.deprecated.format": False, "auto.register.schemas": True}
            )

            def encode_protobuf(data: bytes, ctx: Any) -> bytes:
                try:
                    message = json_format.Parse(data, cls())
                except json_format.ParseError as exc:
                    raise ValueError(f"{side} does not fit {message_class}: {exc}") from None
                framed: bytes = protobuf(message, ctx)
                return framed

            return encode_protobuf
        if fmt == "avro":
            from confluent_kafka.schema_registry.avro import AvroSerializer

            serializer: Any = AvroSerializer(client, schema, conf=conf)
        else:
            from confluent_kafka.schema_registry.json_schema import JSONSerializer

            serializer = JSONSerializer(schema, client, conf=conf)
    except ImportError as exc:
        raise _missing(fmt, exc) from None

    def encode(data: bytes, ctx: Any) -> bytes:
        try:
            document = json.loads(data)
        except ValueError:
            if side != "key":
                raise ValueError(
                    f"a {_LABEL[fmt]} {side} is written as JSON: {data[:80]!r}"
                ) from None
            document = data.decode()  # a plain string key
        framed: bytes = serializer(document, ctx)
        return framed

    return encode
