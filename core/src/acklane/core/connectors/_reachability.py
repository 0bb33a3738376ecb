"""Whether a stream's broker answers, told once per change, for the connectors.

A broker that does not answer is not a failure of the group: the connector keeps
trying. What it must not do is log every attempt (a retry a second made hundreds of
identical lines), nor look healthy meanwhile. :class:`Reachability` keeps that state:

- :attr:`Reachability.problem`: why the broker cannot be reached now (``None`` when
  it answers); the producer's ``broker_problem()`` returns it, and ``/readyz`` says
  the stream is not ready while it is set;
- :meth:`Reachability.failed` (a client callback on any thread) and
  :meth:`Reachability.wait` (async connectors: the same, then a pause doubling from
  1 s up to 30 s) record a failed attempt: WARNING the first time, DEBUG after;
- :meth:`Reachability.answered`: the broker answered; INFO once, with how long it
  was unreachable.

Writes come from one thread (the event loop, or a client's own thread); other threads
only read :attr:`~Reachability.problem`, one attribute holding a ``str`` or ``None``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

__all__ = ["INITIAL_PAUSE", "MAX_PAUSE", "Reachability"]

R = TypeVar("R")

#: The first pause after a failed attempt (seconds); it doubles at each failure.
INITIAL_PAUSE: Final = 1.0
#: The longest pause between two attempts (seconds).
MAX_PAUSE: Final = 30.0


def _reason_text(reason: BaseException | str) -> str:
    """One line: an exception's message (gRPC's ``message`` when it has one)."""
    text = reason if isinstance(reason, str) else str(getattr(reason, "message", None) or reason)
    return " ".join(text.split()) or type(reason).__name__


class Reachability:
    """One stream's view of its broker: reachable, or not and why (see the module).

    ``describe`` is the stream's secret-free description (the start of each log
    line), ``what`` names the far end (``"broker"``, ``"SQS endpoint"``) and ``where``
    its address (the bootstrap servers, the endpoint URL, the namespace).
    """

    def __init__(
        self,
        describe: str,
        what: str,
        where: str,
        *,
        logger: logging.Logger | None = None,
        initial_pause: float = INITIAL_PAUSE,
        max_pause: float = MAX_PAUSE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.describe = describe
        self.what = what
        self.where = where
        self.initial_pause = initial_pause
        self.max_pause = max_pause
        self._log = logger or logging.getLogger("acklane.connectors")
        self._clock = clock
        #: Why the broker cannot be reached now; ``None`` while it answers.
        self.problem: str | None = None
        #: When it stopped answering (``clock()``), while it does not.
        self.since: float | None = None
        #: The pause the next :meth:`wait` sleeps.
        self.pause = initial_pause

    def failed(self, reason: BaseException | str) -> bool:
        """An attempt failed because the broker does not answer; True on the change
        from reachable (the one that is logged at WARNING)."""
        text = _reason_text(reason)
        if self.problem is not None:
            self._log.debug("%s: %s still unreachable: %s", self.describe, self.what, text)
            return False
        self.since = self._clock()
        self.pause = self.initial_pause
        self.problem = f"{self.what} unreachable at {self.where} ({text})"
        self._log.warning(
            "%s: %s unreachable at %s (%s); retrying until it answers",
            self.describe,
            self.what,
            self.where,
            text,
        )
        return True

    async def wait(self, reason: BaseException | str) -> None:
        """:meth:`failed`, then sleep the pause (doubled for next time, up to the max)."""
        self.failed(reason)
        pause = self.pause
        self.pause = min(pause * 2, self.max_pause)
        await asyncio.sleep(pause)

    def answered(self) -> None:
        """The broker answered: told once (INFO, how long it was down) after a failure."""
        if self.problem is None:
            return
        down = self._clock() - (self.since if self.since is not None else self._clock())
        self.problem = None
        self.since = None
        self.pause = self.initial_pause
        self._log.info(
            "%s: reconnected to %s at %s after %.0fs", self.describe, self.what, self.where, down
        )

    async def until_answered(
        self,
        call: Callable[[], Awaitable[R]],
        unreachable: Callable[[BaseException], bool],
        reason: Callable[[BaseException], str] = str,
    ) -> R:
        """``call()`` again and again while it fails as ``unreachable`` (each failure
        told as :meth:`wait` does); its result once it answers."""
        while True:
            try:
                result = await call()
            except Exception as exc:
                if not unreachable(exc):
                    raise
                await self.wait(reason(exc))
                continue
            self.answered()
            return result
