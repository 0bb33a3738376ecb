"""Records built from the raw protobuf are what the SDK's proto-plus messages say.

The identity of a message (the event store's dedupe key) holds its publish time as
RFC 3339 text: it must stay byte for byte what ``DatetimeWithNanoseconds.rfc3339``
wrote, or a message redelivered across an upgrade would be stored twice.
"""

from __future__ import annotations

import random

import pytest
from google.pubsub_v1 import types
from proto.datetime_helpers import DatetimeWithNanoseconds

from acklane.connectors.pubsub import PubSubMessage
from acklane.connectors.pubsub._message import publish_stamp_of, records, rfc3339

SUB = "projects/p/subscriptions/s"
TOPIC = "projects/p/topics/t"

_rng = random.Random(23)
STAMPS = [
    (0, 0),
    (1, 0),
    (1, 1),
    (1, 1000),
    (1_733_240_000, 123_456_789),
    (1_733_240_000, 120_000_000),
    (1_733_240_000, 5_000),
    (1_733_240_000, 100),
    (253_402_300_799, 999_999_999),
] + [
    (
        _rng.randrange(4_000_000_000),
        _rng.choice([0, _rng.randrange(10**9), _rng.randrange(10**6) * 1000]),
    )
    for _ in range(300)
]


def received(i: int, seconds: int | None, nanos: int = 0) -> types.ReceivedMessage:
    message = types.PubsubMessage(
        data=f"m{i}".encode(),
        attributes={"a": str(i)} if i % 2 else {},
        message_id=str(1000 + i),
        ordering_key="k" if i % 3 else "",
    )
    if seconds is not None:
        stamp = types.PubsubMessage.pb(message).publish_time
        stamp.seconds, stamp.nanos = seconds, nanos
    return types.ReceivedMessage(ack_id=f"ack-{i}", message=message, delivery_attempt=i % 3)


def test_the_publish_stamp_is_the_sdks_text() -> None:
    from google.protobuf.timestamp_pb2 import Timestamp

    for seconds, nanos in STAMPS:
        sdk = DatetimeWithNanoseconds.from_timestamp_pb(Timestamp(seconds=seconds, nanos=nanos))
        assert rfc3339(seconds, nanos) == sdk.rfc3339(), (seconds, nanos)


@pytest.mark.parametrize("topic", [TOPIC, ""])
def test_records_match_the_proto_plus_reading(topic: str) -> None:
    pulled = [received(i, s, n) for i, (s, n) in enumerate(STAMPS)] + [received(999, None)]
    response = types.PullResponse(received_messages=pulled)
    raw = types.PullResponse.pb(response).received_messages
    deliveries = records(SUB, topic, raw, 7, 1.0, 2.0)
    assert len(deliveries) == len(pulled)
    for r, d in zip(response.received_messages, deliveries, strict=True):
        m, published = d.message, r.message.publish_time
        stamp = published.rfc3339() if published is not None else "None"
        assert d.publish_stamp == stamp == publish_stamp_of(r)
        assert m.message_id.endswith(f"/{r.message.message_id}@{stamp}")
        assert m.publish_time == published  # to the microsecond, as a plain datetime
        assert (m.body, m.attributes, m.key) == (
            r.message.data,
            dict(r.message.attributes),
            r.message.ordering_key or None,
        )
        assert m.broker_message_id == r.message.message_id and m.source == SUB
        assert m.delivery_attempt == (r.delivery_attempt or None)
        assert m.native == r and isinstance(m.native, types.ReceivedMessage)
        assert (d.ack_id, d.pull, d.received_at, d.lease_until) == (r.ack_id, 7, 1.0, 2.0)
        assert PubSubMessage.from_received(SUB, topic, r) == m
