"""What filters see of a Pub/Sub message, and what the producer keeps to settle it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from acklane.core.message import RawMessage

__all__ = ["PubSubDelivery", "PubSubMessage", "identity_of", "publish_stamp_of"]


def publish_stamp_of(received: Any) -> str:
    """A received message's publish time, precise to the nanosecond as the service gave
    it (RFC 3339)."""
    stamp = received.message.publish_time
    return stamp.rfc3339() if hasattr(stamp, "rfc3339") else str(stamp)


def identity_of(subscription: str, topic: str, message_id: str, publish_stamp: str) -> str:
    """``pubsub:<project>/<topic>/<message id>@<publish time>``: a message's identity.

    A message id is unique within a topic; the publish time tells a deleted and
    recreated topic's messages apart. With the topic unknown (or deleted), the
    subscription names the stream: ``pubsub:subscription:<project>/subscriptions/...``.
    """
    if topic.startswith("projects/"):
        _, project, _, name = topic.split("/", 3)
        where = f"{project}/{name}"
    else:
        where = f"subscription:{subscription.removeprefix('projects/')}"
    return f"pubsub:{where}/{message_id}@{publish_stamp}"


@dataclass(slots=True)
class PubSubMessage(RawMessage):
    """One pulled Pub/Sub message, as filters see it.

    ``body`` is the message data, ``attributes`` its attributes, ``key`` its
    ordering key (``None`` when empty), ``message_id`` the message's identity
    (:func:`identity_of`: the event store's, the producer's ``message_id()``),
    ``broker_message_id`` (also ``pubsub_message_id``) Pub/Sub's own id (unique
    within the topic), ``publish_time`` the server's publish time and
    ``delivery_attempt`` Pub/Sub's count (only when the subscription has a
    dead-letter policy, else ``None``). ``native`` is the ``ReceivedMessage``.
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

    @property
    def pubsub_message_id(self) -> str:
        """Pub/Sub's own id of the message (unique within its topic)."""
        return self.broker_message_id or ""

    @classmethod
    def from_received(cls, subscription: str, topic: str, received: Any) -> PubSubMessage:
        """Build from one ``google.pubsub_v1.types.ReceivedMessage``."""
        message = received.message
        published = message.publish_time
        if isinstance(published, datetime):
            publish_time: datetime | None = published.astimezone(UTC)
        else:
            publish_time = None
        native_id = str(message.message_id)
        return cls(
            body=bytes(message.data),
            attributes=dict(message.attributes),
            key=message.ordering_key or None,
            message_id=identity_of(subscription, topic, native_id, publish_stamp_of(received)),
            broker_message_id=native_id,
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
        """Pub/Sub's own id (the message's identity is ``message.message_id``)."""
        return self.message.pubsub_message_id

    @property
    def ordering_key(self) -> str | None:
        return self.message.key
