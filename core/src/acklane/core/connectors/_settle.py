"""Settlements decided and not yet sent: buffered, lingered on, sent in chunks, once.

A broker that settles message by message (an SQS delete, a Pub/Sub ack, a Service
Bus complete) is asked the fewest calls when settlements share them: ``advance``
queues each one in a :class:`SettleBuffer` and returns; the buffer's flusher
(:meth:`SettleBuffer.run`, a task of the producer) waits until something is
queued, lingers up to ``linger`` seconds for a chunk to fill, and sends.

- Queues are keyed: one per kind of call (SQS: deletes, then releases) or per
  connection that must send its own (Service Bus: a receiver). Keys are flushed
  in the order first seen (``order`` fixes it up front), or all at once with
  ``parallel``; a key's items go in their order, ``batch`` at a time.
- Single flight: one flush of a key at a time, and :meth:`~SettleBuffer.flush`
  returns once everything queued before it was answered. A flush runs shielded:
  cancelling its caller (a closing producer) never drops a chunk half-sent.
- ``send(key, chunk)`` takes items off the front of ``chunk`` as they land. When
  it raises, the first item left (the one that failed) is dropped: its message
  comes again when its lease lapses; the rest go back to the front of the queue
  (a last flush at close tries them again), and the error propagates.
- Back-pressure: past ``limit`` items queued, :meth:`~SettleBuffer.settle_soon`
  flushes before it returns, so a flusher that fell behind slows the engine down.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Iterable
from typing import Generic, TypeVar

__all__ = ["SettleBuffer"]

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


class SettleBuffer(Generic[K, T]):
    """Queued settlements of one producer (see the module)."""

    def __init__(
        self,
        send: Callable[[K, deque[T]], Awaitable[None]],
        *,
        batch: int,
        limit: int,
        linger: float | Callable[[], float] = 0.0,
        parallel: bool = False,
        order: Iterable[K] = (),
    ) -> None:
        if batch < 1 or limit < 1:
            raise ValueError("batch and limit must be at least 1")
        self._send = send
        self.batch = batch
        self.limit = limit
        self._linger = linger
        self.parallel = parallel
        self._queues: dict[K, deque[T]] = {key: deque() for key in order}
        self._in_flight: dict[K, int] = {}
        self._locks: dict[K, asyncio.Lock] = {}
        self._wanted = asyncio.Event()
        self._full = asyncio.Event()
        #: Items queued and not yet taken by a flush.
        self.queued = 0

    # -- what advance calls

    def add(self, key: K, item: T) -> None:
        """Queue ``item`` under ``key``; the flusher sends it (after its linger)."""
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = deque()
        queue.append(item)
        self.queued += 1
        self._wanted.set()
        if len(queue) >= self.batch:
            self._full.set()

    async def settle_soon(self) -> None:
        """Back-pressure after a round of :meth:`add`: flush now past ``limit`` queued."""
        if self.queued >= self.limit:
            await self.flush()

    def holds(self, key: K) -> bool:
        """Whether ``key`` has items queued or being sent."""
        return bool(self._queues.get(key)) or self._in_flight.get(key, 0) > 0

    def __len__(self) -> int:
        return self.queued + sum(self._in_flight.values())

    def forget(self, key: K) -> list[T]:
        """Drop ``key``'s queue (its connection is gone); returns what it held."""
        queue = self._queues.pop(key, None) or deque()
        self.queued -= len(queue)
        self._locks.pop(key, None)
        return list(queue)

    # -- sending

    async def run(self) -> None:
        """The flusher: wait for work, linger for a full chunk, flush; for ever.

        A failed flush ends it with the error (the producer's tasks latch it).
        """
        while True:
            await self._wanted.wait()
            linger = self._linger() if callable(self._linger) else self._linger
            if linger > 0 and not self._full.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(linger):
                        await self._full.wait()
            self._wanted.clear()
            self._full.clear()
            await self.flush()

    async def flush(self, key: K | None = None) -> None:
        """Send what is queued (under ``key`` only, if given); return once answered.

        Raises the first failure (see the module for what happens to the items).
        """
        if key is not None:
            if self.holds(key):
                await _shielded(self._flush_key(key))
            return
        if self.parallel:
            keys = [k for k in self._queues if self.holds(k)]
            if keys:
                await _shielded(_first_failure(self._flush_key(k) for k in keys))
            return
        for k in list(self._queues):
            if self.holds(k):
                await _shielded(self._flush_key(k))

    async def _flush_key(self, key: K) -> None:
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        async with lock:  # waits for a flush in flight: it answers what came before
            queue = self._queues.get(key)
            while queue:
                chunk = deque(queue.popleft() for _ in range(min(self.batch, len(queue))))
                self.queued -= len(chunk)
                self._in_flight[key] = len(chunk)
                try:
                    await self._send(key, chunk)
                except BaseException:
                    if chunk:
                        chunk.popleft()  # the one that failed: it comes again by itself
                    queue.extendleft(reversed(chunk))
                    self.queued += len(chunk)
                    raise
                finally:
                    self._in_flight.pop(key, None)


async def _shielded(work: Awaitable[None]) -> None:
    """Run ``work`` to its end even if the caller is cancelled meanwhile."""
    task = asyncio.ensure_future(work)
    task.add_done_callback(_retrieve)
    await asyncio.shield(task)


def _retrieve(task: asyncio.Future[None]) -> None:
    if not task.cancelled():
        task.exception()  # raised to whoever awaited it; never "never retrieved"


async def _first_failure(flushes: Iterable[Awaitable[None]]) -> None:
    results = await asyncio.gather(*flushes, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
