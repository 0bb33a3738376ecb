"""Periodic progress of a running engine: one INFO line per stream.

Every ``engine.progress_interval`` seconds the runner logs, per stream (one line per
shared poll: the streams that share a key share a line)::

    progress stream=orders received=1200 (+200) events=950 (+150) acked=1180 (+198)
    rejected=12 (+2) failed=8 (+0) restarts=1 lag=340 state=polling

Each count is cumulative since the runner started, with what it grew by since the
previous line in parentheses:

- ``received``: messages the poll broadcast to the stream's watchers (redeliveries
  included), from the engine's group counters;
- ``events``: trigger events its watchers yielded and handed to the event store
  (redelivered copies included; the store drops those duplicates);
- ``acked``, ``rejected``, ``failed``: messages the engine handed back to the
  connector, by what the connector does with them: acked (commit, delete, ack,
  complete), rejected (dead-lettered, or dropped without a dead-letter destination),
  failed (not advanced past: redelivered);
- ``restarts``: how many times the stream's watchers were restarted;
- ``lag``: what waits for the stream on its broker at the last read (see
  :mod:`acklane.core.observe.lag`), absent when its connector cannot tell or
  nothing was read yet.

Counting ``acked``/``rejected``/``failed`` costs one step per advanced message;
``received`` is read from the group counters (sampled every second and at each
line, so a poll that lived less than a second between two samples may go
uncounted).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NoReturn

from ..manager import Hooks

if TYPE_CHECKING:
    from ..manager import GroupStats
    from ..producer import AdvanceItem

__all__ = ["COUNTS", "Progress", "StreamProgress"]

log = logging.getLogger("acklane.core.observe.progress")

#: The counts of a progress line, in order.
COUNTS = ("received", "events", "acked", "rejected", "failed")


@dataclass(slots=True)
class StreamProgress:
    """Counters of one stream key (its cohort), cumulative since the runner started."""

    streams: str
    key_text: str
    events: int = 0
    acked: int = 0
    rejected: int = 0
    failed: int = 0
    restarts: int = 0
    #: ``events`` by watcher.
    watcher_events: dict[str, int] = field(default_factory=dict)
    #: ``received`` of the polls that ended (their group was replaced).
    _received_before: int = 0
    _group: GroupStats | None = None
    _last: dict[str, int] = field(default_factory=dict)

    @property
    def received(self) -> int:
        current = self._group
        return self._received_before + (0 if current is None else current.broadcast)

    def observe_group(self, stats: GroupStats | None) -> None:
        """The live group's counters (a new object after each restart)."""
        if stats is None or stats is self._group:
            return
        if self._group is not None:
            self._received_before += self._group.broadcast
        self._group = stats

    def counts(self) -> dict[str, int]:
        return {name: int(getattr(self, name)) for name in COUNTS}

    def line(self, state: str | None = None, lag: float | None = None) -> str:
        """The progress line; what grew is measured from the previous call."""
        now = self.counts()
        parts = [f"progress stream={self.streams}"]
        for name in COUNTS:
            parts.append(f"{name}={now[name]} (+{now[name] - self._last.get(name, 0)})")
        parts.append(f"restarts={self.restarts}")
        if lag is not None:
            parts.append(f"lag={lag:g}")
        if state is not None:
            parts.append(f"state={state}")
        self._last = now
        return " ".join(parts)


class Progress(Hooks):
    """The runner's progress counters, by stream key."""

    def __init__(self, group_stats: Callable[[], Mapping[Hashable, GroupStats]]) -> None:
        self._group_stats = group_stats
        self.streams: dict[Hashable, StreamProgress] = {}

    def add(self, key: Hashable, streams: str, key_text: str) -> StreamProgress:
        progress = self.streams.get(key)
        if progress is None:
            progress = self.streams[key] = StreamProgress(streams, key_text)
        return progress

    def advanced(self, key: Hashable, batch: Sequence[AdvanceItem]) -> None:
        """Count a batch the engine handed to the connector (the ``advanced`` hook)."""
        progress = self.streams.get(key)
        if progress is None:
            return
        # verdict() inlined (once per advanced message): a failure outweighs a
        # rejection; accepted by nobody is a failure too.
        acked = rejected = 0
        for _, outcome in batch:
            if outcome.failed:
                continue
            if outcome.rejected:
                rejected += 1
            elif outcome.acked:
                acked += 1
        progress.acked += acked
        progress.rejected += rejected
        progress.failed += len(batch) - acked - rejected

    def sample(self) -> None:
        """Take note of the live groups' counters (cheap: a few dict lookups)."""
        for key, stats in self._group_stats().items():
            progress = self.streams.get(key)
            if progress is not None:
                progress.observe_group(stats)

    def report(
        self,
        state_of: Callable[[str], str | None] | None = None,
        lag_of: Callable[[str], float | None] | None = None,
    ) -> None:
        """Log one INFO line per stream."""
        self.sample()
        for progress in self.streams.values():
            state = None if state_of is None else state_of(progress.key_text)
            lag = None if lag_of is None else lag_of(progress.key_text)
            log.info("%s", progress.line(state, lag))

    async def run_forever(
        self,
        interval: float,
        state_of: Callable[[str], str | None] | None = None,
        lag_of: Callable[[str], float | None] | None = None,
    ) -> NoReturn:
        """Report every ``interval`` seconds; a task owned by the runner."""
        while True:
            await asyncio.sleep(interval)
            try:
                self.report(state_of, lag_of)
            except Exception:  # a display must never bring the engine down
                log.exception("progress report failed")
