"""The engine's public value types and callback shapes, shared by every module of it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from ..producer import AdvanceItem

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


@dataclass(frozen=True, slots=True)
class Rejected:
    """A verdict: the raw event must be rejected (dead-lettered), for this reason."""

    reason: str


#: An inline filter (:meth:`SharedStreamManager.inline_subscription`): called with
#: each raw event, synchronously, by the group as it broadcasts it; returns the
#: payloads of the trigger events it makes of it (a list, empty when nothing fires)
#: or :class:`Rejected`. Raising is a failure of the subscriber on that event.
InlineEvaluate = Callable[[Any], "list[Any] | Rejected"]
#: Takes each payload an inline filter returned, with its binding (None on the fast
#: path or when the event could not be bound), synchronously: it persists it (and
#: later confirms ``bound.seq``). Raising fails the subscriber out of what it holds.
InlineEmit = Callable[[Any, "BoundEvent | None"], None]
#: Back-pressure of what ``emit`` feeds: None when it can take more, else an
#: awaitable the poll waits on before it pulls the next batch.
InlineReady = Callable[[], "Awaitable[None] | None"]


class PoisonPolicy(Protocol):
    """acklane's addition: counts failures per message and judges redeliveries.

    The manager calls it (when given one, in ack mode only) at three moments, all
    synchronously on the event loop:

    - :meth:`failed` when a subscriber is force-failed for a reason that belongs to
      the raw event it was on (its filter raised there, or it sat on it past the ack
      timeout), with that event's message id;
    - :meth:`poisoned` when a raw event whose message id is in :meth:`suspects`
      is pulled: a reason means "do not broadcast it: reject it for every member
      with that reason" (the producer dead-letters it);
    - :meth:`resolved` after ``advance`` handed the broker suspects that every
      member acked or rejected.

    :meth:`suspects` is read once per group: a live mapping (the policy keeps it up
    to date), so the poll checks nothing per raw event while it is empty.
    """

    def suspects(self, key: Hashable) -> Mapping[str, object]:
        """Message ids of ``key`` with failed attempts on record (a live mapping)."""
        ...

    def poisoned(self, key: Hashable, message_id: str) -> str | None:
        """Why the suspect ``message_id`` must be dead-lettered now, or None."""
        ...

    def failed(self, key: Hashable, trigger_id: str, message_id: str, error: BaseException) -> None:
        """``trigger_id`` failed on ``message_id`` with ``error``."""
        ...

    def resolved(self, key: Hashable, message_ids: Sequence[str]) -> None:
        """Suspects advanced as acked or rejected: their books may close."""
        ...


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


# Builds a NamedTuple (BoundEvent, AdvanceItem) without its Python-level __new__:
# ``_new_tuple(BoundEvent, (seq, mid, position))``, once per delivered event.
_new_tuple = tuple.__new__
