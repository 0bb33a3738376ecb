"""What filters see of a Pub/Sub message, and what the producer keeps to settle it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from acklane.core.message import RawMessage

__all__ = ["PubSubDelivery", "PubSubMessage"]


@dataclass(slots=True)
class PubSubMessage(RawMessage):
    """One pulled Pub/Sub message, as filters see it.

    ``body`` is the message data, ``attributes`` its attributes, ``key`` its
    ordering key (``None`` when empty), ``message_id`` Pub/Sub's id (unique within
    the topic), ``publish_time`` the server's publish time and ``delivery_attempt``
    Pub/Sub's count (only when the subscription has a dead-letter policy, else
    ``None``). ``native`` is the ``ReceivedMessage``. The event store's identity of
    the message is the producer's ``message_id()``, which adds the topic and the
    publish time.
    """

    subscription: str = ""
    topic: str = ""

    @property
    def data(self) -> bytes:
        """The message data (the same bytes as ``body``)."""
        return self.body

    @property
    def ordering_key(self) -> str | None:
        return self.key

    @classmethod
    def from_received(cls, subscription: str, topic: str, received: Any) -> PubSubMessage:
        """Build from one ``google.pubsub_v1.types.ReceivedMessage``."""
        message = received.message
        published = message.publish_time
        if isinstance(published, datetime):
            publish_time: datetime | None = published.astimezone(UTC)
        else:
            publish_time = None
        return cls(
            body=bytes(message.data),
            attributes=dict(message.attributes),
            key=message.ordering_key or None,
            message_id=str(message.message_id),
            publish_time=publish_time,
            delivery_attempt=int(received.delivery_attempt) or None,
            source=subscription,
            native=received,
            subscription=subscription,
            topic=topic,
        )


@dataclass(slots=True, eq=False)
class PubSubDelivery:
    """The broker payload of one pulled message: what ``advance`` needs to settle it.

    One instance per delivery (a redelivered message comes with a new ack id).
    Hashable by identity: it is the advance lane of a message without ordering key.
    """

    message: PubSubMessage
    ack_id: str
    #: The number of the pull that returned it (holds of an ordering key compare it).
    pull: int
    #: Monotonic time just before that pull was sent.
    received_at: float
    #: Monotonic time at which its lease ends, as far as we know.
    lease_until: float
    #: A publish time precise to the nanosecond, as the service gave it (RFC 3339).
    publish_stamp: str = ""

    @property
    def message_id(self) -> str:
        assert self.message.message_id is not None
        return self.message.message_id

    @property
    def ordering_key(self) -> str | None:
        return self.message.key
