"""The manager, one per process: subscribing, the binding channel, and the live groups.

It groups triggers by key (one upstream poll per key), routes a yielded trigger
event to the raw event its filter is on (``bind_event``), and resolves that raw
event once the event store confirms the trigger event persisted.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..trigger import BaseEventTrigger, TriggerEvent, current_window
from ._common import aclose_iter, log
from ._group import _Group
from ._hooks import Callbacks, HookChain, Hooks
from ._ledger import _UNASKED, ACKED, _Entry
from ._settings import _check_settings, _stream_settings
from ._subscriber import _Binding, _Inline, _Subscriber
from ._types import (
    AdvanceObserver,
    BoundEvent,
    FailureObserver,
    GroupStats,
    InlineEmit,
    InlineEvaluate,
    InlineReady,
    LeaveObserver,
    PoisonPolicy,
    _new_tuple,
)


class SharedStreamManager:
    """One per process: groups triggers by key and runs one poll per group."""

    def __init__(
        self,
        *,
        log: Any = None,
        max_subscriber_queue: int = 1024,
        ack_timeout: float = 300.0,
        cohort_grace_period: float = 0.0,
        overflow: Literal["fail", "pause"] = "fail",
        on_advance: AdvanceObserver | None = None,
        on_subscriber_failed: FailureObserver | None = None,
        on_subscriber_leaving: LeaveObserver | None = None,
        poison_policy: PoisonPolicy | None = None,
        tracer: Hooks | None = None,
        hooks: Hooks | None = None,
    ) -> None:
        _check_limits(max_subscriber_queue, ack_timeout, overflow)
        #: Airflow's parameter (a bound logger), accepted so that code written for
        #: Airflow's manager builds this one; acklane logs to ``acklane.core.manager``.
        self.log = log
        self.max_subscriber_queue = max_subscriber_queue
        self.ack_timeout = ack_timeout
        self.cohort_grace_period = cohort_grace_period
        #: "fail" (Airflow's rule): a full queue force-fails its subscriber. "pause"
        #: (acklane's option): the poll waits for room instead; a stuck subscriber is
        #: still failed, by the ack timeout.
        self.overflow = overflow
        #: Airflow-shaped callbacks, kept: adapted onto :attr:`hooks`' moments (before
        #: them) for each group that starts after they are set.
        self.on_advance = on_advance
        self.on_subscriber_failed = on_subscriber_failed
        self.on_subscriber_leaving = on_subscriber_leaving
        #: acklane's addition: failures attributed to a message are counted, and a
        #: message that failed too often is rejected before any subscriber sees it. A
        #: policy (its answers change what the engine does), not a hook.
        self.poison_policy = poison_policy
        #: acklane's addition: OpenTelemetry spans per message (a ``MessageTracer`` of
        #: acklane.core.observe.tracing; None: tracing off), called after the callbacks.
        self.tracer = tracer
        #: acklane's addition: what watches the engine (:class:`Hooks`; a
        #: :class:`HookChain` for several), called last, in its order. Read as each
        #: group starts: a moment no hook overrides costs nothing per message.
        self.hooks: Hooks = Hooks() if hooks is None else hooks
        self._groups: dict[Hashable, _Group] = {}
        self._subs: dict[tuple[str, Hashable], _Subscriber] = {}
        # trigger id -> [(key, subscriber)]: bind_event's lookup without hashing the key
        self._by_trigger: dict[str, list[tuple[Hashable, _Subscriber]]] = {}
        self._bindings: dict[int, _Binding] = {}
        self._next_seq = itertools.count(1).__next__  # sequence numbers of bound events
        self._closing: set[_Group] = set()
        # wait_failed(): futures per key, resolved with the error of the key's next failure
        self._failure_waiters: dict[Hashable, list[asyncio.Future[BaseException]]] = {}

    # -- subscribing

    def subscribe(
        self, *, trigger_id: str, trigger: BaseEventTrigger, key: Hashable
    ) -> AsyncIterator[Any]:
        """Join the group of ``key`` and return this trigger's raw event stream.

        Airflow's shape: the caller feeds the stream to ``trigger.filter_shared_stream``,
        binds each event the filter yields (:meth:`bind_pending_event`), and calls
        :meth:`unsubscribe` when done (closing the stream alone does not leave). The
        checks run at once: a ``None`` key raises ``ValueError``, a trigger id already
        subscribed to ``key`` ``RuntimeError``, differing stream settings ``ValueError``.
        :meth:`events` is the form that runs the filter and leaves by itself.
        """
        return self._join((trigger_id, key), trigger).raw_stream()

    async def events(
        self, *, trigger_id: str, trigger: BaseEventTrigger, key: Hashable
    ) -> AsyncGenerator[TriggerEvent, None]:
        """Join the group of ``key`` and yield what this trigger's filter makes of it.

        acklane's form of :meth:`subscribe`: it runs the filter, and leaves the group
        when closed or when the filter ends. A filter that raises (or is cancelled)
        fails its subscriber out of what it holds (redelivered) instead of acking
        the event it is on. The checks of :meth:`subscribe` run at the first step.
        :meth:`subscription` is the same without the generator in between.
        """
        subscription = self.subscription(trigger_id=trigger_id, trigger=trigger, key=key)
        how = CONSUMER_CLOSED
        try:
            async for event in subscription.events:
                yield event
            how = FILTER_RETURNED
        except GeneratorExit:
            raise  # closed by its consumer at a yield: an orderly unsubscribe
        except BaseException as exc:
            subscription.failed(exc)
            raise
        finally:
            await subscription.aclose(how)

    def subscription(
        self, *, trigger_id: str, trigger: BaseEventTrigger, key: Hashable
    ) -> Subscription:
        """Join the group of ``key``: :meth:`events` for a caller that runs the loop itself.

        The caller iterates ``events`` (the filter's own iterator: no generator step
        per event in between), calls :meth:`Subscription.failed` when iterating it
        raised, and awaits :meth:`Subscription.aclose` in every case. The checks of
        :meth:`subscribe` run now.
        """
        sub_key = (trigger_id, key)
        raw_stream = self.subscribe(trigger_id=trigger_id, trigger=trigger, key=key)
        return Subscription(self, sub_key, self._subs[sub_key], trigger, raw_stream)

    def inline_subscription(
        self,
        *,
        trigger_id: str,
        trigger: BaseEventTrigger,
        key: Hashable,
        evaluate: InlineEvaluate,
        emit: InlineEmit,
        ready: InlineReady | None = None,
        windowed: bool = False,
    ) -> InlineSubscription:
        """Join the group of ``key`` with a synchronous filter the group evaluates itself.

        acklane's addition, for pure filters: no queue, task or generator of the
        subscriber's own. As the group broadcasts each raw event it calls
        ``evaluate(raw)`` (a list of payloads, or :class:`Rejected`), binds each
        payload to the raw event and hands it to ``emit(payload, bound)``, which
        persists it and later confirms ``bound.seq`` (:meth:`confirm_persisted`). The
        rules are a queued subscriber's: the snapshot, rejects with their reason, a
        raising ``evaluate`` fails the subscriber on that event (the poison policy
        counts it), acked once every emitted event is confirmed. ``ready()`` is the
        back-pressure of what ``emit`` feeds (see :data:`InlineReady`); ``windowed``
        sets the binding window while ``evaluate`` runs, for a filter that calls
        ``reject_shared_stream_event`` itself. The checks of :meth:`subscribe` run now.
        """
        sub_key = (trigger_id, key)
        sub = self._join(sub_key, trigger, _Inline(evaluate, emit, ready, windowed))
        return InlineSubscription(self, sub_key, sub)

    def _join(
        self,
        sub_key: tuple[str, Hashable],
        trigger: BaseEventTrigger,
        inline: _Inline | None = None,
    ) -> _Subscriber:
        """Check the subscription, find or start its group, and register the new member."""
        trigger_id, key = sub_key
        # (Airflow's exception types and texts: its callers may match on them)
        if key is None:
            raise ValueError("shared stream key must not be None")
        if sub_key in self._subs:
            raise RuntimeError(f"Trigger {trigger_id} already subscribed to shared stream {key!r}")
        settings = _stream_settings(trigger)
        group = self._groups.get(key)
        if group is None:
            group = self._start_group(key, trigger, trigger_id, settings)
        else:
            _check_settings(group.key, group.founder, group.settings, trigger_id, settings)
        sub = group.attach(trigger_id, trigger, inline)
        sub.key = key
        self._register(sub_key, sub)
        return sub

    def _start_group(
        self, key: Hashable, trigger: BaseEventTrigger, trigger_id: str, settings: object
    ) -> _Group:
        """The key's first subscriber founds its group: its kwargs build the producer."""
        _, kwargs = trigger.serialize()
        group = _Group(self._host(), key, type(trigger), kwargs, trigger_id, settings)
        self._groups[key] = group
        group.start()
        return group

    def _host(self) -> _Host:
        """What a new group may use of this manager (its settings and hooks as of now)."""
        callbacks = Callbacks(
            self.on_advance, self.on_subscriber_failed, self.on_subscriber_leaving
        )
        watching = [callbacks, *([] if self.tracer is None else [self.tracer]), self.hooks]
        return _Host(
            self.max_subscriber_queue,
            self.ack_timeout,
            self.cohort_grace_period,
            self.overflow,
            self.poison_policy,
            HookChain(*watching),
            self._bind,
            self._forget_group,
            self._drop_bindings,
            self._closing.discard,
        )

    def _leaving(self, sub: _Subscriber, how: str) -> None:
        """Tell the hooks a live subscription is about to end in order."""
        group = sub.group
        try:
            group.hooks.subscriber_leaving(group.key, sub.trigger_id, how)
        except Exception:  # a hook must never break the ack channel
            log.exception("subscriber-leaving observer failed key=%r", group.key)

    def _register(self, sub_key: tuple[str, Hashable], sub: _Subscriber) -> None:
        """Index the subscriber by (trigger id, key) and by trigger id."""
        self._subs[sub_key] = sub
        self._by_trigger.setdefault(sub_key[0], []).append((sub_key[1], sub))

    def _unregister(self, sub_key: tuple[str, Hashable], sub: _Subscriber) -> None:
        """Undo :meth:`_register`, unless a newer subscription holds the key by now."""
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
        """The subscriber leaves; the group it empties closes (returned, to wait for)."""
        self._unregister(sub_key, sub)
        sub.group.detach(sub)
        group = self._groups.get(sub.group.key)
        if group is sub.group and not group.members and group.error is None:
            del self._groups[group.key]
            group.close()
            self._closing.add(group)
            return group
        return None

    async def unsubscribe(
        self, trigger_id: str, key: Hashable, *, error: BaseException | None = None
    ) -> None:
        """Leave the group; the last one out stops its poll and waits for it to close.

        The event the subscriber is on counts as moved past (Airflow's rule), what it
        has not pulled fails. With ``error`` (acklane's addition: the caller's filter
        raised) it is failed out of everything it holds instead, so nothing it was
        working on is acked.
        """
        sub = self._subs.get((trigger_id, key))
        if sub is None:
            return
        if error is not None:
            sub.group.filter_failed(sub, error)
        group = self._detach((trigger_id, key), sub)
        if group is not None:
            await self._finish(group)

    async def _finish(self, group: _Group) -> None:
        """Wait for a closing group; its errors are logged, never raised."""
        try:
            await group.wait_closed()
        except Exception:  # a bug inside the group must not take its callers down
            log.exception("Shared stream group key=%r ended with an error", group.key)
        # (the group's done-callback removes it from _closing once its task is done)

    # -- the binding channel

    def bind_event(self, *, trigger_id: str, key: Hashable) -> BoundEvent | None:
        """Bind the trigger's just-yielded event to the raw event whose window is open."""
        # Once per yielded event: kept in one piece, on purpose.
        # The subscription whose filter runs in the calling task, if it is this one: an
        # old subscription of the same trigger id, still finishing, must not bind to a
        # new one's raw event.
        window = current_window.get()
        if (
            isinstance(window, _Subscriber)
            and window.trigger_id == trigger_id
            and (window.key is key or window.group.key == key)
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
        entry = sub.current
        if (
            entry is None
            or sub.rejected_current
            or sub.failure is not None
            or sub.closed
            or not sub.acking
        ):
            return None
        return self._bind(sub, entry)

    def _bind(self, sub: _Subscriber, entry: _Entry) -> BoundEvent:
        """Bind one more event of ``sub`` to ``entry``, the raw event its window is on."""
        mid = entry.mid
        if mid is _UNASKED:  # once per raw event, whichever member binds to it first
            mid = sub.group.entry_message_id(entry)
        binding = sub.binding
        if binding is None:
            binding = sub.binding = _Binding(sub, entry)  # pending and count 1: this yield
            position = 0
        elif binding.entry is not entry:
            # the last event's, all confirmed and let go (see _Subscriber.binding): reused
            # as new (never moved nor done), with this yield
            binding.entry = entry
            binding.pending = 1
            binding.count = 1
            position = 0
        else:
            binding.pending += 1
            position = binding.count
            binding.count = position + 1
        seq = self._next_seq()
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
            # moved first: it is False when the confirmation comes within the window
            if binding.moved and binding.pending == 0 and not binding.done:
                binding.done = True
                binding.sub.group.resolve(binding.entry, ACKED)

    def discard_pending_event(self, seq: int) -> None:
        """A bound event will never be persisted (say, its payload is not JSON): forget it.

        Its raw event is not resolved by this; reject it in the window, or it times out.
        """
        binding = self._bindings.pop(seq, None)
        if binding is not None:
            binding.pending -= 1

    def _drop_bindings(self, group: _Group) -> None:
        """Forget the bindings of a group that ended: they will never resolve anything."""
        stale = [s for s, b in self._bindings.items() if b.sub.group is group]
        for seq in stale:
            del self._bindings[seq]

    # -- groups

    def _forget_group(self, group: _Group) -> None:
        """A failed group: no longer live, its members unregistered, still closing."""
        if self._groups.get(group.key) is group:
            del self._groups[group.key]
        for sub in group.members:
            sub_key = (sub.trigger_id, group.key)
            self._unregister(sub_key, sub)
        self._closing.add(group)
        error = group.error if group.error is not None else RuntimeError("group failed")
        for future in self._failure_waiters.pop(group.key, ()):
            if not future.done():
                future.set_result(error)

    async def wait_failed(self, key: Hashable) -> BaseException:
        """acklane's addition: wait until a group of ``key`` fails; return its error.

        The live group, or the next one to start if none is live. A caller whose
        subscriber may be stuck in its own code (never pulling again, so never seeing
        the failure its iterator would raise) learns of the failure here.
        """
        future: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()
        waiters = self._failure_waiters.setdefault(key, [])
        waiters.append(future)
        try:
            return await future
        finally:
            if future in waiters:
                waiters.remove(future)
                if not waiters and self._failure_waiters.get(key) is waiters:
                    del self._failure_waiters[key]

    def group_stats(self) -> dict[Hashable, GroupStats]:
        """Counters of the live groups, by key."""
        return {key: g.stats for key, g in self._groups.items()}

    def producer_counters(self) -> dict[Hashable, Mapping[str, float]]:
        """Per live group, its producer's :meth:`~SharedStreamProducer.counters`.

        A producer without the method (Airflow's) is left out, without a word.
        """
        out: dict[Hashable, Mapping[str, float]] = {}
        for key, group in self._groups.items():
            counters = getattr(group.producer, "counters", None)
            if counters is None:
                continue
            try:
                out[key] = counters()
            except Exception:  # a producer's bug must not break a metrics scrape
                log.exception("producer counters failed key=%r", key)
        return out

    def broker_problems(self) -> dict[Hashable, str]:
        """Per live group whose broker cannot be reached now, why (its producer's
        :meth:`~SharedStreamProducer.broker_problem`).

        A producer without the method is left out; one whose method raises is too
        (at DEBUG: this runs on every heartbeat).
        """
        out: dict[Hashable, str] = {}
        for key, group in self._groups.items():
            problem_of = getattr(group.producer, "broker_problem", None)
            if problem_of is None:
                continue
            try:
                problem = problem_of()
            except Exception:  # a producer's bug must not stop the heartbeat
                log.debug("producer broker_problem failed key=%r", key, exc_info=True)
                continue
            if problem:
                out[key] = str(problem)
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
            self._stop_group(group)
        self._groups.clear()
        for group in list(self._closing):
            await self._finish(group)

    def _stop_group(self, group: _Group) -> None:
        """Close the group, then detach its members: what they hold is abandoned, not acked."""
        group.close()  # first: events a filter is still working on are abandoned, not acked
        for sub in group.members:
            sub_key = (sub.trigger_id, group.key)
            self._unregister(sub_key, sub)
            group.detach(sub)
        self._closing.add(group)


@dataclass(frozen=True, slots=True)
class _Host:
    """What a group uses of its manager (:class:`~._group.GroupHost`): plain settings,
    its hooks, and the manager's books of bindings and live groups, behind four calls."""

    max_subscriber_queue: int
    ack_timeout: float
    cohort_grace_period: float
    overflow: str
    poison_policy: PoisonPolicy | None
    hooks: Hooks
    bind: Callable[[_Subscriber, _Entry], BoundEvent]
    group_failed: Callable[[_Group], None]
    group_ended: Callable[[_Group], None]
    group_done: Callable[[_Group], None]


#: How a subscription ended in order, for the leaving observer.
CONSUMER_CLOSED = "its consumer closed the subscription"
FILTER_RETURNED = "its filter returned"


class Subscription:
    """One trigger's subscription, run by its caller (:meth:`SharedStreamManager.subscription`).

    ``events`` is what the trigger's filter yields; each event is bound with
    :meth:`SharedStreamManager.bind_event` while the filter is on its raw event.
    """

    __slots__ = ("_closed", "_manager", "_raw_stream", "_sub", "_sub_key", "events")

    def __init__(
        self,
        manager: SharedStreamManager,
        sub_key: tuple[str, Hashable],
        sub: _Subscriber,
        trigger: BaseEventTrigger,
        raw_stream: AsyncIterator[Any],
    ) -> None:
        self._manager = manager
        self._sub_key = sub_key
        self._sub = sub
        self._raw_stream = raw_stream
        self._closed = False
        self.events: AsyncIterator[TriggerEvent] = trigger.filter_shared_stream(raw_stream)

    def failed(self, exc: BaseException) -> None:
        """Iterating ``events`` raised ``exc``: the filter is not done with its raw event.

        The subscriber is failed out of what it holds (redelivered) instead of acking
        the event it is on; a crash (not a cancellation) is a failed attempt of that
        event. Not for errors of the caller's own (they close the subscription).
        """
        self._sub.group.filter_failed(self._sub, exc)

    async def aclose(self, how: str = CONSUMER_CLOSED) -> None:
        """Leave the group: the event the subscriber is on counts as moved past, what
        it has not pulled fails; the filter is closed (its ``finally`` blocks run now,
        in this task), then its raw stream. Once; ``how`` is for the leaving observer."""
        if self._closed:
            return
        self._closed = True
        sub = self._sub
        manager = self._manager
        if not sub.closed and sub.failure is None and not sub.group.frozen:
            manager._leaving(sub, how)  # before it detaches: the observer may fail the group
        manager._detach(self._sub_key, sub)
        await _close_pipeline(self.events, self._raw_stream)


class InlineSubscription:
    """One trigger's inline subscription (:meth:`SharedStreamManager.inline_subscription`).

    Its filter runs in the group's broadcast; what is left to its caller is to wait
    for its end (:meth:`wait`), to reject the event being evaluated from ``emit``
    (:meth:`reject`), and to leave (:meth:`aclose`, in every case).
    """

    __slots__ = ("_closed", "_manager", "_sub", "_sub_key")

    def __init__(
        self, manager: SharedStreamManager, sub_key: tuple[str, Hashable], sub: _Subscriber
    ) -> None:
        self._manager = manager
        self._sub_key = sub_key
        self._sub = sub
        self._closed = False

    async def wait(self) -> None:
        """Until the subscription ends: returns when it was closed in order (the group
        stopped), raises why it failed (its filter raised, an ack timeout, the group)."""
        await self._sub.wait_inline()

    def reject(self, reason: str | None) -> bool:
        """Reject the raw event being evaluated (from ``emit``: a payload that cannot be
        stored); False outside an evaluation."""
        return self._sub.reject(reason)

    async def aclose(self, how: str = CONSUMER_CLOSED) -> None:
        """Leave the group, as :meth:`Subscription.aclose`: the leaving observer first;
        what the member had emitted and not yet seen confirmed still acks it when
        confirmed (or times out). Once; ``how`` is for the leaving observer."""
        if self._closed:
            return
        self._closed = True
        sub = self._sub
        manager = self._manager
        if not sub.closed and sub.failure is None and not sub.group.frozen:
            manager._leaving(sub, how)
        manager._detach(self._sub_key, sub)


def _check_limits(max_subscriber_queue: int, ack_timeout: float, overflow: str) -> None:
    """Refuse settings the engine cannot run with."""
    if max_subscriber_queue < 1:
        raise ValueError("max_subscriber_queue must be at least 1")
    if ack_timeout <= 0:
        raise ValueError("ack_timeout must be positive")
    if overflow not in ("fail", "pause"):
        raise ValueError(f"overflow must be 'fail' or 'pause', not {overflow!r}")


async def _close_pipeline(
    events: AsyncIterator[TriggerEvent], raw_stream: AsyncIterator[Any]
) -> None:
    """Close the filter (its finally blocks run now, in this task), then its raw stream."""
    await aclose_iter(events)
    await aclose_iter(raw_stream)
