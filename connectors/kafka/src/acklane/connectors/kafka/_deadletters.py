"""``acklane dlq`` on a Kafka stream: its ``dead_letter`` topic, read by offset.

A log has no per-record removal: the reader keeps its place in a consumer group
of its own, ``acklane-dlq.<dead_letter>``, whose committed offsets say what has
left the dead-letter topic. Reading (``list``) assigns the partitions at that
group's offsets and never commits: nothing changes. Removing (``redrive``,
``purge``) commits past the removed records; a record the command did not take
that lies before one it removed is first appended again to the dead-letter topic,
as it was (same key, value and headers), so that the commit loses nothing. A crash
between that append and the commit shows the record twice, never zero times.

The emulator's high-water marks cannot be trusted (nor librdkafka's partition EOF,
which relies on them): the end of the topic is where a read waits for nothing
``idle`` seconds before the first record, :data:`IDLE_AFTER` after one (the records
of a topic at rest come in quick succession once the first fetch answered).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, ClassVar

from acklane.core.connectors.deadletter import (
    ORIGIN_OFFSET,
    ORIGIN_PARTITION,
    ORIGIN_PREFIX,
    ORIGIN_TOPIC,
    REDRIVE_COUNT,
    REJECT_REASON,
)
from acklane.core.connectors.dlq import (
    DeadLetter,
    DeadLetterReader,
    DeadLettersNotSupported,
    redrive_count,
)
from acklane.core.errors import ConnectorError

from ._config import KafkaConfig

__all__ = ["KafkaDeadLetterReader", "reader_group"]

#: Seconds with no record before the first one that call the topic read to its end.
IDLE = 1.5
#: The same, once records came.
IDLE_AFTER = 0.3
#: Seconds of one wait of the consumer.
_STEP = 0.05


def reader_group(dead_letter: str) -> str:
    """The consumer group whose committed offsets mark what left ``dead_letter``."""
    return f"acklane-dlq.{dead_letter}"


def _text(value: str | bytes | None) -> str:
    if value is None:
        return ""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


class KafkaDeadLetterReader(DeadLetterReader):
    """The stream's ``dead_letter`` topic (see the module); sync client calls in threads."""

    reading_cost: ClassVar[str] = "Kafka: read by offset without a commit; reading changes nothing."

    def __init__(self, config: KafkaConfig, *, idle: float = IDLE) -> None:
        if config.dead_letter is None:
            raise DeadLettersNotSupported(
                f"{config.describe()}: the stream has no dead_letter topic; its rejects are "
                "dropped, there is nothing to read"
            )
        self.config = config
        self.topic: str = config.dead_letter
        self.group = reader_group(self.topic)
        self.idle = idle
        self._consumer: Any = None
        self._producer: Any = None
        self._drained = False
        #: Per partition, the records handed out and not removed nor appended again, in order.
        self._held: dict[int, list[DeadLetter]] = {}
        #: Per partition, where this reader's own appends start (not handed out again).
        self._own_from: dict[int, int] = {}

    @property
    def destination(self) -> str:
        return f"kafka topic {self.topic} at {self.config.bootstrap_servers}"

    @property
    def source(self) -> str:
        return f"kafka topic(s) {', '.join(self.config.topics)} at {self.config.bootstrap_servers}"

    # -- reading

    def _open(self) -> Any:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        if self._consumer is not None:
            return self._consumer
        settings = self.config.consumer_settings()
        settings.pop("group.instance.id", None)
        settings.update(
            {
                "group.id": self.group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "fetch.wait.max.ms": 50,
            }
        )
        consumer = Consumer(settings)
        try:
            metadata = consumer.list_topics(self.topic, timeout=10)
            found = metadata.topics.get(self.topic)
            if found is None or found.error is not None or not found.partitions:
                why = found.error if found is not None else "not found"
                raise ConnectorError(f"{self.destination}: cannot read the topic ({why})")
            partitions = sorted(found.partitions)
            committed = consumer.committed(
                [TopicPartition(self.topic, p) for p in partitions], timeout=10
            )
            consumer.assign(
                [
                    TopicPartition(
                        self.topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
                    )
                    for tp in committed
                ]
            )
        except BaseException:
            consumer.close()
            raise
        self._consumer = consumer
        return consumer

    def _letter(self, record: Any) -> DeadLetter:
        headers = list(record.headers() or ())
        named = {name: _text(value) for name, value in headers}
        originals = [
            (name, value)
            for name, value in headers
            if not name.startswith(ORIGIN_PREFIX) and name not in (REJECT_REASON, REDRIVE_COUNT)
        ]
        kind, stamp = record.timestamp()
        when = datetime.fromtimestamp(stamp / 1000, UTC) if kind and stamp >= 0 else None
        origin = named.get(ORIGIN_TOPIC, "")
        origin_id = (
            f"{origin}/{named.get(ORIGIN_PARTITION, '?')}/{named.get(ORIGIN_OFFSET, '?')}"
            if origin
            else ""
        )
        return DeadLetter(
            id=f"{record.topic()}:{record.partition()}:{record.offset()}",
            origin_id=origin_id,
            origin=origin,
            reason=named.get(REJECT_REASON, ""),
            time=when,
            body=record.value() or b"",
            key=record.key(),
            attributes={name: _text(value) for name, value in originals},
            redrives=redrive_count(named),
            handle=(record, originals),
        )

    def _fetch(self, limit: int) -> list[DeadLetter]:
        if self._drained:
            return []
        consumer = self._open()
        out: list[DeadLetter] = []
        quiet_since = time.monotonic()
        while len(out) < limit:
            records = consumer.consume(num_messages=limit - len(out), timeout=_STEP)
            if not records:
                idle = IDLE_AFTER if self._held or out else self.idle
                if time.monotonic() - quiet_since >= idle:
                    self._drained = True
                    break
                continue
            quiet_since = time.monotonic()
            for record in records:
                if record.error() is not None:
                    continue
                own = self._own_from.get(record.partition())
                if own is not None and record.offset() >= own:
                    continue  # appended again by this reader: handed out already
                letter = self._letter(record)
                self._held.setdefault(record.partition(), []).append(letter)
                out.append(letter)
        return out

    async def fetch(self, limit: int) -> list[DeadLetter]:
        return await asyncio.to_thread(self._fetch, limit)

    # -- sending

    def _produce(self, items: Sequence[tuple[str, int, Any, Any, list[Any]]]) -> list[int]:
        """Produce (topic, partition, key, value, headers) items; their offsets, in order."""
        from confluent_kafka import KafkaException, Producer

        if self._producer is None:
            self._producer = Producer(self.config.dlq_settings())
        producer = self._producer
        offsets: list[int] = [-1] * len(items)
        errors: list[str] = []

        def delivered(index: int, error: Any, message: Any) -> None:
            if error is not None:
                errors.append(f"{error.name()}: {error.str()}")
            else:
                offsets[index] = message.offset()

        for index, (topic, partition, key, value, headers) in enumerate(items):
            while True:
                try:
                    producer.produce(
                        topic,
                        value=value,
                        key=key,
                        headers=headers or None,
                        partition=partition,
                        on_delivery=functools.partial(delivered, index),
                    )
                    break
                except BufferError:
                    producer.poll(0.1)
                except KafkaException as exc:
                    raise ConnectorError(f"kafka topic {topic}: {exc}") from exc
        timeout = self.config.dead_letter_flush_timeout
        remaining = producer.flush(timeout)
        if remaining:
            raise ConnectorError(
                f"{remaining} record(s) not confirmed within {timeout:g}s "
                "(dead_letter_flush_timeout); nothing was removed from the dead-letter topic"
            )
        if errors:
            raise ConnectorError(
                f"{len(errors)} record(s) refused, the first: {errors[0]}; nothing was "
                "removed from the dead-letter topic"
            )
        return offsets

    def _origin_of(self, letter: DeadLetter) -> tuple[str, int]:
        named = [t for t in self.config.topics if not t.startswith("^")]
        topic = letter.origin or (named[0] if len(named) == 1 else "")
        if not topic:
            raise ConnectorError(
                f"dead letter {letter.id} names no origin topic ({ORIGIN_TOPIC}) and the "
                "stream reads several: it cannot be redriven"
            )
        record, _ = letter.handle
        headers = {name: _text(value) for name, value in record.headers() or ()}
        try:
            partition = int(headers.get(ORIGIN_PARTITION, ""))
        except ValueError:
            partition = -1  # RD_KAFKA_PARTITION_UA: the partitioner picks
        return topic, partition

    async def copy_back(self, letters: Sequence[DeadLetter]) -> None:
        items = []
        for letter in letters:
            record, originals = letter.handle
            topic, partition = self._origin_of(letter)
            headers = [*originals, (REDRIVE_COUNT, str(letter.redrives + 1).encode())]
            items.append((topic, partition, record.key(), record.value(), headers))
        await asyncio.to_thread(self._produce, items)

    # -- removing

    def _remove(self, letters: Sequence[DeadLetter]) -> None:
        from confluent_kafka import TopicPartition

        removed = {letter.id for letter in letters}
        commits: list[Any] = []
        again: list[DeadLetter] = []
        for partition, held in self._held.items():
            ours = [letter for letter in held if letter.id in removed]
            if not ours:
                continue
            last = max(letter.handle[0].offset() for letter in ours)
            before = [
                letter
                for letter in held
                if letter.id not in removed and letter.handle[0].offset() < last
            ]
            again.extend(before)
            self._held[partition] = [
                letter
                for letter in held
                if letter.id not in removed and letter.handle[0].offset() > last
            ]
            commits.append(TopicPartition(self.topic, partition, last + 1))
        if again:
            # kept as they are: appended again before the commit passes them
            items = []
            for letter in again:
                record = letter.handle[0]
                items.append(
                    (
                        self.topic,
                        record.partition(),
                        record.key(),
                        record.value(),
                        list(record.headers() or ()),
                    )
                )
            offsets = self._produce(items)
            for letter, offset in zip(again, offsets, strict=True):
                partition = letter.handle[0].partition()
                if partition not in self._own_from and offset >= 0:
                    self._own_from[partition] = offset
        if commits:
            self._open().commit(offsets=commits, asynchronous=False)

    async def remove(self, letters: Sequence[DeadLetter]) -> None:
        await asyncio.to_thread(self._remove, letters)

    def _close(self) -> None:
        consumer, self._consumer = self._consumer, None
        producer, self._producer = self._producer, None
        if producer is not None:
            producer.flush(5)
        if consumer is not None:
            consumer.close()

    async def aclose(self) -> None:
        await asyncio.to_thread(self._close)
