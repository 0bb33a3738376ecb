"""A received Service Bus message as filters see it, its identity, and the payload that
settles it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from azure.servicebus.aio import ServiceBusReceiver

from acklane.core.message import RawMessage

__all__ = ["ServiceBusDelivery", "ServiceBusMessage", "identity_of"]


def identity_of(namespace: str, entity: str, message: Any) -> str:
    """``servicebus:<namespace>/<entity>/<sequence number>@<enqueued time>``: a
    received message's identity (sequence numbers restart on a recreated entity, the
    enqueued time tells the two apart; the sender's ``MessageId`` may repeat)."""
    enqueued = message.enqueued_time_utc
    stamp = enqueued.isoformat(timespec="milliseconds") if enqueued is not None else "-"
    return f"servicebus:{namespace}/{entity.lower()}/{message.sequence_number}@{stamp}"


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def _body(body: Any) -> bytes:
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode()
    return b"".join(part if isinstance(part, bytes) else str(part).encode() for part in body)


@dataclass(slots=True)
class ServiceBusMessage(RawMessage):
    """One received Service Bus message, as filters see it.

    ``attributes`` are the application properties as strings
    (``application_properties`` keeps their types); ``key`` the session id;
    ``message_id`` the message's identity (:func:`identity_of`), and
    ``broker_message_id`` the sender's ``MessageId``; ``delivery_attempt`` the
    delivery count (0 on the first delivery); ``native`` the SDK's
    ``ServiceBusReceivedMessage``.
    """

    sequence_number: int = 0
    enqueued_time: datetime | None = None
    session_id: str | None = None
    application_properties: Mapping[str, Any] = field(default_factory=dict)

    @property
    def delivery_count(self) -> int:
        return self.delivery_attempt or 0

    @classmethod
    def from_received(cls, message: Any, identity: str, entity: str) -> ServiceBusMessage:
        """Build from one ``ServiceBusReceivedMessage`` of ``entity``."""
        props = {_text(k): v for k, v in (message.application_properties or {}).items()}
        return cls(
            body=_body(message.body),
            attributes={k: _text(v) for k, v in props.items()},
            key=message.session_id,
            message_id=identity,
            publish_time=message.enqueued_time_utc,
            delivery_attempt=message.delivery_count or 0,
            source=entity,
            native=message,
            broker_message_id=None if message.message_id is None else str(message.message_id),
            sequence_number=int(message.sequence_number or 0),
            enqueued_time=message.enqueued_time_utc,
            session_id=message.session_id,
            application_properties=props,
        )


@dataclass(slots=True, eq=False)
class ServiceBusDelivery:
    """The broker payload: the SDK message and the receiver that must settle it.

    ``link`` is the receiver's AMQP link handler that received the message (the
    SDK replaces it when it reconnects): delivery ids are only meaningful on it.
    """

    message: Any
    receiver: ServiceBusReceiver
    identity: str
    session_id: str | None
    received_at: float
    settled: bool = False
    link: Any = None
