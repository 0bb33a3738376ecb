"""The shared stream producer of one Kafka consumer group.

confluent-kafka's consumer is not thread-safe, so its calls (consume, commit, seek,
pause, close) and the rebalance callbacks run one at a time, and so do the
producer's books (owned partitions, held floors, last commits): on a dedicated
thread for every call that may wait (a commit, a seek, a consume that waits for
records, the connect and close), or on the event loop's thread, while that thread
runs nothing, for a consume of what librdkafka has already fetched (``timeout=0``:
it does not wait). Handing records from one thread to the other cost more wall time
than building them, and the two threads fought for the GIL (bench/README.md).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import operator
import threading
import time
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Callable,
    Hashable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    ResourceType,
)

from acklane.core.connectors import Action, CommitLedger, LedgerEntry, verdict
from acklane.core.connectors.deadletter import (
    ORIGIN_GROUP,
    ORIGIN_OFFSET,
    ORIGIN_PARTITION,
    ORIGIN_TOPIC,
    REASON_MAX_BYTES,
    REJECT_REASON,
    DeadLetterStep,
    bounded_text,
    log_origin,
    outcome_reason,
)
from acklane.core.errors import AdvanceError, DeadLetterRefused, ReceiveError
from acklane.core.producer import (
    AdvanceItem,
    LaneBatch,
    SharedStreamProducer,
)

from ._config import KafkaConfig
from ._formats import prefetcher, record_type
from ._health import AUTH_CODES, ClientHealth, QuietClientLog, auth_error
from ._message import _UNSET, KafkaDelivery, KafkaMessage, id_prefix

__all__ = [
    "DLQ_ADDED_MAX_BYTES",
    "DLQ_GROUP_MAX_BYTES",
    "KafkaAdvanceError",
    "KafkaReceiveError",
    "KafkaStreamProducer",
    "KafkaStreamStats",
]

log = logging.getLogger("acklane.connectors.kafka")
_client_log = QuietClientLog(logging.getLogger("acklane.connectors.kafka.librdkafka"))

T = TypeVar("T")
TP = tuple[str, int]
# (seek epoch at fetch time, the records fetched)
Fetched = tuple[int, list[KafkaMessage]]
# ... and where each run of records of one partition starts among them
FetchedRuns = tuple[int, list[KafkaMessage], list[int]]

#: The most bytes of the group name an ``acklane.origin.group`` header carries.
DLQ_GROUP_MAX_BYTES = 255
#: The most bytes acklane adds to a dead-letter copy (header names and values; the
#: topic name is at most 249 bytes, the reason at most ``REASON_MAX_BYTES``).
DLQ_ADDED_MAX_BYTES = (
    sum(map(len, (ORIGIN_TOPIC, ORIGIN_PARTITION, ORIGIN_OFFSET, ORIGIN_GROUP, REJECT_REASON)))
    + 249
    + len(str(2**31 - 1))
    + len(str(2**63 - 1))
    + DLQ_GROUP_MAX_BYTES
    + REASON_MAX_BYTES
)
# librdkafka's own batch.size: the most a producer batches into one request per partition.
_LIBRDKAFKA_BATCH_SIZE = 1_000_000
# Seconds to wait for the cluster id, topic ids and topic configs.
_METADATA_TIMEOUT = 30.0

# Commit errors that mean "the group is rebalancing away from you": the partition is
# (about to be) revoked, and its new owner redelivers from the last commit.
_REBALANCING = frozenset(
    {
        KafkaError.REBALANCE_IN_PROGRESS,
        KafkaError.ILLEGAL_GENERATION,
        KafkaError.UNKNOWN_MEMBER_ID,
        KafkaError.FENCED_INSTANCE_ID,
        KafkaError._ASSIGNMENT_LOST,
        KafkaError._STATE,
    }
)
# Seconds between two looks at a pending metadata request (a close, a refusal).
_METADATA_SLICE = 0.2
# Seconds between two metadata requests looking for the brokers during an outage.
_PROBE_INTERVAL = 5.0
# A record (or its batch) over a size limit, from produce() or the broker.
_TOO_LARGE = frozenset({KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE})

# How long a full stream waits for room before it pauses fetching and polls (and then
# between polls): rebalance callbacks and max.poll.interval.ms stay served while the
# watchers catch up, and a short stall does not throw away prefetched records.
_FULL_WAIT = 0.5
# Seconds of one consume that waits for records on the consumer thread: a call queued
# behind it (an advance's commit) waits at most this long, not the whole poll_timeout.
_WAIT_SLICE = 0.01


class KafkaReceiveError(ReceiveError):
    """Consuming failed: the group fails and the runner restarts it."""


class KafkaAdvanceError(AdvanceError):
    """A commit, dead-letter copy or seek failed: the group fails; the broker redelivers."""


class _Refused(KafkaAdvanceError, DeadLetterRefused):
    """The DLQ topic (or the DLQ producer) refused a copy as too large."""


@dataclass(slots=True)
class KafkaStreamStats:
    """Counters of one producer, for tests, logs and metrics; each field is named by
    its :class:`~acklane.core.connectors.Action` (what ``counters()`` reports)."""

    delivered: int = 0  # records handed to the engine
    committed: int = 0  # successful commit calls
    held: int = 0  # failed / unclaimed records that held their partition
    sought_back: int = 0  # seeks back to a held offset
    dead_lettered: int = 0  # rejected records copied to the DLQ topic
    dead_letter_refused: int = 0  # DLQ copies refused as too large (the group fails on them)
    dropped: int = 0  # rejected records committed past with no DLQ topic
    skipped_revoked: int = 0  # advanced records of partitions no longer owned
    commit_skipped: int = 0  # commits refused because the group was rebalancing
    paused: int = 0  # times fetching paused at max_outstanding


def _tp(p: Any) -> TP:
    return (p.topic, p.partition)


def _stale(record: KafkaMessage, epoch: int, sought: dict[TP, tuple[int, int]]) -> bool:
    """Fetched before its partition was sought back to an offset at or before it."""
    seek = sought.get(record.lane)
    return seek is not None and seek[0] > epoch and record.offset >= seek[1]


_outcome_of = operator.attrgetter("outcome")


def _all_clean(batch: Sequence[AdvanceItem[KafkaDelivery]]) -> bool:
    """Whether every item's outcome ``is_clean``, asking each distinct outcome once.

    An engine shares one outcome object among events resolved alike (acklane's
    does), so a batch holds few: the pass over the batch is made in C.
    """
    outcomes = list(map(_outcome_of, batch))
    distinct = dict(zip(map(id, outcomes), outcomes, strict=True))
    return all(outcome.is_clean for outcome in distinct.values())


def _names(tps: Any) -> str:
    return ",".join(f"{t}[{p}]" for t, p in sorted(tps)) or "none"


def _copy_size(key: bytes | None, value: bytes | None, headers: list[tuple[str, Any]]) -> int:
    """Bytes of a record's key, value and headers (names and values)."""
    size = len(key or b"") + len(value or b"")
    for name, data in headers:
        size += len(name.encode()) + len(data.encode() if isinstance(data, str) else data or b"")
    return size


def _is_zero(topic_id: Any) -> bool:
    """A topic id of all zeros: what a broker without topic ids answers."""
    return bool(
        topic_id.get_most_significant_bits() == 0 and topic_id.get_least_significant_bits() == 0
    )


class _Handout:
    """One partition's run of a fetch, as the engine takes it (see ``_hand_out``).

    Its length (that of the run: an upper bound, should records turn stale) lets the
    engine take the whole run at once when its watchers' queues have room for it.
    """

    __slots__ = ("_epoch", "_producer", "_records")

    def __init__(self, producer: KafkaStreamProducer, records: list[KafkaMessage], epoch: int):
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


class KafkaStreamProducer(SharedStreamProducer[KafkaDelivery]):
    """Consumes a Kafka consumer group for one shared stream and commits what the engine advances.

    Lane = ``(topic, partition)``. ``advance`` commits offset+1 of the last
    committable record of the lane; a failed or unclaimed record holds its
    partition (nothing at or after it is committed, across batches) and the
    partition is sought back to it so it comes again now; a rejected record is
    copied to ``dead_letter`` (flushed before the commit that passes it) or, with no
    DLQ, committed past and counted in ``stats.dropped``.

    A record's ``message_id`` names the cluster and the topic's life as well as the
    partition and offset (see :func:`~acklane.connectors.kafka.id_prefix`): read
    once on connect (the cluster id) and once per assignment (the topic ids).
    """

    def __init__(self, config: KafkaConfig) -> None:
        self.config = config
        self.stats = KafkaStreamStats()
        self._dead_letters = DeadLetterStep(
            "Kafka",
            f"group {config.group_id}",
            config.dead_letter,
            "dead_letter",
            logger=log,
            refused_error=_Refused,
            failed_error=KafkaAdvanceError,
        )
        # KafkaMessage, or a class that decodes Schema Registry framing (_formats.py)
        self._record_type = record_type(config)
        self._prefetch = prefetcher(self._record_type)  # on the consumer thread, or None
        self._executor: ThreadPoolExecutor | None = None
        self._opened = False
        self._closed = False
        # Consumer-thread state.
        self._consumer: Any = None
        self._dlq: Any = None
        self._admin: Any = None
        self._cluster_id = ""  # read on connect
        # partition -> (generation, id prefix of its records): all the fetch loop reads
        self._fetching: dict[TP, tuple[int, str]] = {}
        # Under auto_offset_reset latest: assigned partitions whose starting position is
        # not committed yet (the first record fetched from each commits it).
        self._starts_at_end = config.starts_at_the_end()
        self._unanchored: set[TP] = set()
        self._dlq_limit: int | None = None  # the DLQ topic's max.message.bytes, if known
        self._generation = 0
        # Generations, floors (lowest held offsets), commits and seeks back, per partition.
        self._ledger: CommitLedger[TP, AdvanceItem[KafkaDelivery]] = CommitLedger()
        self._owned = self._ledger.owned  # partition -> generation of its assignment
        self._assignment: frozenset[TP] = frozenset()  # snapshot of _owned, for the loop
        self._paused = False
        self._paused_parts: set[TP] = set()
        self._deferred_seeks: dict[TP, int] = {}
        self._failure: KafkaError | None = None
        # Connection state changes, told once each (consumer thread); aclose sets
        # _closing so that a connect waiting for an unreachable cluster ends now.
        self._health = ClientHealth(config.describe(), config.bootstrap_servers)
        # the metadata request that looks for the brokers while they are unreachable
        self._probe: concurrent.futures.Future[Any] | None = None
        self._probed_at = 0.0
        self._closing = threading.Event()
        # Written on the consumer thread, read on the loop while a batch is handed out:
        # partition -> (seek epoch, offset) of its latest seek back to a held record.
        self._seek_epoch = 0
        self._sought: dict[TP, tuple[int, int]] = {}
        # Partitions assigned during a consume on the loop's thread, named once their
        # topic ids come (the lookup is not waited for there): (partitions and the
        # generation of their assignment, the lookup's futures by topic, or its error).
        self._naming: list[tuple[list[tuple[TP, int]], Mapping[str, Any] | Exception]] = []
        self._on_loop = False  # a consume runs on the loop's thread (callbacks must not wait)
        # Calls handed to the consumer thread: counted by the loop as submitted, by the
        # thread as started and finished. The loop consumes itself only when every
        # call submitted has finished: the thread is idle, and stays so meanwhile.
        self._submitted = 0
        self._started = 0
        self._finished = 0
        self._last_call: asyncio.Future[Any] | None = None
        # Event-loop state.
        self._outstanding = 0
        self._room = asyncio.Event()
        # Fetch when at least this many more may be outstanding (half a batch): a
        # stream whose watchers lag takes batches, not the few records each advance
        # frees (each batch costs the engine as much as dozens of records).
        self._min_room = max(1, min(config.batch_size, config.max_outstanding) // 2)

    # -- the SharedStreamProducer interface

    async def open_stream(self) -> AsyncIterator[tuple[KafkaMessage, KafkaDelivery]]:
        """Join the consumer group and yield its records, one at a time, forever."""
        batches = self.open_batches()
        try:
            async for batch in batches:
                for pair in batch.pairs:
                    yield pair
        finally:
            await batches.aclose()

    async def open_batches(self) -> AsyncGenerator[LaneBatch]:
        """Join the consumer group and yield its records, batch by batch, forever.

        Each record is both the filters' raw event and the broker payload. A batch is
        a run of records of one partition (a fetch holds runs of each partition), so
        the engine looks the lane up once per run.
        """
        if self._opened:
            raise RuntimeError(f"{self.config.describe()}: open_stream() may be called only once")
        if self._closed:
            raise RuntimeError(f"{self.config.describe()}: the producer is closed")
        self._opened = True
        self._executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"acklane-kafka-{self.config.group_id}"
        )
        await self._call(self._connect)
        cfg = self.config
        while True:
            room = cfg.max_outstanding - self._outstanding
            if room >= self._min_room:
                epoch, batch, starts = await self._fetch_batch(min(room, cfg.batch_size))
            elif await self._wait_for_room():
                continue
            else:
                # Still full: pause fetching, but keep polling so that rebalances and
                # max.poll.interval.ms are served while the watchers catch up.
                epoch, batch, starts = await self._call(self._fetch_runs, 1, True)
            if not batch:
                continue
            ends = starts[1:]
            ends.append(len(batch))
            for start, end in zip(starts, ends, strict=True):
                run = batch[start:end]
                yield LaneBatch(run[0].lane, _Handout(self, run, epoch))

    async def _fetch_batch(self, want: int) -> FetchedRuns:
        """Up to ``want`` records: what librdkafka has fetched already, taken on this
        thread while the consumer thread is idle, else waited for on that thread.

        librdkafka fetches ahead of the consumer (its own threads fill its queue), so
        the consumer thread is needed only when that queue is empty, or for what may
        wait: naming partitions just assigned, committing the start of new ones.
        """
        if self._thread_busy():
            await self._thread_done()  # an advance's commit, most often
        if self._closed or self._paused or self._thread_busy():
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

    async def advance(self, batch: Sequence[AdvanceItem[KafkaDelivery]]) -> None:
        """Commit, dead-letter or hold, per partition, for a resolved prefix of one lane."""
        if not batch:
            return
        try:
            await self._call(self._advance, batch)
        finally:
            self._outstanding -= len(batch)
            if self.config.max_outstanding - self._outstanding >= self._min_room:
                self._room.set()

    def counters(self) -> Mapping[str, float]:
        return {Action(name): count for name, count in asdict(self.stats).items()}

    def broker_problem(self) -> str | None:
        # written on the consumer thread; one str attribute, read here on the loop
        return self._health.unreachable

    def get_advance_lane(self, delivery: KafkaDelivery) -> Hashable:
        return delivery.lane

    def message_id(self, delivery: KafkaDelivery) -> str | None:
        mid: str = delivery._mid  # made when the record was fetched (see KafkaMessage)
        return delivery.message_id if mid is _UNSET else mid

    async def aclose(self) -> None:
        """Flush the DLQ producer and close the consumer (leaving the group), once."""
        if self._closed:
            return
        self._closed = True
        self._closing.set()  # a connect still waiting for the cluster gives up now
        executor = self._executor
        if executor is None:
            return
        try:
            await self._hand_over(executor, self._close_clients, ())
        finally:
            executor.shutdown(wait=False)

    @property
    def assignment(self) -> frozenset[tuple[str, int]]:
        """The ``(topic, partition)`` pairs this consumer owns now."""
        return self._assignment

    # -- plumbing

    def _submit(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        executor = self._executor
        if executor is None or self._closed:
            raise RuntimeError(f"{self.config.describe()}: the producer is not open")
        return self._hand_over(executor, fn, args)

    def _hand_over(
        self, executor: ThreadPoolExecutor, fn: Callable[..., T], args: tuple[Any, ...]
    ) -> asyncio.Future[T]:
        self._submitted += 1
        future = asyncio.get_running_loop().run_in_executor(executor, self._run_call, fn, args)
        self._last_call = future
        return future

    def _run_call(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        """A call on the consumer thread, counted (see ``_thread_busy``)."""
        self._started += 1
        try:
            return fn(*args)
        finally:
            self._finished += 1

    def _thread_busy(self) -> bool:
        """A call handed to the consumer thread has not finished (it may still run even
        when the future that awaited it was cancelled)."""
        return self._finished != self._submitted

    def _call_waiting(self) -> bool:
        """(Consumer thread) a call is queued behind the one running."""
        return self._submitted - self._started > 0

    async def _thread_done(self) -> None:
        """Until the last call handed to the consumer thread is done (or cancelled)."""
        last = self._last_call
        if last is not None and not last.done():
            await asyncio.wait((last,))

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        return await self._submit(fn, *args)

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

    # -- everything below runs on the consumer thread

    def _connect(self) -> None:
        settings = self.config.consumer_settings()
        settings["error_cb"] = self._on_client_error
        settings["logger"] = _client_log
        try:
            consumer = Consumer(settings)
        except KafkaException as exc:
            raise KafkaReceiveError(
                f"cannot create the Kafka consumer for {self.config.describe()}: {exc}"
            ) from exc
        self._consumer = consumer
        admin = self.config.admin_settings()
        admin["error_cb"] = self._on_client_error
        admin["logger"] = _client_log
        self._admin = AdminClient(admin)
        self._cluster_id = self._read_cluster_id()
        if self.config.dead_letter is not None:
            self._check_dlq_limits(self.config.dead_letter)
        consumer.subscribe(
            list(self.config.topics),
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        log.info(
            "Kafka consumer subscribed %s cluster=%s", self.config.describe(), self._cluster_id
        )

    def _read_cluster_id(self) -> str:
        """The cluster's id, part of every message id (a record's offset names it only
        within one topic's life on one cluster).

        Read with a metadata request for no topic (``describe_cluster``): the consumer's
        ``cluster_id()`` can miss the metadata it waits for and sleep a second, and
        ``list_topics()`` lists every topic of the cluster.
        """
        cluster = self._wait_for_cluster()
        if cluster:
            return cluster
        servers = ",".join(sorted(self.config.bootstrap_servers.split(",")))
        log.warning(
            "Kafka cluster of %s reports no cluster id (a broker before 0.10.1): message ids "
            "name it by its bootstrap servers %s instead",
            self.config.describe(),
            servers,
        )
        return servers

    def _wait_for_cluster(self) -> str | None:
        """The cluster id, waiting as long as the brokers do not answer.

        An unreachable cluster is no reason to fail (and restart) the group: the wait
        goes on, told once (``ClientHealth``), until the brokers answer, the producer
        closes, or they refuse the credentials (``BrokerAuthError``, raised).
        """
        admin = self._admin
        while True:
            future = admin.describe_cluster(request_timeout=_METADATA_TIMEOUT)
            while not future.done():
                admin.poll(0)  # serves error_cb: the unreachable state, a refusal
                self._consumer.poll(0)  # the consumer's own connection errors
                self._raise_if_refused("reading the cluster metadata")
                if self._closing.is_set():
                    future.cancel()
                    raise KafkaReceiveError(f"{self.config.describe()}: closed while connecting")
                try:
                    future.result(timeout=_METADATA_SLICE)
                except concurrent.futures.TimeoutError:
                    continue
                except Exception:
                    break
            self._raise_if_refused("reading the cluster metadata")
            try:
                cluster: str | None = future.result(timeout=0).cluster_id
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                if isinstance(error, KafkaError) and error.code() in AUTH_CODES:
                    raise auth_error(error, "reading the cluster metadata") from None
                if isinstance(error, KafkaError) and error.code() == KafkaError._TIMED_OUT:
                    self._health.unanswered(error.str())  # told once, keep waiting
                    continue
                raise KafkaReceiveError(
                    f"cannot read the cluster id of {self.config.describe()}: {exc}"
                ) from exc
            except Exception as exc:
                raise KafkaReceiveError(
                    f"cannot read the cluster id of {self.config.describe()}: {exc}"
                ) from exc
            self._health.alive()
            return cluster

    def _probe_cluster(self) -> None:
        """While the brokers count as unreachable and nothing arrives (an idle topic),
        ask for the cluster's metadata every few seconds, without waiting: its answer is
        the sign of life that ends the outage (else the stream would stay unready until
        the next record). Consumer thread."""
        probe = self._probe
        if probe is not None:
            if not probe.done():
                return
            self._probe = None
            if probe.exception() is None:
                self._health.alive()
                return
        now = time.monotonic()
        if self._admin is None or now - self._probed_at < _PROBE_INTERVAL:
            return
        self._probed_at = now
        self._probe = self._admin.describe_cluster(request_timeout=_METADATA_TIMEOUT)

    def _raise_if_refused(self, where: str) -> None:
        refused = self._health.refused
        if refused is not None:
            raise auth_error(refused, where)

    def _topic_ids(self, topics: set[str]) -> dict[str, str]:
        """The ids of ``topics`` that the broker gives (KIP-516, Kafka 2.8+), by name."""
        return self._read_topic_ids(topics, self._ask_topic_ids(topics))

    def _ask_topic_ids(self, topics: set[str]) -> Mapping[str, Any] | Exception:
        """The lookup of ``topics``' ids, sent (not waited for): futures by topic."""
        admin = self._admin
        if admin is None or not topics:
            return {}
        try:
            futures: Mapping[str, Any] = admin.describe_topics(
                TopicCollection(sorted(topics)), request_timeout=_METADATA_TIMEOUT
            )
        except KafkaException as exc:
            return exc
        return futures

    def _read_topic_ids(
        self, topics: set[str], lookup: Mapping[str, Any] | Exception
    ) -> dict[str, str]:
        """The ids a lookup of ``topics`` gave (it is waited for), by name."""
        if isinstance(lookup, Exception):
            self._no_topic_id(topics, lookup)
            return {}
        ids: dict[str, str] = {}
        for topic, future in lookup.items():
            try:
                topic_id = future.result(timeout=_METADATA_TIMEOUT + 5).topic_id
            except Exception as exc:
                self._no_topic_id([topic], exc)
                continue
            if topic_id is None or _is_zero(topic_id):
                log.info(
                    "Kafka broker gives no topic id for %s: its message ids name the cluster, "
                    "topic, partition and offset only",
                    topic,
                )
                continue
            ids[topic] = str(topic_id)
        return ids

    def _no_topic_id(self, topics: Iterable[str], error: Exception) -> None:
        log.warning(
            "Kafka topic id of %s unknown group=%s (%s): its message ids name the cluster, "
            "topic, partition and offset only until the next assignment, so records "
            "redelivered across it may be stored twice",
            ",".join(sorted(topics)),
            self.config.group_id,
            error,
        )

    def _max_message_bytes(self, topics: list[str]) -> dict[str, int | Exception | None]:
        """Each topic's ``max.message.bytes``: an int, None when not reported, or the error."""
        admin = self._admin
        out: dict[str, int | Exception | None] = {}
        resources = [ConfigResource(ResourceType.TOPIC, t) for t in topics]
        try:
            futures = admin.describe_configs(resources, request_timeout=_METADATA_TIMEOUT)
        except KafkaException as exc:
            return dict.fromkeys(topics, exc)
        for resource, future in futures.items():
            try:
                entry = future.result(timeout=_METADATA_TIMEOUT + 5).get("max.message.bytes")
                out[resource.name] = None if entry is None else int(entry.value)
            except Exception as exc:
                out[resource.name] = exc
        return out

    def _check_dlq_limits(self, dlq: str) -> None:
        """Warn, at start, when a record a source topic holds cannot fit in the DLQ topic."""
        sources = [t for t in self.config.topics if not t.startswith("^")]
        limits = self._max_message_bytes([dlq, *sources])
        dlq_limit = limits.get(dlq)
        if isinstance(dlq_limit, Exception):
            log.warning(
                "Kafka DLQ topic %s: cannot read its max.message.bytes (%s); a rejected record "
                "larger than it allows will stop its partition (nothing is committed past a "
                "record that was not dead-lettered)",
                dlq,
                dlq_limit,
            )
            return
        self._dlq_limit = dlq_limit
        client_limit = int(self.config.dlq_settings()["message.max.bytes"])
        for topic in sources:
            limit = limits.get(topic)
            if not isinstance(limit, int):
                log.debug("Kafka topic %s: max.message.bytes unknown (%s)", topic, limit)
                continue
            for smaller, setting in (
                (dlq_limit, f"max.message.bytes of the DLQ topic {dlq}"),
                (
                    client_limit,
                    "message.max.bytes of the dead-letter producer (dead_letter_client)",
                ),
            ):
                if smaller is not None and smaller < limit:
                    log.warning(
                        "Kafka %s is %d bytes, smaller than topic %s's max.message.bytes %d: a "
                        "rejected record between the two (less the up to %d bytes of headers "
                        "acklane adds) cannot be dead-lettered, and its partition stops there "
                        "(nothing is committed past it). Raise %s to at least %d",
                        setting,
                        smaller,
                        topic,
                        limit,
                        DLQ_ADDED_MAX_BYTES,
                        setting,
                        limit + DLQ_ADDED_MAX_BYTES,
                    )

    def _on_client_error(self, error: KafkaError) -> None:
        # Logged once per state change (ClientHealth); a refusal is raised by the
        # consumer thread; a fatal error fails the group (a new client starts over).
        if error.fatal() and self._failure is None and error.code() not in AUTH_CODES:
            self._failure = error
        self._health.on_error(error)

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        # Once per assignment, not per record: a topic deleted and recreated under the
        # same name comes back with a new id (and a rebalance).
        self._health.alive()
        topics = {p.topic for p in partitions}
        assigned: list[tuple[TP, int]] = []
        for p in partitions:
            self._generation += 1
            tp = _tp(p)
            self._ledger.assign(tp, self._generation)
            assigned.append((tp, self._generation))
            if self._starts_at_end:
                self._unanchored.add(tp)
        self._assignment = frozenset(self._owned)
        if self._on_loop:
            # on the loop's thread, which must not wait: named (their records held back)
            # once the topic ids come, waited for on the consumer thread if need be
            self._naming.append((assigned, self._ask_topic_ids(topics)))
        else:
            self._name(assigned, self._read_topic_ids(topics, self._ask_topic_ids(topics)))
        log.info(
            "Kafka partitions assigned group=%s partitions=%s",
            self.config.group_id,
            _names(_tp(p) for p in partitions),
        )

    def _name(self, assigned: list[tuple[TP, int]], topic_ids: Mapping[str, str]) -> None:
        """Fetch the records of partitions still owned since this assignment, named
        by the cluster and their topic's id."""
        cluster = self._cluster_id
        for tp, generation in assigned:
            if self._owned.get(tp) == generation:
                prefix = id_prefix(cluster, tp[0], topic_ids.get(tp[0]), tp[1])
                self._fetching[tp] = (generation, prefix)

    def _name_assigned(self, *, wait: bool) -> bool:
        """Name the partitions assigned on the loop's thread; False (nothing named) when
        a topic id lookup is not done and ``wait`` is false (the loop's thread)."""
        if not wait:
            for _, lookup in self._naming:
                if not isinstance(lookup, Exception) and not all(f.done() for f in lookup.values()):
                    return False
        naming, self._naming = self._naming, []
        for assigned, lookup in naming:
            self._name(assigned, self._read_topic_ids({tp[0] for tp, _ in assigned}, lookup))
        return True

    def _forget(self, partitions: list[Any]) -> list[TP]:
        gone = [_tp(p) for p in partitions]
        for tp in gone:
            self._ledger.revoke(tp)
            self._fetching.pop(tp, None)
            self._unanchored.discard(tp)
            self._deferred_seeks.pop(tp, None)
            self._sought.pop(tp, None)
            self._paused_parts.discard(tp)
        self._assignment = frozenset(self._owned)
        return gone

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        gone = self._forget(partitions)
        log.info(
            "Kafka partitions revoked group=%s partitions=%s: their pending records leave the "
            "books without a commit (the new owner redelivers them)",
            self.config.group_id,
            _names(gone),
        )

    def _on_lost(self, consumer: Any, partitions: list[Any]) -> None:
        gone = self._forget(partitions)
        log.warning(
            "Kafka partitions lost group=%s partitions=%s: their pending records leave the "
            "books without a commit",
            self.config.group_id,
            _names(gone),
        )

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
            if messages or left <= _WAIT_SLICE or self._call_waiting():
                return messages

    def _runs(self, epoch: int, messages: list[Any], anchor: bool = True) -> FetchedRuns:
        """The records of what a consume returned, in runs of one partition each.

        On the consumer thread, or on the loop's thread with ``anchor`` false and every
        assigned partition named (nothing here waits then).
        """
        if self._naming:
            self._name_assigned(wait=True)
        if self._failure is not None or self._health.refused is not None:
            self._raise_if_refused("consuming")
            assert self._failure is not None
            raise KafkaReceiveError(
                f"Kafka client failed for {self.config.describe()}: {self._failure.str()}"
            )
        if self._health.unreachable is not None:
            if messages:
                self._health.alive()
            else:
                self._probe_cluster()
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

    def _advance(self, batch: Sequence[AdvanceItem[KafkaDelivery]]) -> None:
        if self._consumer is None:
            raise KafkaAdvanceError(f"{self.config.describe()}: the consumer is not connected")
        if self._all_clean_in_one_owned_lane(batch):
            last: KafkaDelivery = batch[-1].broker_payload
            self._commit([self._position(last, last.offset + 1)])
            return
        plan = self._ledger.plan(
            LedgerEntry(d.lane, d.offset, d.generation, verdict(item.outcome), item)
            for item in batch
            for d in (item.broker_payload,)
        )
        self.stats.skipped_revoked += plan.skipped_revoked
        for item in plan.held:
            self.stats.held += 1
            log.info(
                "Kafka record held group=%s record=%s acked=%d failed=%d: not committed, "
                "redelivering from it",
                self.config.group_id,
                item.broker_payload.message_id,
                item.outcome.acked,
                item.outcome.failed,
            )
        if plan.dead_letter:
            if self.config.dead_letter is not None:
                self._dead_letter(plan.dead_letter, self.config.dead_letter)
            else:
                self._drop(plan.dead_letter)
        if plan.commits:
            self._commit(
                [self._position(item.broker_payload, to) for to, item in plan.commits.values()]
            )
        for tp, offset in plan.seeks.items():
            if tp in self._paused_parts:
                self._deferred_seeks[tp] = offset
            else:
                self._seek(tp, offset)

    def _all_clean_in_one_owned_lane(self, batch: Sequence[AdvanceItem[KafkaDelivery]]) -> bool:
        """The common case: one partition, owned since, not held, every record clean
        (its :func:`~acklane.core.connectors.verdict` is COMMIT: ``is_clean``)."""
        first: KafkaDelivery = batch[0].broker_payload
        last: KafkaDelivery = batch[-1].broker_payload
        lane = first.lane
        return (
            lane == last.lane
            and first.generation == last.generation
            and self._ledger.is_clear(lane, first.generation, last.offset)
            and _all_clean(batch)
        )

    @staticmethod
    def _position(delivery: KafkaDelivery, offset: int) -> TopicPartition:
        """``offset`` of the record's partition, with the record's leader epoch (KIP-320)."""
        topic, partition = delivery.lane
        epoch = delivery.message.leader_epoch()
        if epoch is None:
            return TopicPartition(topic, partition, offset)
        return TopicPartition(topic, partition, offset, leader_epoch=epoch)

    def _dead_letter(self, items: Sequence[AdvanceItem[KafkaDelivery]], topic: str) -> None:
        producer = self._dlq
        if producer is None:
            producer = self._dlq = self._dlq_producer()
        # (message id, copy size, error) of each copy the broker did not take
        errors: list[tuple[str, int, KafkaError]] = []

        def delivered(record_id: str, size: int, error: KafkaError | None, _msg: Any) -> None:
            if error is not None:
                errors.append((record_id, size, error))

        group = bounded_text(self.config.group_id, DLQ_GROUP_MAX_BYTES)
        for item in items:
            delivery: KafkaDelivery = item.broker_payload
            message = delivery.message
            outcome = item.outcome
            headers: list[tuple[str, str | bytes | None]] = list(message.headers() or ())
            headers += log_origin(message.topic(), message.partition(), message.offset())
            headers += [(ORIGIN_GROUP, group), (REJECT_REASON, outcome_reason(outcome))]
            key, value = message.key(), message.value()
            size = _copy_size(key, value, headers)
            while True:
                try:
                    producer.produce(
                        topic,
                        value=value,
                        key=key,
                        headers=headers,
                        on_delivery=functools.partial(delivered, delivery.message_id, size),
                    )
                    break
                except BufferError:
                    producer.poll(0.1)  # the local queue is full: let deliveries drain
                except KafkaException as exc:
                    error = exc.args[0] if exc.args else None
                    if isinstance(error, KafkaError) and error.code() in _TOO_LARGE:
                        raise self._refused(
                            delivery.message_id, size, topic, by_broker=False
                        ) from exc
                    raise KafkaAdvanceError(
                        f"cannot dead-letter {delivery.message_id} ({size} bytes of key, value "
                        f"and headers) to {topic!r}: {exc}; nothing was committed past it"
                    ) from exc
        remaining = producer.flush(self.config.dead_letter_flush_timeout)
        if remaining:
            raise KafkaAdvanceError(
                f"{remaining} dead-letter copies to {topic!r} were not confirmed within "
                f"{self.config.dead_letter_flush_timeout}s; nothing was committed past them"
            )
        if errors:
            refused = [(mid, size) for mid, size, e in errors if e.code() in _TOO_LARGE]
            if refused:
                raise self._refused(*refused[0], topic, by_broker=True, count=len(refused))
            mid, _, error = errors[0]
            raise KafkaAdvanceError(
                f"dead-lettering to {topic!r} failed: {error.str()} (the copy of {mid}); "
                "nothing was committed past it"
            )
        for item in items:
            self._dead_letters.copied(item.broker_payload.message_id, outcome_reason(item.outcome))
        self.stats.dead_lettered = self._dead_letters.dead_lettered

    def _dlq_producer(self) -> Any:
        settings = self.config.dlq_settings()
        settings["error_cb"] = self._on_client_error
        settings["logger"] = _client_log
        limit = self._dlq_limit
        if limit is not None and "batch.size" not in settings:
            # Copies batched together must fit the DLQ topic's limit as one batch too.
            settings["batch.size"] = min(limit, _LIBRDKAFKA_BATCH_SIZE)
        return Producer(settings)

    def _refused(
        self, message_id: str, size: int, topic: str, *, by_broker: bool, count: int = 1
    ) -> DeadLetterRefused:
        """A dead-letter copy refused as too large: counted, told, and the error to raise."""
        if by_broker:
            limit = "" if self._dlq_limit is None else f" of {self._dlq_limit} bytes"
            why = f"the broker refused it: over the max.message.bytes{limit} of topic {topic!r}"
        else:
            limit = self.config.dlq_settings()["message.max.bytes"]
            why = f"the DLQ producer refuses messages over its message.max.bytes of {limit} bytes"
        text = (
            f"cannot dead-letter {message_id}: its copy is {size} bytes (key, value and "
            f"headers) and {why}. Nothing was committed past it: the group fails on it until "
            f"the copy fits. Raise max.message.bytes on the DLQ topic {topic!r} and/or "
            f"message.max.bytes in dead_letter_client"
        )
        refused = self._dead_letters.refuse(
            text,
            settings=(
                f"max.message.bytes of topic {topic}",
                "dead_letter_client.message.max.bytes",
            ),
            count=count,
        )
        self.stats.dead_letter_refused = self._dead_letters.refused
        return refused

    def _drop(self, items: Sequence[AdvanceItem[KafkaDelivery]]) -> None:
        for item in items:
            self._dead_letters.drop(
                item.broker_payload.message_id,
                outcome_reason(item.outcome),
                why="committed past, no dead_letter",
            )
        self.stats.dropped = self._dead_letters.dropped

    def _commit(self, offsets: list[TopicPartition]) -> None:
        try:
            result = self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if isinstance(error, KafkaError) and error.code() in _REBALANCING:
                self._skip_commit(offsets, error.str())
                return
            if isinstance(error, KafkaError) and error.code() in AUTH_CODES:
                raise auth_error(error, "committing offsets") from exc
            raise KafkaAdvanceError(
                f"commit of {_names(_tp(o) for o in offsets)} for {self.config.describe()} "
                f"failed: {exc}"
            ) from exc
        for tp in result or ():
            if tp.error is not None:
                if tp.error.code() in _REBALANCING:
                    self._skip_commit([tp], tp.error.str())
                    continue
                raise KafkaAdvanceError(
                    f"commit of {tp.topic}[{tp.partition}] at {tp.offset} for "
                    f"{self.config.describe()} failed: {tp.error.str()}"
                )
            self._ledger.committed_to(_tp(tp), tp.offset)
        self.stats.committed += 1
        if self._health.unreachable is not None:
            self._health.alive()

    def _skip_commit(self, offsets: list[TopicPartition], why: str) -> None:
        self.stats.commit_skipped += 1
        log.warning(
            "Kafka commit skipped group=%s partitions=%s: %s (the group is rebalancing; the "
            "partition's next owner redelivers from its last commit)",
            self.config.group_id,
            _names(_tp(o) for o in offsets),
            why,
        )

    def _seek(self, tp: TP, offset: int) -> None:
        """Seek back to a held offset; records at or after it in batches fetched
        before now are stale (they come again) and are not handed out."""
        try:
            self._consumer.seek(TopicPartition(tp[0], tp[1], offset))
        except KafkaException as exc:
            raise KafkaAdvanceError(
                f"cannot seek {tp[0]}[{tp[1]}] back to held offset {offset} for redelivery: {exc}"
            ) from exc
        self._seek_epoch += 1
        self._sought[tp] = (self._seek_epoch, offset)
        self._ledger.sought(tp, offset)
        self.stats.sought_back += 1

    def _close_clients(self) -> None:
        problems: list[str] = []
        if self._dlq is not None:
            try:
                remaining = self._dlq.flush(self.config.dead_letter_flush_timeout)
                if remaining:
                    problems.append(f"{remaining} dead-letter copies were not confirmed")
            except Exception as exc:
                problems.append(f"DLQ producer flush failed: {exc!r}")
            self._dlq = None
        self._admin = None
        if self._consumer is not None:
            try:
                self._consumer.close()
            except Exception as exc:
                problems.append(f"consumer close failed: {exc!r}")
            self._consumer = None
        if problems:
            raise KafkaAdvanceError(f"closing {self.config.describe()}: {'; '.join(problems)}")
