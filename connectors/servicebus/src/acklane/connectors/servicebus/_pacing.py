"""How a Service Bus receiver's connection is shared, and how much each receive asks for.

The SDK reads and writes a connection under one lock, and a read that finds
nothing holds it up to the socket timeout (0.2 s): a settlement waiting for its
answer while another task reads, or a receive reading while settlements wait to
be written, stalls them all that long. So one user at a time uses a receiver's
connection (:meth:`ReceivePacing.lock`): each read then waits for an answer that
is on its way.

A receive returns once it has the count asked for; short of it, only after a
pause in the transfers that the SDK notices with a read timing out (its socket
timeout, 0.2 s) past ``max_wait_time`` or 0.2 s after the first message. So
receives ask for one message (it returns the moment one arrives) until a
backlog shows, as ``batch_size`` receives of one in a row that each found their
message there; then for ``batch_size`` (fewer calls) until a batch comes short
(:meth:`ReceivePacing.count`). And while a receiver has messages the engine
holds, a receive waits at most ``busy_wait``: their settlements should not wait
behind a long empty receive.

Messages the SDK prefetched wait in its receive buffer: a receive of no more than
that many returns them at once without reading the connection
(:func:`prefetched` tells how many), so it asks for them, up to ``batch_size``,
whatever the backlog streak, and the settlements queued are left to the flusher
rather than sent first (no round trip before the receive).
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from typing import Any

__all__ = ["ReceivePacing", "prefetched", "top_up_credit"]

#: A receive of one message that took less found it there (no wait): a backlog sign.
QUICK = 0.001


def prefetched(receiver: Any) -> int:
    """Messages waiting in ``receiver``'s SDK buffer (prefetched, not yet received);
    0 when unknown (the SDK's pyamqp receive client keeps them in a queue)."""
    handler = getattr(receiver, "_handler", None)
    buffer = getattr(handler, "_received_messages", None)
    size = getattr(buffer, "qsize", None)
    return int(size()) if callable(size) else 0


async def top_up_credit(receiver: Any, prefetch: int, buffered: int) -> bool:
    """Give ``receiver``'s link its credit back once half of it is used, rather than
    when all of it is (as the SDK does); whether it did.

    The SDK asks for ``prefetch + 1`` more messages only when its link has no credit
    left, so a receiver that empties its buffer then waits a round trip for the next
    messages. Topped up to what the buffer has room for (``prefetch + 1`` less what
    it holds), the link keeps the messages coming while the engine works, and never
    holds more unreceived than the SDK itself would. Only on the SDK's pyamqp
    transport, with prefetch (without it the SDK asks per receive).
    """
    handler = getattr(receiver, "_handler", None)
    link = getattr(handler, "_link", None)
    transport: Any = getattr(receiver, "_amqp_transport", None)
    credit = getattr(link, "current_link_credit", None)
    if prefetch <= 0 or not isinstance(credit, int) or getattr(transport, "KIND", None) != "pyamqp":
        return False
    if not getattr(receiver, "_running", False):
        return False  # opening or reconnecting: the SDK gives the link its credit then
    room = prefetch + 1 - buffered
    if credit * 2 > room:
        return False
    try:
        await transport.reset_link_credit_async(handler, room)
    except Exception:
        # The connection broke under it: pyamqp's own error, which the SDK maps and
        # recovers from only in its calls. The receive that follows is one of them
        # (it reconnects, or fails with the SDK's error); the top-up is only early.
        return False
    return True


class ReceivePacing:
    """The connection locks and receive sizes of a producer's receivers."""

    def __init__(self, max_batch: int, max_wait_time: float, busy_wait: float) -> None:
        self.max_batch = max_batch
        self.max_wait_time = max_wait_time
        self.busy_wait = busy_wait
        self._locks: dict[Hashable, asyncio.Lock] = {}
        #: Receives in a row that returned all they asked for at once.
        self._streak: dict[Hashable, int] = {}

    def lock(self, receiver: Hashable) -> asyncio.Lock:
        """The lock of whoever uses ``receiver``'s connection to receive or settle."""
        lock = self._locks.get(receiver)
        if lock is None:
            lock = self._locks[receiver] = asyncio.Lock()
        return lock

    def count(self, receiver: Hashable, buffered: int = 0) -> int:
        """How many messages the next receive asks for: what waits in the SDK's buffer
        (``buffered``, at most ``batch_size``: a backlog), else 1, or ``batch_size`` in
        a backlog."""
        batch = self.max_batch
        if buffered > 0:
            self._streak[receiver] = batch  # prefetched messages waiting: a backlog
            return min(buffered, batch)
        return batch if self._streak.get(receiver, 0) >= batch else 1

    def wait_time(self, busy: bool) -> float:
        """``max_wait_time``, cut short while the receiver has messages the engine holds."""
        return min(self.max_wait_time, self.busy_wait) if busy else self.max_wait_time

    def received(self, receiver: Hashable, got: int, asked: int, took: float) -> None:
        """A receive of ``asked`` returned ``got`` messages in ``took`` seconds."""
        full = got == asked and (asked > 1 or took < QUICK)
        self._streak[receiver] = self._streak.get(receiver, 0) + 1 if full else 0

    def forget(self, receiver: Hashable) -> None:
        self._locks.pop(receiver, None)
        self._streak.pop(receiver, None)
