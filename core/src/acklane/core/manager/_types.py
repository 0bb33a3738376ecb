"""The engine's public value types and callback shapes, shared by every module of it."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

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
