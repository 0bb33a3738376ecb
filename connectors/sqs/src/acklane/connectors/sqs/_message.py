"""What filters see of an SQS message, and what the producer keeps to settle it."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from acklane.core.message import RawMessage

__all__ = ["SqsDelivery", "SqsMessage"]


@dataclass(slots=True)
class SqsMessage(RawMessage):
    """One received SQS message, as filters see it.

    ``attributes`` flattens the message attributes to strings (binary values
    base64-encoded); ``message_attributes`` keeps SQS's typed form
    (``{"DataType": ..., "StringValue" | "BinaryValue": ...}``), and
    ``system_attributes`` holds SQS's own (``SentTimestamp``, ``SequenceNumber``...).
    ``key`` is the FIFO ``MessageGroupId``; ``delivery_attempt`` is
    ``ApproximateReceiveCount``; ``native`` is the message dict from ``ReceiveMessage``.
    ``message_id`` is the message's identity, ``<queue ARN>/<MessageId>`` (the event
    store's, the producer's ``message_id()``); ``broker_message_id`` (also
    ``sqs_message_id``) is SQS's own ``MessageId``.
    """

    queue_url: str = ""
    message_attributes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    system_attributes: Mapping[str, str] = field(default_factory=dict)

    @property
    def receive_count(self) -> int:
        """How many times SQS has handed out this message (1 on first delivery)."""
        return self.delivery_attempt or 1

    @property
    def group_id(self) -> str | None:
        """The FIFO message group, ``None`` on standard queues."""
        return self.key

    @property
    def sequence_number(self) -> str | None:
        """The FIFO sequence number, ``None`` on standard queues."""
        return self.system_attributes.get("SequenceNumber")

    @property
    def sqs_message_id(self) -> str:
        """SQS's ``MessageId`` of the message."""
        return self.broker_message_id or ""

    @classmethod
    def from_sqs(
        cls, queue_url: str, message: Mapping[str, Any], identity: str | None = None
    ) -> SqsMessage:
        """Build from one entry of a ``ReceiveMessage`` response.

        ``identity`` names the queue in ``message_id`` (its ARN; the URL when not given).
        """
        system = {str(k): str(v) for k, v in (message.get("Attributes") or {}).items()}
        typed = dict(message.get("MessageAttributes") or {})
        sent = system.get("SentTimestamp")
        native_id = str(message["MessageId"])
        return cls(
            body=str(message.get("Body", "")).encode("utf-8"),
            attributes={name: _flatten(value) for name, value in typed.items()},
            key=system.get("MessageGroupId"),
            message_id=f"{identity or queue_url}/{native_id}",
            broker_message_id=native_id,
            publish_time=datetime.fromtimestamp(int(sent) / 1000, UTC) if sent else None,
            delivery_attempt=int(system.get("ApproximateReceiveCount", "1")),
            source=queue_url,
            native=dict(message),
            queue_url=queue_url,
            message_attributes=typed,
            system_attributes=system,
        )


def _flatten(value: Mapping[str, Any]) -> str:
    if "StringValue" in value:
        return str(value["StringValue"])
    if "BinaryValue" in value:
        raw = value["BinaryValue"]
        return base64.b64encode(raw if isinstance(raw, bytes) else bytes(raw)).decode("ascii")
    return ""


@dataclass(slots=True, eq=False)
class SqsDelivery:
    """The broker payload of one received message: what ``advance`` needs to settle it.

    One instance per receipt (a redelivered message gets a new one, with a new
    receipt handle; a message whose lease a closing producer kept is handed to the
    next producer of its queue as the same instance, receipt and all). The producer
    also uses it to track the message's visibility.
    """

    message: SqsMessage
    receipt_handle: str
    #: Monotonic time just before the ReceiveMessage request that returned it; the
    #: 12-hour visibility cap is counted from here (conservatively early).
    received_at: float
    #: Monotonic time at which SQS makes the message visible again, as far as we know.
    visible_until: float
    #: The heartbeat may no longer extend it (lease lost, or the 12-hour cap reached).
    extension_stopped: bool = False
    #: The number of the receive that returned it (FIFO groups' holds compare it).
    stamp: int = 0

    @property
    def message_id(self) -> str:
        """SQS's ``MessageId`` (the message's identity is ``message.message_id``)."""
        return self.message.sqs_message_id

    @property
    def group_id(self) -> str | None:
        return self.message.key

    @property
    def receive_count(self) -> int:
        return self.message.receive_count
