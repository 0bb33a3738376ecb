"""A producer's own tasks: spawned, owned, latched on failure, closed in order.

A lease producer runs work beside its stream: a settle flusher, a lease keeper,
receive loops. Each such task is spawned through :class:`ProducerTasks`, which
owns it until :meth:`ProducerTasks.aclose` cancels and awaits it; a task that
ends with an exception *latches* the failure: the first one is kept,
:meth:`~ProducerTasks.raise_failure` raises it at the producer's next receive or
``advance`` (so the engine fails the group), and the ``on_failure`` callbacks wake
whatever waits for the stream (a queue, a paused poll).

Why not a :class:`asyncio.TaskGroup`: ``open_stream`` is an async generator the
engine iterates, and a group entered in it would have to stay open across its
``yield``. The engine closes the generator from another task (or lets it be
garbage-collected), and a cancel scope opened in one task cannot be exited from
another; a failing child would also cancel the task that happens to be iterating
the generator, not the producer's owner. So the producer owns its tasks itself,
and ``aclose`` (which the engine always awaits) is where they end: see
``docs/architecture.md``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["ProducerTasks", "finish_within"]

R = TypeVar("R")


class ProducerTasks:
    """The tasks of one producer and its failure latch (see the module).

    ``describe`` starts the log line of a failure (the stream's description).
    """

    def __init__(self, describe: str, *, logger: logging.Logger | None = None) -> None:
        self.describe = describe
        self._log = logger or logging.getLogger("acklane.connectors")
        self._tasks: list[asyncio.Task[Any]] = []
        self._on_failure: list[Callable[[BaseException], object]] = []
        #: The first failure latched; ``None`` while the producer is healthy.
        self.failure: BaseException | None = None
        self.closed = False

    def spawn(self, work: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """Run ``work`` as a task of this producer; its exception fails the group."""
        if self.closed:
            work.close()
            raise RuntimeError(f"{self.describe}: the producer is closed")
        task = asyncio.create_task(work, name=f"acklane {name}")
        self._tasks.append(task)
        task.add_done_callback(self._ended)
        return task

    def on_failure(self, callback: Callable[[BaseException], object]) -> None:
        """Call ``callback(exc)`` once, when the first failure is latched."""
        self._on_failure.append(callback)

    def fail(self, exc: BaseException) -> None:
        """Latch ``exc`` as the producer's failure (only the first one is kept)."""
        if self.failure is not None:
            return
        self.failure = exc
        # DEBUG: whoever consumes the group is told, once (the runner's restart line,
        # or, for a refused credential, its line with the settings to check; an
        # Airflow trigger raises it). Telling it here too made three lines per fault.
        self._log.debug("%s: %s; the group will fail", self.describe, _text(exc))
        for callback in self._on_failure:
            callback(exc)

    def raise_failure(self) -> None:
        """Raise the latched failure, if any."""
        if self.failure is not None:
            raise self.failure

    async def stop(self, task: asyncio.Task[Any] | None) -> None:
        """Cancel one task and wait until it ended (an ordered close: this one first)."""
        if task is None:
            return
        if not task.done():
            task.cancel()
        await asyncio.wait([task])

    async def aclose(self) -> None:
        """Cancel every task still running, the last spawned first, and await each."""
        self.closed = True
        while self._tasks:
            await self.stop(self._tasks.pop())

    def _ended(self, task: asyncio.Task[Any]) -> None:
        if task in self._tasks:
            self._tasks.remove(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            self.fail(exc)


def _text(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


async def finish_within(task: asyncio.Future[R] | None, grace: float) -> R | None:
    """What a call cut off by a stop returned, given ``grace`` seconds to answer.

    A receive shielded from a stop still hands messages out when it completes;
    a closing producer waits for it (briefly) to release them rather than leave
    them leased to nobody. ``None``: no call, it failed, or it did not answer in
    time (then it is cancelled, and what it received lapses by itself).
    """
    if task is None:
        return None
    if not task.done():
        await asyncio.wait([task], timeout=grace)
    if not task.done():
        task.cancel()
        await asyncio.wait([task])
        return None
    if task.cancelled() or task.exception() is not None:
        return None
    return task.result()
