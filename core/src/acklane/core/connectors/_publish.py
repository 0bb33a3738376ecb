"""Sending messages to a stream's upstream: the optional half of the connector contract.

``acklane publish CONFIG STREAM`` sends test messages through the broker of a
configured stream, with that stream's settings (servers, credentials, endpoint).
A connector that can do so returns a :class:`Publisher` from
:meth:`Connector.publisher`; the default raises :class:`PublishNotSupported`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Self

from ..errors import ConnectorError

__all__ = ["OutgoingMessage", "PublishError", "PublishNotSupported", "Publisher"]


class PublishNotSupported(ConnectorError):
    """The stream's connector cannot send messages (from this process, or at all)."""


class PublishError(ConnectorError):
    """The broker refused messages, or did not confirm them in time."""


@dataclass(frozen=True, slots=True)
class OutgoingMessage:
    """One message to send: its body, and the broker's key and attributes when given.

    ``key`` is what the connector reads back as the message's key (Kafka's record
    key, SQS's FIFO MessageGroupId, Pub/Sub's ordering key, Service Bus's session
    id); ``attributes`` what it reads back as attributes (Kafka headers, SQS message
    attributes, Pub/Sub attributes, Service Bus application properties).

    ``dedupe_id`` is the broker's own duplicate-detection key, where it has one a
    sender can set: Service Bus's ``MessageId`` (duplicate detection, when the entity
    has it on) and an SQS FIFO queue's ``MessageDeduplicationId`` (a standard queue
    has none). Pub/Sub and Kafka have no such key (Kafka's idempotent producer only
    drops its own retries): their publishers ignore it. ``None``: the broker's
    default (a fresh id per message).
    """

    body: bytes
    key: str | None = None
    attributes: Mapping[str, str] = field(default_factory=dict)
    dedupe_id: str | None = None


class Publisher(ABC):
    """Sends messages to one destination of a broker; an async context manager.

    :meth:`send` returns once the broker has confirmed every message of the batch
    (or raises :class:`PublishError`). Callers give it at most :attr:`max_batch`
    messages at a time.
    """

    #: Messages per :meth:`send` call that suit the broker's batch APIs.
    max_batch: ClassVar[int] = 100

    @property
    @abstractmethod
    def destination(self) -> str:
        """Where the messages go, secret-free (``kafka topic orders at host:9092``)."""

    @abstractmethod
    async def send(self, messages: Sequence[OutgoingMessage]) -> None:
        """Send the messages, in order, and wait until the broker has them all."""

    def encode_with(self, value_schema: str | None, key_schema: str | None) -> None:
        """Encode bodies (and keys) with these schemas (``acklane publish --schema``).

        For streams whose broker frames bodies for a schema registry (Kafka's
        ``value_format``); every other publisher refuses with :class:`PublishNotSupported`.
        """
        raise PublishNotSupported(
            f"{self.destination}: this stream sends bodies as they are (no schema to encode with)"
        )

    async def aclose(self) -> None:
        """Release the clients (flushing what is pending)."""
        return None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
