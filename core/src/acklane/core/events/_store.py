"""The event store: every trigger event is committed before its raw event may be acked.

``put`` checks and serializes a record and queues it without suspending. One
writer task (owned by the store) takes what is queued, lingers at most
``commit_interval`` for more while more keeps coming, writes the batch in one transaction with one
duplicate-skipping INSERT, commits, and only then calls ``on_confirmed`` with
the batch's binding numbers. A failed transaction is rolled back, confirms
nothing, and is retried with capped exponential backoff.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Literal, NoReturn

from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ..durations import format_duration
from ..errors import AcklaneError
from ..names import DEFAULT_PIPELINE, check_pipeline_name
from ..redact import redact_url
from ..sql import (
    DEFAULT_URL,
    async_engine,
    is_sqlite_memory,
    sqlite_path_problem,
    unsupported_url,
)
from ._insert import BatchInsert, batch_insert_for
from ._model import (
    MAX_MESSAGE_ID_BYTES,
    MAX_POSITION,
    EncodedRow,
    EventRecord,
    StoredEvent,
    checked_message_id,
    encode_payload,
    encode_record,
    storable_pair,
)
from ._reader import EventReader
from ._retention import DEFAULT_PRUNE_BATCH, count_older_than, cutoff_for, prune_older_than
from ._schema import create_tables

__all__ = [
    "BeforeCommitHook",
    "ConfirmCallback",
    "EventStore",
    "EventStoreStats",
    "StoreUnavailable",
    "backoff",
    "display_url",
    "why_unavailable",
]

log = logging.getLogger("acklane.core.events")

ConfirmCallback = Callable[[Sequence[int]], None]
BeforeCommitHook = Callable[[AsyncConnection], Awaitable[None]]

_State = Literal["new", "open", "closing", "closed"]


@dataclass(slots=True)
class EventStoreStats:
    """Counters of one store's writer since it opened (read them, don't write them)."""

    #: Transactions committed; each holds one batch.
    batches: int = 0
    #: Records committed and confirmed (new rows plus duplicates).
    events: int = 0
    #: New rows written.
    inserted: int = 0
    #: Records that were already stored (a redelivered copy): confirmed, not written again.
    duplicates: int = 0
    #: Transactions that failed and were rolled back (each is retried).
    failed_attempts: int = 0
    #: The most records one transaction held.
    largest_batch: int = 0
    #: Rows deleted by retention (:meth:`EventStore.prune`).
    pruned: int = 0


class EventStore:
    """Durable, deduplicating store of trigger events with group commit.

    Use as ``async with EventStore(url, on_confirmed=cb) as store:``. ``put``
    never suspends unless ``max_pending`` records wait for the writer (then it
    waits for room: back-pressure); at most ``max_pending + max_batch`` records
    are held in memory. ``on_confirmed`` is called on the event loop, right
    after each commit, with the non-None ``seq`` of every record of the batch
    (duplicates included).
    """

    #: First and largest pause between two attempts at a failed batch (seconds).
    retry_initial_delay: float = 0.05
    retry_max_delay: float = 5.0
    #: Seconds :meth:`open` waits for its first connection before it gives up.
    open_timeout: float = 30.0

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        on_confirmed: ConfirmCallback | None = None,
        commit_interval: float = 0.002,
        max_batch: int = 2000,
        max_pending: int = 20000,
        pipeline: str = DEFAULT_PIPELINE,
    ) -> None:
        if commit_interval < 0:
            raise ValueError(f"commit_interval must be >= 0, not {commit_interval}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, not {max_batch}")
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, not {max_pending}")
        self.url = url
        #: Every row this store writes, reads, counts and prunes is this pipeline's.
        self.pipeline = check_pipeline_name(pipeline)
        self.stats = EventStoreStats()
        #: Test hook (failure injection): awaited in each write transaction after
        #: the INSERT and before COMMIT; raising makes the transaction fail.
        self.before_commit: BeforeCommitHook | None = None
        #: PostgreSQL: ``NOTIFY`` this channel in each transaction that stored new rows,
        #: so that sink dispatchers in other processes wake at once (set by the runner
        #: when sinks are configured).
        self.notify_channel: str | None = None
        self._commit_listeners: list[Callable[[], None]] = []
        self._on_confirmed = on_confirmed
        self._commit_interval = commit_interval
        self._max_batch = max_batch
        self._max_pending = max_pending
        self._state: _State = "new"
        self._engine: AsyncEngine | None = None
        self._pg = False
        self._reader: EventReader | None = None
        self._insert: BatchInsert | None = None
        # One in-memory SQLite database lives on one shared connection: writer and
        # readers take turns on it. Files and PostgreSQL use pooled connections.
        self._serialize: asyncio.Lock | None = None
        self._writer: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None
        self._stopping = False
        self._queue: deque[tuple[EncodedRow, int | None]] = deque()
        # put_event_nowait's memos: each trigger's last (stream key, storable key), and
        # the last shared payload with its JSON text (held, so its id is not reused).
        self._pairs: dict[str, tuple[str, str]] = {}
        self._last_payload: tuple[Any, str] = (None, "null")
        self._accepted = 0  # records put so far
        self._done = 0  # records committed and confirmed so far (FIFO, so a prefix)
        self._flush_waiters: deque[tuple[int, asyncio.Future[None]]] = deque()
        self._wakeup = asyncio.Event()  # the queue became non-empty, or stop
        self._batch_full = asyncio.Event()  # cut the linger short
        self._room = asyncio.Event()  # the queue shrank below max_pending
        self._closed = asyncio.Event()
        # Health (read by /readyz from another thread: plain values only).
        self._write_problem: str | None = None  # the last write attempt failed: why
        self._ping_problem: str | None = None  # the last ping failed: why

    # -- lifecycle -----------------------------------------------------------------

    async def __aenter__(self) -> EventStore:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def open(self) -> None:
        """Create the table if missing and start the writer task."""
        if self._state == "open":
            return
        if self._state != "new":
            raise RuntimeError(
                f"event store {self._display_url()} is {self._state}; open a new one"
            )
        unsupported = unsupported_url(self.url)
        if unsupported is not None:
            raise ValueError(
                f"the event store supports sqlite:// and postgresql:// URLs "
                f"({self._display_url()}): {unsupported}"
            )
        engine = async_engine(self.url)
        try:
            self._insert = batch_insert_for(engine.dialect, self.pipeline)
            await _reach(engine, self.url, self.open_timeout)
            await create_tables(engine)
        except BaseException:
            await engine.dispose()
            raise
        if is_sqlite_memory(self.url):
            self._serialize = asyncio.Lock()
        self._engine = engine
        self._pg = engine.dialect.name == "postgresql"
        self._reader = EventReader(engine, self._serialize, pipeline=self.pipeline)
        self._state = "open"
        self._writer = asyncio.create_task(self._write_loop(), name="acklane-event-store-writer")

    async def flush(self) -> None:
        """Return when every record put so far is committed and confirmed."""
        target = self._accepted
        if self._done >= target:
            return
        self._raise_if_failed()
        if self._state == "closed":
            raise RuntimeError(
                f"event store {self._display_url()} closed with "
                f"{target - self._done} event(s) never committed"
            )
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._flush_waiters.append((target, future))
        self._batch_full.set()  # no lingering: someone is waiting
        await future

    async def close(self) -> None:
        """Flush, stop the writer, dispose of the engine. Idempotent.

        If the database stays unreachable, flushing waits (bound it with
        ``asyncio.timeout``); a close that is cancelled or times out drops the
        records not yet committed, which were never confirmed: the broker
        redelivers their raw events.
        """
        if self._state == "closed":
            return
        if self._state == "closing":
            await self._closed.wait()
            return
        if self._state == "new":
            self._state = "closed"
            self._closed.set()
            return
        self._state = "closing"
        self._room.set()  # puts waiting for room give up
        try:
            if self._failure is None:
                await self.flush()
        finally:
            await self._shutdown()

    async def _shutdown(self) -> None:
        writer = self._writer
        dropped = self._accepted - self._done
        self._stopping = True
        if writer is not None:
            if dropped:
                writer.cancel()
            self._wakeup.set()
            await asyncio.wait([writer])
            if not writer.cancelled():
                writer.exception()  # already logged by the writer; retrieved here
        if dropped:
            log.warning(
                "event store %s closed with %d event(s) not committed; they were never "
                "confirmed, so their raw events will be redelivered",
                self._display_url(),
                dropped,
            )
        self._queue.clear()
        self._fail_flush_waiters(RuntimeError("the event store closed before this flush completed"))
        try:
            if self._engine is not None:
                await self._engine.dispose()
        finally:
            self._state = "closed"
            self._closed.set()

    # -- writing ---------------------------------------------------------------------

    async def put(self, record: EventRecord, seq: int | None = None) -> None:
        """Queue ``record`` for the next batch; ``seq`` comes back in ``on_confirmed``.

        The payload is checked and serialized here: a value that is not JSON raises
        :class:`TypeError` naming the trigger and the offending type, and nothing is
        queued. Returns without suspending unless ``max_pending`` records wait.
        """
        row = encode_record(record)
        if seq is not None and type(seq) is not int:
            raise TypeError(f"seq must be an int or None, not {type(seq).__qualname__}")
        self._raise_unless_accepting()
        queue = self._queue
        while len(queue) >= self._max_pending:
            self._room.clear()
            await self._room.wait()
            self._raise_unless_accepting()
        self._enqueue(row, seq)

    def put_nowait(self, record: EventRecord, seq: int | None = None) -> None:
        """:meth:`put` without waiting: queued even past ``max_pending`` (a caller that
        cannot wait, the engine's inline path, waits on :meth:`room` instead, between
        batches). The same checks, the same errors."""
        self._queue_row(encode_record(record), seq)

    def put_event_nowait(
        self,
        trigger_id: str,
        stream_key: str,
        payload: Any,
        message_id: str | None,
        position: int,
        seq: int | None = None,
        payload_shared: bool = False,
    ) -> None:
        """:meth:`put_nowait` of an :class:`EventRecord`'s fields, without building one
        (the runner's inline path, once per trigger event): the same checks and errors,
        written out here for the common case (a checked trigger and stream key, an
        ASCII message id), which is most of a run's work outside the database.

        ``payload_shared``: the caller knows that a payload which is the very object
        of the previous such put is unchanged since (one message's decoded body,
        emitted by several declarative watchers, which only read it): its JSON text
        is then reused instead of checked and encoded again.
        """
        if type(trigger_id) is str and type(stream_key) is str:
            checked = self._pairs.get(trigger_id)
            if checked is not None and checked[0] == stream_key:
                storable_key = checked[1]
            else:
                storable_key = storable_pair(trigger_id, stream_key)
                self._pairs[trigger_id] = (stream_key, storable_key)
        else:
            storable_key = storable_pair(trigger_id, stream_key)
        if message_id is not None and not (
            type(message_id) is str
            and message_id.isascii()
            and len(message_id) <= MAX_MESSAGE_ID_BYTES
            and "\x00" not in message_id
        ):
            message_id = checked_message_id(trigger_id, message_id)
        if type(position) is not int or not 0 <= position <= MAX_POSITION:
            raise ValueError(
                f"trigger {trigger_id!r}: position must be an int in [0, {MAX_POSITION}], "
                f"not {position!r}"
            )
        if payload_shared:
            last = self._last_payload
            if last[0] is payload:
                text = last[1]
            else:
                text = encode_payload(trigger_id, payload)
                self._last_payload = (payload, text)
        else:
            text = encode_payload(trigger_id, payload)
        if seq is not None and type(seq) is not int:
            raise TypeError(f"seq must be an int or None, not {type(seq).__qualname__}")
        if self._failure is not None or self._state != "open":
            self._raise_unless_accepting()
        queue = self._queue
        queue.append(((trigger_id, storable_key, text, message_id, position), seq))
        self._accepted += 1
        size = len(queue)
        if size == 1:
            self._wakeup.set()
        if size >= self._max_batch:
            self._batch_full.set()

    def _queue_row(self, row: EncodedRow, seq: int | None) -> None:
        if seq is not None and type(seq) is not int:
            raise TypeError(f"seq must be an int or None, not {type(seq).__qualname__}")
        self._raise_unless_accepting()
        self._enqueue(row, seq)

    def _enqueue(self, row: EncodedRow, seq: int | None) -> None:
        """Append a checked row, and wake the writer (first row) or flush (batch full).
        ``put_event_nowait`` writes the same steps in line: it runs once per event."""
        queue = self._queue
        queue.append((row, seq))
        self._accepted += 1
        size = len(queue)
        if size == 1:
            self._wakeup.set()
        if size >= self._max_batch:
            self._batch_full.set()

    def room(self) -> Awaitable[None] | None:
        """None while fewer than ``max_pending`` records wait for the writer, else an
        awaitable that is done once they are fewer (or the store fails or closes)."""
        if len(self._queue) < self._max_pending:
            return None
        return self._wait_for_room()

    async def _wait_for_room(self) -> None:
        queue = self._queue
        while len(queue) >= self._max_pending:
            self._room.clear()
            await self._room.wait()
            self._raise_unless_accepting()

    def add_commit_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` on the event loop after each commit that stored new rows
        (a sink dispatcher wakes on it). It must not raise or block."""
        self._commit_listeners.append(listener)

    @property
    def pending(self) -> int:
        """Records put and not yet committed (queued or in the transaction in flight)."""
        return self._accepted - self._done

    async def _write_loop(self) -> None:
        queue = self._queue
        # Only on SQLite, where a commit is cheap (an fsync on this machine), does the
        # linger stop as soon as nothing more comes; a PostgreSQL commit costs several
        # round trips, and fuller batches there measured faster (bench/README.md,
        # "runfast").
        eager = not self._pg
        try:
            while True:
                if not queue:
                    if self._stopping:
                        return
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
                if (
                    len(queue) < self._max_batch
                    and self._commit_interval > 0
                    and not self._flush_waiters
                    and not self._stopping
                ):
                    self._batch_full.clear()
                    linger = True
                    if eager:
                        # Linger only while records keep coming: one turn of the loop
                        # first (what the engine hands out now is queued in it); if none
                        # came in that turn, none is on its way, and lingering would only
                        # add commit_interval to the latency of every event of the batch.
                        before = len(queue)
                        await asyncio.sleep(0)
                        linger = len(queue) > before and not self._flush_waiters
                    if linger:
                        try:
                            async with asyncio.timeout(self._commit_interval):
                                await self._batch_full.wait()
                        except TimeoutError:
                            pass
                # Records queued from here on, while this batch commits, form the next one.
                batch = [queue.popleft() for _ in range(min(len(queue), self._max_batch))]
                self._room.set()
                inserted = await self._commit(batch)
                self._confirm(batch, inserted)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # a bug: fail loudly rather than hang everyone
            log.exception("event store %s: the writer stopped", self._display_url())
            self._failure = exc
            self._room.set()
            self._fail_flush_waiters(RuntimeError("the event store writer stopped"), cause=exc)
            raise

    async def _commit(self, batch: list[tuple[EncodedRow, int | None]]) -> int:
        """Write and commit one batch, retrying until it is committed; the number of new rows."""
        assert self._engine is not None and self._insert is not None
        rows = [row for row, _ in batch]
        pauses = backoff(self.retry_initial_delay, self.retry_max_delay)
        attempt = 0
        while True:
            attempt += 1
            created_at = datetime.now(UTC)
            try:
                async with self._turn(), self._engine.connect() as conn, conn.begin():
                    inserted = await self._insert(conn, rows, created_at)
                    if self.notify_channel is not None and inserted != 0 and self._pg:
                        await conn.exec_driver_sql(f"NOTIFY {self.notify_channel}")
                    if self.before_commit is not None:
                        await self.before_commit(conn)
                self._write_problem = None
                if attempt > 1:
                    log.info(
                        "event store %s: writable again; the batch was committed at attempt %d",
                        self._display_url(),
                        attempt,
                    )
                return inserted
            except Exception as exc:  # DB error, lock, lost connection: nothing is confirmed
                self.stats.failed_attempts += 1
                self._write_problem = f"writing failed: {type(exc).__name__}: {exc}"
                delay = next(pauses)
                # told once per outage (then at DEBUG), and once more when it ends
                log.log(
                    logging.WARNING if attempt == 1 else logging.DEBUG,
                    "event store %s: writing a batch of %d event(s) failed (attempt %d), "
                    "rolled back, nothing confirmed; retrying in %.2f s until it succeeds: "
                    "%s: %s",
                    self._display_url(),
                    len(rows),
                    attempt,
                    delay,
                    type(exc).__name__,
                    exc,
                )
                await asyncio.sleep(delay)

    def _confirm(self, batch: list[tuple[EncodedRow, int | None]], inserted: int) -> None:
        size = len(batch)
        stats = self.stats
        stats.batches += 1
        stats.events += size
        if inserted >= 0:
            stats.inserted += inserted
            stats.duplicates += size - inserted
        stats.largest_batch = max(stats.largest_batch, size)
        self._done += size
        if inserted != 0:
            for listener in self._commit_listeners:
                listener()
        if self._on_confirmed is not None:
            seqs = [seq for _, seq in batch if seq is not None]
            if seqs:
                try:
                    self._on_confirmed(seqs)
                except Exception:
                    # The rows are committed; an engine that missed the confirmation
                    # times the raw events out and they come back as duplicates.
                    log.exception("event store: on_confirmed raised for %d seq(s)", len(seqs))
        waiters = self._flush_waiters
        while waiters and waiters[0][0] <= self._done:
            _, future = waiters.popleft()
            if not future.done():
                future.set_result(None)

    def _fail_flush_waiters(self, error: Exception, cause: BaseException | None = None) -> None:
        error.__cause__ = cause
        while self._flush_waiters:
            _, future = self._flush_waiters.popleft()
            if not future.done():
                future.set_exception(error)

    def _raise_unless_accepting(self) -> None:
        self._raise_if_failed()
        if self._state != "open":
            raise RuntimeError(
                f"event store {self._display_url()} is {self._state}: "
                + ("open it first" if self._state == "new" else "it takes no more events")
            )

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            raise RuntimeError("the event store writer stopped") from self._failure

    def _turn(self) -> AbstractAsyncContextManager[object]:
        return self._serialize if self._serialize is not None else nullcontext()

    # -- health ----------------------------------------------------------------------

    @property
    def problem(self) -> str | None:
        """Why the store cannot take events now (None: it can): it is not open, its
        writer stopped, its last write attempt failed (and is being retried), or the
        last :meth:`ping` failed. Safe to read from another thread."""
        if self._failure is not None:
            return "the event store writer stopped"
        if self._state != "open":
            return f"the event store is {self._state}"
        return self._write_problem or self._ping_problem

    async def ping(self, max_wait: float = 5.0) -> bool:
        """A cheap round trip to the database (``SELECT 1``); records the outcome for
        :attr:`problem` and returns whether it succeeded. Never raises for a database
        problem or a timeout."""
        if self._engine is None or self._state != "open":
            return False
        try:
            async with asyncio.timeout(max_wait), self._turn(), self._engine.connect() as conn:
                await conn.exec_driver_sql("SELECT 1")
        except TimeoutError:
            self._ping_problem = f"the database did not answer within {max_wait:g}s"
            return False
        except Exception as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise asyncio.CancelledError from None  # cancelled inside the driver
            self._ping_problem = f"the database is unreachable: {type(exc).__name__}: {exc}"
            return False
        self._ping_problem = None
        return True

    # -- retention -------------------------------------------------------------------

    async def count_older_than(self, cutoff: datetime) -> int:
        """How many of the pipeline's stored events created before ``cutoff`` may be pruned."""
        engine = self._open_engine()
        return await count_older_than(engine, cutoff, pipeline=self.pipeline, serialize=self._turn)

    async def prune(
        self,
        cutoff: datetime,
        *,
        batch_size: int = DEFAULT_PRUNE_BATCH,
        on_batch: Callable[[int], None] | None = None,
    ) -> int:
        """Delete the events created before ``cutoff``, ``batch_size`` per transaction
        (see :func:`~acklane.core.events.prune_older_than`); the number deleted."""
        engine = self._open_engine()

        def counted(n: int) -> None:
            self.stats.pruned += n
            if on_batch is not None:
                on_batch(n)

        return await prune_older_than(
            engine,
            cutoff,
            batch_size=batch_size,
            pipeline=self.pipeline,
            serialize=self._turn,
            on_batch=counted,
        )

    async def run_retention_forever(
        self, retention: float, interval: float, *, batch_size: int = DEFAULT_PRUNE_BATCH
    ) -> NoReturn:
        """Prune events older than ``retention`` seconds now, then every ``interval``.

        Meant to run as a task owned by the engine's TaskGroup and cancelled with it.
        A failed round is logged and tried again at the next interval: a database
        hiccup must not bring the engine down.
        """
        while True:
            cutoff = cutoff_for(retention)
            try:
                deleted = await self.prune(cutoff, batch_size=batch_size)
            except Exception as exc:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    # a cancellation inside a database call can surface as a driver
                    # error (SQLAlchemy's greenlet bridge): stop all the same
                    raise asyncio.CancelledError from None
                log.warning(
                    "event store %s: pruning events older than %s failed; next try in %s: %s: %s",
                    self._display_url(),
                    format_duration(retention),
                    format_duration(interval),
                    type(exc).__name__,
                    exc,
                )
                log.debug("pruning failed", exc_info=True)
            else:
                if deleted:
                    log.info(
                        "event store %s: pruned %d event(s) created before %s (retention %s)",
                        self._display_url(),
                        deleted,
                        cutoff.isoformat(timespec="seconds"),
                        format_duration(retention),
                    )
            await asyncio.sleep(interval)

    def _open_engine(self) -> AsyncEngine:
        if self._engine is None or self._state == "closed":
            raise RuntimeError(f"event store {self._display_url()} is not open")
        return self._engine

    # -- reading ---------------------------------------------------------------------

    @property
    def reader(self) -> EventReader:
        if self._reader is None or self._state == "closed":
            raise RuntimeError(f"event store {self._display_url()} is not open")
        return self._reader

    async def list_events(
        self,
        *,
        trigger_id: str | None = None,
        stream_key: str | None = None,
        after_id: int | None = None,
        limit: int = 100,
        newest_first: bool = False,
    ) -> list[StoredEvent]:
        """Committed events in id order (or newest first), filtered, at most ``limit``."""
        return await self.reader.list_events(
            trigger_id=trigger_id,
            stream_key=stream_key,
            after_id=after_id,
            limit=limit,
            newest_first=newest_first,
        )

    async def count(self, *, trigger_id: str | None = None) -> int:
        return await self.reader.count(trigger_id=trigger_id)

    def tail(
        self,
        *,
        trigger_id: str | None = None,
        stream_key: str | None = None,
        after_id: int | None = None,
        poll_interval: float = 0.5,
    ) -> AsyncGenerator[StoredEvent, None]:
        """Follow new events forever (see :meth:`EventReader.tail`)."""
        return self.reader.tail(
            trigger_id=trigger_id,
            stream_key=stream_key,
            after_id=after_id,
            poll_interval=poll_interval,
        )

    def _display_url(self) -> str:
        return display_url(self.url)

    def __repr__(self) -> str:
        return f"<EventStore {self._display_url()} {self._state} pending={self.pending}>"


class StoreUnavailable(AcklaneError, RuntimeError):
    """The event store's database cannot be opened (``store.url``): a SQLite file in a
    directory that is missing or not writable, a PostgreSQL server that does not
    answer or refuses the login. ``acklane run`` exits with code 1 on it."""

    def __init__(self, url: str, reason: str) -> None:
        self.url = display_url(url)
        self.reason = reason
        super().__init__(f"cannot open the event store {self.url} (store.url): {reason}")


async def _reach(engine: AsyncEngine, url: str, seconds: float) -> None:
    """Connect once, so that a database that cannot be opened is named, not retried."""
    path = _sqlite_file(url)
    if path is not None and "uri" not in make_url(url).query:
        # Named without trying: a failed aiosqlite connect can leave its worker thread
        # answering a loop that is already closed (a stray traceback at exit).
        problem = sqlite_path_problem(path)
        if problem:
            raise StoreUnavailable(url, f"unable to open database file: {problem}")
    try:
        async with asyncio.timeout(seconds):
            pauses = backoff(0.05, 1.0)
            while True:
                try:
                    async with engine.connect():
                        return
                except DBAPIError as exc:
                    # another process opening the same SQLite file holds its lock for a
                    # moment (setting up WAL): that one is waited out, not fatal
                    if path is None or "database is locked" not in str(exc):
                        raise
                await asyncio.sleep(next(pauses))
    except TimeoutError:
        raise StoreUnavailable(url, f"no connection within {seconds:g}s") from None
    except (DBAPIError, OSError) as exc:
        raise StoreUnavailable(url, why_unavailable(url, exc)) from exc


def why_unavailable(url: str, exc: BaseException) -> str:
    """A one-line reason a database could not be opened: the driver's first words,
    and for SQLite what is wrong with the file's directory."""
    original = getattr(exc, "orig", None) or exc
    lines = [line.strip() for line in str(original).splitlines() if line.strip()]
    reason = "; ".join(line for line in lines if not line.startswith("(Background"))
    reason = reason or type(original).__name__
    path = _sqlite_file(url)
    problem = None if path is None else sqlite_path_problem(path)
    return f"{reason}: {problem}" if problem else reason


def _sqlite_file(url: str) -> str | None:
    """The database file of a SQLite URL (not an in-memory one), else None."""
    u = make_url(url)
    if u.get_backend_name() == "sqlite" and u.database and not is_sqlite_memory(url):
        return u.database
    return None


def backoff(initial: float, cap: float) -> Iterator[float]:
    """Pauses between attempts: ``initial``, doubling, never above ``cap``."""
    delay = initial
    while True:
        yield min(delay, cap)
        delay = min(delay * 2, cap)


def display_url(url: str) -> str:
    """The URL without its password or secret query parameters, for logs and errors."""
    try:
        rendered = make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<invalid URL>"
    return redact_url(rendered)
