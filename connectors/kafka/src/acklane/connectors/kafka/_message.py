"""What a Kafka record looks like to filters, and to the producer's books."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE

from acklane.core.message import RawMessage

__all__ = ["Clock", "KafkaDelivery", "KafkaMessage", "deliver", "message_id_of"]

Headers = tuple[tuple[str, bytes | None], ...]


@dataclass(slots=True)
class KafkaMessage(RawMessage):
    """One Kafka record as filters receive it.

    ``body`` is the value (``b""`` for a tombstone), ``attributes`` the headers
    decoded as UTF-8 (the last value of a repeated header wins; ``headers`` keeps
    them all, as bytes), ``key`` the key decoded as UTF-8 (``key_bytes`` is exact),
    ``message_id`` ``"topic/partition/offset"``, ``publish_time`` = ``timestamp``.
    """

    topic: str = ""
    partition: int = 0
    offset: int = 0
    timestamp: datetime | None = None
    headers: Headers = ()
    key_bytes: bytes | None = None
    tombstone: bool = False


class KafkaDelivery(NamedTuple):
    """The broker payload of one delivered record: the message and the assignment it came in.

    ``generation`` tells deliveries of one partition apart across rebalances: an
    advance of a delivery from an earlier assignment is skipped, never committed.
    ``lane`` is ``(topic, partition)``; ``message_id`` is ``"topic/partition/offset"``.
    """

    message: Any  # confluent_kafka.Message
    generation: int
    lane: tuple[str, int]
    offset: int
    message_id: str

    @property
    def topic(self) -> str:
        return self.lane[0]

    @property
    def partition(self) -> int:
        return self.lane[1]


def message_id_of(message: Any) -> str:
    """``topic/partition/offset``: a record's identity, stable across redeliveries."""
    return f"{message.topic()}/{message.partition()}/{message.offset()}"


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


class Clock:
    """Timestamps as datetimes; records of one produce burst share a millisecond."""

    __slots__ = ("ms", "when")

    def __init__(self) -> None:
        self.ms: int | None = None
        self.when: datetime | None = None

    def at(self, ts_type: int, ms: int | None) -> datetime | None:
        if ts_type == TIMESTAMP_NOT_AVAILABLE or ms is None or ms < 0:
            return None
        if ms != self.ms:
            self.ms, self.when = ms, datetime.fromtimestamp(ms / 1000, tz=UTC)
        return self.when


def deliver(
    message: Any, generation: int, clock: Clock | None = None
) -> tuple[KafkaDelivery, KafkaMessage]:
    """The books' payload and the filters' record of one consumed confluent-kafka message."""
    topic = message.topic()
    partition = message.partition()
    offset = message.offset()
    message_id = f"{topic}/{partition}/{offset}"
    value = message.value()
    key = message.key()
    raw_headers = message.headers()
    if raw_headers:
        headers: Headers = tuple(raw_headers)
        attributes = {name: _text(v) if v is not None else "" for name, v in headers}
    else:
        headers, attributes = (), {}
    when = (clock or Clock()).at(*message.timestamp())
    raw = KafkaMessage(
        b"" if value is None else value,
        attributes,
        None if key is None else _text(key),
        message_id,
        when,
        None,
        topic,
        message,
        topic,
        partition,
        offset,
        when,
        headers,
        key,
        value is None,
    )
    return KafkaDelivery(message, generation, (topic, partition), offset, message_id), raw
