"""The broadcast paths: the poll pulls upstream and hands each raw event to the members.

The fast path (nothing acknowledged), and the ack path, pair by pair or a whole lane
batch at once (``_broadcast_run``) when every member has room for it.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Hashable, Iterable
from typing import Any

from ..producer import LaneBatch, SharedStreamProducer
from ..trigger import StreamEnded
from ._common import aclose_iter, log
from ._delivery import _Delivery
from ._ledger import _FAST_RUN, _Entry, _Run

_monotonic = time.monotonic

# No LaneBatch: each pair's lane is the producer's get_advance_lane().
_NO_LANE: Any = object()


class _Broadcast(_Delivery):
    """The poll and its broadcast."""

    async def _poll(self) -> None:
        """Pull upstream and broadcast, after the cohort's grace period, until it fails."""
        grace = self.host.cohort_grace_period
        if grace > 0:
            await asyncio.sleep(grace)
        log.info("Shared stream group started key=%r subscribers=%d", self.key, len(self.members))
        if self.acking:
            assert self.producer is not None
            await self._poll_ack(self.producer)
        else:
            await self._poll_fast()
        raise StreamEnded(f"shared stream {self.key!r} ended; a shared stream must run forever")

    async def _poll_fast(self) -> None:
        """The fast path: broadcast raw events; nothing is acknowledged or advanced."""
        stream = self.trigger_cls.open_shared_stream(self.kwargs)
        maxq = self.host.max_subscriber_queue
        stats = self.stats
        try:
            async for raw in stream:
                stats.broadcast += 1
                entry = _Entry(None, raw, _FAST_RUN)
                for sub in self.queued:
                    if len(sub.queue) >= maxq:
                        self._overflow(sub, maxq)
                        continue
                    sub.queue.append(entry)
                    if sub.waiter is not None:
                        sub.wake()
                inline = self.inline
                if inline:
                    for sub in inline:
                        self._deliver_inline(sub, entry)
                    await self._inline_ready(inline)
        finally:
            await aclose_iter(stream)

    async def _poll_ack(self, producer: SharedStreamProducer) -> None:
        """Ack mode: enter each raw event in its lane's ledger, then broadcast it."""
        stream, single = _open_upstream(producer)
        maxq = self.host.max_subscriber_queue
        almost_full = maxq - 1  # a queue this deep before the append is full after it
        get_lane = producer.get_advance_lane
        stats = self.stats
        suspects = self.suspects
        received = self.on_received  # (tracing's spans, or None)
        try:
            async for item in stream:
                fixed: Hashable = _NO_LANE  # the lane of every pair of a LaneBatch
                batch: Iterable[tuple[Any, Any]]
                if single:
                    batch = (item,)
                elif type(item) is LaneBatch:
                    fixed, batch = item
                else:
                    batch = item
                now = _monotonic()
                run: _Run | None = None  # what the batch's entries share, while it holds
                if (
                    fixed is not _NO_LANE
                    and not suspects
                    and self._broadcast_run(fixed, batch, now, maxq)
                ):
                    if self.inline:
                        await self._inline_ready(self.inline)
                    continue
                lane_q: deque[_Entry] | None = None
                lane: Hashable = None
                # once per raw event from here on: helpers only off the delivery path
                for raw, payload in batch:
                    if fixed is _NO_LANE or lane_q is None:
                        lane = get_lane(payload) if fixed is _NO_LANE else fixed
                        lane_q = self._lane_queue(lane)
                    members = self.members
                    if run is None or run.lane_q is not lane_q or run.n != len(members):
                        run = _Run(lane, lane_q, now, len(members))
                    entry = _Entry(payload, raw, run)
                    lane_q.append(entry)
                    stats.broadcast += 1
                    if received is not None:
                        received(self.key, [self._received(entry)])
                    if not members:
                        self._unclaimed(entry)
                        continue
                    if suspects and self._poisoned(entry):
                        continue
                    filled = False
                    for sub in self.queued:
                        queue = sub.queue
                        depth = len(queue)
                        queue.append(entry)
                        if sub.waiter is not None:  # (never while its queue is full)
                            sub.wake()
                        if depth >= almost_full:
                            if depth >= maxq:  # counted in this event too, then failed
                                self._overflow(sub, maxq)
                                continue
                            filled = True
                    inline = self.inline
                    if inline:
                        for sub in inline:
                            self._deliver_inline(sub, entry)
                            if self.frozen:
                                return  # an inline member failed the group: nothing more
                    if filled and self.pausing:
                        await self._wait_for_room(maxq)
                        now = _monotonic()
                        lane_q = None  # the pump may have drained and dropped it meanwhile
                        run = None
                if self.inline:
                    await self._inline_ready(self.inline)
        finally:
            await aclose_iter(stream)

    def _broadcast_run(
        self, lane: Hashable, pairs: Iterable[tuple[Any, Any]], now: float, maxq: int
    ) -> bool:
        """A LaneBatch whose pairs have a length, taken and broadcast at once, when every
        member's queue has room for all of it (False: take it pair by pair instead).

        The same as the pair-by-pair broadcast (nothing awaits in between, no queue
        fills), with one ``extend`` per member instead of one ``append`` per member and
        pair: the entries are made first, then queued in the lane and in each member's
        queue, in order. Pairs with an ``at_once()`` method are taken from what it
        returns instead (a producer that checks its pairs as they are taken may then
        check them once for all: nothing awaits until the last is taken).
        """
        members = self.members
        try:
            k = len(pairs)  # type: ignore[arg-type]
        except TypeError:
            return False
        if not members or any(len(sub.queue) + k >= maxq for sub in members):
            return False
        run = _Run(lane, self._lane_queue(lane), now, len(members))
        at_once = getattr(pairs, "at_once", None)  # pairs checked once for all of them
        if at_once is not None:
            pairs = at_once()
        entries = _Entry.of_run(pairs, run)
        run.lane_q.extend(entries)
        self.stats.broadcast += len(entries)
        received = self.on_received
        if received is not None:
            received(self.key, [self._received(e) for e in entries])
        for sub in self.queued:
            sub.queue.extend(entries)
            if sub.waiter is not None:
                sub.wake()
        inline = self.inline
        if inline:
            self._deliver_inline_run(entries, inline)
        return True


def _optional_hook(producer: SharedStreamProducer, name: str) -> Any:
    """acklane's optional producer method ``name``: None if absent or only the default.

    Airflow's producers have none of acklane's additions (``open_batches``,
    ``message_id``, ``counters``); that is not an error, and costs nothing per event.
    """
    hook = getattr(producer, name, None)
    if hook is None or getattr(hook, "__func__", None) is getattr(SharedStreamProducer, name):
        return None
    return hook


def _open_upstream(producer: SharedStreamProducer) -> tuple[AsyncIterator[Any], bool]:
    """The producer's batches if it offers them, else its stream (True: one pair per item).

    Airflow's form (open_stream) yields one pair per step: the poll iterates it directly
    and makes each pair a batch of one itself, not in a wrapping generator (that would
    cost one more async generator step per raw event).
    """
    open_batches = _optional_hook(producer, "open_batches")
    batches = None if open_batches is None else open_batches()
    if batches is None:
        return producer.open_stream(), True
    return batches, False
