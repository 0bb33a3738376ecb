"""What bench/sqs.py and bench/pubsub.py share: consumers timed against a bare SDK loop.

- :class:`Feeder` keeps a queue's backlog bounded but never empty, and counts what
  the consumer under test took; :func:`timed` runs a consumer beside it;
- :func:`engine_seconds` drains it through a ``SharedStreamManager`` with N watchers,
  every trigger event confirmed persisted at once (the store is not measured);
- :func:`best_of` runs the consumers round after round, interleaved, and keeps each
  one's best; :func:`print_table` and :func:`print_verdict` print the figures;
- :class:`CpuClock` reads the CPU time the bench process and the emulator's and
  proxy's processes spent, so that each result says it per 1000 messages;
- :func:`arguments` is the command line they have in common; :func:`add_rtt` and
  :func:`latency` put acklane's latency proxy between the consumers and the
  emulator (``--rtt-ms``), :func:`print_rtt_verdict` says whether the engine with
  one watcher keeps up with the bare loop there.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from acklane.core.manager import SharedStreamManager
from acklane.core.trigger import BaseEventTrigger
from acklane.integration.emulator import Emulator
from acklane.integration.netproxy import ProxyProcess

TARGET_CALLS_PER_MESSAGE = 0.25
#: The engine with one watcher against the bare SDK loop, through the same proxy.
TARGET_VERSUS_BARE = 0.9


@dataclass
class Result:
    name: str
    messages: int
    seconds: float
    calls: int
    #: CPU seconds by process ("bench", "emulator", "proxy") over the run, if measured.
    cpu: dict[str, float] = field(default_factory=dict)
    #: Said beside the run's figures (what was not timed, for one).
    note: str = ""

    @property
    def rate(self) -> float:
        return self.messages / self.seconds

    def cpu_per_1000(self) -> str:
        """``bench 0.41 emulator 1.20 ...``: CPU seconds per 1000 messages, by process."""
        return " ".join(f"{k} {v * 1000 / self.messages:.2f}" for k, v in self.cpu.items())

    @property
    def calls_per_message(self) -> float:
        return self.calls / self.messages


class Feeder:
    """Keeps a backlog bounded but never empty until ``total`` messages were sent.

    ``send`` sends the bodies it is given (to one queue or topic); the consumer
    under test adds what it took to :attr:`consumed`. While the backlog is full the
    feeder looks again every ``idle`` seconds.
    """

    def __init__(
        self,
        send: Callable[[Iterable[str]], Awaitable[object]],
        total: int,
        backlog: int,
        idle: float,
    ) -> None:
        self.send, self.total, self.backlog, self.idle = send, total, backlog, idle
        self.sent = 0
        self.consumed = 0

    async def prefill(self) -> None:
        await self._send(min(2 * self.backlog, self.total))

    async def run(self) -> None:
        while self.sent < self.total:
            if self.sent - self.consumed < self.backlog:
                await self._send(min(self.backlog, self.total - self.sent))
            else:
                await asyncio.sleep(self.idle)

    async def _send(self, n: int) -> None:
        await self.send(f'{{"n": {self.sent + i}}}' for i in range(n))
        self.sent += n


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far, from ``/proc`` (Linux)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()  # after the command's name
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


class CpuClock:
    """CPU seconds spent by this process ("bench") and by the named others (by pid)
    since :meth:`start`; a process whose pid is ``None`` or unreadable is left out."""

    def __init__(self, others: dict[str, int | None]) -> None:
        self.others = {name: pid for name, pid in others.items() if pid is not None}
        self._at: dict[str, float] = {}

    def _now(self) -> dict[str, float]:
        now = {"bench": time.process_time()}
        for name, pid in self.others.items():
            with contextlib.suppress(OSError):
                now[name] = process_cpu_seconds(pid)
        return now

    def start(self) -> None:
        self._at = self._now()

    def spent(self) -> dict[str, float]:
        now = self._now()
        return {name: now[name] - self._at[name] for name in now if name in self._at}


async def metered(clock: CpuClock | None, run: Awaitable[Result]) -> Result:
    """``run``'s result with the CPU each process spent meanwhile (none without a clock)."""
    if clock is None:
        return await run
    clock.start()
    result = await run
    result.cpu = clock.spent()
    return result


async def timed(feeder: Feeder, consume: Callable[[], Awaitable[float | None]]) -> float:
    """Seconds from the prefill to the end of ``consume`` (or the moment it returns)."""
    await feeder.prefill()
    started = time.perf_counter()
    async with asyncio.TaskGroup() as tg:
        tg.create_task(feeder.run())
        done = await consume()
    return (done or time.perf_counter()) - started


async def engine_seconds(
    feeder: Feeder,
    watchers: int,
    trigger: Callable[[], BaseEventTrigger],
    landed: Callable[[], bool],
    *,
    poll: float,
    time_the_stop: bool,
    stops: list[float] | None = None,
) -> float:
    """Seconds for ``watchers`` watchers (each ``trigger()``, sharing one stream) to
    see ``feeder.total`` messages each and for ``landed()`` (the last advances) to
    hold, asked every ``poll`` seconds; the stop of the manager counted too when
    ``time_the_stop``. The stop's own seconds are appended to ``stops`` if given."""
    total = feeder.total
    manager = SharedStreamManager(max_subscriber_queue=1024, ack_timeout=300.0)
    seen = [0] * watchers
    all_seen = asyncio.Event()

    async def watch(i: int) -> None:
        watcher = trigger()
        key = watcher.shared_stream_key()
        events: AsyncIterator[Any] = manager.events(trigger_id=f"w{i}", trigger=watcher, key=key)
        async for _event in events:
            seq = manager.bind_pending_event(trigger_id=f"w{i}", key=key)
            if seq is not None:
                manager.confirm_persisted([seq])
            seen[i] += 1
            if i == 0:
                feeder.consumed = seen[0]
            if min(seen) >= total:
                all_seen.set()

    async def consume() -> float | None:
        async with asyncio.TaskGroup() as tg:
            for i in range(watchers):
                tg.create_task(watch(i))
            await all_seen.wait()
            while not landed():
                await asyncio.sleep(poll)
            done = time.perf_counter()
            await manager.stop_all()
            if stops is not None:
                stops.append(time.perf_counter() - done)
        return None if time_the_stop else done

    return await timed(feeder, consume)


def arguments(
    doc: str, *, messages: int, backlog: tuple[int, str], watchers: tuple[int, str]
) -> argparse.ArgumentParser:
    """``--messages``, ``--backlog`` and ``--watchers`` with these defaults (and helps);
    the first line of ``doc`` describes the command."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--messages", type=int, default=messages, help="messages per consumer")
    parser.add_argument("--backlog", type=int, default=backlog[0], help=backlog[1])
    parser.add_argument("--watchers", type=int, default=watchers[0], help=watchers[1])
    return parser


def add_repeat(parser: argparse.ArgumentParser, default: int) -> None:
    """``--repeat``: how many rounds :func:`best_of` runs."""
    parser.add_argument(
        "--repeat", type=int, default=default, help="runs per consumer; the best counts"
    )


@contextlib.contextmanager
def started(emulator: Emulator, broker: str) -> Iterator[dict[str, Any]]:
    """Start ``emulator`` and say where it is; its client settings; stopped after."""
    emulator.start()
    try:
        settings = emulator.client_settings()
        print(f"{broker} emulator: {emulator.backend} at {emulator.endpoint}")
        yield settings
    finally:
        with contextlib.suppress(Exception):
            emulator.stop()


async def best_of(
    repeat: int,
    one_round: Callable[[], Awaitable[list[Result]]],
    about: str = "",
    *,
    show_runs: bool = False,
) -> list[Result]:
    """Each consumer's best of ``repeat`` rounds (interleaved, so a busy moment hurts all
    alike), said with ``about`` added; every round's figures printed first if
    ``show_runs``."""
    runs = [await one_round() for _ in range(repeat)]
    if show_runs:
        for i, run in enumerate(runs, 1):
            for r in run:
                note = f" ({r.note})" if r.note else ""
                print(f"  run {i}: {r.name:<30} {r.rate:>9.1f} msgs/s  {r.cpu_per_1000()}{note}")
    print(f"best of {repeat} runs per consumer{about}")
    return [max(column, key=lambda r: r.rate) for column in zip(*runs, strict=True)]


def print_table(results: list[Result]) -> None:
    """One line per consumer, its rate also as a ratio to the first (the bare loop)."""
    base = results[0]
    cpu = "  CPU s per 1000 msgs" if any(r.cpu for r in results) else ""
    print(f"{'consumer':<30} {'msgs':>6} {'msgs/s':>9} {'x base':>7} {'calls/msg':>10}{cpu}")
    for r in results:
        print(
            f"{r.name:<30} {r.messages:>6} {r.rate:>9.1f} {r.rate / base.rate:>7.2f} "
            f"{r.calls_per_message:>10.3f}  {r.cpu_per_1000()}".rstrip()
        )


def print_verdict(broker: str, acklane: list[Result]) -> None:
    """PASS or MISS: acklane's worst calls per message against the target."""
    worst = max(r.calls_per_message for r in acklane)
    verdict = "PASS" if worst <= TARGET_CALLS_PER_MESSAGE else "MISS"
    print(
        f"{verdict} acklane {broker} calls/message = {worst:.3f} at worst "
        f"(target <= {TARGET_CALLS_PER_MESSAGE})"
    )


def add_rtt(parser: argparse.ArgumentParser, default: tuple[float, ...] = (0.0, 5.0)) -> None:
    """``--rtt-ms``: the round trips the consumers run at, through the latency proxy."""
    parser.add_argument(
        "--rtt-ms",
        type=float,
        nargs="+",
        default=list(default),
        help="round trips added between the consumers and the emulator, in ms (one run each)",
    )


@contextlib.contextmanager
def latency(host: str, port: int, rtt_ms: float, listen_port: int = 0) -> Iterator[ProxyProcess]:
    """acklane's latency proxy before ``host:port``, ``rtt_ms`` of round trip, in a process
    of its own (its work is not the measured process's), on ``listen_port`` if given."""
    with ProxyProcess(host, port, rtt=rtt_ms / 1000, listen_port=listen_port) as proxy:
        yield proxy


def print_rtt_verdict(broker: str, rtt_ms: float, bare: Result, engine: Result) -> None:
    """PASS or MISS: the engine with one watcher against the bare loop, both proxied."""
    ratio = engine.rate / bare.rate
    verdict = "PASS" if ratio >= TARGET_VERSUS_BARE else "MISS"
    print(
        f"{verdict} {broker} at {rtt_ms:g} ms round trip: {engine.name} / {bare.name} = "
        f"{ratio:.2f} (target >= {TARGET_VERSUS_BARE})"
    )
