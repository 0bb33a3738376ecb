"""One trigger's membership in a group: its queue, its binding window, what it iterates.

Bookkeeping is per subscriber, not per event: a subscriber consumes its queue in
order, so resolving the event it moves past is a pop and a counter decrement.
"""

from __future__ import annotations

import asyncio
import sys
from collections import deque
from collections.abc import AsyncIterator, Callable, Hashable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Protocol

from ..trigger import AIRFLOW_SHARED_STREAM, BaseEventTrigger, current_window
from ._common import log
from ._hooks import ACKED as ACKED_OUTCOME
from ._hooks import FAILED as FAILED_OUTCOME
from ._hooks import FIRED, Hooks, Received, Verdict
from ._hooks import REJECTED as REJECTED_OUTCOME
from ._ledger import _UNASKED, ACKED, REJECTED, _Entry
from ._types import _new_tuple

if TYPE_CHECKING:
    from ._types import InlineEmit, InlineEvaluate, InlineReady


class SubscriberGroup(Protocol):
    """What a subscriber, and the manager through it, use of the subscriber's group
    (``_members._Members`` and its layers): all of it, so this module imports none."""

    @property
    def key(self) -> Hashable: ...
    @property
    def acking(self) -> bool: ...
    @property
    def frozen(self) -> bool: ...
    @property
    def hooks(self) -> Hooks: ...
    @property
    def room_for(self) -> _Subscriber | None: ...
    @property
    def low_water(self) -> int: ...
    @property
    def on_filtered(self) -> Callable[[Hashable, Received, Verdict], None] | None: ...

    def resolve(self, entry: _Entry, kind: int, n: int = 1) -> None:
        """``n`` snapshot members resolved ``entry``."""
        ...

    def wake_poll(self) -> None:
        """The member a paused poll waits for has room again."""
        ...

    def detach(self, sub: _Subscriber) -> None:
        """``sub`` leaves in order."""
        ...

    def filter_failed(self, sub: _Subscriber, exc: BaseException) -> None:
        """``sub``'s filter raised on the event it is on."""
        ...

    def entry_message_id(self, entry: _Entry) -> str | None:
        """``entry``'s message id, asked once."""
        ...

    def _event_id(self, entry: _Entry) -> str:
        """``entry``'s name for a log line."""
        ...


class _Inline:
    """What an inline member runs instead of a queue and a task: its filter, called by
    the group as it broadcasts each raw event, and where the filter's payloads go."""

    __slots__ = ("emit", "evaluate", "ready", "windowed")

    def __init__(
        self,
        evaluate: InlineEvaluate,
        emit: InlineEmit,
        ready: InlineReady | None,
        windowed: bool,
    ) -> None:
        self.evaluate = evaluate
        self.emit = emit
        self.ready = ready
        # the filter may call reject_shared_stream_event() itself (a user's function):
        # the binding window ContextVar is set to the member while it runs
        self.windowed = windowed


class _Binding:
    """The trigger events one subscriber yielded while on one raw event.

    Made by the first yield bound to the raw event, so it starts with that one; once
    all its yields were confirmed before the filter moved on, the subscriber's next
    raw event reuses it (see ``_Subscriber.binding``).
    """

    __slots__ = ("count", "done", "entry", "moved", "pending", "sub")

    def __init__(self, sub: _Subscriber, entry: _Entry) -> None:
        self.sub = sub
        self.entry = entry
        self.pending = 1  # bound, not yet confirmed persisted
        self.count = 1  # bound in total (the next yield's position)
        self.moved = False  # the subscriber moved past the raw event
        self.done = False  # this subscriber's resolution of the entry is settled


class _AirflowWindow:
    """What Airflow's ``reject_shared_stream_event()`` finds in its ContextVar, under acklane.

    Set once per subscription, and only in a process that has loaded Airflow, so
    that a filter written against Airflow's function rejects under acklane's
    manager too. Airflow's function reads ``trigger_id`` and ``event_id`` (for its
    log line) and calls ``group._reject_pending_event(...)``: this object is its
    own ``group`` and resolves the subscriber's current event, whichever it is then.
    """

    __slots__ = ("sub",)

    #: tells acklane's reject_shared_stream_event() this is not Airflow's own window
    acklane_window = True

    def __init__(self, sub: _Subscriber) -> None:
        self.sub = sub

    @property
    def group(self) -> _AirflowWindow:
        return self

    @property
    def trigger_id(self) -> str:
        return self.sub.trigger_id

    @property
    def event_id(self) -> str | None:
        entry = self.sub.current
        return None if entry is None else self.sub.group._event_id(entry)

    def _reject_pending_event(self, **_ids: Any) -> None:
        if not self.sub.reject(None):
            log.warning(
                "reject_shared_stream_event() called outside a binding window; ignored "
                "(fast path, standalone run(), or between two events)"
            )


def _airflow_reject_context() -> ContextVar[Any] | None:
    """Airflow's reject ContextVar, if Airflow's module is loaded (it is never imported)."""
    module = sys.modules.get(AIRFLOW_SHARED_STREAM)
    return None if module is None else getattr(module, "_reject_context", None)


class _Subscriber:
    """One trigger's membership in a group: its queue and its place in the stream."""

    __slots__ = (
        "acking",
        "awaiting",
        "binding",
        "closed",
        "current",
        "failure",
        "group",
        "inline",
        "key",
        "queue",
        "rejected_current",
        "trigger",
        "trigger_id",
        "waiter",
    )

    def __init__(self, group: SubscriberGroup, trigger_id: str, trigger: BaseEventTrigger) -> None:
        self.group = group
        # the key object it subscribed with (equal to the group's): bind_event's check
        # that a window is this subscription's is then an identity test, no tuple compare
        self.key = group.key
        self.acking = group.acking  # the group's, fixed for its life
        self.trigger_id = trigger_id
        self.trigger = trigger
        self.queue: deque[_Entry] = deque()
        self.waiter: asyncio.Future[None] | None = None
        self.current: _Entry | None = None  # the raw event whose binding window is open
        # The yields bound to ``current``. May also be the binding of an event already
        # acked with all its yields confirmed (pending 0, ``entry`` not ``current``):
        # nothing else refers to it then, and bind_event reuses it for the next event
        # (no object per delivery); every reader treats it as a binding with nothing
        # pending, which resolves as if there were none.
        self.binding: _Binding | None = None
        self.rejected_current = False
        self.awaiting: deque[_Binding] = deque()  # moved past, yields not yet confirmed
        self.failure: BaseException | None = None
        self.closed = False
        #: an inline member's filter (no queue, no task of its own), else None
        self.inline: _Inline | None = None

    # -- the binding window (reject_shared_stream_event looks us up via a ContextVar)

    def reject(self, reason: str | None) -> bool:
        """The filter rejected the raw event it is on: resolve it as rejected, now."""
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
            marks = entry.marked()
            if marks.reasons is None:
                marks.reasons = []
            marks.reasons.append(reason)
        group.resolve(entry, REJECTED)
        return True

    def wake(self) -> None:
        """Resume raw_stream if it waits for an event (or for its failure)."""
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def oldest_outstanding(self) -> float | None:
        """Broadcast time of the oldest event this subscriber has not resolved."""
        self._prune_awaiting()
        if self.awaiting:
            return self.awaiting[0].entry.run.t
        if self.current is not None and not self.rejected_current:
            return self.current.run.t
        if self.queue:
            return self.queue[0].run.t
        return None

    def oldest_entry(self) -> _Entry:
        """The event :meth:`oldest_outstanding` dates (there must be one): for the log."""
        if self.awaiting:
            return self.awaiting[0].entry
        if self.current is not None and not self.rejected_current:
            return self.current
        return self.queue[0]

    def _received(self, entry: _Entry) -> Received:
        """``entry`` as the hooks see it (its message id, if it was asked for already)."""
        mid = entry.mid
        return _new_tuple(Received, (entry.raw, entry.payload, None if mid is _UNASKED else mid))

    def _verdict(self, entry: _Entry) -> Verdict:
        """What this subscriber's filter made of ``entry``, as it asks for the next one."""
        outcome = ACKED_OUTCOME
        events = 0
        reason = None
        if self.current is not entry or self.failure is not None:
            outcome = FAILED_OUTCOME
        elif self.rejected_current:
            outcome = REJECTED_OUTCOME
            reasons = None if entry.marks is None else entry.marks.reasons
            reason = reasons[-1] if reasons else None
        else:
            binding = self.binding
            if binding is not None and binding.entry is entry and binding.count:
                outcome = FIRED
                events = binding.count
        return _new_tuple(Verdict, (self.trigger_id, outcome, events, reason))

    def _prune_awaiting(self) -> None:
        """Drop settled bindings from the front, so the head is the oldest unsettled one."""
        awaiting = self.awaiting
        while awaiting and awaiting[0].done:
            awaiting.popleft()

    def move_past(self) -> None:
        """The filter is done with the raw event it is on: close its window.

        Acked now when nothing it yielded for it awaits the event store, else when the
        last yield is confirmed (:meth:`SharedStreamManager.confirm_persisted`). A
        binding whose yields are all confirmed stays: nothing else refers to it then
        (the manager forgot its seqs, it never was in ``awaiting``, it was never moved
        nor done), and the next event's binding reuses it (no object per delivery).
        """
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
        if binding is None or binding.pending == 0:
            group.resolve(entry, ACKED)
            return
        self.binding = None
        binding.moved = True
        # _prune_awaiting() inlined: with a store, this runs once per delivery
        awaiting = self.awaiting
        while awaiting and awaiting[0].done:
            awaiting.popleft()
        awaiting.append(binding)

    async def wait_inline(self) -> None:
        """An inline member's life: returns once it is closed in order, raises its failure."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                if self.failure is not None:
                    raise self.failure
                if self.closed:
                    return
                waiter: asyncio.Future[None] = loop.create_future()
                self.waiter = waiter
                await waiter
        finally:
            self.waiter = None

    async def raw_stream(self) -> AsyncIterator[Any]:
        """What the filter iterates: this subscriber's share of the broadcast."""
        queue = self.queue
        group = self.group
        acking = group.acking
        resolve = group.resolve
        loop = asyncio.get_running_loop()
        window_get = current_window.get
        window_set = current_window.set
        filtered = group.on_filtered if acking else None  # (tracing's spans, or None)
        if acking:
            # once per subscription, in the filter's task (nothing per event, nothing at
            # all without Airflow): Airflow's reject finds this subscriber's window
            airflow_context = _airflow_reject_context()
            if airflow_context is not None:
                airflow_context.set(_AirflowWindow(self))
        try:
            while True:
                # (``current`` may still name an event a failure or close let go: it
                # is cleared here, or replaced by the next event)
                if self.failure is not None:
                    self.current = None
                    raise self.failure
                if not queue:
                    self.current = None
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
                # set only when another window is current in this context: a set makes
                # a new context mapping and a token (once per delivery otherwise)
                if window_get() is not self:
                    window_set(self)
                yield entry.raw
                if filtered is not None:  # this watcher's verdict (a tracing span's)
                    filtered(group.key, self._received(entry), self._verdict(entry))
                # The filter asks for the next raw event: this one's window closes
                # (unless the subscriber was failed or closed meanwhile, which did it).
                if self.current is not entry:
                    continue
                binding = self.binding
                if (
                    acking
                    and not self.rejected_current
                    and (binding is None or binding.pending == 0)
                ):
                    # move_past()'s common case, without its call (once per delivery):
                    # nothing it yielded for the event awaits the store, so it is acked
                    self.current = None
                    resolve(entry, ACKED)
                else:
                    self.move_past()
        finally:
            self.waiter = None
