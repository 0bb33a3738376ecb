"""The ledger's record of one broadcast raw event, how a member resolved it, and its outcome.

Resolution kinds are plain ints behind names (not an IntEnum): ``resolve`` compares
them once per resolution, and exact ints keep that comparison on CPython's fast path.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable
from typing import Any, Final

from ..producer import AdvanceOutcome

#: How one snapshot member resolved an entry (``_Group.resolve(entry, kind)``).
ACKED: Final[int] = 0
FAILED: Final[int] = 1
REJECTED: Final[int] = 2


#: An entry's ``mid`` before the producer was asked for it.
_UNASKED: Any = object()


class _Run:
    """What the entries broadcast together share: their lane (and its ledger queue),
    the broadcast time, and how many members were in the snapshot.

    One per broadcast batch of one lane (a Kafka run of one partition): an entry
    refers to it instead of holding these four fields itself.
    """

    __slots__ = ("lane", "lane_q", "n", "t")

    def __init__(self, lane: Hashable, lane_q: deque[_Entry], t: float, n: int) -> None:
        self.lane = lane
        self.lane_q = lane_q
        self.t = t
        # members in the snapshot. Acks are not counted: every resolution decrements
        # an entry's ``remaining`` and only failures and rejections are counted (in its
        # marks), so once it is 0 the acks are ``n - failed - rejected``
        self.n = n


class _Marks:
    """How many snapshot members failed or rejected an entry, and the reject reasons.

    Most entries have none: an entry gets its marks at its first failure or rejection.
    """

    __slots__ = ("failed", "reasons", "rejected")

    def __init__(self) -> None:
        self.failed = 0
        self.rejected = 0
        self.reasons: list[str] | None = None


class _Entry:
    """One broadcast raw event in the ledger: counters only, never a set of subscribers."""

    __slots__ = ("lane_q", "marks", "mid", "payload", "raw", "remaining", "run")

    def __init__(self, payload: Any, raw: Any, run: _Run) -> None:
        self.payload = payload
        self.raw = raw
        self.run = run
        self.lane_q = run.lane_q  # (read once per resolution: kept on the entry)
        self.remaining = run.n
        self.marks: _Marks | None = None
        # the producer's message_id() of the payload, asked once for every member
        # that binds a yield to it (_UNASKED until then)
        self.mid: str | None = _UNASKED

    @staticmethod
    def of_run(pairs: Iterable[tuple[Any, Any]], run: _Run) -> list[_Entry]:
        """An entry per ``(raw, payload)`` pair, all of ``run``: what ``__init__`` sets,
        set in place (no type call and ``__init__`` frame per entry: a Kafka fetch
        makes hundreds at once)."""
        new = _Entry.__new__
        lane_q = run.lane_q
        n = run.n
        entries: list[_Entry] = []
        append = entries.append
        for raw, payload in pairs:
            entry = new(_Entry)
            entry.payload = payload
            entry.raw = raw
            entry.run = run
            entry.lane_q = lane_q
            entry.remaining = n
            entry.marks = None
            entry.mid = _UNASKED
            append(entry)
        return entries

    def marked(self) -> _Marks:
        """The entry's marks, made at its first failure or rejection."""
        marks = self.marks
        if marks is None:
            marks = self.marks = _Marks()
        return marks


# The fast path's entries belong to no lane: they are never advanced.
_EMPTY_LANE: deque[_Entry] = deque()
_FAST_RUN = _Run(None, _EMPTY_LANE, 0.0, 0)

# Outcomes without reject reasons are immutable and few: share one per (acked,
# failed, rejected), so the pump builds no AdvanceOutcome per event. Bounded.
_CLEAN_CACHE: dict[tuple[int, int, int], AdvanceOutcome] = {}
_CLEAN_CACHE_MAX: Final[int] = 4096


def _outcome(entry: _Entry) -> AdvanceOutcome:
    """The entry's outcome: shared from the cache when it has no reject reasons."""
    marks = entry.marks
    n = entry.run.n
    if marks is None:
        k = (n, 0, 0)
    else:
        failed, rejected = marks.failed, marks.rejected
        if marks.reasons:
            return AdvanceOutcome(n - failed - rejected, failed, rejected, tuple(marks.reasons))
        k = (n - failed - rejected, failed, rejected)  # (resolved: remaining is 0)
    outcome = _CLEAN_CACHE.get(k)
    if outcome is None:
        outcome = AdvanceOutcome(*k)
        if len(_CLEAN_CACHE) < _CLEAN_CACHE_MAX:
            _CLEAN_CACHE[k] = outcome
    return outcome
