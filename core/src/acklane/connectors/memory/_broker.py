"""An in-process broker that behaves like Kafka: topics of partitions, groups, offsets."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
import uuid
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import ClassVar

from acklane.core.errors import AdvanceError

__all__ = [
    "MemoryBroker",
    "MemoryCommitRefused",
    "MemoryConsumer",
    "MemoryGroupStats",
    "MemoryRecord",
    "TopicPartition",
]

TopicPartition = tuple[str, int]


class MemoryCommitRefused(AdvanceError):
    """The broker refused a commit (:meth:`MemoryBroker.refuse_commits`): nothing was
    committed, as when a real broker answers a commit with an error."""


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
        #: Commits still to refuse, by group (:meth:`refuse_commits`).
        self._refusals: dict[str, int] = {}

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

    def refuse_commits(self, group_id: str, times: int = 1) -> None:
        """Make the group's next ``times`` commits fail (:class:`MemoryCommitRefused`),
        as a real broker's error would: for tests of what a failed advance does.
        ``times=0`` clears it."""
        with self._lock:
            self._refusals[group_id] = times

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
            refusals = broker._refusals.get(self.group_id, 0)
            if refusals > 0:
                broker._refusals[self.group_id] = refusals - 1
                raise MemoryCommitRefused(
                    f"memory broker {broker.name!r}: commit of group {self.group_id!r} refused "
                    "(refuse_commits)"
                )
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
