"""A received Service Bus message as filters see it, and the payload that settles it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from azure.servicebus.aio import ServiceBusReceiver

from acklane.core.message import RawMessage

__all__ = ["ServiceBusDelivery", "ServiceBusRecord"]


@dataclass(slots=True)
class ServiceBusRecord(RawMessage):
    """One received message, as filters see it: the raw record's fields.

    ``attributes`` are the application properties as strings; ``key`` the session id;
    ``message_id`` the sender's ``MessageId``; ``delivery_attempt`` the delivery count
    (0 on the first delivery).
    """

    sequence_number: int = 0
    enqueued_time: datetime | None = None
    session_id: str | None = None
    application_properties: Mapping[str, Any] = field(default_factory=dict)

    @property
    def delivery_count(self) -> int:
        return self.delivery_attempt or 0

    @classmethod
    def from_received(cls, entity: str, message: Any) -> ServiceBusRecord:
        """The record of an SDK ``ServiceBusReceivedMessage`` received from ``entity``."""
        props = {_text(k): v for k, v in (message.application_properties or {}).items()}
        body = message.body
        if isinstance(body, str):
            data = body.encode()
        elif isinstance(body, bytes):
            data = body
        else:  # a generator of sections
            data = b"".join(p if isinstance(p, bytes) else str(p).encode() for p in body)
        return cls(
            body=data,
            attributes={k: _text(v) for k, v in props.items()},
            key=message.session_id,
            message_id=None if message.message_id is None else str(message.message_id),
            publish_time=message.enqueued_time_utc,
            delivery_attempt=message.delivery_count or 0,
            source=entity,
            native=message,
            sequence_number=int(message.sequence_number or 0),
            enqueued_time=message.enqueued_time_utc,
            session_id=message.session_id,
            application_properties=props,
        )


@dataclass(slots=True, eq=False)
class ServiceBusDelivery:
    """The broker payload: the SDK message and the receiver that must settle it."""

    message: Any
    receiver: ServiceBusReceiver
    identity: str
    session_id: str | None
    received_at: float
    settled: bool = False


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)
