"""The consumer thread: where every call on the Kafka clients that may wait runs.

confluent-kafka's consumer is not thread-safe, so its calls run one at a time on one
dedicated thread. Calls are counted as submitted (by the loop), started and finished
(by the thread): the loop may consume on its own thread only while every call
submitted has finished (the thread is idle, and stays so meanwhile), and a consume
waiting on the thread ends early when a call is queued behind it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

__all__ = ["ConsumerThread"]

T = TypeVar("T")


class ConsumerThread:
    """One worker thread, started by :meth:`start`, with its calls counted."""

    __slots__ = ("_describe", "_executor", "_finished", "_last_call", "_started", "_submitted")

    def __init__(self, describe: str) -> None:
        self._describe = describe
        self._executor: ThreadPoolExecutor | None = None
        self._submitted = 0
        self._started = 0
        self._finished = 0
        self._last_call: asyncio.Future[Any] | None = None

    @property
    def started(self) -> bool:
        return self._executor is not None

    def start(self, name: str) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    def submit(self, closed: bool, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """``fn(*args)`` on the thread; refused before :meth:`start` or once ``closed``."""
        executor = self._executor
        if executor is None or closed:
            raise RuntimeError(f"{self._describe}: the producer is not open")
        return self._hand_over(executor, fn, args)

    async def last(self, fn: Callable[..., T]) -> T:
        """``fn()`` on the thread, then the thread ends (a close: after every call)."""
        executor = self._executor
        assert executor is not None
        try:
            return await self._hand_over(executor, fn, ())
        finally:
            executor.shutdown(wait=False)

    def _hand_over(
        self, executor: ThreadPoolExecutor, fn: Callable[..., T], args: tuple[Any, ...]
    ) -> asyncio.Future[T]:
        self._submitted += 1
        future = asyncio.get_running_loop().run_in_executor(executor, self._run_call, fn, args)
        self._last_call = future
        return future

    def _run_call(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        """A call on the thread, counted (see :meth:`busy`)."""
        self._started += 1
        try:
            return fn(*args)
        finally:
            self._finished += 1

    def busy(self) -> bool:
        """A call handed to the thread has not finished (it may still run even when
        the future that awaited it was cancelled)."""
        return self._finished != self._submitted

    def call_waiting(self) -> bool:
        """(On the thread) a call is queued behind the one running."""
        return self._submitted - self._started > 0

    async def idle(self) -> None:
        """Until the last call handed to the thread is done (or cancelled)."""
        last = self._last_call
        if last is not None and not last.done():
            await asyncio.wait((last,))
