"""What tests of the engine, of a connector and of a pipeline share, with core alone.

:func:`eventually` is the one wait of every test that waits for something to have
happened; :mod:`acklane.integration.testing` re-exports it beside its helpers that
need brokers and processes.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Final

from .producer import AdvanceOutcome

__all__ = ["CLEAN", "FAILED", "UNCLAIMED", "eventually", "rejected"]

#: The outcome of a message every watcher accepted (one watcher).
CLEAN: Final = AdvanceOutcome(acked=1, failed=0)
#: The outcome of a message a watcher failed: it must come again.
FAILED: Final = AdvanceOutcome(acked=0, failed=1)
#: The outcome of a message no watcher received: it must come again.
UNCLAIMED: Final = AdvanceOutcome(acked=0, failed=0)


def rejected(*reasons: str) -> AdvanceOutcome:
    """The outcome of a message a watcher rejected, with the reasons it gave."""
    return AdvanceOutcome(acked=0, failed=0, rejected=1, reject_reasons=reasons)


async def eventually(
    check: Callable[[], bool | Awaitable[bool]],
    what: str = "the condition",
    within: float = 20.0,
    *,
    every: float = 0.01,
) -> None:
    """Wait until ``check()`` (sync or async) holds, asking every ``every`` seconds.

    Not ``within`` seconds: AssertionError ``not within {within}s: {what}``.
    """
    try:
        async with asyncio.timeout(within):
            while True:
                result = check()
                if inspect.isawaitable(result):
                    result = await result
                if result:
                    return
                await asyncio.sleep(every)
    except TimeoutError:
        raise AssertionError(f"not within {within}s: {what}") from None
