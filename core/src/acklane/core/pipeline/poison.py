"""The poison policy: a message that keeps failing its watchers is dead-lettered, and its
stream moves on.

A watcher's filter that raises on a message, or sits on it past ``engine.ack_timeout``,
fails its cohort: the cohort restarts and the broker delivers the message again. The
engine tells the policy which message such a failure belongs to (the raw event the
failing filter was on; a failure that belongs to no one message, such as a broker or
an event store error, counts for none). The policy counts these failed attempts per
message, with the last error, and keeps them in acklane's database
(:mod:`acklane.core.events.attempts`), so a restart of the process does not reset them.

When a message that has already failed ``max_attempts`` times (a stream setting,
:data:`DEFAULT_MAX_ATTEMPTS` by default) is delivered again, the engine does not hand it
to the watchers: it rejects it on behalf of all of them with the reason
``poison: failed N times; last error: watcher W: <error>``, and the connector
dead-letters it as any rejected message (its dead-letter copy carries the reason).

The policy also keeps the per-stream counts the runner reports: restarts, failed
attempts and messages dead-lettered as poison.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from ..connectors._stream_settings import DEFAULT_MAX_ATTEMPTS, MaxAttempts
from ..connectors.deadletter import bounded_text
from ..names import DEFAULT_PIPELINE
from ..redact import redact

if TYPE_CHECKING:
    from ..events.attempts import AttemptRecord, AttemptStore

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "Failure",
    "MaxAttempts",
    "PoisonPolicy",
    "StreamAttempts",
    "describe_error",
    "max_attempts_of",
]

log = logging.getLogger("acklane.core.pipeline.poison")

# DEFAULT_MAX_ATTEMPTS and MaxAttempts (``max_attempts``, a field of every stream block)
# are defined with the other shared stream settings, in acklane.core.connectors.
#: The most bytes of error text kept per message (and quoted in a dead-letter reason).
MAX_ERROR_BYTES: Final = 1024
#: Seconds the background writer waits to gather more changes into one flush.
_FLUSH_LINGER: Final = 0.5


def max_attempts_of(config: object) -> int:
    """A stream configuration's ``max_attempts`` (the default for a connector without it)."""
    value = getattr(config, "max_attempts", None)
    return value if isinstance(value, int) and value >= 1 else DEFAULT_MAX_ATTEMPTS


def describe_error(error: BaseException) -> str:
    """``Type: text`` (or ``Type``) of an exception, redacted and bounded for storage and
    reasons: the text is kept in the database and quoted in a dead-letter copy, span and
    log line, and a filter's error may quote a connection URL or a secret."""
    text = str(error)
    described = f"{type(error).__name__}: {text}" if text else type(error).__name__
    return bounded_text(redact(described), MAX_ERROR_BYTES)


@dataclass(frozen=True, slots=True)
class Failure:
    """A failed attempt the engine attributed to a message (the last one of a run)."""

    message_id: str
    watcher: str
    error: str
    attempts: int
    max_attempts: int

    def describe(self) -> str:
        return (
            f"watcher {self.watcher} failed on message {self.message_id} "
            f"(attempt {self.attempts} of max_attempts={self.max_attempts}): {self.error}"
        )


class StreamAttempts:
    """The policy's books of one stream key: suspects, counts, and what to write."""

    def __init__(self, key_text: str, max_attempts: int) -> None:
        self.key_text = key_text
        self.max_attempts = max_attempts
        #: message id -> its failed attempts; the engine reads this mapping live.
        self.suspects: dict[str, AttemptRecord] = {}
        #: Failed attempts attributed to a message (cumulative, for metrics).
        self.failures = 0
        #: Messages dead-lettered because they reached max_attempts (cumulative).
        self.poisoned = 0
        #: Restarts of the stream's cohort (cumulative).
        self.restarts = 0
        #: Events advanced since :meth:`take_progress` last looked.
        self.advanced = 0
        #: The last attributed failure since :meth:`take_failure` last looked.
        self.last_failure: Failure | None = None
        # not yet written: message id -> (watcher, error, failed attempts to add)
        self._to_add: dict[str, tuple[str, str, int]] = {}
        self._to_forget: set[str] = set()

    def take_failure(self) -> Failure | None:
        failure, self.last_failure = self.last_failure, None
        return failure

    def take_progress(self) -> int:
        advanced, self.advanced = self.advanced, 0
        return advanced

    @property
    def dirty(self) -> bool:
        return bool(self._to_add or self._to_forget)


class PoisonPolicy:
    """Counts failed attempts per message, durably, and judges each redelivered suspect.

    Implements the engine's :class:`~acklane.core.manager.PoisonPolicy` hooks (all
    synchronous, on the event loop; they only change memory) and the runner's side:
    :meth:`open` the table, :meth:`load` a stream's suspects before its cohort starts,
    :meth:`flush` changes to the table (also done in the background by
    :meth:`run_forever`), :meth:`close`.
    """

    def __init__(self) -> None:
        self._books: dict[Hashable, StreamAttempts] = {}
        self._store: AttemptStore | None = None
        self._lock: asyncio.Lock | None = None
        self._wake: asyncio.Event | None = None
        self._write_error: str | None = None

    def stream(self, key: Hashable, key_text: str, max_attempts: int) -> StreamAttempts:
        """The books of ``key`` (made on first use)."""
        book = self._books.get(key)
        if book is None:
            book = self._books[key] = StreamAttempts(key_text, max_attempts)
        return book

    def streams(self) -> Mapping[Hashable, StreamAttempts]:
        return self._books

    # -- the engine's hooks

    def suspects(self, key: Hashable) -> Mapping[str, object]:
        book = self._books.get(key)
        return {} if book is None else book.suspects

    def poisoned(self, key: Hashable, message_id: str) -> str | None:
        book = self._books.get(key)
        record = None if book is None else book.suspects.get(message_id)
        if book is None or record is None or record.attempts < book.max_attempts:
            return None
        book.poisoned += 1
        times = f"{record.attempts} time{'' if record.attempts == 1 else 's'}"
        watcher = f"watcher {record.watcher}: " if record.watcher else ""
        log.warning(
            "Dead-lettering message %s of key=%s: it failed %s (max_attempts=%d); last error: %s%s",
            message_id,
            book.key_text,
            times,
            book.max_attempts,
            watcher,
            record.last_error,
        )
        return bounded_text(f"poison: failed {times}; last error: {watcher}{record.last_error}")

    def failed(self, key: Hashable, trigger_id: str, message_id: str, error: BaseException) -> None:
        book = self._books.get(key)
        if book is None:
            return
        from ..events.attempts import AttemptRecord, storable_message_id

        text = describe_error(error)
        record = book.suspects.get(message_id)
        attempts = (0 if record is None else record.attempts) + 1
        book.suspects[message_id] = AttemptRecord(attempts, text, trigger_id)
        book.failures += 1
        book.last_failure = Failure(message_id, trigger_id, text, attempts, book.max_attempts)
        book._to_forget.discard(message_id)
        if storable_message_id(message_id):
            pending = book._to_add.get(message_id)
            times = 1 if pending is None else pending[2] + 1
            book._to_add[message_id] = (trigger_id, text, times)
        self._signal()

    def resolved(self, key: Hashable, message_ids: Sequence[str]) -> None:
        book = self._books.get(key)
        if book is None:
            return
        from ..events.attempts import storable_message_id

        for message_id in message_ids:
            book.suspects.pop(message_id, None)
            book._to_add.pop(message_id, None)
            if storable_message_id(message_id):
                book._to_forget.add(message_id)
        self._signal()

    # -- the runner's side

    def advanced(self, key: Hashable, count: int) -> None:
        """``count`` events of ``key`` were advanced (progress, for engine.max_restarts)."""
        book = self._books.get(key)
        if book is not None:
            book.advanced += count

    async def open(self, url: str, *, pipeline: str = DEFAULT_PIPELINE) -> None:
        """Open ``pipeline``'s failed attempts in the database at ``url``."""
        from ..events.attempts import AttemptStore

        store = AttemptStore(url, pipeline=pipeline)
        await store.open()
        self._store = store
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()

    async def load(self, key: Hashable) -> None:
        """Read the suspects of ``key`` from the table (what other runs counted too)."""
        book = self._books.get(key)
        store = self._store
        if book is None or store is None:
            return
        from ..events.attempts import storable_message_id

        await self.flush()  # what this process counted first, so the table has it all
        try:
            rows = await store.load(book.key_text)
        except Exception as exc:
            log.warning(
                "Reading the failed attempts of key=%s failed (counted in memory meanwhile): %s",
                book.key_text,
                describe_error(exc),
            )
            return
        in_memory_only = {m: r for m, r in book.suspects.items() if not storable_message_id(m)}
        book.suspects.clear()
        book.suspects.update(rows)
        book.suspects.update(in_memory_only)

    async def flush(self) -> None:
        """Write what changed: failed attempts added, resolved messages removed."""
        store, lock = self._store, self._lock
        if store is None or lock is None:
            return
        async with lock:
            for book in list(self._books.values()):
                if book.dirty:
                    await self._flush_book(store, book)

    async def _flush_book(self, store: AttemptStore, book: StreamAttempts) -> None:
        adding, book._to_add = book._to_add, {}
        forgetting = list(book._to_forget)
        try:
            while adding:
                message_id, (watcher, error, times) = next(iter(adding.items()))
                record = await store.add_failure(book.key_text, message_id, watcher, error, times)
                del adding[message_id]
                if message_id in book.suspects:
                    # the table's count: other engines sharing the database add to it too
                    book.suspects[message_id] = _larger(book.suspects[message_id], record)
            await store.forget(book.key_text, forgetting)
            book._to_forget.difference_update(forgetting)
            self._write_error = None
        except Exception as exc:
            for message_id, (watcher, error, times) in adding.items():
                later = book._to_add.get(message_id)
                if later is not None:
                    watcher, error, times = later[0], later[1], times + later[2]
                book._to_add[message_id] = (watcher, error, times)
            text = describe_error(exc)
            if text != self._write_error:  # once per distinct error, not per retry
                self._write_error = text
                log.warning(
                    "Writing failed attempts of key=%s failed (kept in memory, retried): %s",
                    book.key_text,
                    text,
                )

    async def run_forever(self) -> None:
        """Flush in the background whenever something changed (the runner owns the task)."""
        wake = self._wake
        if wake is None:
            return
        while True:
            await wake.wait()
            await asyncio.sleep(_FLUSH_LINGER)
            wake.clear()
            await self.flush()

    async def close(self) -> None:
        """Flush, then close the table's connections."""
        store = self._store
        if store is None:
            return
        try:
            await self.flush()
        finally:
            self._store = None
            await store.close()

    def _signal(self) -> None:
        if self._wake is not None:
            self._wake.set()


def _larger(mine: AttemptRecord, stored: AttemptRecord) -> AttemptRecord:
    return stored if stored.attempts >= mine.attempts else mine
