"""What filters see of a Pub/Sub message, and what the producer keeps to settle it.

Records are built from the raw protobuf of a ``PullResponse`` (``PullResponse.pb``),
not through proto-plus: reading a field of a proto-plus message costs microseconds
(a marshal rule looked up per read, a ``DatetimeWithNanoseconds`` per timestamp),
and it was most of the connector's time per message (``bench/README.md``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from acklane.core.message import RawMessage

__all__ = [
    "PubSubDelivery",
    "PubSubMessage",
    "identity_of",
    "identity_prefix",
    "publish_stamp_of",
    "rfc3339",
]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def rfc3339(seconds: int, nanos: int) -> str:
    """A ``Timestamp`` as RFC 3339, to the nanosecond, written as the SDK writes it
    (``DatetimeWithNanoseconds.rfc3339``: six zeros for a whole second, else the
    nanoseconds without trailing zeros), so that identities stay what they were."""
    whole = _EPOCH + timedelta(seconds=seconds)
    if nanos == 0:
        return whole.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return f"{whole.strftime('%Y-%m-%dT%H:%M:%S')}.{str(nanos).rjust(9, '0').rstrip('0')}Z"


def publish_stamp_of(received: Any) -> str:
    """A received message's publish time, precise to the nanosecond as the service gave
    it (RFC 3339); ``received`` is a ``ReceivedMessage``, proto-plus or raw protobuf."""
    message = _raw(received).message
    if not message.HasField("publish_time"):
        return "None"  # what the SDK's missing timestamp printed as: identities unchanged
    stamp = message.publish_time
    return rfc3339(stamp.seconds, stamp.nanos)


def _raw(received: Any) -> Any:
    """The raw protobuf of a proto-plus message (itself if it is one already)."""
    return getattr(received, "_pb", received)


def identity_prefix(subscription: str, topic: str) -> str:
    """What every identity of a stream starts with: ``pubsub:<where>/`` (see
    :func:`identity_of`)."""
    if topic.startswith("projects/"):
        _, project, _, name = topic.split("/", 3)
        where = f"{project}/{name}"
    else:
        where = f"subscription:{subscription.removeprefix('projects/')}"
    return f"pubsub:{where}/"


def identity_of(subscription: str, topic: str, message_id: str, publish_stamp: str) -> str:
    """``pubsub:<project>/<topic>/<message id>@<publish time>``: a message's identity.

    A message id is unique within a topic; the publish time tells a deleted and
    recreated topic's messages apart. With the topic unknown (or deleted), the
    subscription names the stream: ``pubsub:subscription:<project>/subscriptions/...``.
    """
    return f"{identity_prefix(subscription, topic)}{message_id}@{publish_stamp}"


@dataclass(slots=True)
class PubSubMessage(RawMessage):
    """One pulled Pub/Sub message, as filters see it.

    ``body`` is the message data, ``attributes`` its attributes, ``key`` its
    ordering key (``None`` when empty), ``message_id`` the message's identity
    (:func:`identity_of`: the event store's, the producer's ``message_id()``),
    ``broker_message_id`` (also ``pubsub_message_id``) Pub/Sub's own id (unique
    within the topic), ``publish_time`` the server's publish time (a UTC
    ``datetime``, to the microsecond: the nanoseconds are in the identity) and
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
        """Build from one ``google.pubsub_v1.types.ReceivedMessage`` (proto-plus or its
        raw protobuf)."""
        return records(subscription, topic, [_raw(received)], 0, 0.0, 0.0)[0].message


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


def records(
    subscription: str, topic: str, received: Any, pull: int, sent_at: float, lease_until: float
) -> list[PubSubDelivery]:
    """The deliveries of raw ``ReceivedMessage`` protobufs (a ``PullResponse``'s
    ``received_messages``, read with ``PullResponse.pb``): pull number ``pull``, sent
    at ``sent_at``. Each message's ``native`` is its proto-plus ``ReceivedMessage``
    (a wrapper of the same protobuf, no copy)."""
    from google.pubsub_v1.types import ReceivedMessage

    wrap = ReceivedMessage.wrap
    prefix = identity_prefix(subscription, topic)
    # Messages of a pull were mostly published within the same few seconds: the
    # second's datetime and text once each.
    seconds_seen: dict[int, tuple[datetime, str]] = {}
    out = []
    for pb in received:
        message = pb.message
        stamp = message.publish_time
        seconds, nanos = stamp.seconds, stamp.nanos
        if seconds or nanos or message.HasField("publish_time"):
            whole = seconds_seen.get(seconds)
            if whole is None:
                at = _EPOCH + timedelta(seconds=seconds)
                whole = seconds_seen[seconds] = (at, at.strftime("%Y-%m-%dT%H:%M:%S"))
            if nanos:
                text = f"{whole[1]}.{str(nanos).rjust(9, '0').rstrip('0')}Z"
                published: datetime | None = whole[0] + timedelta(microseconds=nanos // 1000)
            else:
                text = f"{whole[1]}.000000Z"
                published = whole[0]
        else:
            text, published = "None", None
        native_id = message.message_id
        attempt = pb.delivery_attempt
        attributes = message.attributes
        out.append(
            PubSubDelivery(
                message=PubSubMessage(
                    body=message.data,
                    attributes=dict(attributes) if attributes else {},
                    key=message.ordering_key or None,
                    message_id=f"{prefix}{native_id}@{text}",
                    publish_time=published,
                    delivery_attempt=attempt or None,
                    source=subscription,
                    native=wrap(pb),
                    broker_message_id=native_id,
                    subscription=subscription,
                    topic=topic,
                ),
                ack_id=pb.ack_id,
                pull=pull,
                received_at=sent_at,
                lease_until=lease_until,
                publish_stamp=text,
            )
        )
    return out
