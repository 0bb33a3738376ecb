"""What a Kafka record looks like to filters, and to the producer's books."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import msgspec
from confluent_kafka import TIMESTAMP_NOT_AVAILABLE

from acklane.core.message import RawMessage, check_json_depth

__all__ = ["KafkaDelivery", "KafkaMessage", "id_prefix", "message_id_of"]

Headers = tuple[tuple[str, bytes | None], ...]

_UNSET: Any = object()

# RawMessage.json()'s decoder (msgspec, exact on big integers), for KafkaMessage.json
_fast_loads = msgspec.json.Decoder().decode


def id_prefix(cluster_id: str, topic: str, topic_id: str | None, partition: int) -> str:
    """``kafka:<cluster_id>/<topic>[:<topic_id>]/<partition>/``: what precedes the offset.

    Offsets restart at 0 on a recreated topic and on another cluster, so the offset
    alone names a record only within one topic's life on one cluster: the cluster id
    and the topic id (where the broker gives one) name that life. Topic names hold no
    ``/`` or ``:`` and topic ids are URL-safe base64, so the id reads back unambiguously
    from the right whatever the cluster id holds.
    """
    tid = f":{topic_id}" if topic_id else ""
    return f"kafka:{cluster_id}/{topic}{tid}/{partition}/"


def message_id_of(message: Any, cluster_id: str, topic_id: str | None = None) -> str:
    """A record's identity, stable across redeliveries and never reused by another record.

    ``message`` is a confluent-kafka ``Message``; ``cluster_id`` the cluster's id (its
    metadata's ``cluster_id``), ``topic_id`` the topic's id where the broker gives one.
    """
    prefix = id_prefix(cluster_id, message.topic(), topic_id, message.partition())
    return f"{prefix}{message.offset()}"


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


class KafkaMessage(RawMessage):
    """One Kafka record, as filters receive it and as the producer's books keep it.

    ``body`` is the value (``b""`` for a tombstone), ``attributes`` the headers
    decoded as UTF-8 (the last value of a repeated header wins; ``headers`` keeps
    them all, as bytes), ``key`` the key decoded as UTF-8 (``key_bytes`` is exact),
    ``message_id`` ``"kafka:<cluster_id>/<topic>[:<topic_id>]/<partition>/<offset>"``
    (see :func:`id_prefix`), ``publish_time`` = ``timestamp``, ``native`` (also
    ``message``) the confluent-kafka ``Message``.

    The same object is the producer's broker payload: ``lane`` is
    ``(topic, partition)`` and ``generation`` tells deliveries of one partition
    apart across rebalances (an advance of a record from an earlier assignment is
    skipped, never committed).

    Only ``message``, ``generation``, ``lane``, ``offset`` and the identity prefix
    of its partition (computed once per assignment) are set when a record arrives;
    every other field is read from the client's message when first asked for, so a
    filter pays only for what it looks at. A record built without a prefix (outside
    a producer) has the bare ``topic/partition/offset`` as its ``message_id``, which
    names no cluster: the producer always gives one. The record is read-only
    (``copy.copy`` works; ``dataclasses.replace`` does not: build a
    :class:`~acklane.core.message.RawMessage` instead).
    """

    __slots__ = (
        "_attributes",
        "_generation",
        "_lane",
        "_message",
        "_mid",
        "_offset",
        "_prefix",
        "_when",
    )

    def __init__(
        self,
        message: Any,
        generation: int,
        lane: tuple[str, int],
        offset: int,
        prefix: str | None = None,
    ) -> None:
        self._message = message
        self._generation = generation
        self._lane = lane
        self._offset = offset
        self._prefix = prefix
        # with a prefix (a producer's record) the id is made now, when it is fetched:
        # the engine asks every bound record for it. (KafkaStreamProducer._runs sets
        # these same fields itself, without this call: keep the two alike.)
        self._mid = _UNSET if prefix is None else f"{prefix}{offset}"
        self._attributes = self._when = _UNSET
        self.json_memo = None  # (RawMessage's: its __init__ is not called)

    def __copy__(self) -> KafkaMessage:
        return KafkaMessage(self._message, self._generation, self._lane, self._offset, self._prefix)

    def __deepcopy__(self, memo: dict[int, Any]) -> KafkaMessage:
        return self.__copy__()  # a read-only view of an immutable client message

    # -- the producer's books (read-only: a filter must not change what gets committed)

    @property
    def message(self) -> Any:
        """The confluent-kafka ``Message``."""
        return self._message

    @property
    def generation(self) -> int:
        return self._generation

    @property
    def lane(self) -> tuple[str, int]:
        return self._lane

    @property
    def offset(self) -> int:
        return self._offset

    @property
    def topic(self) -> str:
        return self._lane[0]

    @property
    def partition(self) -> int:
        return self._lane[1]

    # -- RawMessage's fields, read lazily from the client's message

    @property
    def message_id(self) -> str:  # type: ignore[override]
        mid: str = self._mid
        if mid is _UNSET:
            prefix = self._prefix
            if prefix is None:
                topic, partition = self._lane
                prefix = f"{topic}/{partition}/"
            mid = self._mid = f"{prefix}{self._offset}"
        return mid

    @property
    def body(self) -> bytes:  # type: ignore[override]
        value: bytes | None = self._message.value()
        return b"" if value is None else value

    def json(self) -> Any:
        """:meth:`RawMessage.json` of the value, read without the ``body`` property (one
        call less per message: filters decode every body)."""
        value: bytes | None = self._message.value()
        if value is not None:
            try:
                return check_json_depth(self, value, _fast_loads(value))
            except (msgspec.DecodeError, TypeError, RecursionError):
                pass  # the standard library decides, and words the error (too deep too)
        return RawMessage.json(self)

    @property
    def key(self) -> str | None:  # type: ignore[override]
        key: bytes | None = self._message.key()
        return None if key is None else _text(key)

    @property
    def key_bytes(self) -> bytes | None:
        key: bytes | None = self._message.key()
        return key

    @property
    def tombstone(self) -> bool:
        return self._message.value() is None

    @property
    def headers(self) -> Headers:
        raw = self._message.headers()
        return tuple(raw) if raw else ()

    @property
    def attributes(self) -> Mapping[str, str]:  # type: ignore[override]
        attributes: dict[str, str] = self._attributes
        if attributes is _UNSET:
            raw = self._message.headers()
            attributes = {n: "" if v is None else _text(v) for n, v in raw} if raw else {}
            self._attributes = attributes
        return attributes

    @property
    def timestamp(self) -> datetime | None:
        when: datetime | None = self._when
        if when is _UNSET:
            ts_type, ms = self._message.timestamp()
            if ts_type == TIMESTAMP_NOT_AVAILABLE or ms is None or ms < 0:
                when = None
            else:
                when = datetime.fromtimestamp(ms / 1000, tz=UTC)
            self._when = when
        return when

    @property
    def publish_time(self) -> datetime | None:  # type: ignore[override]
        return self.timestamp

    @property
    def delivery_attempt(self) -> int | None:  # type: ignore[override]
        return None  # Kafka does not count deliveries

    @property
    def source(self) -> str:  # type: ignore[override]
        return self._lane[0]

    @property
    def native(self) -> Any:
        return self._message

    @property
    def broker_message_id(self) -> None:  # type: ignore[override]
        return None  # a record is named by its position, which message_id holds

    def __repr__(self) -> str:
        return f"KafkaMessage({self.message_id!r}, body={self.body[:64]!r})"


#: The producer's broker payload is the record itself (see :class:`KafkaMessage`).
KafkaDelivery = KafkaMessage
