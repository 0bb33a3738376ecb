"""A group's lanes and its pump: the ledger's queue per lane, advanced in order.

An entry is resolved by the one routine of ``_group_base``; once a lane's head is
resolved, the pump hands the lane's resolved prefix to the producer's ``advance``,
one call at a time, and tells the hooks.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Hashable

from ..producer import AdvanceItem, AdvanceOutcome
from ._common import log
from ._ledger import _Entry, _outcome
from ._poison import _Poison
from ._types import _new_tuple

_monotonic = time.monotonic

# The outcome of an entry every member acked, by that number (the pump's common case).
_ACKED_ONLY: dict[int, AdvanceOutcome] = {}


class _Lanes(_Poison):
    """The ledger's lanes and the pump that advances them."""

    def _new_lane(self, lane: Hashable) -> deque[_Entry]:
        """The ledger's queue for a lane seen for the first time (or again, once drained)."""
        q: deque[_Entry] = deque()
        self.lanes[lane] = q
        return q

    def _lane_queue(self, lane: Hashable) -> deque[_Entry]:
        """The ledger's queue of ``lane`` (made when the lane is new, or drained)."""
        try:
            lane_q = self.lanes.get(lane)
        except TypeError as exc:
            raise TypeError(f"advance lane {lane!r} is not hashable") from exc
        return self._new_lane(lane) if lane_q is None else lane_q

    def _unclaimed(self, entry: _Entry) -> None:
        """Nobody was subscribed: resolved at once, as (0, 0, 0), so it is redelivered."""
        self.stats.unclaimed += 1
        if entry.lane_q[0] is entry:
            self._lane_ready(entry)

    async def _pump(self) -> None:
        """Hand resolved lane prefixes to the producer, one ``advance`` at a time."""
        producer = self.producer
        assert producer is not None
        ready = self.ready
        lanes = self.lanes
        stats = self.stats
        wake = self._pump_wake
        # Locals: CPython 3.11 compiles a method call on an imported name as an
        # attribute load plus a call, a bound method per event.
        acked_get = _ACKED_ONLY.get
        while True:
            if not ready:
                if self._closing:
                    return
                wake.clear()
                await wake.wait()
                continue
            lane = next(iter(ready))
            del ready[lane]
            q = lanes.get(lane)
            if q is None:
                continue
            # the lane's resolved prefix, inlined (once per advanced event)
            batch: list[AdvanceItem] = []
            latencies = self.latencies
            while q and q[0].remaining == 0:
                entry = q.popleft()
                # acked by every member (reasons come only with rejections): shared, by
                # an int key (no tuple per event)
                marks = entry.marks
                outcome = None if marks is not None else acked_get(entry.run.n)
                if outcome is None:
                    outcome = _outcome(entry)
                    if marks is None and len(_ACKED_ONLY) < 1024:
                        _ACKED_ONLY[entry.run.n] = outcome
                batch.append(_new_tuple(AdvanceItem, (entry.payload, outcome)))
                if latencies is not None:
                    latencies.append(_monotonic() - entry.run.t)
            if not q:
                del lanes[lane]
            if not batch:
                continue
            started = _monotonic()
            try:
                await producer.advance(batch)
            except Exception as exc:
                self._advance_failed(lane, batch, exc)
                return
            stats.advance_batches += 1
            stats.advanced_events += len(batch)
            stats.advance_seconds += _monotonic() - started
            if self.suspects:
                self._suspects_resolved(batch)
            observer = self.on_advanced
            if observer is not None:
                try:
                    observer(self.key, batch)
                except Exception:  # a hook must never break the ack channel
                    log.exception("advance observer failed key=%r", self.key)
            q2 = lanes.get(lane)
            if q2 and q2[0].remaining == 0:
                ready[lane] = None  # resolved while the advance was in flight

    def _advance_failed(self, lane: Hashable, batch: list[AdvanceItem], exc: Exception) -> None:
        """``advance`` raised: the group fails, and nothing more is advanced."""
        log.warning(
            "Shared stream advance failed key=%r lane=%r batch=%d: %r",
            self.key,
            lane,
            len(batch),
            exc,
        )
        self.advance_broken = True
        self.fail(exc)
