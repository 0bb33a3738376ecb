"""acklane's Pub/Sub emulator's state: what the Publisher and Subscriber services do, in memory.

The gRPC service on it is :mod:`._server`.

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

import itertools
import logging
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import grpc

from ._filter import FilterError, compile_filter
from ._model import (
    _PROJECT,
    _SNAPSHOT,
    _SUBSCRIPTION,
    _TOPIC,
    DEFAULT_ACK_DEADLINE,
    DELETED_TOPIC,
    MAX_ACK_DEADLINE,
    MAX_SUBSCRIPTION_RETENTION,
    MAX_TOPIC_RETENTION,
    MIN_RETENTION,
    _Entry,
    _Snapshot,
    _Stream,
    _Subscription,
    _Topic,
)
from ._schemas import SchemaRegistry
from ._status import _Abort, _AckIdFailure, _invalid, _not_found, _unimplemented
from ._types import pb

__all__ = ["PubSubState"]

log = logging.getLogger(__name__)


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
        stored = pb["Topic"]()
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
        updated = pb["Topic"]()
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
            stored = pb["PubsubMessage"]()
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
        stored = pb["Subscription"]()
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
        updated = pb["Subscription"]()
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
        config = pb["Snapshot"](name=name, topic=sub.config.topic, labels=labels)
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
            received = pb["ReceivedMessage"](ack_id=entry.ack_id)
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
        copy = pb["PubsubMessage"]()
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
