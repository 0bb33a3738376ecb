"""acklane's Pub/Sub emulator: the Publisher and Subscriber gRPC services, in memory.

A ``grpc.aio`` server with generic handlers; the request and response classes are
the ones ``google-cloud-pubsub`` ships (``google.pubsub_v1.types.X.pb()``), so the
official clients talk to it unchanged through ``PUBSUB_EMULATOR_HOST``.

What it models, as the service does where a consumer depends on it: topics and
subscriptions, publish (attributes, ordering keys, server-assigned ids unique
within the topic, publish time), unary ``Pull`` and ``StreamingPull`` with flow
control, ack deadlines and their expiry, ``ModifyAckDeadline`` (0 is a nack),
``Acknowledge``, dead-letter policies (``delivery_attempt``, the
``CloudPubSubDeadLetterSource*`` attributes), retry policies, ordered delivery per
key (the next message of a key only once the previous one is acked), and the
service's limits (``INVALID_ARGUMENT`` otherwise). ``relaxed=True`` lowers two of
them for fast tests: ack deadlines from 1 s and ``max_delivery_attempts`` from 1.
One call of its own, not Pub/Sub's: ``INSPECT_STATS``, a subscription's backlog
and leases read without pulling (tests and benchmarks; JSON, no protobuf).

All state lives on the server's event loop; nothing is persisted.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf import any_pb2, empty_pb2
from google.pubsub_v1 import types as t
from google.rpc import code_pb2, error_details_pb2, status_pb2

from ._filter import FilterError, Predicate, compile_filter
from ._paging import paginate
from ._schemas import SchemaError, SchemaRegistry

__all__ = ["INSPECT_STATS", "RELAXED_ENV", "PubSubServer", "PubSubState", "ServerThread"]

log = logging.getLogger(__name__)

#: Set to ``1`` to start the server in relaxed mode (``python -m`` and the launcher).
RELAXED_ENV = "ACKLANE_PUBSUB_RELAXED"

_TOPIC = re.compile(r"^projects/([^/]+)/topics/([A-Za-z][A-Za-z0-9._~%+-]{2,254})$")
_SUBSCRIPTION = re.compile(r"^projects/([^/]+)/subscriptions/([A-Za-z][A-Za-z0-9._~%+-]{2,254})$")
_PROJECT = re.compile(r"^projects/([^/]+)$")
DELETED_TOPIC = "_deleted-topic_"
DEFAULT_ACK_DEADLINE = 10
MAX_ACK_DEADLINE = 600
#: How long a subscription keeps unacked messages unless told otherwise (7 days).
DEFAULT_RETENTION = 7 * 24 * 3600.0
MIN_RETENTION = 600.0
MAX_SUBSCRIPTION_RETENTION = 7 * 24 * 3600.0
MAX_TOPIC_RETENTION = 31 * 24 * 3600.0
_SNAPSHOT = re.compile(r"^projects/([^/]+)/snapshots/([A-Za-z][A-Za-z0-9._~%+-]{2,254})$")


@dataclass(eq=False)
class _Snapshot:
    config: Any  # Snapshot
    #: The messages a seek to it makes unacked again: those unacked when it was taken,
    #: and every message published to its topic since.
    messages: dict[str, Any] = field(default_factory=dict)


#: acklane's read-only inspection call (not part of Pub/Sub): JSON request and answer.
INSPECT_STATS = "/acklane.pubsub.v1.Inspector/SubscriptionStats"
#: How long a unary Pull waits for messages before it answers empty.
PULL_WAIT = 2.0

_pb = {
    name: getattr(t, name).pb()
    for name in (
        "Topic",
        "Subscription",
        "PubsubMessage",
        "PublishRequest",
        "PublishResponse",
        "GetTopicRequest",
        "ListTopicsRequest",
        "ListTopicsResponse",
        "ListTopicSubscriptionsRequest",
        "ListTopicSubscriptionsResponse",
        "DeleteTopicRequest",
        "GetSubscriptionRequest",
        "UpdateSubscriptionRequest",
        "ListSubscriptionsRequest",
        "ListSubscriptionsResponse",
        "DeleteSubscriptionRequest",
        "ModifyAckDeadlineRequest",
        "AcknowledgeRequest",
        "PullRequest",
        "PullResponse",
        "StreamingPullRequest",
        "StreamingPullResponse",
        "ReceivedMessage",
        "UpdateTopicRequest",
        "DetachSubscriptionRequest",
        "DetachSubscriptionResponse",
        "ModifyPushConfigRequest",
        "Snapshot",
        "CreateSnapshotRequest",
        "GetSnapshotRequest",
        "UpdateSnapshotRequest",
        "ListSnapshotsRequest",
        "ListSnapshotsResponse",
        "ListTopicSnapshotsRequest",
        "ListTopicSnapshotsResponse",
        "DeleteSnapshotRequest",
        "SeekRequest",
        "SeekResponse",
    )
}


class _Abort(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _invalid(message: str) -> _Abort:
    return _Abort(grpc.StatusCode.INVALID_ARGUMENT, message)


def _not_found(kind: str, name: str) -> _Abort:
    return _Abort(grpc.StatusCode.NOT_FOUND, f"Resource not found ({kind}={name}).")


def _unimplemented(feature: str) -> _Abort:
    """A feature of the service this emulator does not model: refused, never ignored."""
    return _Abort(
        grpc.StatusCode.UNIMPLEMENTED,
        f"acklane's Pub/Sub emulator does not implement {feature}; it refuses it rather "
        "than accept it and act differently from the service",
    )


class _AckIdFailure(_Abort):
    """Exactly-once delivery: some ack ids were invalid (expired, unknown or acked)."""

    def __init__(self, failures: dict[str, str]) -> None:
        super().__init__(
            grpc.StatusCode.INVALID_ARGUMENT,
            "Some acknowledgement ids in the request were invalid. This could be because "
            "the acknowledgement ids have expired or the acknowledgement ids were malformed.",
        )
        self.failures = failures

    def trailing_metadata(self) -> tuple[tuple[str, bytes], ...]:
        info = error_details_pb2.ErrorInfo(
            reason="EXACTLY_ONCE_ACKID_FAILURE",
            domain="pubsub.googleapis.com",
            metadata=self.failures,
        )
        detail = any_pb2.Any()
        detail.Pack(info)
        status = status_pb2.Status(
            code=code_pb2.INVALID_ARGUMENT, message=self.message, details=[detail]
        )
        return (("grpc-status-details-bin", status.SerializeToString()),)


@dataclass(eq=False)
class _Entry:
    """One message of one subscription's backlog."""

    seq: int
    message: Any  # PubsubMessage (protobuf)
    attempts: int = 0
    ack_id: str | None = None
    deadline: float = 0.0
    available_at: float = 0.0
    stream: _Stream | None = None

    @property
    def key(self) -> str:
        return str(self.message.ordering_key)


@dataclass(eq=False)
class _Stream:
    """One open StreamingPull: its deadline and its flow control."""

    deadline: int
    max_messages: int
    max_bytes: int
    leased: dict[str, _Entry] = field(default_factory=dict)

    def prune(self, now: float) -> None:
        for ack_id, entry in list(self.leased.items()):
            if entry.ack_id != ack_id or entry.deadline <= now:
                del self.leased[ack_id]

    def room(self) -> tuple[int, int]:
        messages = self.max_messages - len(self.leased) if self.max_messages > 0 else 1 << 30
        used = sum(e.message.ByteSize() for e in self.leased.values())
        size = self.max_bytes - used if self.max_bytes > 0 else 1 << 62
        return messages, size


@dataclass(eq=False)
class _Topic:
    config: Any  # Topic
    ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    subscriptions: set[str] = field(default_factory=set)
    #: Messages kept for seeking back (``message_retention_duration`` set on the topic).
    log: list[Any] = field(default_factory=list)
    snapshots: set[str] = field(default_factory=set)

    @property
    def retention(self) -> float:
        """Seconds the topic keeps its messages for seeking (0: it keeps none)."""
        if not self.config.HasField("message_retention_duration"):
            return 0.0
        return float(self.config.message_retention_duration.ToTimedelta().total_seconds())


@dataclass(eq=False)
class _Subscription:
    config: Any  # Subscription
    backlog: dict[int, _Entry] = field(default_factory=dict)
    by_ack: dict[str, _Entry] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    #: The compiled ``filter`` (``None``: every message).
    predicate: Predicate | None = None
    #: Acked messages kept for seeking back (``retain_acked_messages``), by message id.
    acked: dict[str, Any] = field(default_factory=dict)
    #: When it was created (ns since the epoch): a seek cannot bring back what came before.
    created_ns: int = 0

    @property
    def ordered(self) -> bool:
        return bool(self.config.enable_message_ordering)

    @property
    def exactly_once(self) -> bool:
        return bool(self.config.enable_exactly_once_delivery)

    def wants(self, message: Any) -> bool:
        return self.predicate is None or self.predicate(message.attributes)

    @property
    def retention(self) -> float:
        if not self.config.HasField("message_retention_duration"):
            return DEFAULT_RETENTION
        return float(self.config.message_retention_duration.ToTimedelta().total_seconds())

    def poke(self) -> None:
        self.changed.set()


class PubSubState:
    """Topics, subscriptions and their messages; every method runs on one loop."""

    def __init__(
        self,
        *,
        relaxed: bool = False,
        clock: Callable[[], float] = time.monotonic,
        schemas: SchemaRegistry | None = None,
    ) -> None:
        self.relaxed = relaxed
        self.clock = clock
        self.topics: dict[str, _Topic] = {}
        self.subscriptions: dict[str, _Subscription] = {}
        self.snapshots: dict[str, _Snapshot] = {}
        self.schemas = schemas if schemas is not None else SchemaRegistry()
        self._seq = itertools.count()

    # ------------------------------------------------------------ limits

    @property
    def min_ack_deadline(self) -> int:
        return 1 if self.relaxed else 10

    @property
    def min_delivery_attempts(self) -> int:
        return 1 if self.relaxed else 5

    def _check_subscription(self, sub: Any) -> None:
        _refuse_unmodelled_subscription(sub)
        if sub.HasField("message_retention_duration"):
            seconds = sub.message_retention_duration.ToTimedelta().total_seconds()
            if not MIN_RETENTION <= seconds <= MAX_SUBSCRIPTION_RETENTION:
                raise _invalid(
                    f"Invalid message_retention_duration: {seconds:g}s; it must be between "
                    "10 minutes and 7 days."
                )
        if sub.ack_deadline_seconds == 0:
            sub.ack_deadline_seconds = DEFAULT_ACK_DEADLINE
        if not self.min_ack_deadline <= sub.ack_deadline_seconds <= MAX_ACK_DEADLINE:
            raise _invalid(
                f"Invalid ack_deadline_seconds: {sub.ack_deadline_seconds}; it must be between "
                f"{self.min_ack_deadline} and {MAX_ACK_DEADLINE} seconds."
            )
        if sub.HasField("dead_letter_policy") and sub.dead_letter_policy.dead_letter_topic:
            policy = sub.dead_letter_policy
            if policy.max_delivery_attempts == 0:
                policy.max_delivery_attempts = 5
            if not self.min_delivery_attempts <= policy.max_delivery_attempts <= 100:
                raise _invalid(
                    f"Invalid max_delivery_attempts: {policy.max_delivery_attempts}; it must be "
                    f"between {self.min_delivery_attempts} and 100."
                )
            if not _TOPIC.match(policy.dead_letter_topic):
                raise _invalid(f"Invalid dead_letter_topic: {policy.dead_letter_topic}")
            if policy.dead_letter_topic not in self.topics:
                raise _not_found("topic", policy.dead_letter_topic)

    # ------------------------------------------------------------ topics

    def create_topic(self, topic: Any) -> Any:
        if not _TOPIC.match(topic.name):
            raise _invalid(f"Invalid [topics] name: ({topic.name})")
        if topic.name in self.topics:
            raise _Abort(grpc.StatusCode.ALREADY_EXISTS, "Topic already exists")
        stored = _pb["Topic"]()
        stored.CopyFrom(topic)
        self._check_topic(stored)
        stored.state = 1  # ACTIVE
        self.topics[topic.name] = _Topic(stored)
        return stored

    def _check_topic(self, topic: Any) -> None:
        if topic.HasField("ingestion_data_source_settings"):
            raise _unimplemented("import topics (ingestion_data_source_settings)")
        if len(topic.message_transforms):
            raise _unimplemented("single message transforms (message_transforms)")
        if topic.HasField("message_retention_duration"):
            seconds = topic.message_retention_duration.ToTimedelta().total_seconds()
            if not MIN_RETENTION <= seconds <= MAX_TOPIC_RETENTION:
                raise _invalid(
                    f"Invalid message_retention_duration: {seconds:g}s; it must be between "
                    "10 minutes and 31 days."
                )
        if topic.HasField("schema_settings"):
            self.schemas.check_settings(topic.schema_settings)

    def update_topic(self, topic: Any, paths: Iterable[str]) -> Any:
        current = self.topic(topic.name)
        updated = _pb["Topic"]()
        updated.CopyFrom(current.config)
        paths = list(paths)
        if not paths:
            raise _invalid("The update_mask in the UpdateTopicRequest must be set.")
        for path in paths:
            if path not in _TOPIC_UPDATABLE:
                raise _invalid(f"Invalid update_mask provided: {path}")
            if path == "labels":
                updated.labels.clear()
                updated.labels.update(topic.labels)
            elif path == "kms_key_name":
                updated.kms_key_name = topic.kms_key_name
            elif path == "message_transforms":
                del updated.message_transforms[:]
                updated.message_transforms.extend(topic.message_transforms)
            elif topic.HasField(path):
                getattr(updated, path).CopyFrom(getattr(topic, path))
            else:
                updated.ClearField(path)
        self._check_topic(updated)
        current.config = updated
        if not current.retention:
            current.log.clear()
        return updated

    def topic(self, name: str) -> _Topic:
        try:
            return self.topics[name]
        except KeyError:
            if not _TOPIC.match(name):
                raise _invalid(f"Invalid [topics] name: ({name})") from None
            raise _not_found("topic", name) from None

    def delete_topic(self, name: str) -> None:
        topic = self.topic(name)
        del self.topics[name]
        for sub_name in topic.subscriptions:
            sub = self.subscriptions.get(sub_name)
            if sub is not None:
                sub.config.topic = DELETED_TOPIC
        for snap_name in topic.snapshots:
            snapshot = self.snapshots.get(snap_name)
            if snapshot is not None:
                snapshot.config.topic = DELETED_TOPIC

    def publish(self, topic_name: str, messages: Iterable[Any]) -> list[str]:
        topic = self.topic(topic_name)
        messages = list(messages)
        if not messages:
            raise _invalid("The request contains no messages.")
        for message in messages:
            if not message.data and not message.attributes:
                raise _invalid("Some messages contain neither data nor attributes.")
        has_schema = topic.config.HasField("schema_settings")
        settings = topic.config.schema_settings if has_schema else None
        revisions: list[Any] = []
        if settings is not None:
            revisions = [self.schemas.validate_published(settings, m) for m in messages]
        ids = []
        now = time.time()
        now_ns = int(now * 1e9)
        retention = topic.retention
        if retention and topic.log:
            self._prune_log(topic, now_ns)
        snapshots = [self.snapshots[n] for n in topic.snapshots if n in self.snapshots]
        for i, message in enumerate(messages):
            stored = _pb["PubsubMessage"]()
            stored.CopyFrom(message)
            stored.message_id = str(next(topic.ids))
            stored.publish_time.FromNanoseconds(now_ns)
            if revisions:
                SchemaRegistry.stamp(settings, stored, revisions[i])
            ids.append(stored.message_id)
            if retention:
                topic.log.append(stored)
            for snapshot in snapshots:
                snapshot.messages[stored.message_id] = stored
            for sub_name in topic.subscriptions:
                sub = self.subscriptions.get(sub_name)
                if sub is not None and sub.wants(stored):
                    seq = next(self._seq)
                    sub.backlog[seq] = _Entry(seq, stored)
                    sub.poke()
        return ids

    @staticmethod
    def _prune_log(topic: _Topic, now_ns: int) -> None:
        oldest = now_ns - int(topic.retention * 1e9)
        drop = 0
        for message in topic.log:
            if message.publish_time.ToNanoseconds() >= oldest:
                break
            drop += 1
        if drop:
            del topic.log[:drop]

    # ------------------------------------------------------------ subscriptions

    def create_subscription(self, sub: Any) -> Any:
        if not _SUBSCRIPTION.match(sub.name):
            raise _invalid(f"Invalid [subscriptions] name: ({sub.name})")
        if sub.name in self.subscriptions:
            raise _Abort(grpc.StatusCode.ALREADY_EXISTS, "Subscription already exists")
        topic = self.topic(sub.topic)
        stored = _pb["Subscription"]()
        stored.CopyFrom(sub)
        self._check_subscription(stored)
        try:
            predicate = compile_filter(stored.filter)
        except FilterError as exc:
            raise _invalid(str(exc)) from None
        stored.state = 1  # ACTIVE
        if topic.config.HasField("message_retention_duration"):
            stored.topic_message_retention_duration.CopyFrom(
                topic.config.message_retention_duration
            )
        self.subscriptions[sub.name] = _Subscription(
            stored, predicate=predicate, created_ns=time.time_ns()
        )
        topic.subscriptions.add(sub.name)
        return stored

    def subscription(self, name: str) -> _Subscription:
        try:
            return self.subscriptions[name]
        except KeyError:
            if not _SUBSCRIPTION.match(name):
                raise _invalid(f"Invalid [subscriptions] name: ({name})") from None
            raise _not_found("subscription", name) from None

    def update_subscription(self, sub: Any, paths: Iterable[str]) -> Any:
        current = self.subscription(sub.name)
        updated = _pb["Subscription"]()
        updated.CopyFrom(current.config)
        paths = list(paths)
        if not paths:
            raise _invalid("The update_mask in the UpdateSubscriptionRequest must be set.")
        messages = (
            "dead_letter_policy",
            "retry_policy",
            "message_retention_duration",
            "expiration_policy",
            "push_config",
        )
        for path in paths:
            if path == "filter":
                raise _invalid("A subscription's filter cannot be changed after it is created.")
            if path not in _SUBSCRIPTION_UPDATABLE:
                raise _invalid(f"Invalid update_mask provided: {path}")
            if path == "labels":
                updated.labels.clear()
                updated.labels.update(sub.labels)
            elif path in messages:
                if sub.HasField(path):
                    getattr(updated, path).CopyFrom(getattr(sub, path))
                else:
                    updated.ClearField(path)
            else:
                setattr(updated, path, getattr(sub, path))
        self._check_subscription(updated)
        current.config = updated
        if not updated.retain_acked_messages:
            current.acked.clear()
        current.poke()
        return updated

    def detach_subscription(self, name: str) -> None:
        """Detach from its topic: the backlog is dropped and pulls fail from now on."""
        sub = self.subscription(name)
        topic = self.topics.get(sub.config.topic)
        if topic is not None:
            topic.subscriptions.discard(name)
        sub.config.detached = True
        sub.backlog.clear()
        sub.by_ack.clear()
        sub.acked.clear()
        sub.poke()

    def live_subscription(self, name: str) -> _Subscription:
        """A subscription that can deliver: ``FAILED_PRECONDITION`` once detached."""
        sub = self.subscription(name)
        if sub.config.detached:
            raise _Abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"Subscription {name} is detached from its topic.",
            )
        return sub

    # ------------------------------------------------------------ snapshots and seek

    def create_snapshot(self, name: str, sub_name: str, labels: dict[str, str]) -> Any:
        if not _SNAPSHOT.match(name):
            raise _invalid(f"Invalid [snapshots] name: ({name})")
        if name in self.snapshots:
            raise _Abort(grpc.StatusCode.ALREADY_EXISTS, "Snapshot already exists")
        sub = self.live_subscription(sub_name)
        topic = self.topics.get(sub.config.topic)
        if topic is None:
            raise _Abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"The topic of subscription {sub_name} was deleted: no snapshot can be taken.",
            )
        config = _pb["Snapshot"](name=name, topic=sub.config.topic, labels=labels)
        unacked = {e.message.message_id: e.message for e in sub.backlog.values()}
        oldest = min(
            (m.publish_time.ToNanoseconds() for m in unacked.values()), default=time.time_ns()
        )
        config.expire_time.FromNanoseconds(oldest + int(7 * 24 * 3600 * 1e9))
        self.snapshots[name] = _Snapshot(config, unacked)
        topic.snapshots.add(name)
        return config

    def snapshot(self, name: str) -> _Snapshot:
        try:
            return self.snapshots[name]
        except KeyError:
            if not _SNAPSHOT.match(name):
                raise _invalid(f"Invalid [snapshots] name: ({name})") from None
            raise _not_found("snapshot", name) from None

    def update_snapshot(self, snapshot: Any, paths: Iterable[str]) -> Any:
        current = self.snapshot(snapshot.name)
        paths = list(paths)
        if not paths:
            raise _invalid("The update_mask in the UpdateSnapshotRequest must be set.")
        for path in paths:
            if path == "labels":
                current.config.labels.clear()
                current.config.labels.update(snapshot.labels)
            elif path == "expire_time":
                current.config.expire_time.CopyFrom(snapshot.expire_time)
            else:
                raise _invalid(f"Invalid update_mask provided: {path}")
        return current.config

    def delete_snapshot(self, name: str) -> None:
        snapshot = self.snapshot(name)
        del self.snapshots[name]
        topic = self.topics.get(snapshot.config.topic)
        if topic is not None:
            topic.snapshots.discard(name)

    def seek(self, sub_name: str, *, to_ns: int | None = None, snapshot: str = "") -> None:
        """Mark messages acked or unacked in bulk, as the service's ``Seek`` does.

        To a time: the messages published at or after it become unacked (those the
        subscription still holds: unacked ones, acked ones it retains, and those its
        topic retains since), the ones before it acked. To a snapshot: what the
        snapshot holds becomes unacked, everything else acked. Outstanding leases are
        dropped, so their messages are delivered again.
        """
        sub = self.live_subscription(sub_name)
        held: dict[str, Any] = dict(sub.acked)
        held.update({e.message.message_id: e.message for e in sub.backlog.values()})
        if snapshot:
            snap = self.snapshot(snapshot)
            if snap.config.topic != sub.config.topic:
                raise _invalid(
                    f"The snapshot {snapshot} is of topic {snap.config.topic}, not of the "
                    f"subscription's topic {sub.config.topic}."
                )
            wanted = {k: m for k, m in snap.messages.items() if sub.wants(m)}
            rest = {k: m for k, m in held.items() if k not in wanted}
        else:
            assert to_ns is not None
            topic = self.topics.get(sub.config.topic)
            if topic is not None and topic.retention:
                self._prune_log(topic, time.time_ns())
                for message in topic.log:
                    if sub.wants(message):
                        held.setdefault(message.message_id, message)
            wanted = {k: m for k, m in held.items() if m.publish_time.ToNanoseconds() >= to_ns}
            rest = {k: m for k, m in held.items() if k not in wanted}
        sub.backlog.clear()
        sub.by_ack.clear()
        for message in sorted(wanted.values(), key=_publish_order):
            seq = next(self._seq)
            sub.backlog[seq] = _Entry(seq, message)
        sub.acked = rest if sub.config.retain_acked_messages else {}
        sub.poke()

    def delete_subscription(self, name: str) -> None:
        sub = self.subscription(name)
        del self.subscriptions[name]
        topic = self.topics.get(sub.config.topic)
        if topic is not None:
            topic.subscriptions.discard(name)
        sub.poke()

    # ------------------------------------------------------------ delivery

    def _expire(self, sub: _Subscription, now: float) -> None:
        for ack_id, entry in list(sub.by_ack.items()):
            if entry.deadline <= now:
                del sub.by_ack[ack_id]
                entry.ack_id = None
                entry.stream = None

    def take(
        self, sub: _Subscription, max_messages: int, stream: _Stream | None = None
    ) -> list[Any]:
        """Lease up to ``max_messages`` deliverable messages; their ReceivedMessages."""
        now = self.clock()
        self._expire(sub, now)
        budget = max_messages
        room_bytes = 1 << 62
        if stream is not None:
            stream.prune(now)
            room, room_bytes = stream.room()
            budget = min(budget, room)
        if budget <= 0:
            return []
        policy = sub.config.dead_letter_policy
        dead_letter = policy.dead_letter_topic if sub.config.HasField("dead_letter_policy") else ""
        blocked: set[str] = set()
        taken: list[Any] = []
        deadline = stream.deadline if stream is not None else sub.config.ack_deadline_seconds
        forwards: list[_Entry] = []
        # (read once: the leased messages at the front of the backlog are walked past
        # on every pull, as many as the consumer holds)
        ordered = sub.ordered
        for entry in sub.backlog.values():
            if len(taken) >= budget:
                break
            key = entry.key if ordered else ""
            if key:
                if key in blocked:
                    continue
                blocked.add(key)  # one message of a key at a time, in publish order
            if entry.ack_id is not None or entry.available_at > now:
                continue
            if dead_letter and entry.attempts >= policy.max_delivery_attempts:
                forwards.append(entry)
                if key:
                    blocked.discard(key)
                continue
            size = entry.message.ByteSize()
            if taken and size > room_bytes:
                break
            room_bytes -= size
            entry.attempts += 1
            entry.ack_id = f"{uuid.uuid4().hex}-{entry.seq}"
            entry.deadline = now + deadline
            entry.stream = stream
            sub.by_ack[entry.ack_id] = entry
            if stream is not None:
                stream.leased[entry.ack_id] = entry
            received = _pb["ReceivedMessage"](ack_id=entry.ack_id)
            received.message.CopyFrom(entry.message)
            if dead_letter:
                received.delivery_attempt = entry.attempts
            taken.append(received)
        for entry in forwards:
            self._forward(sub, entry, dead_letter)
        return taken

    def _forward(self, sub: _Subscription, entry: _Entry, topic_name: str) -> None:
        """Move a message past its max delivery attempts to the dead-letter topic."""
        del sub.backlog[entry.seq]
        if topic_name not in self.topics:
            log.warning("dead-letter topic %s of %s is gone: message dropped", topic_name, sub)
            return
        copy = _pb["PubsubMessage"]()
        copy.data = entry.message.data
        copy.attributes.update(entry.message.attributes)
        copy.ordering_key = entry.message.ordering_key
        project = _SUBSCRIPTION.match(sub.config.name)
        published = entry.message.publish_time.ToJsonString()
        copy.attributes.update(
            {
                "CloudPubSubDeadLetterSourceDeliveryCount": str(entry.attempts),
                "CloudPubSubDeadLetterSourceSubscription": sub.config.name.rsplit("/", 1)[-1],
                "CloudPubSubDeadLetterSourceSubscriptionProject": project.group(1)
                if project
                else "",
                "CloudPubSubDeadLetterSourceTopicPublishTime": published,
            }
        )
        self.publish(topic_name, [copy])

    def release(self, sub: _Subscription, taken: Iterable[Any]) -> None:
        """Undo the delivery of messages whose answer could not be sent."""
        for received in taken:
            entry = sub.by_ack.pop(received.ack_id, None)
            if entry is not None:
                entry.ack_id = None
                entry.stream = None
                entry.attempts -= 1
        sub.poke()

    def sweep(self) -> None:
        """Expire lapsed leases and dead-letter what reached its max delivery attempts.

        The service does this on its own, whether anyone pulls or not.
        """
        now = self.clock()
        now_ns = time.time_ns()
        for sub in list(self.subscriptions.values()):
            self._expire_retained(sub, now_ns)
            if not sub.by_ack and not sub.config.HasField("dead_letter_policy"):
                continue
            self._expire(sub, now)
            policy = sub.config.dead_letter_policy
            if not sub.config.HasField("dead_letter_policy") or not policy.dead_letter_topic:
                continue
            done = [
                e
                for e in sub.backlog.values()
                if e.ack_id is None and e.attempts >= policy.max_delivery_attempts
            ]
            for entry in done:
                self._forward(sub, entry, policy.dead_letter_topic)

    @staticmethod
    def _expire_retained(sub: _Subscription, now_ns: int) -> None:
        """Drop what is older than the subscription's ``message_retention_duration``."""
        oldest = now_ns - int(sub.retention * 1e9)
        if sub.backlog:
            first = next(iter(sub.backlog.values()))
            if first.message.publish_time.ToNanoseconds() < oldest:
                for seq, entry in list(sub.backlog.items()):
                    if entry.message.publish_time.ToNanoseconds() < oldest:
                        del sub.backlog[seq]
                        if entry.ack_id is not None:
                            sub.by_ack.pop(entry.ack_id, None)
        if sub.acked:
            for key, message in list(sub.acked.items()):
                if message.publish_time.ToNanoseconds() < oldest:
                    del sub.acked[key]

    def next_wakeup(self, sub: _Subscription) -> float | None:
        """When a leased or delayed message of ``sub`` may become deliverable."""
        times = [e.deadline for e in sub.by_ack.values()]
        times += [e.available_at for e in sub.backlog.values() if e.available_at > 0]
        now = self.clock()
        future = [x for x in times if x > now]
        return min(future) if future else None

    def acknowledge(self, sub_name: str, ack_ids: Iterable[str]) -> None:
        """Ack; with exactly-once delivery, an ack id that is no longer valid fails.

        Without it, as the service does, a late or unknown ack id is ignored. With
        it, every such id is reported back (``PERMANENT_FAILURE_INVALID_ACK_ID`` in
        the error's ``ErrorInfo``), the valid ones in the same request still acked.
        """
        sub = self.live_subscription(sub_name)
        now = self.clock()
        failures: dict[str, str] = {}
        for ack_id in ack_ids:
            entry = sub.by_ack.pop(ack_id, None)
            if entry is None:
                failures[ack_id] = "PERMANENT_FAILURE_INVALID_ACK_ID"
                continue
            entry.ack_id = None
            if entry.deadline <= now:  # expired: the ack is too late
                failures[ack_id] = "PERMANENT_FAILURE_INVALID_ACK_ID"
                continue
            sub.backlog.pop(entry.seq, None)
            if sub.config.retain_acked_messages:
                sub.acked[entry.message.message_id] = entry.message
        sub.poke()
        if failures and sub.exactly_once:
            raise _AckIdFailure(failures)

    def modify_ack_deadline(self, sub_name: str, ack_ids: Iterable[str], seconds: int) -> None:
        sub = self.live_subscription(sub_name)
        if not 0 <= seconds <= MAX_ACK_DEADLINE:
            raise _invalid(
                f"Invalid ack deadline given: {seconds}; it must be between 0 and "
                f"{MAX_ACK_DEADLINE} seconds."
            )
        now = self.clock()
        failures: dict[str, str] = {}
        for ack_id in ack_ids:
            entry = sub.by_ack.get(ack_id)
            if entry is None or entry.deadline <= now:
                failures[ack_id] = "PERMANENT_FAILURE_INVALID_ACK_ID"
                continue
            if seconds == 0:
                del sub.by_ack[ack_id]
                entry.ack_id = None
                entry.stream = None
                entry.available_at = now + self._retry_delay(sub, entry)
            else:
                entry.deadline = now + seconds
        sub.poke()
        if failures and sub.exactly_once:
            raise _AckIdFailure(failures)

    def stats(self, sub_name: str) -> dict[str, int]:
        """What a subscription holds, read without leasing anything (acklane's inspection).

        ``backlog``: messages not acked yet (leased ones included); ``leased``: those
        under an ack deadline now; ``delayed``: those waiting out a retry backoff.
        """
        sub = self.subscription(sub_name)
        now = self.clock()
        self._expire(sub, now)
        return {
            "backlog": len(sub.backlog),
            "leased": len(sub.by_ack),
            "delayed": sum(1 for e in sub.backlog.values() if e.available_at > now),
        }

    @staticmethod
    def _retry_delay(sub: _Subscription, entry: _Entry) -> float:
        if not sub.config.HasField("retry_policy"):
            return 0.0
        policy = sub.config.retry_policy
        low = policy.minimum_backoff.ToTimedelta().total_seconds() or 10.0
        high = policy.maximum_backoff.ToTimedelta().total_seconds() or 600.0
        return float(min(low * 2 ** max(entry.attempts - 1, 0), high))


class PubSubServer:
    """The gRPC servicer: the Publisher and Subscriber services on a ``PubSubState``."""

    def __init__(self, state: PubSubState, *, pull_wait: float = PULL_WAIT) -> None:
        self.state = state
        self.pull_wait = pull_wait
        self._server: grpc.aio.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self.port: int | None = None

    # ----------------------------------------------------------- serving

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", 20 * 1024 * 1024),
                ("grpc.max_send_message_length", 20 * 1024 * 1024),
            ]
        )
        server.add_generic_rpc_handlers(self._handlers())
        self.port = server.add_insecure_port(f"{host}:{port}")
        if not self.port:
            raise OSError(f"cannot listen on {host}:{port}")
        await server.start()
        self._server = server
        self._sweeper = asyncio.create_task(self._sweep())
        return self.port

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(0.2)
            try:
                self.state.sweep()
            except Exception:
                log.exception("Pub/Sub emulator: sweep failed")

    async def stop(self, grace: float | None = 0.5) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        if self._server is not None:
            server, self._server = self._server, None
            for sub in self.state.subscriptions.values():
                sub.poke()
            await server.stop(grace)

    async def wait(self) -> None:
        if self._server is not None:
            await self._server.wait_for_termination()

    def _handlers(self) -> tuple[grpc.GenericRpcHandler, ...]:
        def unary(fn: Any, request: str, response: str | None) -> grpc.RpcMethodHandler:
            out = _pb[response] if response else empty_pb2.Empty
            return grpc.unary_unary_rpc_method_handler(
                self._guard(fn),
                request_deserializer=_pb[request].FromString,
                response_serializer=out.SerializeToString,
            )

        publisher = {
            "CreateTopic": unary(self.create_topic, "Topic", "Topic"),
            "GetTopic": unary(self.get_topic, "GetTopicRequest", "Topic"),
            "ListTopics": unary(self.list_topics, "ListTopicsRequest", "ListTopicsResponse"),
            "ListTopicSubscriptions": unary(
                self.list_topic_subscriptions,
                "ListTopicSubscriptionsRequest",
                "ListTopicSubscriptionsResponse",
            ),
            "DeleteTopic": unary(self.delete_topic, "DeleteTopicRequest", None),
            "Publish": unary(self.publish, "PublishRequest", "PublishResponse"),
            "UpdateTopic": unary(self.update_topic, "UpdateTopicRequest", "Topic"),
            "DetachSubscription": unary(
                self.detach_subscription,
                "DetachSubscriptionRequest",
                "DetachSubscriptionResponse",
            ),
            "ListTopicSnapshots": unary(
                self.list_topic_snapshots,
                "ListTopicSnapshotsRequest",
                "ListTopicSnapshotsResponse",
            ),
        }
        subscriber = {
            "CreateSubscription": unary(self.create_subscription, "Subscription", "Subscription"),
            "GetSubscription": unary(
                self.get_subscription, "GetSubscriptionRequest", "Subscription"
            ),
            "UpdateSubscription": unary(
                self.update_subscription, "UpdateSubscriptionRequest", "Subscription"
            ),
            "ListSubscriptions": unary(
                self.list_subscriptions, "ListSubscriptionsRequest", "ListSubscriptionsResponse"
            ),
            "DeleteSubscription": unary(
                self.delete_subscription, "DeleteSubscriptionRequest", None
            ),
            "Pull": unary(self.pull, "PullRequest", "PullResponse"),
            "Acknowledge": unary(self.acknowledge, "AcknowledgeRequest", None),
            "ModifyAckDeadline": unary(self.modify_ack_deadline, "ModifyAckDeadlineRequest", None),
            "ModifyPushConfig": unary(self.modify_push_config, "ModifyPushConfigRequest", None),
            "CreateSnapshot": unary(self.create_snapshot, "CreateSnapshotRequest", "Snapshot"),
            "GetSnapshot": unary(self.get_snapshot, "GetSnapshotRequest", "Snapshot"),
            "UpdateSnapshot": unary(self.update_snapshot, "UpdateSnapshotRequest", "Snapshot"),
            "ListSnapshots": unary(
                self.list_snapshots, "ListSnapshotsRequest", "ListSnapshotsResponse"
            ),
            "DeleteSnapshot": unary(self.delete_snapshot, "DeleteSnapshotRequest", None),
            "Seek": unary(self.seek, "SeekRequest", "SeekResponse"),
            "StreamingPull": grpc.stream_stream_rpc_method_handler(
                self.streaming_pull,
                request_deserializer=_pb["StreamingPullRequest"].FromString,
                response_serializer=_pb["StreamingPullResponse"].SerializeToString,
            ),
        }
        inspector = {
            # JSON in and out, no protobuf: ``{"subscription": path}`` -> :meth:`stats`.
            INSPECT_STATS.rsplit("/", 1)[1]: grpc.unary_unary_rpc_method_handler(
                self._inspect_stats
            ),
        }
        iam = {
            name: grpc.unary_unary_rpc_method_handler(self._refuse_iam)
            for name in ("SetIamPolicy", "GetIamPolicy", "TestIamPermissions")
        }
        handlers = [
            grpc.method_handlers_generic_handler("google.pubsub.v1.Publisher", publisher),
            grpc.method_handlers_generic_handler("google.pubsub.v1.Subscriber", subscriber),
            grpc.method_handlers_generic_handler(INSPECT_STATS.split("/")[1], inspector),
            grpc.method_handlers_generic_handler("google.iam.v1.IAMPolicy", iam),
        ]
        handlers.append(self.state.schemas.handler(self._guard))
        return tuple(handlers)

    @staticmethod
    async def _refuse_iam(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED,
            "acklane's Pub/Sub emulator does not implement IAM policies (google.iam.v1."
            "IAMPolicy); neither does Google's emulator. Test access control on the service.",
        )
        raise AssertionError("unreachable")  # abort raises

    async def _inspect_stats(
        self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]
    ) -> bytes:
        try:
            name = json.loads(request)["subscription"]
            return json.dumps(self.state.stats(str(name))).encode()
        except _Abort as exc:
            await context.abort(exc.code, exc.message)
        except (ValueError, KeyError, TypeError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad request: {exc}")
        raise AssertionError("unreachable")  # abort raises

    @staticmethod
    def _guard(fn: Any) -> Any:
        with_context = fn.__name__ == "pull"

        async def call(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            try:
                return await (fn(request, context) if with_context else fn(request))
            except _AckIdFailure as exc:
                await context.abort(exc.code, exc.message, exc.trailing_metadata())
            except (_Abort, SchemaError) as exc:
                await context.abort(exc.code, exc.message)

        return call

    # ----------------------------------------------------------- publisher

    async def create_topic(self, request: Any) -> Any:
        return self.state.create_topic(request)

    async def get_topic(self, request: Any) -> Any:
        return self.state.topic(request.topic).config

    async def list_topics(self, request: Any) -> Any:
        project = _project(request.project)
        names = sorted(n for n in self.state.topics if n.startswith(f"projects/{project}/"))
        page, token = paginate(names, request.page_size, request.page_token)
        return _pb["ListTopicsResponse"](
            topics=[self.state.topics[n].config for n in page], next_page_token=token
        )

    async def list_topic_subscriptions(self, request: Any) -> Any:
        names = sorted(self.state.topic(request.topic).subscriptions)
        page, token = paginate(names, request.page_size, request.page_token)
        return _pb["ListTopicSubscriptionsResponse"](subscriptions=page, next_page_token=token)

    async def delete_topic(self, request: Any) -> Any:
        self.state.delete_topic(request.topic)
        return empty_pb2.Empty()

    async def publish(self, request: Any) -> Any:
        ids = self.state.publish(request.topic, request.messages)
        return _pb["PublishResponse"](message_ids=ids)

    async def update_topic(self, request: Any) -> Any:
        return self.state.update_topic(request.topic, request.update_mask.paths)

    async def detach_subscription(self, request: Any) -> Any:
        self.state.detach_subscription(request.subscription)
        return _pb["DetachSubscriptionResponse"]()

    async def list_topic_snapshots(self, request: Any) -> Any:
        names = sorted(self.state.topic(request.topic).snapshots)
        page, token = paginate(names, request.page_size, request.page_token)
        return _pb["ListTopicSnapshotsResponse"](snapshots=page, next_page_token=token)

    # ----------------------------------------------------------- subscriber

    async def create_subscription(self, request: Any) -> Any:
        return self.state.create_subscription(request)

    async def get_subscription(self, request: Any) -> Any:
        return self.state.subscription(request.subscription).config

    async def update_subscription(self, request: Any) -> Any:
        return self.state.update_subscription(request.subscription, request.update_mask.paths)

    async def list_subscriptions(self, request: Any) -> Any:
        project = _project(request.project)
        names = sorted(n for n in self.state.subscriptions if n.startswith(f"projects/{project}/"))
        page, token = paginate(names, request.page_size, request.page_token)
        return _pb["ListSubscriptionsResponse"](
            subscriptions=[self.state.subscriptions[n].config for n in page],
            next_page_token=token,
        )

    async def delete_subscription(self, request: Any) -> Any:
        self.state.delete_subscription(request.subscription)
        return empty_pb2.Empty()

    async def acknowledge(self, request: Any) -> Any:
        if not request.ack_ids:
            raise _invalid("No ack ids were given.")
        self.state.acknowledge(request.subscription, request.ack_ids)
        return empty_pb2.Empty()

    async def modify_ack_deadline(self, request: Any) -> Any:
        if not request.ack_ids:
            raise _invalid("No ack ids were given.")
        self.state.modify_ack_deadline(
            request.subscription, request.ack_ids, request.ack_deadline_seconds
        )
        return empty_pb2.Empty()

    async def modify_push_config(self, request: Any) -> Any:
        if request.push_config.push_endpoint:
            raise _unimplemented("push subscriptions (push_config.push_endpoint)")
        sub = self.state.subscription(request.subscription)
        sub.config.ClearField("push_config")  # an empty push config: a pull subscription
        return empty_pb2.Empty()

    async def create_snapshot(self, request: Any) -> Any:
        return self.state.create_snapshot(request.name, request.subscription, dict(request.labels))

    async def get_snapshot(self, request: Any) -> Any:
        return self.state.snapshot(request.snapshot).config

    async def update_snapshot(self, request: Any) -> Any:
        return self.state.update_snapshot(request.snapshot, request.update_mask.paths)

    async def list_snapshots(self, request: Any) -> Any:
        project = _project(request.project)
        names = sorted(n for n in self.state.snapshots if n.startswith(f"projects/{project}/"))
        page, token = paginate(names, request.page_size, request.page_token)
        return _pb["ListSnapshotsResponse"](
            snapshots=[self.state.snapshots[n].config for n in page], next_page_token=token
        )

    async def delete_snapshot(self, request: Any) -> Any:
        self.state.delete_snapshot(request.snapshot)
        return empty_pb2.Empty()

    async def seek(self, request: Any) -> Any:
        target = request.WhichOneof("target")
        if target == "time":
            self.state.seek(request.subscription, to_ns=request.time.ToNanoseconds())
        elif target == "snapshot":
            self.state.seek(request.subscription, snapshot=request.snapshot)
        else:
            raise _invalid("A seek needs a time or a snapshot.")
        return _pb["SeekResponse"]()

    async def pull(self, request: Any, context: Any = None) -> Any:
        if request.max_messages <= 0:
            raise _invalid("max_messages must be a positive integer.")
        state = self.state
        sub = state.live_subscription(request.subscription)
        give_up = state.clock() + (0 if request.return_immediately else self.pull_wait)
        while True:
            sub.changed.clear()
            taken = state.take(sub, min(request.max_messages, 1000))
            if taken and context is not None and (context.cancelled() or context.done()):
                state.release(sub, taken)  # nobody will read this answer
                return _pb["PullResponse"]()
            if taken or state.subscriptions.get(sub.config.name) is not sub:
                return _pb["PullResponse"](received_messages=taken)
            left = give_up - state.clock()
            if left <= 0:
                return _pb["PullResponse"]()
            await _wait(sub, min(left, _until(state, sub)))

    async def streaming_pull(
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        state = self.state
        try:
            first = await anext(aiter(requests))
        except StopAsyncIteration:
            return
        try:
            sub = state.live_subscription(first.subscription)
            deadline = first.stream_ack_deadline_seconds
            if not state.min_ack_deadline <= deadline <= MAX_ACK_DEADLINE:
                raise _invalid(
                    f"Invalid stream_ack_deadline_seconds: {deadline}; it must be between "
                    f"{state.min_ack_deadline} and {MAX_ACK_DEADLINE} seconds."
                )
            self._stream_control(sub, first)
        except _Abort as exc:
            await context.abort(exc.code, exc.message)
            return
        stream = _Stream(deadline, first.max_outstanding_messages, first.max_outstanding_bytes)
        closed = asyncio.Event()

        async def read() -> None:
            try:
                async for request in requests:
                    if request.stream_ack_deadline_seconds:
                        stream.deadline = max(
                            state.min_ack_deadline,
                            min(request.stream_ack_deadline_seconds, MAX_ACK_DEADLINE),
                        )
                    try:
                        self._stream_control(sub, request)
                    except _Abort as exc:
                        log.warning("StreamingPull control request refused: %s", exc.message)
            finally:
                closed.set()
                sub.poke()

        reader = asyncio.create_task(read())
        properties = t.StreamingPullResponse.SubscriptionProperties.pb()(
            message_ordering_enabled=sub.ordered, exactly_once_delivery_enabled=sub.exactly_once
        )
        try:
            while not closed.is_set() and state.subscriptions.get(sub.config.name) is sub:
                sub.changed.clear()
                taken = state.take(sub, 1000, stream)
                if taken:
                    response = _pb["StreamingPullResponse"](received_messages=taken)
                    response.subscription_properties.CopyFrom(properties)
                    yield response
                    continue
                await _wait(sub, _until(state, sub), closed)
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)

    def _stream_control(self, sub: _Subscription, request: Any) -> None:
        name = sub.config.name
        if request.ack_ids:
            self.state.acknowledge(name, request.ack_ids)
        if len(request.modify_deadline_ack_ids) != len(request.modify_deadline_seconds):
            raise _invalid("modify_deadline_seconds and modify_deadline_ack_ids differ in length")
        by_seconds: dict[int, list[str]] = {}
        for ack_id, seconds in zip(
            request.modify_deadline_ack_ids, request.modify_deadline_seconds, strict=True
        ):
            by_seconds.setdefault(seconds, []).append(ack_id)
        for seconds, ack_ids in by_seconds.items():
            self.state.modify_ack_deadline(name, ack_ids, seconds)


def _until(state: PubSubState, sub: _Subscription) -> float:
    wake = state.next_wakeup(sub)
    return 1.0 if wake is None else max(min(wake - state.clock(), 1.0), 0.001)


async def _wait(sub: _Subscription, seconds: float, closed: asyncio.Event | None = None) -> None:
    waiters = [asyncio.ensure_future(sub.changed.wait())]
    if closed is not None:
        waiters.append(asyncio.ensure_future(closed.wait()))
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


def _project(name: str) -> str:
    match = _PROJECT.match(name)
    if match is None:
        raise _invalid(f"Invalid [projects] name: ({name})")
    return match.group(1)


_TOPIC_UPDATABLE = (
    "labels",
    "message_storage_policy",
    "kms_key_name",
    "schema_settings",
    "message_retention_duration",
    "ingestion_data_source_settings",
    "message_transforms",
)
_SUBSCRIPTION_UPDATABLE = (
    "ack_deadline_seconds",
    "dead_letter_policy",
    "retry_policy",
    "labels",
    "message_retention_duration",
    "retain_acked_messages",
    "enable_exactly_once_delivery",
    "expiration_policy",
    "push_config",
)


def _refuse_unmodelled_subscription(sub: Any) -> None:
    """The subscription features the emulator does not model, refused by name."""
    if sub.HasField("push_config") and sub.push_config.push_endpoint:
        raise _unimplemented("push subscriptions (push_config.push_endpoint)")
    for name in ("bigquery_config", "cloud_storage_config", "bigtable_config"):
        if sub.HasField(name):
            raise _unimplemented(f"export subscriptions ({name})")
    if len(sub.message_transforms):
        raise _unimplemented("single message transforms (message_transforms)")


def _publish_order(message: Any) -> tuple[int, int]:
    return message.publish_time.ToNanoseconds(), int(message.message_id or 0)


def relaxed_from_env() -> bool:
    return os.environ.get(RELAXED_ENV, "").strip().lower() in ("1", "true", "yes", "on")


class ServerThread:
    """The emulator on a thread of its own, with its own event loop (in-process use)."""

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, relaxed: bool = False) -> None:
        self.host = host
        self.requested_port = port
        self.relaxed = relaxed
        self.port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: PubSubServer | None = None

    @property
    def endpoint(self) -> str:
        if self.port is None:
            raise RuntimeError("the Pub/Sub emulator thread is not started")
        return f"{self.host}:{self.port}"

    def start(self) -> None:
        if self._thread is not None:
            return
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            try:
                server = PubSubServer(PubSubState(relaxed=self.relaxed))
                self.port = loop.run_until_complete(server.start(self.host, self.requested_port))
                self._server = server
            except BaseException as exc:
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(server.stop(0))
                loop.close()

        self._thread = threading.Thread(target=run, name="acklane-pubsub-emulator", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread = None
            raise failure[0]

    def stop(self) -> None:
        thread, self._thread = self._thread, None
        if thread is None or self._loop is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        thread.join(timeout=10)
        self.port = None
