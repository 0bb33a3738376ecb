"""A group's members: joining, leaving, failing, and the room a paused poll waits for.

Later broadcasts go to a snapshot of the members; a member that leaves or fails is
out of it, and what it held is resolved (failed, or moved past on an orderly leave).
"""

from __future__ import annotations

import asyncio

from ..trigger import BaseEventTrigger, SubscriberOverflow
from ._common import log
from ._lanes import _Lanes
from ._ledger import FAILED, _Entry
from ._subscriber import _Inline, _Subscriber


class _Members(_Lanes):
    """Membership and failure propagation."""

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
