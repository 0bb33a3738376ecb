"""The fetch path: records from librdkafka's queue to the engine, and the pause.

librdkafka fetches ahead of the consumer (its own threads fill its queue): what it
has fetched already is taken on the event loop's thread while the consumer thread is
idle (a consume with ``timeout=0`` does not wait); only an empty queue, or what may
wait (naming partitions just assigned, committing the start of new ones), goes to
the consumer thread. Handing records from one thread to the other cost more wall
time than building them (bench/README.md). A fetch is handed out in runs of one
partition; a run's records sought back since it was fetched are stale and are not
handed out. At ``max_outstanding`` fetching pauses, and polls go on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from typing import Any

from confluent_kafka import KafkaError, TopicPartition

from ._books import TP
from ._commit import CommitPath
from ._config import KafkaConfig
from ._errors import KafkaReceiveError
from ._formats import prefetcher, record_type
from ._health import AUTH_CODES, auth_error
from ._identity import raise_if_refused
from ._message import _UNSET, KafkaMessage

__all__ = ["FetchPath", "FetchedRuns"]

log = logging.getLogger("acklane.connectors.kafka")

# (seek epoch at fetch time, the records fetched)
Fetched = tuple[int, list[KafkaMessage]]
# ... and where each run of records of one partition starts among them
FetchedRuns = tuple[int, list[KafkaMessage], list[int]]

# How long a full stream waits for room before it pauses fetching and polls (and then
# between polls): rebalance callbacks and max.poll.interval.ms stay served while the
# watchers catch up, and a short stall does not throw away prefetched records.
_FULL_WAIT = 0.5
# Seconds of one consume that waits for records on the consumer thread: a call queued
# behind it (an advance's commit) waits at most this long, not the whole poll_timeout.
_WAIT_SLICE = 0.01


def _stale(record: KafkaMessage, epoch: int, sought: dict[TP, tuple[int, int]]) -> bool:
    """Fetched before its partition was sought back to an offset at or before it."""
    seek = sought.get(record.lane)
    return seek is not None and seek[0] > epoch and record.offset >= seek[1]


class _Handout:
    """One partition's run of a fetch, as the engine takes it (see ``_hand_out``).

    Its length (that of the run: an upper bound, should records turn stale) lets the
    engine take the whole run at once when its watchers' queues have room for it.
    """

    __slots__ = ("_epoch", "_producer", "_records")

    def __init__(self, producer: FetchPath, records: list[KafkaMessage], epoch: int):
        self._producer = producer
        self._records = records
        self._epoch = epoch

    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        return self._producer._hand_out(self._records, self._epoch)

    def at_once(self) -> Iterator[tuple[Any, Any]]:
        """The run's records still current, for an engine that takes them all now
        (nothing awaits until the last is taken): checked once, not one by one."""
        producer = self._producer
        records = self._records
        sought = producer._sought
        seek = sought.get(records[0].lane) if sought else None
        if seek is not None and seek[0] > self._epoch:  # its partition sought back since
            records = [r for r in records if not _stale(r, self._epoch, sought)]
        producer._outstanding += len(records)
        return zip(records, records, strict=True)


class FetchPath(CommitPath):
    """Fetches, hands out and pauses; counts what is outstanding (event loop)."""

    def __init__(self, config: KafkaConfig) -> None:
        super().__init__(config)
        # KafkaMessage, or a class that decodes Schema Registry framing (_formats.py)
        self._record_type = record_type(config)
        self._prefetch = prefetcher(self._record_type)  # on the consumer thread, or None
        # Event-loop state.
        self._outstanding = 0
        self._room = asyncio.Event()
        # Fetch when at least this many more may be outstanding (half a batch): a
        # stream whose watchers lag takes batches, not the few records each advance
        # frees (each batch costs the engine as much as dozens of records).
        self._min_room = max(1, min(config.batch_size, config.max_outstanding) // 2)

    async def _fetch_batch(self, want: int) -> FetchedRuns:
        """Up to ``want`` records: what librdkafka has fetched already, taken on this
        thread while the consumer thread is idle, else waited for on that thread.

        librdkafka fetches ahead of the consumer (its own threads fill its queue), so
        the consumer thread is needed only when that queue is empty, or for what may
        wait: naming partitions just assigned, committing the start of new ones.
        """
        if self._thread.busy():
            await self._thread.idle()  # an advance's commit, most often
        if self._closed or self._paused or self._thread.busy():
            return await self._call(self._fetch_runs, want, False)
        epoch = self._seek_epoch
        self._on_loop = True
        try:
            messages = self._consumer.consume(num_messages=want, timeout=0)
        finally:
            self._on_loop = False
        if not messages:
            return await self._call(self._fetch_runs, want, False)  # wait for some there
        if self._naming and not self._name_assigned(wait=False):
            return await self._call(self._runs, epoch, messages)
        fetched = self._runs(epoch, messages, anchor=False)
        if self._unanchored and fetched[1]:
            await self._call(self._anchor, fetched[1])
        return fetched

    def _hand_out(self, batch: list[KafkaMessage], epoch: int) -> Iterator[tuple[Any, Any]]:
        """The batch's records as the engine takes them, each checked at that moment.

        An advance may seek a partition back while a batch is being handed out (the
        engine pauses mid-batch for a full queue): the records of that partition at or
        after the held offset are then stale and are not handed out; they come again.
        """
        sought = self._sought
        for record in batch:
            if sought and _stale(record, epoch, sought):
                continue
            self._outstanding += 1
            yield record, record

    async def _wait_for_room(self) -> bool:
        """Wait a little for advances to make room; True when there is room."""
        self._room.clear()
        if self.config.max_outstanding - self._outstanding >= self._min_room:
            return True
        try:
            async with asyncio.timeout(_FULL_WAIT):
                await self._room.wait()
        except TimeoutError:
            return False
        return True

    # -- on the consumer thread, or on the loop's while that thread is idle

    def _set_paused(self, pause: bool) -> None:
        consumer = self._consumer
        if pause:
            self._paused = True
            self.stats.paused += 1
            log.debug(
                "Kafka fetching paused group=%s outstanding=%d",
                self.config.group_id,
                self._outstanding,
            )
            return
        self._paused = False
        if self._paused_parts:
            consumer.resume([TopicPartition(t, p) for t, p in self._paused_parts])
            self._paused_parts.clear()
        # A seek on a paused partition can be undone by its resume: seek after resuming.
        seeks, self._deferred_seeks = self._deferred_seeks, {}
        for tp, offset in seeks.items():
            if tp in self._owned:
                self._seek(tp, offset)

    def _fetch(self, want: int, pause: bool) -> Fetched:
        """Up to ``want`` records, with the seek epoch they were fetched in."""
        epoch, out, _ = self._fetch_runs(want, pause)
        return epoch, out

    def _fetch_runs(self, want: int, pause: bool) -> FetchedRuns:
        """:meth:`_fetch`, and where each run of records of one partition starts."""
        consumer = self._consumer
        if pause != self._paused:
            self._set_paused(pause)
        if self._paused:
            self._pause_new_partitions()
        epoch = self._seek_epoch  # after the seeks a resume made: they precede this batch
        # What is already fetched, at once; else wait for one record and take what
        # came with it. consume(want, timeout) alone would wait for a full batch.
        messages = consumer.consume(num_messages=want, timeout=0)
        if not messages and not pause:
            messages = self._wait_for_records()
            if messages and want > 1:
                messages += consumer.consume(num_messages=want - 1, timeout=0)
        return self._runs(epoch, messages)

    def _wait_for_records(self) -> list[Any]:
        """Wait up to ``poll_timeout`` for a record, in slices: a call queued behind
        (an advance) ends the wait early (nothing came: the loop asks again after)."""
        consumer = self._consumer
        deadline = time.monotonic() + self.config.poll_timeout
        while True:
            left = deadline - time.monotonic()
            messages: list[Any] = consumer.consume(
                num_messages=1, timeout=max(0.0, min(left, _WAIT_SLICE))
            )
            if messages or left <= _WAIT_SLICE or self._thread.call_waiting():
                return messages

    def _runs(self, epoch: int, messages: list[Any], anchor: bool = True) -> FetchedRuns:
        """The records of what a consume returned, in runs of one partition each.

        On the consumer thread, or on the loop's thread with ``anchor`` false and every
        assigned partition named (nothing here waits then).
        """
        if self._naming:
            self._name_assigned(wait=True)
        if self._failure is not None or self._health.refused is not None:
            raise_if_refused(self._health, "consuming")
            assert self._failure is not None
            raise KafkaReceiveError(
                f"Kafka client failed for {self.config.describe()}: {self._failure.str()}"
            )
        if self._health.unreachable is not None:
            if messages:
                self._health.alive()
            else:
                self._probe.look(self._admin, self._health)
        if self._paused:
            self._pause_new_partitions()  # assigned during this consume
        out: list[KafkaMessage] = []
        starts: list[int] = []
        books: tuple[int, str] | None = None  # the last record's partition's, by identity
        fetching = self._fetching
        awaiting = self._ledger.awaiting
        record = self._record_type
        # a plain record is built here without a call to its constructor (a type call
        # and an __init__ frame per record): the fields KafkaMessage.__init__ sets for
        # a record with an id prefix, set in place (test_kafka_runs checks the two agree)
        plain = record is KafkaMessage
        new = KafkaMessage.__new__
        unset = _UNSET
        for m in messages:
            error = m.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    continue
                if error.code() in AUTH_CODES:
                    raise auth_error(error, f"consuming {m.topic()}[{m.partition()}]")
                raise KafkaReceiveError(
                    f"consuming {self.config.describe()} failed on "
                    f"{m.topic()}[{m.partition()}]: {error.str()}"
                )
            tp = (m.topic(), m.partition())
            lane = fetching.get(tp)
            if lane is None:
                continue  # its partition was revoked within this consume
            offset = m.offset()
            if awaiting:
                self._check_floor_came_back(tp, offset)
            if lane is not books:  # another partition's run starts here
                starts.append(len(out))
                books = lane
            if plain:
                r = new(KafkaMessage)
                r._message = m
                r._generation = lane[0]
                r._lane = tp
                r._offset = offset
                prefix = r._prefix = lane[1]
                r._mid = f"{prefix}{offset}"
                r._attributes = r._when = unset
                r.json_memo = None
                out.append(r)
            else:
                out.append(record(m, lane[0], tp, offset, lane[1]))
        if anchor and self._unanchored and out:
            self._anchor(out)
        if self._prefetch is not None and out:
            self._prefetch(out)
        self.stats.delivered += len(out)
        return epoch, out, starts

    def _anchor(self, fetched: list[KafkaMessage]) -> None:
        """Under ``latest``: commit where each newly assigned partition starts, before its
        first record is handed out.

        With no committed offset, a group that restarts would resolve ``latest`` again,
        at the end of the log, and skip every record it was holding. The first record
        fetched after an assignment sits at the resolved position (or at the committed
        offset, which committing again leaves as it is).
        """
        firsts: dict[TP, KafkaMessage] = {}
        unanchored = self._unanchored
        for record in fetched:
            tp = record.lane
            if tp in unanchored and tp not in firsts:
                firsts[tp] = record
        if not firsts:
            return
        self._commit([self._position(r, r.offset) for r in firsts.values()])
        unanchored.difference_update(firsts)
        log.info(
            "Kafka starting positions committed group=%s positions=%s",
            self.config.group_id,
            ",".join(f"{t}[{p}]@{r.offset}" for (t, p), r in sorted(firsts.items())),
        )

    def _check_floor_came_back(self, tp: TP, offset: int) -> None:
        """The first record after a seek back to a held offset: is the held one still there?"""
        held = self._ledger.came_back(tp, offset)
        if held is not None:
            log.warning(
                "Kafka record %s[%d]@%d, held for redelivery, is gone from the log (retention "
                "or compaction); partition resumes at offset %d",
                tp[0],
                tp[1],
                held,
                offset,
            )

    def _pause_new_partitions(self) -> None:
        new = [tp for tp in self._owned if tp not in self._paused_parts]
        if new:
            self._consumer.pause([TopicPartition(t, p) for t, p in new])
            self._paused_parts.update(new)
