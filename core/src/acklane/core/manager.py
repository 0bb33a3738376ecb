"""The shared stream manager: one poll per key, fan-out, the ledger, and the advance pump.

Bookkeeping is per subscriber, not per event: each subscriber consumes its queue in
order, so an event only carries counters (how many snapshot members have yet to
resolve it, and how they did). Per delivery the engine does a queue append, a
pop, and a counter decrement; no per-event sets or dicts of subscribers exist.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Callable,
    Hashable,
    Iterable,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, is_dataclass
from dataclasses import fields as dataclass_fields
from typing import Any, Literal, NamedTuple

from .producer import AdvanceItem, AdvanceOutcome, SharedStreamProducer
from .trigger import (
    AckTimeout,
    BaseEventTrigger,
    StreamEnded,
    SubscriberOverflow,
    TriggerEvent,
    current_window,
)

__all__ = [
    "AdvanceObserver",
    "BoundEvent",
    "FailureObserver",
    "GroupStats",
    "LeaveObserver",
    "SharedStreamManager",
]

log = logging.getLogger("acklane.core.manager")

_monotonic = time.monotonic


#: Called after each successful ``advance`` with the group's key and the batch.
AdvanceObserver = Callable[[Hashable, Sequence[AdvanceItem]], None]
#: Called, synchronously, when a subscriber is force-failed: (key, trigger id, error).
FailureObserver = Callable[[Hashable, str, BaseException], None]
#: Called, synchronously, when a live subscription ends without having been failed
#: (its filter returned, or its consumer closed it), just *before* it leaves the
#: group: (key, trigger id, how it left). An orderly leave acks the event the
#: subscriber is on and takes it out of every later broadcast; a caller for whom
#: that is a failure (the runner, while its pipeline runs) fails the group here, so
#: that nothing is advanced without the subscriber.
LeaveObserver = Callable[[Hashable, str, str], None]


class BoundEvent(NamedTuple):
    """A yielded trigger event bound to the raw event whose window is open."""

    seq: int
    message_id: str | None
    position: int


@dataclass(slots=True)
class GroupStats:
    """Plain counters of one group, read by the metrics collector at scrape time."""

    broadcast: int = 0
    acked: int = 0
    failed: int = 0
    rejected: int = 0
    unclaimed: int = 0  # broadcast to an empty snapshot
    pauses: int = 0  # overflow="pause": times the poll waited for a full queue
    advance_batches: int = 0
    advanced_events: int = 0
    advance_seconds: float = 0.0


class _Entry:
    """One broadcast raw event in the ledger."""

    __slots__ = (
        "acked",
        "failed",
        "lane",
        "lane_q",
        "payload",
        "raw",
        "reasons",
        "rejected",
        "remaining",
        "t",
    )

    def __init__(
        self, payload: Any, raw: Any, lane: Hashable, lane_q: deque[_Entry], t: float, n: int
    ) -> None:
        self.payload = payload
        self.raw = raw
        self.lane = lane
        self.lane_q = lane_q
        self.t = t
        self.remaining = n
        self.acked = 0
        self.failed = 0
        self.rejected = 0
        self.reasons: list[str] | None = None


class _Binding:
    """The trigger events one subscriber yielded while on one raw event."""

    __slots__ = ("count", "done", "entry", "moved", "pending", "sub")

    def __init__(self, sub: _Subscriber, entry: _Entry) -> None:
        self.sub = sub
        self.entry = entry
        self.pending = 0  # bound, not yet confirmed persisted
        self.count = 0  # bound in total (the next yield's position)
        self.moved = False  # the subscriber moved past the raw event
        self.done = False  # this subscriber's resolution of the entry is settled


class _Subscriber:
    """One trigger's membership in a group: its queue and its place in the stream."""

    __slots__ = (
        "awaiting",
        "binding",
        "closed",
        "current",
        "failure",
        "group",
        "queue",
        "rejected_current",
        "trigger",
        "trigger_id",
        "waiter",
    )

    def __init__(self, group: _Group, trigger_id: str, trigger: BaseEventTrigger) -> None:
        self.group = group
        self.trigger_id = trigger_id
        self.trigger = trigger
        self.queue: deque[_Entry] = deque()
        self.waiter: asyncio.Future[None] | None = None
        self.current: _Entry | None = None  # the raw event whose binding window is open
        self.binding: _Binding | None = None
        self.rejected_current = False
        self.awaiting: deque[_Binding] = deque()  # moved past, yields not yet confirmed
        self.failure: BaseException | None = None
        self.closed = False

    # -- the binding window (reject_shared_stream_event looks us up via a ContextVar)

    def reject(self, reason: str | None) -> bool:
        entry = self.current
        group = self.group
        if entry is None or self.rejected_current or not group.acking:
            return False
        self.rejected_current = True
        binding = self.binding
        if binding is not None:
            binding.done = True  # its yields still fire, but no longer gate anything
            self.binding = None
        if reason:
            if entry.reasons is None:
                entry.reasons = []
            entry.reasons.append(reason)
        group.resolve(entry, 2)
        return True

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def oldest_outstanding(self) -> float | None:
        """Broadcast time of the oldest event this subscriber has not resolved."""
        awaiting = self.awaiting
        while awaiting and awaiting[0].done:
            awaiting.popleft()
        if awaiting:
            return awaiting[0].entry.t
        if self.current is not None and not self.rejected_current:
            return self.current.t
        if self.queue:
            return self.queue[0].t
        return None

    def move_past(self) -> None:
        """The filter asked for the next raw event: close the current window."""
        entry = self.current
        self.current = None
        if entry is None:
            return
        if self.rejected_current:
            self.rejected_current = False
            return
        group = self.group
        if not group.acking:
            return
        binding = self.binding
        if binding is None:
            group.resolve(entry, 0)
            return
        self.binding = None
        binding.moved = True
        if binding.pending == 0:
            binding.done = True
            group.resolve(entry, 0)
        else:
            awaiting = self.awaiting
            while awaiting and awaiting[0].done:
                awaiting.popleft()
            awaiting.append(binding)

    async def raw_stream(self) -> AsyncIterator[Any]:
        """What the filter iterates: this subscriber's share of the broadcast."""
        queue = self.queue
        group = self.group
        stats = group.stats
        acking = group.acking
        loop = asyncio.get_running_loop()
        try:
            while True:
                entry = self.current
                if entry is not None:
                    binding = self.binding
                    if (
                        acking
                        and not self.rejected_current
                        and (binding is None or binding.pending == 0)
                    ):
                        # move_past() + resolve(entry, 0) inlined for the common cases (this
                        # runs once per delivery): the filter yielded nothing for the event,
                        # or every yield is already confirmed, so it is acked now.
                        self.current = None
                        if binding is not None:
                            self.binding = None
                            binding.moved = binding.done = True
                        if not group.frozen:
                            entry.acked += 1
                            stats.acked += 1
                            remaining = entry.remaining - 1
                            entry.remaining = remaining
                            if remaining == 0 and entry.lane_q[0] is entry:
                                group._lane_ready(entry)
                    else:
                        self.move_past()
                if self.failure is not None:
                    raise self.failure
                if not queue:
                    if self.closed:
                        return
                    waiter: asyncio.Future[None] = loop.create_future()
                    self.waiter = waiter
                    await waiter
                    if self.failure is not None:
                        raise self.failure
                    if not queue:
                        if self.closed:
                            return
                        continue
                entry = queue.popleft()
                self.current = entry
                if group.room_for is self and len(queue) <= group.low_water:
                    group.wake_poll()
                current_window.set(self)
                yield entry.raw
        finally:
            self.waiter = None


_new_tuple = tuple.__new__  # builds a BoundEvent without NamedTuple's Python-level __new__

_CLEAN_CACHE: dict[tuple[int, int, int], AdvanceOutcome] = {}


def _outcome(entry: _Entry) -> AdvanceOutcome:
    if entry.reasons:
        return AdvanceOutcome(entry.acked, entry.failed, entry.rejected, tuple(entry.reasons))
    k = (entry.acked, entry.failed, entry.rejected)
    outcome = _CLEAN_CACHE.get(k)
    if outcome is None:
        outcome = AdvanceOutcome(*k)
        if len(_CLEAN_CACHE) < 4096:
            _CLEAN_CACHE[k] = outcome
    return outcome


class _Group:
    """All live subscribers of one key, sharing one upstream poll."""

    def __init__(
        self,
        manager: SharedStreamManager,
        key: Hashable,
        trigger_cls: type[BaseEventTrigger],
        kwargs: dict[str, Any],
        founder: str = "",
        settings: object = None,
    ) -> None:
        self.manager = manager
        self.key = key
        self.trigger_cls = trigger_cls
        self.kwargs = kwargs
        # the trigger whose kwargs build the producer, and its shared_stream_settings()
        self.founder = founder
        self.settings = settings
        self.acking = trigger_cls.uses_ack_channel()
        self.members: tuple[_Subscriber, ...] = ()
        self.detached: list[_Subscriber] = []  # left with yields still awaiting confirmation
        self.lanes: dict[Hashable, deque[_Entry]] = {}
        self.ready: dict[Hashable, None] = {}  # lanes whose head is resolved, in order
        self.producer: SharedStreamProducer | None = None
        self.error: BaseException | None = None
        self.frozen = False  # after failure/stop: no more resolutions count
        self.advance_broken = False
        self.stats = GroupStats()
        self.latencies: list[float] | None = None  # broadcast-to-advance, when sampled
        self._pump_wake = asyncio.Event()
        # overflow="pause": the poll waits while a member's queue is full, until it
        # drains to the low-water mark (or the member leaves or is failed).
        self.pausing = manager.overflow == "pause"
        self.low_water = manager.max_subscriber_queue // 2
        self.room_for: _Subscriber | None = None
        self._room: asyncio.Future[None] | None = None
        self._polling = True
        self._closing = False
        self._poll_task: asyncio.Task[None] | None = None
        self._task: asyncio.Task[None] | None = None

    # -- membership

    def attach(self, trigger_id: str, trigger: BaseEventTrigger) -> _Subscriber:
        sub = _Subscriber(self, trigger_id, trigger)
        self.members = (*self.members, sub)
        return sub

    def _remove_member(self, sub: _Subscriber) -> None:
        if sub in self.members:
            self.members = tuple(m for m in self.members if m is not sub)
        if self.room_for is sub:
            self.wake_poll()

    def wake_poll(self) -> None:
        """The member the paused poll waits for has room again (or is gone)."""
        room = self._room
        self.room_for = None
        if room is not None and not room.done():
            room.set_result(None)

    async def _wait_for_room(self, maxq: int) -> None:
        while True:
            full = next((s for s in self.members if len(s.queue) >= maxq), None)
            if full is None:
                return
            self.stats.pauses += 1
            self._room = asyncio.get_running_loop().create_future()
            self.room_for = full
            try:
                await self._room
            finally:
                self._room = None
                self.room_for = None

    def detach(self, sub: _Subscriber) -> None:
        """The subscriber leaves: unread events fail; the one it is on counts as moved past."""
        if sub.closed:
            return
        sub.closed = True
        self._remove_member(sub)
        if sub.failure is None and not self.frozen and self.acking:
            queue = sub.queue
            while queue:
                self.resolve(queue.popleft(), 1)
            sub.move_past()
            if any(not b.done for b in sub.awaiting):
                self.detached.append(sub)
        sub.queue.clear()
        sub.wake()

    def force_fail(self, sub: _Subscriber, exc: BaseException) -> None:
        """Fail the subscriber out of every outstanding event; its iterator raises ``exc``."""
        if sub.failure is not None:
            return
        sub.failure = exc
        self._remove_member(sub)
        if self.acking and not self.frozen:
            queue = sub.queue
            while queue:
                self.resolve(queue.popleft(), 1)
            entry = sub.current
            if entry is not None and not sub.rejected_current:
                self.resolve(entry, 1)
            sub.current = None
            sub.rejected_current = False
            if sub.binding is not None:
                sub.binding.done = True
                sub.binding = None
            for binding in sub.awaiting:
                if not binding.done:
                    binding.done = True
                    self.resolve(binding.entry, 1)
            sub.awaiting.clear()
        sub.queue.clear()
        sub.wake()
        observer = self.manager.on_subscriber_failed
        if observer is not None and self.error is None:
            try:
                observer(self.key, sub.trigger_id, exc)
            except Exception:  # an observer must never break the ack channel
                log.exception("subscriber-failure observer failed key=%r", self.key)

    # -- resolution and the pump

    def resolve(self, entry: _Entry, kind: int) -> None:
        """One snapshot member resolved ``entry``: 0 acked, 1 failed, 2 rejected."""
        if self.frozen:
            return
        stats = self.stats
        if kind == 0:
            entry.acked += 1
            stats.acked += 1
        elif kind == 1:
            entry.failed += 1
            stats.failed += 1
        else:
            entry.rejected += 1
            stats.rejected += 1
        entry.remaining -= 1
        if entry.remaining == 0 and entry.lane_q[0] is entry:
            self._lane_ready(entry)

    def _lane_ready(self, entry: _Entry) -> None:
        self.ready[entry.lane] = None
        self._pump_wake.set()

    async def _pump(self) -> None:
        """Hand resolved lane prefixes to the producer, one ``advance`` at a time."""
        producer = self.producer
        assert producer is not None
        ready = self.ready
        lanes = self.lanes
        stats = self.stats
        wake = self._pump_wake
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
            batch: list[AdvanceItem] = []
            latencies = self.latencies
            while q and q[0].remaining == 0:
                entry = q.popleft()
                outcome = _CLEAN_CACHE.get((entry.acked, entry.failed, entry.rejected))
                if outcome is None or entry.reasons:
                    outcome = _outcome(entry)
                batch.append(_new_tuple(AdvanceItem, (entry.payload, outcome)))
                if latencies is not None:
                    latencies.append(_monotonic() - entry.t)
            if not q:
                del lanes[lane]
            if not batch:
                continue
            started = _monotonic()
            try:
                await producer.advance(batch)
            except Exception as exc:
                log.warning(
                    "Shared stream advance failed key=%r lane=%r batch=%d: %r",
                    self.key,
                    lane,
                    len(batch),
                    exc,
                )
                self.advance_broken = True
                self.fail(exc)
                return
            stats.advance_batches += 1
            stats.advanced_events += len(batch)
            stats.advance_seconds += _monotonic() - started
            observer = self.manager.on_advance
            if observer is not None:
                try:
                    observer(self.key, batch)
                except Exception:  # an observer must never break the ack channel
                    log.exception("advance observer failed key=%r", self.key)
            q2 = lanes.get(lane)
            if q2 and q2[0].remaining == 0:
                ready[lane] = None

    # -- the poll

    def _new_lane(self, lane: Hashable) -> deque[_Entry]:
        q: deque[_Entry] = deque()
        self.lanes[lane] = q
        return q

    async def _poll(self) -> None:
        grace = self.manager.cohort_grace_period
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
        stream = self.trigger_cls.open_shared_stream(self.kwargs)
        maxq = self.manager.max_subscriber_queue
        stats = self.stats
        try:
            async for raw in stream:
                stats.broadcast += 1
                entry = _Entry(None, raw, None, _EMPTY_LANE, 0.0, 0)
                for sub in self.members:
                    if len(sub.queue) >= maxq:
                        self._overflow(sub, maxq)
                        continue
                    sub.queue.append(entry)
                    if sub.waiter is not None:
                        sub.wake()
        finally:
            await _aclose_iter(stream)

    async def _poll_ack(self, producer: SharedStreamProducer) -> None:
        batches = producer.open_batches()
        # Airflow's form (open_stream) yields one pair per step: iterate it directly and
        # make each pair a batch of one here, not in a wrapping generator (that would
        # cost one more async generator step per raw event).
        single = batches is None
        stream: AsyncIterator[Any] = producer.open_stream() if batches is None else batches
        maxq = self.manager.max_subscriber_queue
        get_lane = producer.get_advance_lane
        lanes = self.lanes
        stats = self.stats
        try:
            async for item in stream:
                batch: Iterable[tuple[Any, Any]] = (item,) if single else item
                now = _monotonic()
                for raw, payload in batch:
                    lane = get_lane(payload)
                    try:
                        lane_q = lanes.get(lane)
                    except TypeError as exc:
                        raise TypeError(f"advance lane {lane!r} is not hashable") from exc
                    if lane_q is None:
                        lane_q = self._new_lane(lane)
                    members = self.members
                    entry = _Entry(payload, raw, lane, lane_q, now, len(members))
                    lane_q.append(entry)
                    stats.broadcast += 1
                    if not members:
                        stats.unclaimed += 1
                        if lane_q[0] is entry:
                            self._lane_ready(entry)
                        continue
                    filled = False
                    for sub in members:
                        queue = sub.queue
                        if len(queue) >= maxq:
                            queue.append(entry)  # counted in this event too, then failed
                            self._overflow(sub, maxq)
                            continue
                        queue.append(entry)
                        if sub.waiter is not None:
                            sub.wake()
                        if len(queue) >= maxq:
                            filled = True
                    if filled and self.pausing:
                        await self._wait_for_room(maxq)
                        now = _monotonic()
        finally:
            await _aclose_iter(stream)

    def _overflow(self, sub: _Subscriber, maxq: int) -> None:
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
        timeout = self.manager.ack_timeout
        interval = min(max(timeout / 10.0, 0.01), 1.0)
        while True:
            await asyncio.sleep(interval)
            limit = _monotonic() - timeout
            for sub in (*self.members, *self.detached):
                if self.frozen:
                    break  # failed (perhaps by the previous timeout): nothing more counts
                oldest = sub.oldest_outstanding()
                if oldest is not None and oldest <= limit:
                    self._timeout(sub)
            if self.detached:
                self.detached = [
                    s for s in self.detached if s.failure is None and s.oldest_outstanding()
                ]

    def _timeout(self, sub: _Subscriber) -> None:
        if sub.awaiting:
            entry = sub.awaiting[0].entry
        elif sub.current is not None and not sub.rejected_current:
            entry = sub.current
        else:
            entry = sub.queue[0]
        event_id = self._event_id(entry)
        log.warning(
            "Shared stream ack timeout key=%r trigger_id=%s event=%s after %.3gs",
            self.key,
            sub.trigger_id,
            event_id,
            self.manager.ack_timeout,
        )
        self.force_fail(
            sub,
            AckTimeout(
                f"trigger {sub.trigger_id} did not resolve event {event_id} within "
                f"ack_timeout={self.manager.ack_timeout}s"
            ),
        )

    def _event_id(self, entry: _Entry) -> str:
        producer = self.producer
        if producer is not None:
            try:
                mid = producer.message_id(entry.payload)
            except Exception:  # the id is only for the log line
                mid = None
            if mid is not None:
                return mid
        return repr(entry.payload)[:80]

    # -- lifecycle

    def start(self) -> None:
        task = asyncio.get_running_loop().create_task(
            self._run(), name=f"acklane-group-{self.key!r}"
        )
        self._task = task
        # the manager keeps a closing group until its task is really done
        task.add_done_callback(lambda _t: self.manager._closing.discard(self))

    async def _run(self) -> None:
        if self._closing:
            return  # closed or failed before it ever ran: never connect
        try:
            if self.acking:
                self.producer = self.trigger_cls.create_shared_stream_producer(self.kwargs)
        except Exception as exc:
            self.fail(exc)
            return
        try:
            async with asyncio.TaskGroup() as tg:
                self._poll_task = tg.create_task(self._guarded_poll())
                if self.acking:
                    sweep = tg.create_task(self._sweep())
                    await self._pump()
                    sweep.cancel()
        except Exception as exc:  # a bug in the engine or an observer: fail loudly
            log.exception("Shared stream group key=%r crashed", self.key)
            self.fail(exc)
        finally:
            self.frozen = True
            await self._aclose_producer()
            self.manager._drop_bindings(self)

    async def _guarded_poll(self) -> None:
        if not self._polling:
            return  # stopped before the poll task first ran
        try:
            await self._poll()
        except asyncio.CancelledError:
            if self.error is None and self._polling:
                raise  # cancelled from outside, not by stop()/fail()
        except Exception as exc:
            self.fail(exc)
        finally:
            self._polling = False
            self._pump_wake.set()

    async def _aclose_producer(self) -> None:
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
        log.warning("Shared stream group failed key=%r: %r", self.key, exc)
        self.manager._forget_group(self)
        self.close()
        for sub in self.members:
            sub.failure = exc
            sub.wake()
        self.members = ()

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
            task = self._poll_task
            if task is not None and not task.done():
                task.cancel()
            self._pump_wake.set()

    async def wait_closed(self) -> None:
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


_EMPTY_LANE: deque[_Entry] = deque()


def _stream_settings(trigger: BaseEventTrigger) -> object:
    """The trigger's ``shared_stream_settings()``, or None when it has none (not checked)."""
    hook = getattr(trigger, "shared_stream_settings", None)
    return None if hook is None else hook()


def _check_settings(group: _Group, trigger_id: str, settings: object) -> None:
    """Refuse a trigger whose stream settings differ from those the group's producer uses."""
    theirs = group.settings
    if settings is None or theirs is None or settings == theirs:
        return
    names = _differing_fields(theirs, settings)
    if names is None:
        what = (
            f"settings of another kind ({type(settings).__name__}, not {type(theirs).__name__})"
            if type(settings) is not type(theirs)
            else "different settings"
        )
    else:
        what = f"different settings ({', '.join(names)})"
    # Field names only, never values: settings may hold credentials.
    raise ValueError(
        f"trigger {trigger_id} reads the same upstream as trigger {group.founder} "
        f"(key {group.key!r}) with {what}; they would share one poll with the settings of "
        f"{group.founder}: make the settings identical or give the triggers different keys"
    )


def _differing_fields(a: object, b: object, prefix: str = "") -> list[str] | None:
    """Names of the fields in which two settings objects of one kind differ (None: unknown)."""
    if type(a) is not type(b):
        return None
    fields: Iterable[str]
    model_fields = getattr(type(a), "model_fields", None)  # a pydantic model
    if isinstance(model_fields, Mapping):
        fields = model_fields
    elif is_dataclass(a) and not isinstance(a, type):
        fields = [f.name for f in dataclass_fields(a)]
    elif isinstance(a, Mapping) and isinstance(b, Mapping):
        fields = dict.fromkeys([*a, *b])
        return [f"{prefix}{k}" for k in fields if a.get(k) != b.get(k)]
    else:
        return None
    names: list[str] = []
    for name in fields:
        x, y = getattr(a, name, None), getattr(b, name, None)
        if x == y:
            continue
        nested = None
        if hasattr(type(x), "model_fields") or (is_dataclass(x) and not isinstance(x, type)):
            nested = _differing_fields(x, y, f"{prefix}{name}.")
        names.extend(nested or [f"{prefix}{name}"])
    return names


async def _aclose_iter(stream: Any) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        await aclose()


class SharedStreamManager:
    """One per process: groups triggers by key and runs one poll per group."""

    def __init__(
        self,
        max_subscriber_queue: int = 1024,
        ack_timeout: float = 300.0,
        cohort_grace_period: float = 0.0,
        *,
        overflow: Literal["fail", "pause"] = "fail",
        on_advance: AdvanceObserver | None = None,
        on_subscriber_failed: FailureObserver | None = None,
        on_subscriber_leaving: LeaveObserver | None = None,
    ) -> None:
        if max_subscriber_queue < 1:
            raise ValueError("max_subscriber_queue must be at least 1")
        if ack_timeout <= 0:
            raise ValueError("ack_timeout must be positive")
        self.max_subscriber_queue = max_subscriber_queue
        self.ack_timeout = ack_timeout
        self.cohort_grace_period = cohort_grace_period
        if overflow not in ("fail", "pause"):
            raise ValueError(f"overflow must be 'fail' or 'pause', not {overflow!r}")
        #: "fail" (Airflow's rule): a full queue force-fails its subscriber. "pause"
        #: (acklane's option): the poll waits for room instead; a stuck subscriber is
        #: still failed, by the ack timeout.
        self.overflow = overflow
        self.on_advance = on_advance
        self.on_subscriber_failed = on_subscriber_failed
        self.on_subscriber_leaving = on_subscriber_leaving
        self._groups: dict[Hashable, _Group] = {}
        self._subs: dict[tuple[str, Hashable], _Subscriber] = {}
        # trigger id -> [(key, subscriber)]: bind_event's lookup without hashing the key
        self._by_trigger: dict[str, list[tuple[Hashable, _Subscriber]]] = {}
        self._bindings: dict[int, _Binding] = {}
        self._next_seq = 1
        self._closing: set[_Group] = set()

    # -- subscribing

    async def subscribe(
        self, *, trigger_id: str, trigger: BaseEventTrigger, key: Hashable
    ) -> AsyncGenerator[TriggerEvent, None]:
        """Join the group of ``key`` and yield what this trigger's filter makes of it."""
        if key is None:
            raise ValueError(f"trigger {trigger_id}: a None shared stream key cannot be shared")
        sub_key = (trigger_id, key)
        if sub_key in self._subs:
            raise RuntimeError(f"trigger {trigger_id} is already subscribed to {key!r}")
        settings = _stream_settings(trigger)
        group = self._groups.get(key)
        if group is None:
            _, kwargs = trigger.serialize()
            group = _Group(self, key, type(trigger), kwargs, trigger_id, settings)
            self._groups[key] = group
            group.start()
        else:
            _check_settings(group, trigger_id, settings)
        sub = group.attach(trigger_id, trigger)
        self._register(sub_key, sub)
        raw_stream = sub.raw_stream()
        events = trigger.filter_shared_stream(raw_stream)
        how = "its consumer closed the subscription"
        try:
            async for event in events:
                yield event
            how = "its filter returned"
        except GeneratorExit:
            raise  # closed by its consumer at a yield: an orderly unsubscribe
        except BaseException as exc:
            # A filter that crashed or was cancelled mid-event is not done with it:
            # fail it out of what it holds (redelivered) instead of acking on leave.
            if sub.failure is None and not group.frozen:
                group.force_fail(sub, exc)
            raise
        finally:
            if not sub.closed and sub.failure is None and not group.frozen:
                self._leaving(sub, how)  # before it detaches: the observer may fail the group
            self._detach(sub_key, sub)
            # close the filter (its finally blocks run now, in this task) and the stream
            await _aclose_iter(events)
            await _aclose_iter(raw_stream)

    def _leaving(self, sub: _Subscriber, how: str) -> None:
        observer = self.on_subscriber_leaving
        if observer is None:
            return
        try:
            observer(sub.group.key, sub.trigger_id, how)
        except Exception:  # an observer must never break the ack channel
            log.exception("subscriber-leaving observer failed key=%r", sub.group.key)

    def _register(self, sub_key: tuple[str, Hashable], sub: _Subscriber) -> None:
        self._subs[sub_key] = sub
        self._by_trigger.setdefault(sub_key[0], []).append((sub_key[1], sub))

    def _unregister(self, sub_key: tuple[str, Hashable], sub: _Subscriber) -> None:
        if self._subs.get(sub_key) is not sub:
            return
        del self._subs[sub_key]
        trigger_id = sub_key[0]
        remaining = [(k, s) for k, s in self._by_trigger.get(trigger_id, ()) if s is not sub]
        if remaining:
            self._by_trigger[trigger_id] = remaining
        else:
            self._by_trigger.pop(trigger_id, None)

    def _detach(self, sub_key: tuple[str, Hashable], sub: _Subscriber) -> _Group | None:
        self._unregister(sub_key, sub)
        group = sub.group
        group.detach(sub)
        if not group.members and group.error is None and self._groups.get(group.key) is group:
            del self._groups[group.key]
            group.close()
            self._closing.add(group)
            return group
        return None

    async def unsubscribe(self, trigger_id: str, key: Hashable) -> None:
        """Leave the group; the last one out stops its poll and waits for it to close."""
        sub = self._subs.get((trigger_id, key))
        if sub is None:
            return
        group = self._detach((trigger_id, key), sub)
        if group is not None:
            await self._finish(group)

    async def _finish(self, group: _Group) -> None:
        try:
            await group.wait_closed()
        except Exception:  # a bug inside the group must not take its callers down
            log.exception("Shared stream group key=%r ended with an error", group.key)
        # (the group's done-callback removes it from _closing once its task is done)

    # -- the binding channel

    def bind_event(self, *, trigger_id: str, key: Hashable) -> BoundEvent | None:
        """Bind the trigger's just-yielded event to the raw event whose window is open."""
        # The subscription whose filter runs in the calling task, if it is this one: an
        # old subscription of the same trigger id, still finishing, must not bind to a
        # new one's raw event.
        window = current_window.get()
        if (
            isinstance(window, _Subscriber)
            and window.trigger_id == trigger_id
            and (window.group.key is key or window.group.key == key)
        ):
            sub = window
        else:
            subs = self._by_trigger.get(trigger_id)
            if subs is None:
                return None
            for k, sub in subs:  # noqa: B007 - almost always one: a trigger id is on one key
                if k is key or k == key:
                    break
            else:
                return None
        if sub.closed or sub.failure is not None:
            return None
        entry = sub.current
        if entry is None or sub.rejected_current:
            return None
        group = sub.group
        if not group.acking:
            return None
        producer = group.producer
        try:
            mid = producer.message_id(entry.payload) if producer is not None else None
        except Exception as exc:  # only costs dedupe of this event, never the event
            log.warning("message_id() failed key=%r: %r; stored without one", group.key, exc)
            mid = None
        binding = sub.binding
        if binding is None:
            binding = sub.binding = _Binding(sub, entry)
        binding.pending += 1
        position = binding.count
        binding.count = position + 1
        seq = self._next_seq
        self._next_seq = seq + 1
        self._bindings[seq] = binding
        return _new_tuple(BoundEvent, (seq, mid, position))

    def bind_pending_event(self, *, trigger_id: str, key: Hashable) -> int | None:
        """Airflow's shape of :meth:`bind_event`: only the sequence number."""
        bound = self.bind_event(trigger_id=trigger_id, key=key)
        return None if bound is None else bound.seq

    def confirm_persisted(self, seqs: Iterable[int]) -> None:
        """The event store durably wrote these bound events."""
        bindings = self._bindings
        for seq in seqs:
            binding = bindings.pop(seq, None)
            if binding is None:
                continue
            binding.pending -= 1
            if binding.pending == 0 and binding.moved and not binding.done:
                binding.done = True
                binding.sub.group.resolve(binding.entry, 0)

    def discard_pending_event(self, seq: int) -> None:
        """A bound event will never be persisted (say, its payload is not JSON): forget it.

        Its raw event is not resolved by this; reject it in the window, or it times out.
        """
        binding = self._bindings.pop(seq, None)
        if binding is not None:
            binding.pending -= 1

    def _drop_bindings(self, group: _Group) -> None:
        stale = [s for s, b in self._bindings.items() if b.sub.group is group]
        for seq in stale:
            del self._bindings[seq]

    # -- groups

    def _forget_group(self, group: _Group) -> None:
        if self._groups.get(group.key) is group:
            del self._groups[group.key]
        for sub in group.members:
            sub_key = (sub.trigger_id, group.key)
            self._unregister(sub_key, sub)
        self._closing.add(group)

    def group_stats(self) -> dict[Hashable, GroupStats]:
        """Counters of the live groups, by key."""
        return {key: g.stats for key, g in self._groups.items()}

    def producer_counters(self) -> dict[Hashable, Mapping[str, float]]:
        """Per live group, its producer's :meth:`~SharedStreamProducer.counters`."""
        out: dict[Hashable, Mapping[str, float]] = {}
        for key, group in self._groups.items():
            producer = group.producer
            if producer is None:
                continue
            try:
                out[key] = producer.counters()
            except Exception:  # a producer's bug must not break a metrics scrape
                log.exception("producer counters failed key=%r", key)
        return out

    def queue_depths(self) -> dict[tuple[Hashable, str], int]:
        """Raw events waiting in each subscriber's queue."""
        return {
            (key, sub.trigger_id): len(sub.queue)
            for key, g in self._groups.items()
            for sub in g.members
        }

    def lane_heads_waiting(self) -> dict[Hashable, int]:
        """Per group, lanes whose head event is not resolved yet."""
        return {
            key: sum(1 for q in g.lanes.values() if q and q[0].remaining > 0)
            for key, g in self._groups.items()
        }

    def fail_group(self, key: Hashable, exc: BaseException) -> None:
        """Fail the group of ``key`` now: nothing more is advanced; every member raises ``exc``."""
        group = self._groups.get(key)
        if group is not None:
            group.fail(exc)

    def idle(self) -> bool:
        """True when no subscriber has a raw event queued or open (all wait for more)."""
        return all(
            not sub.queue and sub.current is None
            for g in self._groups.values()
            for sub in g.members
        )

    def stop_polling(self) -> None:
        """Stop every group's upstream pull; subscribers keep their books."""
        for group in self._groups.values():
            group.stop_polling()

    async def wait_key_closed(self, key: Hashable) -> None:
        """Wait until no group of ``key`` is still closing (its producer's ``aclose`` ran)."""
        for group in [g for g in self._closing if g.key == key]:
            await self._finish(group)

    async def abort_all(self) -> None:
        """Cancel every group's tasks at once: for a shutdown that ran out of time."""
        groups = {*self._groups.values(), *self._closing}
        self._groups.clear()
        for group in groups:
            await group.abort()
        self._closing.clear()

    async def stop_all(self) -> None:
        """Stop every group: advance what is resolved, abandon the rest, close producers."""
        for group in list(self._groups.values()):
            group.close()  # first: events a filter is still working on are abandoned, not acked
            for sub in group.members:
                sub_key = (sub.trigger_id, group.key)
                self._unregister(sub_key, sub)
                group.detach(sub)
            self._closing.add(group)
        self._groups.clear()
        for group in list(self._closing):
            await self._finish(group)
