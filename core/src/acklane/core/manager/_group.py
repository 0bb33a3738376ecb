"""One group: the live subscribers of a key, sharing one upstream poll.

The group broadcasts each raw event to a snapshot of its members, keeps the ledger
of outstanding events per lane, hands resolved lane prefixes to the producer (the
pump), and fails members that sit on an event past the ack timeout (the sweep).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Hashable, Iterable, Mapping
from typing import Any, Protocol

from ..producer import AdvanceItem, AdvanceOutcome, LaneBatch, SharedStreamProducer
from ..trigger import (
    BaseEventTrigger,
    StreamEnded,
    SubscriberOverflow,
    ack_timeout_error,
    current_window,
    uses_ack_channel,
)
from ._common import aclose_iter, log
from ._hooks import Hooks, Received, Verdict, hook_of, verdict_of
from ._ledger import _FAST_RUN, _UNASKED, ACKED, FAILED, REJECTED, _Entry, _outcome, _Run
from ._subscriber import _Inline, _Subscriber
from ._types import BoundEvent, GroupStats, PoisonPolicy, Rejected, _new_tuple

_monotonic = time.monotonic

# No LaneBatch: each pair's lane is the producer's get_advance_lane().
_NO_LANE: Any = object()

# The outcome of an entry every member acked, by that number (the pump's common case).
_ACKED_ONLY: dict[int, AdvanceOutcome] = {}


class GroupHost(Protocol):
    """All a group uses of its manager: the settings it started with, what watches it,
    and three calls back (the manager's books of bindings and of live groups)."""

    @property
    def max_subscriber_queue(self) -> int: ...
    @property
    def ack_timeout(self) -> float: ...
    @property
    def cohort_grace_period(self) -> float: ...
    @property
    def overflow(self) -> str: ...
    @property
    def poison_policy(self) -> PoisonPolicy | None: ...
    @property
    def hooks(self) -> Hooks: ...

    def bind(self, sub: _Subscriber, entry: _Entry) -> BoundEvent:
        """Bind one more trigger event of ``sub`` to ``entry`` (its window's raw event)."""
        ...

    def group_failed(self, group: _Group) -> None:
        """``group`` failed: it is no longer the key's live group (still closing)."""
        ...

    def group_ended(self, group: _Group) -> None:
        """``group``'s task is ending: its bindings will never resolve anything."""
        ...

    def group_done(self, group: _Group) -> None:
        """``group``'s task is done: it is no longer closing."""
        ...


class _Group:
    """All live subscribers of one key, sharing one upstream poll."""

    def __init__(
        self,
        host: GroupHost,
        key: Hashable,
        trigger_cls: type[BaseEventTrigger],
        kwargs: dict[str, Any],
        founder: str = "",
        settings: object = None,
    ) -> None:
        self.host = host
        self.key = key
        self.trigger_cls = trigger_cls
        self.kwargs = kwargs
        # the trigger whose kwargs build the producer, and its shared_stream_settings()
        self.founder = founder
        self.settings = settings
        # Airflow's rule (its trigger classes have no uses_ack_channel of their own)
        self.acking = uses_ack_channel(trigger_cls)
        self.members: tuple[_Subscriber, ...] = ()
        # the members split by how they take a raw event: into their queue (a filter
        # task pulls it) or evaluated inline by the broadcast itself (_deliver_inline)
        self.queued: tuple[_Subscriber, ...] = ()
        self.inline: tuple[_Subscriber, ...] = ()
        self.detached: list[_Subscriber] = []  # left with yields still awaiting confirmation
        self.lanes: dict[Hashable, deque[_Entry]] = {}
        self.ready: dict[Hashable, None] = {}  # lanes whose head is resolved, in order
        self.producer: SharedStreamProducer | None = None
        # the producer's message_id(), looked up once: None when it has none (Airflow's
        # producers) or only the default one, so nothing is called per event then
        self.message_id_of: Callable[[Any], str | None] | None = None
        # the poison policy's live suspects of this key (message ids with failed
        # attempts on record): the poll looks a raw event up only while it is not empty
        policy = host.poison_policy
        self.suspects: Mapping[str, object] = (
            _NO_SUSPECTS if policy is None else policy.suspects(key)
        )
        self.error: BaseException | None = None
        self.frozen = False  # after failure/stop: no more resolutions count
        self.advance_broken = False
        self.stats = GroupStats()
        self.latencies: list[float] | None = None  # broadcast-to-advance, when sampled
        self._pump_wake = asyncio.Event()
        # overflow="pause": the poll waits while a member's queue is full, until it
        # drains to the low-water mark (or the member leaves or is failed).
        self.pausing = host.overflow == "pause"
        self.low_water = host.max_subscriber_queue // 2
        # what watches the group, looked up once: None where nobody does (and then
        # nothing is called per message)
        hooks = host.hooks
        self.hooks = hooks
        self.on_received: Callable[[Hashable, list[Received]], None] | None = hook_of(
            hooks, "received"
        )
        self.on_filtered: Callable[[Hashable, Received, Verdict], None] | None = hook_of(
            hooks, "filtered"
        )
        self.on_advanced = hook_of(hooks, "advanced")
        self.on_failed = hook_of(hooks, "subscriber_failed")
        self.room_for: _Subscriber | None = None
        self._room: asyncio.Future[None] | None = None
        self._polling = True
        self._closing = False
        # the group's task is in its poll (stop_polling cancels it there), and a
        # cancellation stop_polling asked for is not yet absorbed
        self._in_poll = False
        self._stop_requested = False
        self._task: asyncio.Task[None] | None = None

    # -- membership

    def attach(
        self, trigger_id: str, trigger: BaseEventTrigger, inline: _Inline | None = None
    ) -> _Subscriber:
        """A new member, in every broadcast from now on (``inline``: evaluated by it)."""
        sub = _Subscriber(self, trigger_id, trigger)
        sub.inline = inline
        self._set_members((*self.members, sub))
        return sub

    def _set_members(self, members: tuple[_Subscriber, ...]) -> None:
        """The snapshot of later broadcasts, and its queued and inline parts."""
        self.members = members
        self.queued = tuple(m for m in members if m.inline is None)
        self.inline = tuple(m for m in members if m.inline is not None)

    def _remove_member(self, sub: _Subscriber) -> None:
        """Out of later broadcasts; a poll paused for its room need not wait any more."""
        if sub in self.members:
            self._set_members(tuple(m for m in self.members if m is not sub))
        if self.room_for is sub:
            self.wake_poll()

    def wake_poll(self) -> None:
        """The member the paused poll waits for has room again (or is gone)."""
        room = self._room
        self.room_for = None
        if room is not None and not room.done():
            room.set_result(None)

    async def _wait_for_room(self, maxq: int) -> None:
        """overflow="pause": wait until no member's queue is full."""
        while (full := self._full_member(maxq)) is not None:
            self.stats.pauses += 1
            self._room = asyncio.get_running_loop().create_future()
            self.room_for = full
            try:
                await self._room
            finally:
                self._room = None
                self.room_for = None

    def _full_member(self, maxq: int) -> _Subscriber | None:
        """A member whose queue holds ``maxq`` events, if any (the first one)."""
        return next((s for s in self.members if len(s.queue) >= maxq), None)

    def detach(self, sub: _Subscriber) -> None:
        """The subscriber leaves: unread events fail; the one it is on counts as moved past."""
        if sub.closed:
            return
        sub.closed = True
        self._remove_member(sub)
        if sub.failure is None and not self.frozen and self.acking:
            self._fail_unread(sub)
            sub.move_past()
            if any(not b.done for b in sub.awaiting):
                self.detached.append(sub)  # the sweep still times its awaited yields out
        sub.queue.clear()
        sub.wake()

    def force_fail(
        self, sub: _Subscriber, exc: BaseException, culprit: _Entry | None = None
    ) -> None:
        """Fail the subscriber out of every outstanding event; its iterator raises ``exc``.

        ``culprit``: the raw event the failure belongs to (the filter raised on it, or
        sat on it past the ack timeout); the poison policy counts it a failed attempt.
        """
        if sub.failure is not None:
            return
        if culprit is not None:
            self._attempt_failed(sub, culprit, exc)
        sub.failure = exc
        self._remove_member(sub)
        if self.acking and not self.frozen:
            self._fail_unread(sub)
            self._fail_held(sub)
        sub.queue.clear()
        sub.wake()
        self._notify_failed(sub, exc)

    def filter_failed(self, sub: _Subscriber, exc: BaseException) -> None:
        """The subscriber's filter raised ``exc`` (or was cancelled) while on an event:
        it is not done with it, so it is failed out of what it holds (redelivered)
        instead of acking it; a crash (not a cancellation) is a failed attempt of the
        event it was on. Nothing happens if it or the group already failed."""
        if sub.failure is None and not self.frozen:
            self.force_fail(sub, exc, sub.current if isinstance(exc, Exception) else None)

    def _fail_unread(self, sub: _Subscriber) -> None:
        """The events still in the subscriber's queue: it never saw them, so they fail."""
        queue = sub.queue
        while queue:
            self.resolve(queue.popleft(), FAILED)

    def _fail_held(self, sub: _Subscriber) -> None:
        """The event it is on and those whose yields await confirmation fail too."""
        entry = sub.current
        if entry is not None and not sub.rejected_current:
            self.resolve(entry, FAILED)
        sub.current = None
        sub.rejected_current = False
        if sub.binding is not None:
            sub.binding.done = True
            sub.binding = None
        for binding in sub.awaiting:
            if not binding.done:
                binding.done = True
                self.resolve(binding.entry, FAILED)
        sub.awaiting.clear()

    def _notify_failed(self, sub: _Subscriber, exc: BaseException) -> None:
        """Tell the hooks, unless the whole group failed."""
        observer = self.on_failed
        if observer is not None and self.error is None:
            try:
                observer(self.key, sub.trigger_id, exc)
            except Exception:  # a hook must never break the ack channel
                log.exception("subscriber-failure observer failed key=%r", self.key)

    # -- resolution and the pump

    def resolve(self, entry: _Entry, kind: int, n: int = 1) -> None:
        """``n`` snapshot members resolved ``entry``: ACKED, FAILED or REJECTED.

        The one resolve-and-ack routine: every path (a queued member moving on, an
        inline evaluation, a confirmation, a failure, a poisoned message) counts here,
        and the pump learns here that a lane's head is resolved.
        """
        if self.frozen:
            return
        stats = self.stats
        if kind == ACKED:  # (an entry's acks are not counted: see _Run.n)
            stats.acked += n
        elif kind == FAILED:
            entry.marked().failed += n
            stats.failed += n
        else:
            entry.marked().rejected += n
            stats.rejected += n
        remaining = entry.remaining - n
        entry.remaining = remaining
        if remaining == 0 and entry.lane_q[0] is entry:
            self._lane_ready(entry)

    def _lane_ready(self, entry: _Entry) -> None:
        """The head of the entry's lane is resolved: the pump has work."""
        self.ready[entry.run.lane] = None
        self._pump_wake.set()

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

    # -- the poll

    def _new_lane(self, lane: Hashable) -> deque[_Entry]:
        """The ledger's queue for a lane seen for the first time (or again, once drained)."""
        q: deque[_Entry] = deque()
        self.lanes[lane] = q
        return q

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

    # -- inline members: the filter evaluated by the broadcast (no queue, task, generator)

    def _deliver_inline_run(self, entries: list[_Entry], inline: tuple[_Subscriber, ...]) -> None:
        """Every entry of a run to every inline member of its snapshot, entry by entry
        (so that the members evaluating one message run one after the other: a body
        decoded once serves them all). A member failed on the way resolves the run's
        later entries as failed (they counted it); a failed group stops it all."""
        deliver = self._deliver_inline
        verdict_of = self._inline_verdict
        # (member, its evaluate) for the members evaluated here directly: not windowed
        plain = [
            (sub, sub.inline.evaluate)
            for sub in inline
            if sub.inline is not None and not sub.inline.windowed
        ]
        windowed = [sub for sub in inline if sub.inline is not None and sub.inline.windowed]
        filtered = self.on_filtered  # (tracing's spans, or None)
        for entry in entries:
            raw = entry.raw
            empty = 0  # members on which nothing fired: acked together, after the loop
            for sub, evaluate in plain:
                if sub.failure is not None or sub.closed:
                    self.resolve(entry, FAILED)
                    continue
                try:
                    verdict = evaluate(raw)
                except Exception as exc:  # the filter raised on this event
                    if filtered is not None:
                        self._inline_filtered(sub, entry, None)
                    sub.current = entry
                    self.force_fail(sub, exc, entry)
                    if self.frozen:
                        return  # the failure failed the group (the runner's observer)
                    continue
                if filtered is not None:
                    self._inline_filtered(sub, entry, verdict)
                if type(verdict) is list and not verdict:
                    empty += 1
                    continue
                verdict_of(sub, entry, verdict)
                if self.frozen:
                    return  # its emit failed the group: nothing more
            for sub in windowed:
                if sub.failure is None and not sub.closed:
                    deliver(sub, entry)
                    if self.frozen:
                        return
                else:
                    self.resolve(entry, FAILED)
            if empty:  # the members on which nothing fired, acked at once
                self.resolve(entry, ACKED, empty)

    def _deliver_inline(self, sub: _Subscriber, entry: _Entry) -> None:
        """One inline member takes one raw event: the window opens, the filter runs, each
        payload is bound and emitted, the window closes (acked once every emitted event
        is confirmed). The same rules as a queued member pulling it, in one call.

        This is the inline path's one per-(message, member) step: a hook that must see
        each evaluation (a tracing span) goes around the ``evaluate`` call here.
        """
        hooks = sub.inline
        assert hooks is not None
        windowed = hooks.windowed
        if windowed:  # the filter may reject through the window itself
            sub.current = entry
            if current_window.get() is not sub:
                current_window.set(sub)
        traced = self.on_filtered is not None
        try:
            verdict = hooks.evaluate(entry.raw)
        except Exception as exc:  # the filter raised on this event: a failed attempt
            if traced:
                self._inline_filtered(sub, entry, None)
            sub.current = entry
            self.force_fail(sub, exc, entry)
            return
        if traced:
            self._inline_filtered(sub, entry, verdict)
        if not windowed and type(verdict) is list and not verdict:
            # nothing fires (most evaluations, with many watchers): acked at once, no
            # window ever opened
            if self.acking:
                self.resolve(entry, ACKED)
            return
        self._inline_verdict(sub, entry, verdict)

    def _inline_verdict(self, sub: _Subscriber, entry: _Entry, verdict: Any) -> None:
        """What an inline member's filter decided on ``entry``, applied: rejected, or
        each payload bound and emitted, then the window closed."""
        hooks = sub.inline
        assert hooks is not None
        sub.current = entry
        if type(verdict) is not list:
            if isinstance(verdict, Rejected):
                if not sub.reject(verdict.reason) and not self.acking:
                    log.warning(
                        "reject_shared_stream_event() called outside a binding window; "
                        "ignored (fast path, standalone run(), or between two events)"
                    )
                sub.move_past()
                return
            self.force_fail(
                sub,
                TypeError(
                    f"trigger {sub.trigger_id}: an inline filter returns a list of "
                    f"payloads or Rejected, not {type(verdict).__name__}"
                ),
                entry,
            )
            return
        if verdict:
            emit = hooks.emit
            bind = self.host.bind if self.acking else None
            for payload in verdict:
                if sub.rejected_current:
                    break  # rejected (by the filter, or a payload that cannot be stored):
                    # what it returned beyond that is dropped, never bound to it
                try:
                    emit(payload, None if bind is None else bind(sub, entry))
                except Exception as exc:  # the emitter's own error, not the message's
                    self.force_fail(sub, exc)
                    return
                if sub.current is not entry:
                    break  # failed by emit
        if sub.current is entry:  # (else failed or closed meanwhile: that resolved it)
            sub.move_past()

    def _inline_filtered(self, sub: _Subscriber, entry: _Entry, verdict: Any) -> None:
        """Tell the hooks what an inline member's filter decided on ``entry`` (None: it
        raised), as a queued member's ``raw_stream`` does once its filter moves on."""
        on_filtered = self.on_filtered
        assert on_filtered is not None
        message = _new_tuple(Received, (entry.raw, entry.payload, None))
        on_filtered(self.key, message, verdict_of(sub.trigger_id, verdict))

    def _received(self, entry: _Entry) -> Received:
        """A new entry as the hooks see it: its raw event, payload and message id."""
        mid = entry.mid
        if mid is _UNASKED:
            mid = self.entry_message_id(entry)
        return _new_tuple(Received, (entry.raw, entry.payload, mid))

    def entry_message_id(self, entry: _Entry) -> str | None:
        """The producer's identity of ``entry``'s payload, asked once per raw event (by
        the first to need it: a binding, or the hooks) and kept on the entry."""
        message_id = self.message_id_of
        try:
            mid = message_id(entry.payload) if message_id is not None else None
        except Exception as exc:  # only costs dedupe of this event, never the event
            log.warning("message_id() failed key=%r: %r; stored without one", self.key, exc)
            mid = None
        entry.mid = mid
        return mid

    async def _inline_ready(self, inline: tuple[_Subscriber, ...]) -> None:
        """Wait while what an inline member emits into can take no more (back-pressure)."""
        for sub in inline:
            hooks = sub.inline
            ready = None if hooks is None or hooks.ready is None else hooks.ready()
            if ready is not None:
                self.stats.pauses += 1
                await ready

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

    def _overflow(self, sub: _Subscriber, maxq: int) -> None:
        """A broadcast found the member's queue full: fail it out of what it holds."""
        log.warning(
            "Shared stream subscriber overflow key=%r trigger_id=%s queue_size=%d",
            self.key,
            sub.trigger_id,
            maxq,
        )
        self.force_fail(
            sub,
            SubscriberOverflow(
                f"trigger {sub.trigger_id}: queue of {maxq} raw events full; "
                f"it was failed out of its outstanding events"
            ),
        )

    # -- ack timeout

    async def _sweep(self) -> None:
        """Every tenth of the ack timeout (0.01s to 1s), fail members past it."""
        timeout = self.host.ack_timeout
        interval = min(max(timeout / 10.0, 0.01), 1.0)
        while True:
            await asyncio.sleep(interval)
            self._sweep_once(_monotonic() - timeout)
            if self.detached:
                self._prune_detached()

    def _sweep_once(self, limit: float) -> None:
        """Time out every member (and detached one) whose oldest event is before ``limit``."""
        for sub in (*self.members, *self.detached):
            if self.frozen:
                break  # failed (perhaps by the previous timeout): nothing more counts
            oldest = sub.oldest_outstanding()
            if oldest is not None and oldest <= limit:
                self._timeout(sub)

    def _prune_detached(self) -> None:
        """Forget detached subscribers with nothing left to time out."""
        self.detached = [s for s in self.detached if s.failure is None and s.oldest_outstanding()]

    def _timeout(self, sub: _Subscriber) -> None:
        """The subscriber sat on an event past ``ack_timeout``: fail it out of everything."""
        oldest = sub.oldest_entry()
        event_id = self._event_id(oldest)
        log.warning(
            "Shared stream ack timeout key=%r trigger_id=%s event=%s after %.3gs",
            self.key,
            sub.trigger_id,
            event_id,
            self.host.ack_timeout,
        )
        self.force_fail(
            sub,
            ack_timeout_error(
                f"trigger {sub.trigger_id} did not resolve event {event_id} within "
                f"ack_timeout={self.host.ack_timeout}s"
            ),
            oldest if _stuck_on(sub, oldest) else None,
        )

    # -- the poison policy (acklane's addition; nothing runs per event without suspects)

    def _message_id(self, entry_payload: Any) -> str | None:
        """The producer's identity of a payload (None: it has none, or failed to say)."""
        message_id = self.message_id_of
        if message_id is None:
            return None
        try:
            return message_id(entry_payload)
        except Exception:  # message_id() failing costs the poison count, never the event
            return None

    def _attempt_failed(self, sub: _Subscriber, entry: _Entry, exc: BaseException) -> None:
        """``sub`` failed on ``entry``: a failed attempt of that message, for the policy."""
        policy = self.host.poison_policy
        if policy is None or not self.acking or self.frozen:
            return
        mid = self._message_id(entry.payload)
        if mid is None:
            return
        try:
            policy.failed(self.key, sub.trigger_id, mid, exc)
        except Exception:  # the policy must never break the ack channel
            log.exception("poison policy failed key=%r", self.key)

    def _poisoned(self, entry: _Entry) -> bool:
        """A suspect the policy judges poison: rejected for every member, never broadcast."""
        mid = self._message_id(entry.payload)
        if mid is None or mid not in self.suspects:
            return False
        policy = self.host.poison_policy
        assert policy is not None
        try:
            reason = policy.poisoned(self.key, mid)
        except Exception:
            log.exception("poison policy failed key=%r", self.key)
            return False
        if reason is None:
            return False
        entry.marked().reasons = [reason]
        self.resolve(entry, REJECTED, entry.remaining)
        return True

    def _suspects_resolved(self, batch: list[AdvanceItem]) -> None:
        """Tell the policy which suspects the broker was just told to ack or reject."""
        suspects = self.suspects
        done = []
        for payload, outcome in batch:
            if outcome.failed or not (outcome.acked or outcome.rejected):
                continue  # redelivered: its count goes on
            mid = self._message_id(payload)
            if mid is not None and mid in suspects:
                done.append(mid)
        policy = self.host.poison_policy
        if done and policy is not None:
            try:
                policy.resolved(self.key, done)
            except Exception:
                log.exception("poison policy failed key=%r", self.key)

    def _event_id(self, entry: _Entry) -> str:
        """The event's message id, else its payload's type and lane: for log lines.

        Never the payload's repr: a producer's payload may hold the message's value.
        """
        message_id = self.message_id_of
        if message_id is not None:
            try:
                mid = message_id(entry.payload)
            except Exception:  # the id is only for the log line
                mid = None
            if mid is not None:
                return mid
        return f"<{type(entry.payload).__name__} in lane {entry.run.lane!r}>"

    # -- lifecycle

    def start(self) -> None:
        """Run the group in its own task."""
        task = asyncio.get_running_loop().create_task(
            self._run(), name=f"acklane-group-{self.key!r}"
        )
        self._task = task
        # the manager keeps a closing group until its task is really done
        task.add_done_callback(lambda _t: self.host.group_done(self))

    async def _run(self) -> None:
        """Build the producer, poll until stopped, advance until closed, then clean up.

        As in Airflow's manager, the group's own task polls and the pump and the sweep
        are its children: the first raw event is pulled in the step that built the
        producer (one event-loop turn after ``subscribe``), and a rejected or acked
        event is advanced as few turns after its broadcast as there.
        """
        if self._closing:
            return  # closed or failed before it ever ran: never connect
        if not self._create_producer():
            return
        try:
            async with asyncio.TaskGroup() as tg:
                if self.acking:
                    tg.create_task(self._advance_until_closed())
                await self._guarded_poll()
        except Exception as exc:  # a bug in the engine or an observer: fail loudly
            log.exception("Shared stream group key=%r crashed", self.key)
            self.fail(exc)
        finally:
            self.frozen = True
            await self._aclose_producer()
            self.host.group_ended(self)

    async def _advance_until_closed(self) -> None:
        """The pump, with the sweep beside it until the pump is done."""
        async with asyncio.TaskGroup() as tg:
            sweep = tg.create_task(self._sweep())
            await self._pump()
            sweep.cancel()

    def _create_producer(self) -> bool:
        """Ack mode: build the producer from the founder's kwargs (False: the group failed)."""
        try:
            if self.acking:
                producer = self.trigger_cls.create_shared_stream_producer(self.kwargs)
                self.producer = producer
                self.message_id_of = _optional_hook(producer, "message_id")
        except Exception as exc:
            self.fail(exc)
            return False
        return True

    async def _guarded_poll(self) -> None:
        """The poll, turning its end or its error into the group's failure.

        It runs in the group's task; :meth:`stop_polling` stops it by cancelling that
        task while it polls, and only that cancellation is absorbed here (one from
        outside, by :meth:`abort` or the task's owner, goes on).
        """
        if not self._polling:
            return  # stopped before the group's task first ran
        task = asyncio.current_task()
        assert task is not None
        self._in_poll = True
        try:
            await self._poll()
        except asyncio.CancelledError:
            if not self._stop_requested:
                raise  # cancelled from outside, not by stop_polling()
            self._stop_requested = False
            if task.uncancel() > 0:
                raise  # and from outside as well
        except Exception as exc:
            self._in_poll = False  # over already: failing the group need not stop it
            self.fail(exc)
        finally:
            self._in_poll = False
            self._polling = False
            self._pump_wake.set()
        if self._stop_requested:
            # stop_polling() was called from this task's own poll step, which then
            # ended without awaiting again: its cancellation is still pending; take
            # it here, where it is known to be ours.
            self._stop_requested = False
            try:
                await asyncio.sleep(0)
            except asyncio.CancelledError:
                if task.uncancel() > 0:
                    raise
            else:
                task.uncancel()  # swallowed on the way (by the producer): ours no more

    async def _aclose_producer(self) -> None:
        """Close the producer; a failure to is logged, never raised."""
        producer = self.producer
        if producer is None:
            return
        try:
            await producer.aclose()
        except Exception as exc:
            log.warning("Shared stream producer aclose failed key=%r: %r", self.key, exc)

    def fail(self, exc: BaseException) -> None:
        """The group fails loudly: every subscriber's iterator raises ``exc``."""
        if self.error is not None:
            return
        self.error = exc
        # DEBUG: every member's iterator raises exc, and its consumer tells it (the
        # runner in one restart line); a WARNING here said the same fault twice.
        log.debug("Shared stream group failed key=%r: %r", self.key, exc)
        self.host.group_failed(self)
        self.close()
        for sub in self.members:
            sub.failure = exc
            sub.wake()
        self._set_members(())

    def close(self) -> None:
        """Stop for good: advance what is resolved now, abandon the rest, close the producer."""
        self.frozen = True
        self._closing = True
        self.stop_polling()
        self._pump_wake.set()

    def stop_polling(self) -> None:
        """Stop pulling upstream; resolutions and advances go on until :meth:`close`."""
        if self._polling:
            self._polling = False
            task = self._task
            if self._in_poll and task is not None and not task.done():
                self._stop_requested = True  # _guarded_poll absorbs this cancellation
                task.cancel()
            self._pump_wake.set()

    async def wait_closed(self) -> None:
        """Wait for the group's task to end (without cancelling it if the waiter is)."""
        task = self._task
        if task is not None:
            await asyncio.shield(task)

    async def abort(self) -> None:
        """Cancel the group's tasks (a producer stuck in advance or aclose) and wait."""
        self.close()
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            try:
                async with asyncio.timeout(5.0):
                    await asyncio.shield(task)
            except TimeoutError:
                task.cancel()  # aclose is stuck too: cancel it and give up on it
                log.warning("Shared stream group key=%r did not stop; abandoned", self.key)
            except (asyncio.CancelledError, Exception):
                pass


#: The suspects of a group without a poison policy: always empty.
_NO_SUSPECTS: Mapping[str, object] = {}


def _stuck_on(sub: _Subscriber, oldest: _Entry) -> bool:
    """Whether an ack timeout belongs to ``oldest``: the filter sits on it (its window is
    open) and nothing it yielded for it awaits the event store (a slow store is not the
    message's fault)."""
    if oldest is not sub.current or sub.rejected_current:
        return False
    binding = sub.binding
    return binding is None or binding.pending == 0


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
