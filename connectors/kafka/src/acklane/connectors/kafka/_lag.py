"""The backlog of a Kafka stream: per partition, the log end minus the committed offset.

One consumer of its own, which never subscribes (it joins no group, so it never
rebalances the pipeline) and never commits, reads in a thread:

- the partitions of the stream's topics (cluster metadata; a regex topic matches
  the topics the metadata lists);
- the group's committed offset of each partition (an OffsetFetch, as any member
  reads it);
- each partition's log end, the high-water mark (``lag_end_offsets: broker``, the
  default), or, with ``lag_end_offsets: last_batch``, the end of the last record batch:
  the consumer fetches from the high-water mark minus one and takes the offset after
  the last record it gets. That is for brokers whose high-water mark is wrong: the
  tansu emulator answers a ListOffsets for the latest offset (and a fetch's high-water
  mark) with the last batch's *first* offset plus one, so a batch of 5 records at
  offsets 0-4 reports an end of 1.

A partition with no committed offset counts from its log start
(``auto_offset_reset: earliest``) or as 0 (``latest``: the group starts at the end).
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from collections.abc import Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from acklane.core.observe.lag import Backlog, BacklogProbe

from ._config import KafkaConfig
from ._health import QuietClientLog

__all__ = ["KafkaBacklogProbe"]

_client_log = QuietClientLog(logging.getLogger("acklane.connectors.kafka.librdkafka"))

#: Seconds each metadata, committed-offset or watermark call may take.
_CALL_TIMEOUT = 5.0
#: Seconds a last-batch read may take over all its partitions.
_TAIL_TIMEOUT = 3.0


class KafkaBacklogProbe(BacklogProbe):
    """``Connector.backlog_probe`` of a Kafka stream (see the module's docstring)."""

    broker = "kafka"

    def __init__(self, config: KafkaConfig) -> None:
        self.config = config
        self._consumer: Any = None
        self._lock = threading.Lock()  # one read at a time, and none during close
        self._closing = False

    async def read(self) -> Sequence[Backlog]:
        return await asyncio.to_thread(self._read)

    async def aclose(self) -> None:
        await asyncio.to_thread(self._close)

    # -- in the thread

    def _client(self) -> Any:
        if self._consumer is None:
            settings = {
                k: v
                for k, v in self.config.consumer_settings().items()
                if not k.startswith(("fetch.queue", "auto.offset"))
            }
            settings |= {
                "enable.partition.eof": True,
                # a last-batch read wants its batch now: a broker that holds a fetch for
                # all of fetch.wait.max.ms (tansu does, 500 ms by default) slows each read
                "fetch.wait.max.ms": 10,
                "logger": _client_log,
                "client.id": "acklane-lag",
            }
            self._consumer = Consumer(settings)
        return self._consumer

    def _close(self) -> None:
        """Close now, or, while a read runs (its task was cancelled, its thread goes on
        until the broker answered or timed out), let that read close when it ends: a
        shutdown does not wait for it."""
        self._closing = True
        if not self._lock.acquire(blocking=False):
            return
        try:
            self._drop()
        finally:
            self._lock.release()

    def _drop(self) -> None:
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            consumer.close()

    def _partitions(self, consumer: Any) -> list[TopicPartition]:
        metadata = consumer.list_topics(timeout=_CALL_TIMEOUT)
        patterns = [re.compile(t) for t in self.config.topics if t.startswith("^")]
        named = {t for t in self.config.topics if not t.startswith("^")}
        out: list[TopicPartition] = []
        for name, topic in metadata.topics.items():
            if name in named or any(p.search(name) for p in patterns):
                if topic.error is not None and name not in named:
                    continue
                out.extend(TopicPartition(name, p) for p in sorted(topic.partitions))
        missing = named - {tp.topic for tp in out}
        if missing:
            raise LookupError(f"no such topic: {', '.join(sorted(missing))}")
        return sorted(out, key=lambda tp: (tp.topic, tp.partition))

    def _read(self) -> list[Backlog]:
        with self._lock:
            if self._closing:
                raise RuntimeError("the probe is closed")
            try:
                return self._read_locked()
            finally:
                if self._closing:
                    self._drop()

    def _read_locked(self) -> list[Backlog]:
        consumer = self._client()
        partitions = self._partitions(consumer)
        if not partitions:
            return []
        committed = {
            (tp.topic, tp.partition): tp.offset
            for tp in consumer.committed(partitions, timeout=_CALL_TIMEOUT)
        }
        ends: dict[tuple[str, int], tuple[int, int]] = {}
        for tp in partitions:
            low, high = consumer.get_watermark_offsets(tp, timeout=_CALL_TIMEOUT, cached=False)
            ends[(tp.topic, tp.partition)] = (low, high)
        if self.config.lag_end_offsets == "last_batch":
            ends = self._last_batch_ends(consumer, ends)
        from_start = not self.config.starts_at_the_end()
        out = []
        for tp in partitions:
            where = (tp.topic, tp.partition)
            low, high = ends[where]
            done = committed.get(where, -1)
            if done is None or done < 0:  # no committed offset yet
                done = low if from_start else high
            out.append(Backlog(f"{tp.topic}/{tp.partition}", float(max(0, high - done))))
        return out

    def _last_batch_ends(
        self, consumer: Any, ends: dict[tuple[str, int], tuple[int, int]]
    ) -> dict[tuple[str, int], tuple[int, int]]:
        """Each non-empty partition's end, found by reading its last batch."""
        wanted = {where: high for where, (low, high) in ends.items() if high > low}
        if not wanted:
            return ends
        consumer.assign([TopicPartition(t, p, high - 1) for (t, p), high in wanted.items()])
        try:
            found = dict(wanted)
            pending = set(wanted)
            deadline = time.monotonic() + _TAIL_TIMEOUT
            while pending and time.monotonic() < deadline:
                for message in consumer.consume(num_messages=500, timeout=0.2):
                    where = (message.topic(), message.partition())
                    error = message.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            pending.discard(where)
                        continue
                    found[where] = max(found.get(where, 0), message.offset() + 1)
            if pending:
                raise TimeoutError(
                    f"reading the last batch of {len(pending)} partition(s) took over "
                    f"{_TAIL_TIMEOUT:g}s"
                )
        finally:
            consumer.unassign()
        return {
            where: (low, max(high, found.get(where, high))) for where, (low, high) in ends.items()
        }
