"""The ledger's record of one broadcast raw event, how a member resolved it, and its outcome.

Resolution kinds are plain ints behind names (not an IntEnum): ``resolve`` compares
them once per resolution, and exact ints keep that comparison on CPython's fast path.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from typing import Any, Final

from ..producer import AdvanceOutcome

#: How one snapshot member resolved an entry (``_Group.resolve(entry, kind)``).
ACKED: Final[int] = 0
FAILED: Final[int] = 1
REJECTED: Final[int] = 2


#: An entry's ``mid`` before the producer was asked for it.
_UNASKED: Any = object()


class _Entry:
    """One broadcast raw event in the ledger: counters only, never a set of subscribers."""

    __slots__ = (
        "failed",
        "lane",
        "lane_q",
        "mid",
        "n",
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
        # members in the snapshot. Acks are not counted: every resolution decrements
        # ``remaining`` and only failures and rejections are counted, so once it is 0
        # the acks are ``n - failed - rejected`` (one write less per delivery)
        self.n = n
        self.failed = 0
        self.rejected = 0
        self.reasons: list[str] | None = None
        # the producer's message_id() of the payload, asked once for every member
        # that binds a yield to it (_UNASKED until then)
        self.mid: str | None = _UNASKED


# The fast path's entries belong to no lane: they are never advanced.
_EMPTY_LANE: deque[_Entry] = deque()

# Outcomes without reject reasons are immutable and few: share one per (acked,
# failed, rejected), so the pump builds no AdvanceOutcome per event. Bounded.
_CLEAN_CACHE: dict[tuple[int, int, int], AdvanceOutcome] = {}
_CLEAN_CACHE_MAX: Final[int] = 4096


def _outcome(entry: _Entry) -> AdvanceOutcome:
    """The entry's outcome: shared from the cache when it has no reject reasons."""
    acked = entry.n - entry.failed - entry.rejected  # (resolved: remaining is 0)
    if entry.reasons:
        return AdvanceOutcome(acked, entry.failed, entry.rejected, tuple(entry.reasons))
    k = (acked, entry.failed, entry.rejected)
    outcome = _CLEAN_CACHE.get(k)
    if outcome is None:
        outcome = AdvanceOutcome(*k)
        if len(_CLEAN_CACHE) < _CLEAN_CACHE_MAX:
            _CLEAN_CACHE[k] = outcome
    return outcome
