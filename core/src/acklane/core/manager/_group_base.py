"""A group's state and its books: what every part of the group reads and writes.

A group (``_group._Group``) is one class assembled from one module per concept, each
a layer over the one below: this base (the state, the one resolve-and-ack routine,
message identities), the poison books (``_poison``), the lanes and the pump
(``_lanes``), membership and failure propagation (``_members``), inline delivery
(``_delivery``), the broadcast paths (``_broadcast``), the ack-timeout sweep
(``_sweep``), and the lifecycle (``_group``). One object, so the per-message paths
read their state as attributes of ``self``, as before the split.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Hashable, Mapping
from typing import Any, Protocol

from ..producer import SharedStreamProducer
from ..trigger import BaseEventTrigger, uses_ack_channel
from ._common import log
from ._hooks import Hooks, Received, Verdict, hook_of
from ._ledger import _UNASKED, ACKED, FAILED, _Entry
from ._subscriber import _Subscriber
from ._types import BoundEvent, GroupStats, PoisonPolicy, _new_tuple


class GroupSettings(Protocol):
    """What every part of a group uses of its manager: the settings it started with,
    what watches it, and binding a trigger event to a raw event."""

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


class _GroupBase:
    """All live subscribers of one key, sharing one upstream poll: the state."""

    def __init__(
        self,
        host: GroupSettings,
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

    def _message_id(self, entry_payload: Any) -> str | None:
        """The producer's identity of a payload (None: it has none, or failed to say)."""
        message_id = self.message_id_of
        if message_id is None:
            return None
        try:
            return message_id(entry_payload)
        except Exception:  # message_id() failing costs the poison count, never the event
            return None

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

    def _received(self, entry: _Entry) -> Received:
        """A new entry as the hooks see it: its raw event, payload and message id."""
        mid = entry.mid
        if mid is _UNASKED:
            mid = self.entry_message_id(entry)
        return _new_tuple(Received, (entry.raw, entry.payload, mid))

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

    def fail(self, exc: BaseException) -> None:
        """The group fails loudly (the lifecycle's: ``_group._Group.fail``)."""
        raise NotImplementedError


#: The suspects of a group without a poison policy: always empty.
_NO_SUSPECTS: Mapping[str, object] = {}
