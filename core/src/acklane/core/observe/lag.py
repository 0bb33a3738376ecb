"""How far behind each stream is: its broker's backlog, read every few seconds.

A connector may offer a :class:`BacklogProbe` (``Connector.backlog_probe(config)``):
an object with a client of its own that reads, from the broker, what waits for the
stream (Kafka: per partition, the log end minus the group's committed offset; SQS:
the queue's visible, in-flight and delayed counts). The runner owns one task,
:meth:`LagMonitor.run_forever`, that reads every probe every ``engine.lag_interval``
seconds; the hot path never sees it. What it read is kept per stream key and shown
three ways: the ``acklane_stream_lag`` and ``acklane_stream_backlog`` gauges
(:mod:`acklane.core.observe.metrics`), each stream's ``lag`` in ``/readyz``'s body,
and ``lag=`` on the progress lines.

A probe that fails (the broker does not answer, a permission is missing) keeps the
last figures with their age (``acklane_stream_lag_age_seconds``) and its error; it
never fails the stream: the poll itself says whether the broker answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Final, NoReturn

from ..connectors._backlog import Backlog, BacklogProbe

__all__ = [
    "LAG_READ_TIMEOUT",
    "Backlog",
    "BacklogProbe",
    "LagMonitor",
    "StreamLag",
]

log = logging.getLogger("acklane.core.observe.lag")

#: Seconds one probe read may take before it counts as failed.
LAG_READ_TIMEOUT: Final = 10.0


@dataclass(slots=True)
class StreamLag:
    """The last reading of one stream key."""

    streams: str
    key_text: str
    broker: str
    probe: BacklogProbe
    backlog: tuple[Backlog, ...] = ()
    #: ``time.monotonic()`` of the last successful read, or ``None``.
    read_at: float | None = None
    #: Why the last read failed (``None``: it succeeded, or none was tried yet).
    error: str | None = None
    reads: int = 0
    failures: int = 0
    _logged: str | None = field(default=None, repr=False)

    @property
    def total(self) -> float | None:
        """The stream's lag over all its partitions, or ``None`` before the first read."""
        if self.read_at is None:
            return None
        return sum(b.lag for b in self.backlog)

    def age(self, now: float | None = None) -> float | None:
        if self.read_at is None:
            return None
        return max(0.0, (time.monotonic() if now is None else now) - self.read_at)

    def detail(self) -> dict[str, Any]:
        """The ``lag`` entry of ``/readyz``'s stream."""
        out: dict[str, Any] = {"broker": self.broker}
        total = self.total
        if total is not None:
            out["total"] = _number(total)
            out["age_seconds"] = round(self.age() or 0.0, 1)
            out["partitions"] = {
                b.partition: _number(b.lag) if not b.states else dict(b.states)
                for b in self.backlog
            }
        if self.error is not None:
            out["error"] = self.error
        return out


def _number(value: float) -> float | int:
    return int(value) if float(value).is_integer() else value


class LagMonitor:
    """The probes of a runner's streams and what they last read, by stream key."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.streams: dict[Hashable, StreamLag] = {}

    def add(self, key: Hashable, streams: str, key_text: str, probe: BacklogProbe) -> StreamLag:
        entry = self.streams[key] = StreamLag(streams, key_text, probe.broker, probe)
        return entry

    def of_key_text(self, key_text: str) -> StreamLag | None:
        for entry in self.streams.values():
            if entry.key_text == key_text:
                return entry
        return None

    async def read_once(self, read_timeout: float = LAG_READ_TIMEOUT) -> None:
        """Read every probe once, concurrently, each bounded by ``read_timeout``."""
        entries = list(self.streams.values())
        if not entries:
            return
        async with asyncio.TaskGroup() as tg:
            for entry in entries:
                name = f"acklane-lag-{entry.key_text}"
                tg.create_task(self._read(entry, read_timeout), name=name)

    async def _read(self, entry: StreamLag, read_timeout: float) -> None:
        try:
            async with asyncio.timeout(read_timeout):
                backlog = tuple(await entry.probe.read())
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a probe's failure never reaches the stream
            text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            if isinstance(exc, TimeoutError):
                text = f"no answer within {read_timeout:g}s"
            entry.error = text
            entry.failures += 1
            if entry._logged != text:  # once per distinct error, not every few seconds
                entry._logged = text
                log.warning("Reading the backlog of stream %s failed: %s", entry.streams, text)
            return
        entry.backlog = backlog
        entry.read_at = self._clock()
        entry.error = None
        entry.reads += 1
        if entry._logged is not None:
            entry._logged = None
            log.info("Reading the backlog of stream %s works again", entry.streams)

    async def run_forever(self, interval: float) -> NoReturn:
        """Read every ``interval`` seconds (the first read at once); a task owned by the
        runner, cancelled with it. The probes are closed when it ends."""
        try:
            while True:
                started = self._clock()
                await self.read_once(min(LAG_READ_TIMEOUT, max(interval, 1.0) * 2))
                await asyncio.sleep(max(0.0, interval - (self._clock() - started)))
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        for entry in list(self.streams.values()):
            with contextlib.suppress(Exception):
                await entry.probe.aclose()
