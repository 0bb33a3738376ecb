"""The built-in, in-process ``memory`` connector: a small Kafka look-alike.

:class:`MemoryBroker` keeps named topics of N partitions in memory (one
process-global broker per name), consumer groups with committed offsets, and
per-offset delivery counts. :class:`MemoryProducer` consumes it with Kafka's
semantics as acklane maps them (see the Kafka row of the connectors spec):

- lane = ``(topic, partition)``; ``advance`` commits offset+1 of the last
  committable item of each partition (cumulative commit);
- a failed item, or one nobody received (``acked = failed = rejected = 0``),
  holds its partition: nothing at or after it is committed, across batches,
  and the consumer is sought back to the lowest held offset so it comes again;
- a rejected item is copied to ``dlq_topic`` (original key, value and headers
  plus origin and reason headers) before the commit passes it; with no DLQ it
  is committed past and counted as dropped.

A new consumer starts at its group's committed offset, or at the beginning of
the partition (``earliest``): messages published before the pipeline starts are
consumed. Publishing is thread-safe; waiting consumers are woken on their own
event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
import uuid
import zlib
from collections.abc import AsyncIterator, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..deadletter import reject_reason
from ..message import RawMessage
from ..producer import AdvanceItem, AdvanceOutcome, SharedStreamProducer
from . import Connector

__all__ = [
    "DLQ_ORIGIN_OFFSET",
    "DLQ_ORIGIN_PARTITION",
    "DLQ_ORIGIN_TOPIC",
    "DLQ_REASON",
    "MemoryBroker",
    "MemoryConfig",
    "MemoryConnector",
    "MemoryConsumer",
    "MemoryGroupStats",
    "MemoryPayload",
    "MemoryProducer",
    "MemoryRecord",
]

#: Headers added to a dead-lettered copy.
DLQ_ORIGIN_TOPIC = "acklane.origin.topic"
DLQ_ORIGIN_PARTITION = "acklane.origin.partition"
DLQ_ORIGIN_OFFSET = "acklane.origin.offset"
DLQ_REASON = "acklane.reject.reason"

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class MemoryRecord:
    """One stored message; immutable once published."""

    topic: str
    partition: int
    offset: int
    value: bytes
    key: str | None
    headers: Mapping[str, str]
    timestamp: float
    tp: TopicPartition
    message_id: str  # "memory:<broker incarnation>/topic/partition/offset"


@dataclass(slots=True)
class MemoryGroupStats:
    """Counters of one consumer group, for demos and tests."""

    committed: dict[TopicPartition, int] = field(default_factory=dict)
    delivered: int = 0
    redelivered: int = 0
    dead_lettered: int = 0
    dropped: int = 0


class _Topic:
    __slots__ = ("name", "partitions", "round_robin")

    def __init__(self, name: str, partitions: int) -> None:
        self.name = name
        self.partitions: list[list[MemoryRecord]] = [[] for _ in range(partitions)]
        self.round_robin = itertools.count()


class MemoryBroker:
    """A named in-process broker; ``MemoryBroker.get(name)`` returns the same one each time."""

    _registry: ClassVar[dict[str, MemoryBroker]] = {}
    _registry_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, name: str, *, default_partitions: int = 3) -> None:
        self.name = name
        #: Names this broker's life: offsets restart at 0 in every process, so a
        #: message identity without it would be reused by a later run's messages
        #: (and an event store kept across runs would take them for duplicates).
        self.incarnation = uuid.uuid4().hex[:12]
        self.default_partitions = default_partitions
        self._lock = threading.Lock()
        self._topics: dict[str, _Topic] = {}
        self._committed: dict[tuple[str, str, int], int] = {}
        self._attempts: dict[tuple[str, str, int], dict[int, int]] = {}
        self._stats: dict[str, MemoryGroupStats] = {}
        self._consumers: set[MemoryConsumer] = set()

    # -- the registry

    @classmethod
    def get(cls, name: str = "default") -> MemoryBroker:
        """The process-wide broker of that name, created on first use."""
        with cls._registry_lock:
            broker = cls._registry.get(name)
            if broker is None:
                broker = cls._registry[name] = cls(name)
            return broker

    @classmethod
    def remove(cls, name: str) -> None:
        """Forget a broker (tests); its consumers keep their own reference."""
        with cls._registry_lock:
            cls._registry.pop(name, None)

    # -- topics and publishing

    def create_topic(self, topic: str, partitions: int | None = None) -> int:
        """Create ``topic`` if missing; returns its partition count (an existing one keeps its)."""
        with self._lock:
            return len(self._topic(topic, partitions).partitions)

    def _topic(self, name: str, partitions: int | None = None) -> _Topic:
        topic = self._topics.get(name)
        if topic is None:
            count = partitions or self.default_partitions
            if count < 1:
                raise ValueError(f"topic {name!r}: partitions must be at least 1, got {count}")
            topic = self._topics[name] = _Topic(name, count)
        return topic

    def topics(self) -> dict[str, int]:
        """Topic names and their partition counts."""
        with self._lock:
            return {name: len(t.partitions) for name, t in self._topics.items()}

    def publish(
        self,
        topic: str,
        value: bytes | str,
        key: str | bytes | None = None,
        headers: Mapping[str, str] | None = None,
        *,
        partition: int | None = None,
    ) -> tuple[int, int]:
        """Append a message; returns ``(partition, offset)``.

        The partition is the key's hash (stable across processes) modulo the
        partition count, round-robin without a key, or the one given.
        """
        data = value.encode("utf-8") if isinstance(value, str) else bytes(value)
        key_text = key.decode("utf-8", "replace") if isinstance(key, bytes) else key
        with self._lock:
            t = self._topic(topic)
            count = len(t.partitions)
            if partition is None:
                if key_text is None:
                    partition = next(t.round_robin) % count
                else:
                    partition = zlib.crc32(key_text.encode("utf-8")) % count
            elif not 0 <= partition < count:
                raise ValueError(f"topic {topic!r} has no partition {partition} (0..{count - 1})")
            log = t.partitions[partition]
            offset = len(log)
            record = MemoryRecord(
                topic,
                partition,
                offset,
                data,
                key_text,
                MappingProxyType(dict(headers or {})),
                time.time(),
                (topic, partition),
                f"memory:{self.incarnation}/{topic}/{partition}/{offset}",
            )
            log.append(record)
            waiters = [c for c in self._consumers if topic in c.topics]
        for consumer in waiters:
            consumer._wake()
        return partition, record.offset

    def records(self, topic: str, partition: int | None = None) -> list[MemoryRecord]:
        """Every record of a topic (all partitions, in partition then offset order)."""
        with self._lock:
            t = self._topics.get(topic)
            if t is None:
                return []
            logs = t.partitions if partition is None else [t.partitions[partition]]
            return [r for log in logs for r in log]

    def end_offsets(self, topic: str) -> dict[int, int]:
        """The next offset of each partition of ``topic``."""
        with self._lock:
            t = self._topics.get(topic)
            return {} if t is None else {p: len(log) for p, log in enumerate(t.partitions)}

    # -- consumer groups

    def consumer(
        self, group_id: str, topics: Iterable[str], *, partitions: int | None = None
    ) -> MemoryConsumer:
        """A consumer assigned every partition of ``topics`` (missing topics are created)."""
        consumer = MemoryConsumer(self, group_id, tuple(topics), partitions)
        with self._lock:
            self._consumers.add(consumer)
        return consumer

    def committed(self, group_id: str, topic: str, partition: int) -> int:
        """The group's committed offset (the next one to consume), 0 when none."""
        with self._lock:
            return self._committed.get((group_id, topic, partition), 0)

    def lag(self, group_id: str, topic: str) -> int:
        """Messages of ``topic`` the group has not committed past."""
        with self._lock:
            t = self._topics.get(topic)
            if t is None:
                return 0
            return sum(
                len(log) - self._committed.get((group_id, topic, p), 0)
                for p, log in enumerate(t.partitions)
            )

    def stats(self, group_id: str) -> MemoryGroupStats:
        """A snapshot of the group's counters and committed offsets."""
        with self._lock:
            s = self._stats.get(group_id) or MemoryGroupStats()
            committed = {
                (topic, p): offset
                for (group, topic, p), offset in self._committed.items()
                if group == group_id
            }
            return MemoryGroupStats(
                committed, s.delivered, s.redelivered, s.dead_lettered, s.dropped
            )

    def _group_stats(self, group_id: str) -> MemoryGroupStats:
        s = self._stats.get(group_id)
        if s is None:
            s = self._stats[group_id] = MemoryGroupStats()
        return s


class MemoryConsumer:
    """One group member's view: positions per partition, seek, commit, and waiting."""

    def __init__(
        self,
        broker: MemoryBroker,
        group_id: str,
        topics: tuple[str, ...],
        partitions: int | None,
    ) -> None:
        self.broker = broker
        self.group_id = group_id
        self.topics = frozenset(topics)
        self._positions: dict[TopicPartition, int] = {}
        self._epochs: dict[TopicPartition, int] = {}
        self._seek_offsets: dict[TopicPartition, int] = {}
        self._closed = False
        self._rotation = 0
        self._waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None = None
        self._signalled = False
        self._attempts: dict[TopicPartition, dict[int, int]] = {}
        with broker._lock:
            self._stats = broker._group_stats(group_id)
            for topic in sorted(self.topics):
                t = broker._topic(topic, partitions)
                for p in range(len(t.partitions)):
                    tp = (topic, p)
                    self._positions[tp] = broker._committed.get((group_id, topic, p), 0)
                    self._epochs[tp] = 0

    @property
    def assignment(self) -> list[TopicPartition]:
        return list(self._positions)

    def position(self, tp: TopicPartition) -> int:
        return self._positions[tp]

    def epoch(self, tp: TopicPartition) -> int:
        """How many times ``tp`` has been sought; records carry the epoch they were read in."""
        return self._epochs[tp]

    def seek_offset(self, tp: TopicPartition) -> int:
        return self._seek_offsets.get(tp, -1)

    def poll(self, max_records: int) -> list[tuple[MemoryRecord, int]]:
        """Up to ``max_records`` ``(record, epoch)`` pairs past the positions; never blocks."""
        out: list[tuple[MemoryRecord, int]] = []
        broker = self.broker
        with broker._lock:
            self._signalled = False
            tps = list(self._positions)
            n = len(tps)
            start = self._rotation % n if n else 0
            self._rotation += 1
            for i in range(n):
                if len(out) >= max_records:
                    break
                tp = tps[(start + i) % n]
                log = broker._topics[tp[0]].partitions[tp[1]]
                pos = self._positions[tp]
                if pos >= len(log):
                    continue
                take = log[pos : pos + (max_records - len(out))]
                self._positions[tp] = pos + len(take)
                epoch = self._epochs[tp]
                out.extend((record, epoch) for record in take)
        return out

    def has_data(self) -> bool:
        broker = self.broker
        with broker._lock:
            return self._signalled or any(
                pos < len(broker._topics[tp[0]].partitions[tp[1]])
                for tp, pos in self._positions.items()
            )

    def record_delivery(self, record: MemoryRecord) -> int:
        """Count one delivery of ``record`` to the group; returns its delivery attempt.

        Only the consumer's own event loop touches delivery counts, so no lock.
        """
        counts = self._attempts.get(record.tp)
        if counts is None:
            key = (self.group_id, record.topic, record.partition)
            counts = self._attempts[record.tp] = self.broker._attempts.setdefault(key, {})
        offset = record.offset
        attempt = counts.get(offset, 0) + 1
        counts[offset] = attempt
        stats = self._stats
        stats.delivered += 1
        if attempt > 1:
            stats.redelivered += 1
        return attempt

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Read ``tp`` from ``offset`` next; wakes a waiting poll."""
        if tp not in self._positions:
            raise KeyError(f"{tp} is not assigned to this consumer")
        with self.broker._lock:
            self._positions[tp] = offset
            self._epochs[tp] += 1
            self._seek_offsets[tp] = offset
            self._signalled = True
        self._wake()

    def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Store the group's committed offsets (the next offset to consume, per partition)."""
        broker = self.broker
        with broker._lock:
            for (topic, p), offset in offsets.items():
                broker._committed[(self.group_id, topic, p)] = offset
                counts = broker._attempts.get((self.group_id, topic, p))
                if counts:
                    for old in [o for o in counts if o < offset]:
                        del counts[old]

    def count(self, *, dead_lettered: int = 0, dropped: int = 0) -> None:
        with self.broker._lock:
            stats = self.broker._group_stats(self.group_id)
            stats.dead_lettered += dead_lettered
            stats.dropped += dropped

    async def wait(self, max_wait: float) -> None:
        """Return when a poll may find something (new message, seek) or after ``max_wait`` s."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self.broker._lock:
            self._waiter = (loop, future)
        try:
            if self.has_data():
                return
            try:
                async with asyncio.timeout(max_wait):
                    await future
            except TimeoutError:
                pass
        finally:
            with self.broker._lock:
                if self._waiter is not None and self._waiter[1] is future:
                    self._waiter = None

    def _wake(self) -> None:
        with self.broker._lock:
            waiter, self._waiter = self._waiter, None
        if waiter is None:
            return
        loop, future = waiter
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            loop.call_soon_threadsafe(_resolve, future)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self.broker._lock:
            self.broker._consumers.discard(self)
        self._wake()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


# -- configuration and connector ------------------------------------------------------


class MemoryConfig(BaseModel):
    """The ``connector: memory`` stream block."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    broker: str = Field(default="default", min_length=1)
    topics: list[str] = Field(min_length=1)
    group_id: str = Field(default="acklane", min_length=1)
    partitions: int = Field(default=3, ge=1, le=10_000)
    dlq_topic: str | None = Field(default=None, min_length=1)
    batch_size: int = Field(default=256, ge=1, le=1_000_000)
    poll_interval: float = Field(default=1.0, gt=0)

    @field_validator("topics")
    @classmethod
    def _topics_named(cls, topics: list[str]) -> list[str]:
        for topic in topics:
            if not topic:
                raise ValueError("topic names must not be empty")
        duplicates = sorted({t for t in topics if topics.count(t) > 1})
        if duplicates:
            raise ValueError(f"topics listed twice: {', '.join(duplicates)}")
        return topics

    @model_validator(mode="after")
    def _dlq_is_elsewhere(self) -> MemoryConfig:
        if self.dlq_topic is not None and self.dlq_topic in self.topics:
            raise ValueError(
                f"dlq_topic {self.dlq_topic!r} is also consumed (topics); dead-lettered "
                "messages would come straight back"
            )
        return self


class MemoryPayload(NamedTuple):
    """The broker payload of one delivery: the record, and the seek epoch it was read in."""

    record: MemoryRecord
    epoch: int

    @property
    def tp(self) -> TopicPartition:
        return self.record.tp

    @property
    def offset(self) -> int:
        return self.record.offset


class MemoryProducer(SharedStreamProducer):
    """One group's consumer of a :class:`MemoryBroker`, with Kafka's commit semantics."""

    def __init__(self, config: MemoryConfig) -> None:
        self.config = config
        self._consumer: MemoryConsumer | None = None
        # Offsets held per partition (failed, or nobody received them): the commit never
        # passes the lowest until a later delivery of it resolves committably.
        self._held: dict[TopicPartition, set[int]] = {}
        self._committed: dict[TopicPartition, int] = {}

    @property
    def broker(self) -> MemoryBroker:
        return MemoryBroker.get(self.config.broker)

    @property
    def stats(self) -> MemoryGroupStats:
        return self.broker.stats(self.config.group_id)

    def counters(self) -> Mapping[str, float]:
        s = self.stats
        return {
            "delivered": s.delivered,
            "redelivered": s.redelivered,
            "dead_lettered": s.dead_lettered,
            "dropped": s.dropped,
        }

    def held_offsets(self) -> dict[TopicPartition, list[int]]:
        """The offsets holding each partition back, lowest first (observability)."""
        return {tp: sorted(held) for tp, held in self._held.items() if held}

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        config = self.config
        consumer = self.broker.consumer(
            config.group_id, config.topics, partitions=config.partitions
        )
        self._consumer = consumer
        for tp in consumer.assignment:
            self._committed[tp] = consumer.position(tp)
        try:
            while True:
                batch = consumer.poll(config.batch_size)
                if not batch:
                    await consumer.wait(config.poll_interval)
                    continue
                epochs = consumer._epochs
                for record, epoch in batch:
                    if epoch != epochs[record.tp] and record.offset >= consumer.seek_offset(
                        record.tp
                    ):
                        continue  # sought back over it while it sat here: it comes again
                    message = RawMessage(
                        record.value,
                        record.headers,
                        record.key,
                        record.message_id,
                        None,
                        consumer.record_delivery(record),
                        record.topic,
                        record,
                    )
                    yield message, MemoryPayload(record, epoch)
                # One batch at most between two turns of the event loop.
                await asyncio.sleep(0)
        finally:
            consumer.close()

    def get_advance_lane(self, broker_payload: Any) -> Hashable:
        payload: MemoryPayload = broker_payload
        return payload.record.tp

    def message_id(self, broker_payload: Any) -> str | None:
        payload: MemoryPayload = broker_payload
        return payload.record.message_id

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        consumer = self._consumer
        if consumer is None:
            raise RuntimeError("advance() called before open_stream() opened the consumer")
        committed = self._committed
        held_by_tp = self._held
        candidates: dict[TopicPartition, int] = {}
        rejected: dict[TopicPartition, dict[int, tuple[MemoryPayload, AdvanceOutcome]]] = {}
        to_seek: set[TopicPartition] = set()
        for payload, outcome in batch:
            record = payload.record
            tp = record.tp
            offset = record.offset
            if offset < committed.get(tp, 0):
                continue  # a stale copy of something already committed past
            held = held_by_tp.get(tp)
            if held and offset > min(held):
                # Behind a held record: it comes again after the seek and is judged
                # then. Acting on it now (a DLQ copy, a hold) would be forgotten.
                continue
            if outcome.failed or not (outcome.acked or outcome.rejected):
                # Failed, or nobody received it: hold the partition at this offset.
                held_by_tp.setdefault(tp, set()).add(offset)
                # Seek unless a seek made after this copy was read already covers it.
                if payload.epoch == consumer.epoch(tp) or consumer.seek_offset(tp) > offset:
                    to_seek.add(tp)
                continue
            if held:
                held.discard(offset)
            if offset >= candidates.get(tp, 0):
                candidates[tp] = offset + 1
            if outcome.rejected:
                rejected.setdefault(tp, {})[offset] = (payload, outcome)
            elif rejected:
                rejected.get(tp, {}).pop(offset, None)  # a later copy was accepted

        commits: dict[TopicPartition, int] = {}
        for tp, candidate in candidates.items():
            target = min(candidate, min(held_by_tp.get(tp) or (candidate,)))
            if target > committed.get(tp, 0):
                commits[tp] = target
        if commits:
            self._dead_letter(consumer, commits, rejected)
            consumer.commit(commits)
            committed.update(commits)
        for tp in to_seek:
            consumer.seek(tp, min(held_by_tp[tp]))

    def _dead_letter(
        self,
        consumer: MemoryConsumer,
        commits: Mapping[TopicPartition, int],
        rejected: Mapping[TopicPartition, Mapping[int, tuple[MemoryPayload, AdvanceOutcome]]],
    ) -> None:
        """Copy the rejected items the commit is about to pass to the DLQ, or count them."""
        dlq = self.config.dlq_topic
        dead = dropped = 0
        for tp, target in commits.items():
            start = self._committed.get(tp, 0)
            for offset in sorted(rejected.get(tp, {})):
                if not start <= offset < target:
                    continue
                payload, outcome = rejected[tp][offset]
                if dlq is None:
                    dropped += 1
                    continue
                record = payload.record
                headers = dict(record.headers)
                headers[DLQ_ORIGIN_TOPIC] = record.topic
                headers[DLQ_ORIGIN_PARTITION] = str(record.partition)
                headers[DLQ_ORIGIN_OFFSET] = str(record.offset)
                headers[DLQ_REASON] = reject_reason(outcome.reject_reasons, outcome.rejected)
                consumer.broker.publish(dlq, record.value, record.key, headers)
                dead += 1
        if dead or dropped:
            consumer.count(dead_lettered=dead, dropped=dropped)

    async def aclose(self) -> None:
        if self._consumer is not None:
            self._consumer.close()


class MemoryConnector(Connector):
    """``connector: memory``: an in-process broker for demos, tests and local runs."""

    name = "memory"
    config_model = MemoryConfig

    @classmethod
    def stream_key(cls, config: Any) -> tuple[Hashable, ...]:
        c = _as_config(config)
        return (c.broker, tuple(sorted(c.topics)), c.group_id)

    @classmethod
    def create_producer(cls, config: Any) -> MemoryProducer:
        return MemoryProducer(_as_config(config))

    @classmethod
    def describe(cls, config: Any) -> str:
        c = _as_config(config)
        return f"memory broker={c.broker} topics={','.join(c.topics)} group={c.group_id}"


def _as_config(config: Any) -> MemoryConfig:
    if isinstance(config, MemoryConfig):
        return config
    return MemoryConfig.model_validate(config)
