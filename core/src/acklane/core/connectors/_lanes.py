"""The books of a broker that settles message by message, in ordered lanes.

The per-message twin of :class:`~acklane.core.connectors.CommitLedger`. An SQS FIFO
group, a Pub/Sub ordering key, a Service Bus session is an *ordered lane*: the
broker delivers its messages in order, and delivers the next ones only once the
earlier are settled or released. So a message that must come again
(:attr:`~acklane.core.connectors.Verdict.REDELIVER`) *holds* its lane: every
message of that lane received before its release landed is released too, whatever
its outcome, or a later message would be settled before the failed one comes back
(the lane would be reordered). A message received after the release landed is the
broker's redelivery in order, and lifts the hold.

Receives are numbered (:meth:`OrderedLanes.stamp`, once per receive call); a hold
is "everything of the lane up to receive N" once its release landed, and
everything of the lane while the release is in flight. Messages with no lane
(``None``: a standard queue, no ordering key, no session) are never held.

:meth:`OrderedLanes.plan` reads one advanced batch in order and says what to do
with each message (a :class:`LanePlan`); the connector carries it out: the dead
letters first, then the settlements that wait for them (a committable message
behind a reject of its lane in the batch: if the copy fails, the reject comes
again and so must they), then the rest; releases report :meth:`~OrderedLanes.landed`.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Generic, NamedTuple, TypeVar

from ._verdict import Verdict

__all__ = ["LaneEntry", "LanePlan", "OrderedLanes"]

#: An ordered lane (a FIFO group id, an ordering key, a session).
L = TypeVar("L", bound=Hashable)
#: The connector's object behind one entry.
T = TypeVar("T")


class LaneEntry(NamedTuple, Generic[L, T]):
    """One resolved message of a batch, as the plan reads it."""

    #: Its ordered lane, or ``None`` when it has none.
    lane: L | None
    #: The number of the receive that returned it (:meth:`OrderedLanes.stamp`).
    stamp: int
    verdict: Verdict
    item: T


@dataclass(slots=True)
class LanePlan(Generic[T]):
    """What to do for one batch; each list in batch order."""

    #: Copy to the dead-letter destination, then settle.
    dead_letter: list[T] = field(default_factory=list)
    #: Settle once :attr:`dead_letter` landed (behind a reject of their lane);
    #: release them if it failed.
    after_dead_letter: list[T] = field(default_factory=list)
    #: Settle now.
    commit: list[T] = field(default_factory=list)
    #: Release: failed, or nobody took it (with the redelivery backoff).
    redeliver: list[T] = field(default_factory=list)
    #: Release at once, whatever their outcome: behind a hold of their lane.
    held: list[T] = field(default_factory=list)


class OrderedLanes(Generic[L]):
    """Holds of ordered lanes by receive number (see the module)."""

    __slots__ = ("holds", "receives")

    def __init__(self) -> None:
        #: The number of the last receive (:meth:`stamp`).
        self.receives = 0
        #: lane -> the last receive whose messages of that lane are held (``inf``
        #: while its release is in flight). Public to read, never to write.
        self.holds: dict[L, float] = {}

    def stamp(self) -> int:
        """The number of a new receive: call it once per receive call, before it."""
        self.receives += 1
        return self.receives

    def hold(self, lane: L | None) -> None:
        """A message of ``lane`` is being released: hold the lane until it landed."""
        if lane is not None:
            self.holds[lane] = math.inf

    def landed(self, lane: L | None) -> None:
        """The release of ``lane`` landed: hold what was received up to now."""
        if lane is not None and lane in self.holds:
            self.holds[lane] = self.receives

    def forget(self, lane: L | None) -> None:
        """Drop ``lane``'s hold (its connection is gone: nothing of it comes again here)."""
        self.holds.pop(lane, None)  # type: ignore[arg-type]

    def is_held(self, lane: L | None, stamp: int) -> bool:
        """Whether a message of ``lane`` from receive ``stamp`` must be released; a
        message received after the hold ended lifts it."""
        if lane is None:
            return False
        until = self.holds.get(lane)
        if until is None:
            return False
        if stamp <= until:
            return True
        del self.holds[lane]
        return False

    def plan(self, entries: Iterable[LaneEntry[L, T]]) -> LanePlan[T]:
        """What to do for a batch (see :class:`LanePlan`); holds are set as it is read."""
        plan: LanePlan[T] = LanePlan()
        rejected: set[L] = set()
        for lane, stamp, judged, item in entries:
            if self.is_held(lane, stamp):
                plan.held.append(item)
            elif judged is Verdict.REDELIVER:
                plan.redeliver.append(item)
                self.hold(lane)
            elif judged is Verdict.DEAD_LETTER:
                plan.dead_letter.append(item)
                if lane is not None:
                    rejected.add(lane)
            elif lane is not None and lane in rejected:
                plan.after_dead_letter.append(item)
            else:
                plan.commit.append(item)
        return plan
