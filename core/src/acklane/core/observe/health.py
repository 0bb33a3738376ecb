"""Health of a running engine, as ``/healthz`` (alive) and ``/readyz`` (ready) report it.

The event loop updates a heartbeat every :data:`HEARTBEAT_INTERVAL` seconds; the HTTP
thread (see :mod:`acklane.core.observe.metrics`) only reads plain values, so a hung loop shows
as a heartbeat that grew old rather than as a probe that hangs.

- **Alive**: the runner has not finished, and (once it runs) the heartbeat is at most
  :data:`STALE_AFTER` seconds old.
- **Ready**: the runner is running (not starting, not stopping), every stream's
  watchers are polling (none is waiting out a restart backoff) and its broker answers
  (its producer's ``broker_problem()``, read on every heartbeat, is ``None``: a broker
  that does not answer fails no group, the connector keeps trying), and the event store
  can take events: its last write attempt did not fail and its last check (a
  ``SELECT 1`` every :data:`STORE_CHECK_INTERVAL` seconds) succeeded.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal, NoReturn

if TYPE_CHECKING:
    from ..events import EventStore
    from ..sinks import Dispatcher
    from .lag import LagMonitor

__all__ = [
    "HEARTBEAT_INTERVAL",
    "STALE_AFTER",
    "STORE_CHECK_INTERVAL",
    "STORE_CHECK_TIMEOUT",
    "CohortStatus",
    "Health",
]

#: Seconds between two heartbeats of the event loop.
HEARTBEAT_INTERVAL: Final = 1.0
#: A heartbeat older than this (seconds) means the event loop is hung: not alive.
STALE_AFTER: Final = 15.0
#: Seconds between two checks that the event store's database answers.
STORE_CHECK_INTERVAL: Final = 10.0
#: How long one such check may take (seconds) before the store counts as unreachable.
STORE_CHECK_TIMEOUT: Final = 5.0

log = logging.getLogger("acklane.core.observe.health")

Phase = Literal["new", "starting", "running", "stopping", "stopped"]
CohortState = Literal["starting", "polling", "restarting", "stopped"]


@dataclass(slots=True)
class CohortStatus:
    """Where one stream's watchers are: polling, or waiting to restart (and why)."""

    streams: str
    key_text: str
    watchers: tuple[str, ...]
    state: CohortState = "starting"
    reason: str = ""
    since: float = field(default_factory=time.monotonic)
    #: Why the stream's broker cannot be reached now (``None``: it answers, or
    #: the connector cannot tell); updated by the runner on every heartbeat.
    broker_problem: str | None = None

    def set(self, state: CohortState, reason: str = "") -> None:
        self.state = state
        self.reason = reason
        self.since = time.monotonic()


class Health:
    """What the probes read; written on the event loop, read from the HTTP thread."""

    heartbeat_interval: float = HEARTBEAT_INTERVAL
    stale_after: float = STALE_AFTER
    store_check_interval: float = STORE_CHECK_INTERVAL
    store_check_timeout: float = STORE_CHECK_TIMEOUT

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.phase: Phase = "new"
        self.heartbeat: float | None = None
        self.cohorts: dict[str, CohortStatus] = {}
        self.store: EventStore | None = None
        #: The sinks' dispatcher, when the pipeline has sinks.
        self.sinks: Dispatcher | None = None
        #: Each stream's backlog (its ``lag`` entry), when the runner reads it.
        self.lag: LagMonitor | None = None

    def beat(self) -> None:
        self.heartbeat = self._clock()

    def liveness(self) -> tuple[bool, dict[str, Any]]:
        """``(alive, body)`` for ``/healthz``."""
        phase = self.phase
        body: dict[str, Any] = {"status": "alive", "phase": phase}
        if phase == "stopped":
            body["status"] = "stopped"
            return False, body
        if self.heartbeat is not None:
            age = max(0.0, self._clock() - self.heartbeat)
            body["heartbeat_age_seconds"] = round(age, 3)
            if age > self.stale_after:
                body["status"] = "event loop unresponsive"
                return False, body
        return True, body

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """``(ready, body)`` for ``/readyz``; the body says what is not ready."""
        alive, live = self.liveness()
        problems: list[str] = []
        if not alive:
            problems.append(str(live["status"]))
        if self.phase != "running":
            problems.append(f"the runner is {self.phase}")
        streams: dict[str, dict[str, Any]] = {}
        for status in list(self.cohorts.values()):
            entry: dict[str, Any] = {"key": status.key_text, "state": status.state}
            if status.reason:
                entry["reason"] = status.reason
            broker = status.broker_problem
            if broker is not None:
                entry["broker"] = broker
            lag = None if self.lag is None else self.lag.of_key_text(status.key_text)
            if lag is not None:
                entry["lag"] = lag.detail()
            streams[status.streams] = entry
            if status.state != "polling":
                why = f": {status.reason}" if status.reason else ""
                problems.append(f"stream {status.streams} is {status.state}{why}")
            elif broker is not None:
                problems.append(f"stream {status.streams} cannot reach its broker: {broker}")
        store = self.store
        store_problem = "the event store is not open" if store is None else store.problem
        if store_problem is not None:
            problems.append(f"store: {store_problem}")
        sinks: dict[str, dict[str, Any]] = {}
        if self.sinks is not None:
            for stats in self.sinks.stats():
                entry = {"ok": stats.problem is None, "delivering": stats.holding}
                seen = stats.status
                if seen is not None:
                    entry |= {"lag": seen.lag, "parked": seen.parked}
                if stats.problem is not None:
                    entry["problem"] = stats.problem
                    problems.append(f"sink {stats.sink}: {stats.problem}")
                sinks[stats.sink] = entry
        body: dict[str, Any] = {
            "status": "ready" if not problems else "not ready",
            "streams": streams,
            "store": {"ok": store_problem is None}
            | ({} if store_problem is None else {"problem": store_problem}),
        }
        if sinks:
            body["sinks"] = sinks
        if problems:
            body["problems"] = problems
        return not problems, body

    async def run_forever(self, on_beat: Callable[[], None] | None = None) -> NoReturn:
        """Beat every ``heartbeat_interval`` (calling ``on_beat``) and check the store
        every ``store_check_interval``; a task owned by the runner, cancelled with it."""
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._check_store_forever(), name="acklane-health-store")
            while True:
                self.beat()
                if on_beat is not None:
                    try:
                        on_beat()
                    except Exception:  # a counter's bug must not stop the heartbeat
                        log.exception("heartbeat callback failed")
                await asyncio.sleep(self.heartbeat_interval)
        raise AssertionError("unreachable")  # pragma: no cover - the loop never ends

    async def _check_store_forever(self) -> None:
        while True:
            await asyncio.sleep(self.store_check_interval)
            store = self.store
            if store is not None:
                await store.ping(self.store_check_timeout)
