"""The books of a cumulative-commit broker (Kafka, the memory broker): holds, floors, commits.

Such a broker keeps one committed offset per lane (a partition): committing offset
``n`` says "everything below ``n`` is done". So a message that must come again
(:attr:`~acklane.core.connectors.Verdict.REDELIVER`) *holds* its lane: its offset
becomes the lane's *floor*, nothing at or past it is committed, the consumer is
sought back to it, and messages past it that were already in flight are left alone
(they come again after the seek and are judged then). A rejected message is copied
to the dead-letter destination before the commit that passes it.

:class:`CommitLedger` decides all of that from plain numbers, without a broker:
given a batch of ``(lane, offset, generation, verdict, item)`` it returns a
:class:`CommitPlan` (what to dead-letter first, what to commit, where to seek back)
and keeps the floors across batches. The connector carries the plan out on its
broker, in that order, and reports the commits that landed with :meth:`CommitLedger.committed_to`.

``generation`` tells deliveries of one lane apart across reassignments (a
rebalance): an item whose generation is not the lane's current one is skipped,
never acted on. A broker without reassignments assigns each lane once.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Generic, NamedTuple, TypeVar

from ._verdict import Verdict

__all__ = ["CommitLedger", "CommitPlan", "LedgerEntry"]

#: A lane (a partition: ``(topic, partition)``).
L = TypeVar("L", bound=Hashable)
#: The connector's object behind one entry.
T = TypeVar("T")


class LedgerEntry(NamedTuple, Generic[L, T]):
    """One resolved message of a batch, as the ledger reads it."""

    lane: L
    offset: int
    generation: int
    verdict: Verdict
    #: The connector's own object (its broker payload or advance item), handed back in
    #: the plan so the connector can act on it.
    item: T


@dataclass(slots=True)
class CommitPlan(Generic[L, T]):
    """What to do on the broker for one batch, in this order.

    1. dead-letter :attr:`dead_letter` (or count them dropped): the commits pass them;
    2. commit :attr:`commits`;
    3. seek each lane of :attr:`seeks` back to its floor.
    """

    #: Rejected items the commits pass, in batch order: copy them before committing.
    dead_letter: list[T] = field(default_factory=list)
    #: Per lane: ``(offset to commit, the last item the commit passes)``; the offset is
    #: the next one to consume (the last committable offset + 1), never past a floor.
    commits: dict[L, tuple[int, T]] = field(default_factory=dict)
    #: Items that held their lane (failed or unclaimed), in batch order.
    held: list[T] = field(default_factory=list)
    #: Per held lane: the offset to seek back to (the lane's floor).
    seeks: dict[L, int] = field(default_factory=dict)
    #: Items skipped because their lane was reassigned since they were delivered.
    skipped_revoked: int = 0


class CommitLedger(Generic[L, T]):
    """Per-lane generations, floors and committed offsets of one consumer.

    The dictionaries are public for a connector's hot path to read (never to write):
    ``owned`` (lane -> generation of its assignment), ``floors`` (lane -> lowest held
    offset), ``committed`` (lane -> the last offset committed on this assignment) and
    ``awaiting`` (lane -> floor just sought back to, until the first message after
    the seek came).
    """

    __slots__ = ("awaiting", "committed", "floors", "owned")

    def __init__(self) -> None:
        self.owned: dict[L, int] = {}
        self.floors: dict[L, int] = {}
        self.committed: dict[L, int] = {}
        self.awaiting: dict[L, int] = {}

    # -- assignment

    def assign(self, lane: L, generation: int, committed: int | None = None) -> None:
        """``lane`` is this consumer's from now, as ``generation``; its books start empty.

        ``committed``: the group's committed offset, when known (older copies are stale).
        """
        self.owned[lane] = generation
        self.floors.pop(lane, None)
        self.awaiting.pop(lane, None)
        if committed is None:
            self.committed.pop(lane, None)
        else:
            self.committed[lane] = committed

    def revoke(self, lane: L) -> None:
        """``lane`` is no longer this consumer's: forget it (its new owner redelivers)."""
        self.owned.pop(lane, None)
        self.floors.pop(lane, None)
        self.committed.pop(lane, None)
        self.awaiting.pop(lane, None)

    # -- a batch

    def is_clear(self, lane: L, generation: int, offset: int) -> bool:
        """Whether every message of ``lane`` up to ``offset`` may be committed at once,
        if all are :attr:`~Verdict.COMMIT` (owned as ``generation``, no floor, not stale)."""
        return (
            lane not in self.floors
            and self.owned.get(lane) == generation
            and offset + 1 > self.committed.get(lane, -1)
        )

    def plan(self, entries: Iterable[LedgerEntry[L, T]]) -> CommitPlan[L, T]:
        """What to do for a batch (in lane order); floors are updated as it is read.

        An item of a lane reassigned since is skipped; one below the committed offset
        (a stale copy) or past its lane's floor (it comes again after the seek) is left
        alone; a REDELIVER item becomes its lane's floor; a COMMIT or DEAD_LETTER item
        lifts the floor it sits on and moves its lane's commit past it.
        """
        plan: CommitPlan[L, T] = CommitPlan()
        owned, floors, committed = self.owned, self.floors, self.committed
        # Rejected items by (lane, offset): a later committable copy of one replaces it.
        rejected: dict[tuple[L, int], T] = {}
        candidates: dict[L, tuple[int, T]] = {}
        for lane, offset, generation, verdict, item in entries:
            if owned.get(lane) != generation:
                plan.skipped_revoked += 1
                continue
            if offset < committed.get(lane, -1):
                continue  # a stale copy of something already committed past
            floor = floors.get(lane)
            if floor is not None and offset > floor:
                continue  # behind a held message: it comes again after the seek
            if verdict is Verdict.REDELIVER:
                floors[lane] = offset
                plan.held.append(item)
                plan.seeks[lane] = offset
                continue
            if floor == offset:
                del floors[lane]
            if verdict is Verdict.DEAD_LETTER:
                rejected[lane, offset] = item
            elif rejected:
                rejected.pop((lane, offset), None)
            candidate = candidates.get(lane)
            if candidate is None or offset + 1 > candidate[0]:
                candidates[lane] = (offset + 1, item)
        for lane, (target, item) in candidates.items():
            floor = floors.get(lane)
            if floor is not None and floor < target:
                target = floor  # never past a held message (the item stays the last passed)
            if target > committed.get(lane, -1):
                plan.commits[lane] = (target, item)
        if rejected:
            for (lane, offset), item in rejected.items():
                commit = plan.commits.get(lane)
                if commit is not None and offset < commit[0]:
                    plan.dead_letter.append(item)
        return plan

    def committed_to(self, lane: L, offset: int) -> None:
        """A commit of ``lane`` at ``offset`` landed."""
        self.committed[lane] = offset

    # -- seeks

    def sought(self, lane: L, offset: int) -> None:
        """The consumer was sought back to ``offset`` (the lane's floor)."""
        self.awaiting[lane] = offset

    def came_back(self, lane: L, offset: int) -> int | None:
        """The first message of ``lane`` after a seek is at ``offset``: was the floor still there?

        Retention, compaction or record deletion can remove the held message; the
        consumer then resumes past it, and a floor kept at the missing offset would
        stop every later commit. Returns the floor dropped for that reason, else None.
        """
        held = self.awaiting.pop(lane, None)
        if held is None or offset <= held or self.floors.get(lane) != held:
            return None
        del self.floors[lane]
        return held
