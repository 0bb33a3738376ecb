"""Helpers for tests of a whole pipeline: its YAML file, ``acklane run`` as a user starts
it, ``validate`` as a script reads it, and a runner run until something has happened.

A public helper module of ``acklane-integration``, next to its pytest fixtures: acklane's
own connector tests use it, and so can the tests of a user's pipeline. Nothing here
starts a broker; the fixtures of :mod:`acklane.integration.pytest_plugin` do.

- :func:`write_pipeline` writes ``pipeline.yaml`` with one stream, ``orders``, over an
  SQLite event store in the test's directory.
- :func:`poison_pipeline` writes the docs' poison example beside it: a ``big_orders``
  filter (:data:`BIG_ORDERS_FILTER`) that raises on an order without an ``amount``,
  such as the second of :data:`ORDERS`.
- :class:`AcklaneRun` is ``acklane run CONFIG`` in a subprocess, its log lines read as
  they come (text format), so a test can wait for one, stop the run with SIGINT, and
  count what was told.
- :func:`validate_json` and :func:`stream_check` run ``acklane validate --format json``
  in this process and pick out a stream's check.
- :func:`run_until` runs a :class:`~acklane.core.pipeline.runner.Runner` in this process until
  a condition holds, then stops it; :func:`fired_ids` reads the ids the watchers fired.
- :func:`eventually` waits until a condition holds, or fails the test naming it (from
  :mod:`acklane.core.testing`, which the engine's own tests use too).
- :func:`run_engine` is the engine without a runner: a
  :class:`~acklane.core.manager.SharedStreamManager` whose watchers an
  :class:`EngineDriver` subscribes, playing the event store (every trigger event
  confirmed persisted at once, unless the test holds some back).
- :class:`StreamDriver` is a producer without the engine: its stream pulled and its
  messages advanced by the test, with the outcomes the engine hands back
  (:data:`CLEAN`, :data:`FAILED`, :data:`UNCLAIMED`, :func:`rejected`, from
  :mod:`acklane.core.testing`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Self

from acklane.core.config import AcklaneConfig, load_config
from acklane.core.events import EventStore
from acklane.core.manager import SharedStreamManager
from acklane.core.pipeline.runner import Runner
from acklane.core.producer import AdvanceItem, AdvanceOutcome, SharedStreamProducer
from acklane.core.testing import CLEAN, FAILED, UNCLAIMED, eventually, rejected
from acklane.core.trigger import BaseEventTrigger

__all__ = [
    "BIG_ORDERS_FILTER",
    "CLEAN",
    "FAILED",
    "ORDERS",
    "UNCLAIMED",
    "AcklaneRun",
    "EngineDriver",
    "StreamDriver",
    "eventually",
    "fired_ids",
    "poison_pipeline",
    "rejected",
    "run_engine",
    "run_until",
    "stream_check",
    "validate_json",
    "write_pipeline",
]

#: Four orders: 1 and 3 are big, 4 is small, and 2 has no ``amount`` (poison for
#: :data:`BIG_ORDERS_FILTER`, which raises ``KeyError: 'amount'`` on it).
ORDERS: Final[tuple[Mapping[str, int], ...]] = (
    {"id": 1, "amount": 150},
    {"id": 2},
    {"id": 3, "amount": 300},
    {"id": 4, "amount": 5},
)

#: The docs' filter module (``function: mypipeline.filters:big_orders``): the id of
#: an order over 100, nothing for the others.
BIG_ORDERS_FILTER: Final = """\
from acklane.core import RawMessage


def big_orders(message: RawMessage):
    order = message.json()
    return {"id": order["id"]} if order["amount"] > 100 else None
"""

#: The settings ``acklane run`` logs with in :class:`AcklaneRun`: one text line per
#: record, wide enough that no line is wrapped.
_RUN_ENV: Final = {"ACKLANE_LOG_FORMAT": "text", "COLUMNS": "200"}


def write_pipeline(
    directory: Path,
    connector: str,
    stream: str,
    *,
    engine: Mapping[str, object] | None = None,
    watchers: Sequence[Mapping[str, object]] | None = None,
) -> Path:
    """Write ``directory/pipeline.yaml``: the stream ``orders`` and its watchers.

    ``stream`` is the YAML of the stream's settings after ``connector:`` (one per
    line, as in the docs; indented as a block, so it may be a dedented triple-quoted
    string); its first line is line 5 of the file, so a test can expect the line
    ``validate`` names. The event store is ``directory/events.db``; ``engine`` (last
    in the file) defaults to ``shutdown_timeout: 5``, ``watchers`` to one watcher,
    ``all``, of every event. Returns the file's path.
    """
    engine = {"shutdown_timeout": 5} if engine is None else engine
    watchers = [{"name": "all", "stream": "orders"}] if watchers is None else watchers
    path = directory / "pipeline.yaml"
    store = {"url": f"sqlite:///{directory / 'events.db'}"}
    path.write_text(
        f"store: {json.dumps(store)}\n"
        f"streams:\n  orders:\n    connector: {connector}\n"
        + textwrap.indent(textwrap.dedent(stream), "    ")
        + "watchers:\n"
        + "".join(f"  - {json.dumps(watcher)}\n" for watcher in watchers)
        + f"engine: {json.dumps(engine)}\n"
    )
    return path


def poison_pipeline(
    directory: Path,
    connector: str,
    stream: str,
    *,
    package: str,
    filters: str = BIG_ORDERS_FILTER,
    backoff: float = 0.05,
) -> AcklaneConfig:
    """The poison example, loaded: the watcher ``big-orders`` of ``orders`` with the filter
    ``{package}.filters:big_orders``, the module ``filters`` written beside the pipeline
    file, as a user would.

    ``package`` should be a name of the test's own: Python imports a package once per
    process. Watchers restart after ``backoff`` seconds (at most ``max(backoff, 0.2)``),
    so a test sees several failed attempts quickly; ``ack_timeout`` is 20 s.
    """
    home = directory / package
    home.mkdir(exist_ok=True)
    (home / "__init__.py").write_text("")
    (home / "filters.py").write_text(filters)
    engine = {
        "ack_timeout": 20,
        "restart_backoff_initial": backoff,
        "restart_backoff_max": max(backoff, 0.2),
        "shutdown_timeout": 5,
    }
    watcher = {
        "name": "big-orders",
        "stream": "orders",
        "filter": {"function": f"{package}.filters:big_orders"},
    }
    return load_config(
        write_pipeline(directory, connector, stream, engine=engine, watchers=[watcher])
    )


async def fired_ids(db: Path) -> list[int]:
    """The ``id`` of every event stored in the SQLite event store ``db``, sorted."""
    async with EventStore(f"sqlite:///{db}") as store:
        return sorted(e.payload["id"] for e in await store.list_events(limit=1000))


async def run_until(
    runner: Runner,
    done: Callable[[], bool | Awaitable[bool]],
    *,
    limit: float = 60.0,
    interval: float = 0.1,
) -> None:
    """Run ``runner`` until ``done()`` (sync or async) holds, then stop it and wait for it.

    ``done`` is asked every ``interval`` seconds; the runner ending first, or ``limit``
    seconds passing, fails the test (the runner's exception, or ``TimeoutError``).
    """
    task = asyncio.create_task(runner.run())
    try:
        async with asyncio.timeout(limit):
            while True:
                result = done()
                if inspect.isawaitable(result):
                    result = await result
                if result:
                    break
                assert not task.done(), task.exception()
                await asyncio.sleep(interval)
    finally:
        runner.request_stop()
        await task


class EngineDriver:
    """Watchers subscribed to a :class:`~acklane.core.manager.SharedStreamManager`, each
    a task of ``tg``, with the test playing the event store: every trigger event a
    watcher yields is bound and confirmed persisted at once, unless :attr:`hold` keeps
    it back (a slow store write: its message stays unresolved).

    Made by :func:`run_engine`. :attr:`seen` holds each trigger id's payloads in order,
    :attr:`errors` the exception its subscription ended with.
    """

    def __init__(self, manager: SharedStreamManager, tg: asyncio.TaskGroup) -> None:
        self.manager = manager
        self.tg = tg
        self.seen: dict[str, list[dict[str, Any]]] = {}
        self.errors: dict[str, BaseException] = {}
        #: ``hold(trigger_id, payload)`` true: the event is bound but not persisted
        #: until :meth:`release_held`.
        self.hold: Callable[[str, Mapping[str, Any]], bool] | None = None
        #: The sequence numbers held back so far.
        self.held: list[int] = []
        #: The watchers' tasks, in the order :meth:`watch` started them.
        self.tasks: list[asyncio.Task[None]] = []

    def watch(self, trigger_id: str, trigger: BaseEventTrigger) -> Hashable:
        """Subscribe ``trigger`` as ``trigger_id`` (again, after its subscription ended:
        :attr:`seen` goes on, its error is forgotten); its shared stream's key."""
        self.seen.setdefault(trigger_id, [])
        self.errors.pop(trigger_id, None)
        self.tasks.append(self.tg.create_task(self._consume(trigger_id, trigger)))
        return trigger.shared_stream_key()

    def release_held(self) -> None:
        """Hold nothing more, and persist what was held."""
        self.hold = None
        self.manager.confirm_persisted(self.held)
        self.held.clear()

    def bodies(self, trigger_id: str) -> list[str]:
        """The ``body`` of each payload ``trigger_id`` yielded."""
        return [p["body"] for p in self.seen[trigger_id]]

    async def _consume(self, trigger_id: str, trigger: BaseEventTrigger) -> None:
        key = trigger.shared_stream_key()
        try:
            async for event in self.manager.events(trigger_id=trigger_id, trigger=trigger, key=key):
                seq = self.manager.bind_pending_event(trigger_id=trigger_id, key=key)
                self.seen[trigger_id].append(event.payload)
                if seq is None:
                    continue
                if self.hold is not None and self.hold(trigger_id, event.payload):
                    self.held.append(seq)
                else:
                    self.manager.confirm_persisted([seq])
        except Exception as exc:
            self.errors[trigger_id] = exc


@contextlib.asynccontextmanager
async def run_engine(
    ack_timeout: float = 30.0, *, cancel_watchers: bool = False
) -> AsyncIterator[EngineDriver]:
    """A :class:`~acklane.core.manager.SharedStreamManager` (``ack_timeout`` seconds, no
    cohort grace period) and the :class:`EngineDriver` of its watchers.

    On the way out every group is stopped, then the watchers' tasks are awaited
    (``cancel_watchers``: cancelled first, for a watcher that never ends by itself).
    """
    manager = SharedStreamManager(
        max_subscriber_queue=1024, ack_timeout=ack_timeout, cohort_grace_period=0.0
    )
    async with asyncio.TaskGroup() as tg:
        running = EngineDriver(manager, tg)
        try:
            yield running
        finally:
            await manager.stop_all()
            if cancel_watchers:
                for task in running.tasks:
                    task.cancel()


class StreamDriver:
    """A producer and its open stream, driven by the test as the engine drives them:
    pairs taken, advanced with an outcome, and settled.

    ``async with StreamDriver(producer) as stream``: on the way out the stream is
    closed, then the producer (the engine's order). A pull is never cut off by a
    timeout: the one in flight is kept for the next :meth:`take`.
    """

    def __init__(self, producer: SharedStreamProducer[Any]) -> None:
        self.producer = producer
        self.stream = producer.open_stream()
        self._next: asyncio.Task[tuple[Any, Any]] | None = None
        self._closed = False

    async def take(self, n: int = 1, within: float = 20.0) -> list[tuple[Any, Any]]:
        """The next ``n`` ``(raw, payload)`` pairs; ``TimeoutError`` when they do not come
        within ``within`` seconds."""
        pairs: list[tuple[Any, Any]] = []
        async with asyncio.timeout(within):
            while len(pairs) < n:
                if self._next is None:
                    self._next = asyncio.ensure_future(anext(self.stream))
                try:
                    pairs.append(await asyncio.shield(self._next))
                finally:
                    if self._next.done():
                        self._next = None
        return pairs

    async def advance(self, *items: tuple[tuple[Any, Any], AdvanceOutcome]) -> None:
        """Advance pairs with their outcomes (one call, as the engine makes it), then wait
        until what the producer buffers reached the broker (its ``flush()``, if any)."""
        await self.producer.advance([AdvanceItem(pair[1], outcome) for pair, outcome in items])
        flush = getattr(self.producer, "flush", None)
        if flush is not None:
            await flush()

    async def close(self) -> None:
        """Close the stream, then the producer, once."""
        if self._closed:
            return
        self._closed = True
        if self._next is not None:
            self._next.cancel()
            with contextlib.suppress(BaseException):
                await self._next
        try:
            await self.stream.aclose()  # type: ignore[attr-defined]
        finally:
            await self.producer.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def validate_json(config: Path, *options: str, call_timeout: float = 5) -> tuple[int, Any]:
    """``acklane validate --format json --timeout CALL_TIMEOUT [OPTIONS] CONFIG``, run in
    this process: its exit code and its JSON document."""
    from typer.testing import CliRunner

    from acklane.core.cli.app import app

    args = ["validate", "--format", "json", "--timeout", str(call_timeout), *options]
    result = CliRunner().invoke(app, [*args, str(config)])
    return result.exit_code, json.loads(result.stdout)


def stream_check(document: Mapping[str, Any], stream: str = "orders") -> dict[str, Any]:
    """The one check of ``stream`` in a ``validate --format json`` document."""
    (check,) = [c for c in document["checks"] if c["target"] == f"stream {stream}"]
    return dict(check)


class AcklaneRun:
    """``acklane run CONFIG`` in a subprocess; its log lines (text format) as they come.

    A thread reads the output (stdout and stderr together), so :meth:`wait_for` can give
    up after a timeout. Used as a context manager, the process is killed on the way out
    if it still runs.
    """

    def __init__(self, config: Path, *options: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "acklane.core.cli", *options, "run", str(config)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **_RUN_ENV},
        )
        #: The lines read so far (by :meth:`wait_for` and :meth:`finish`).
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, text: str, timeout: float = 90) -> str:
        """The first line from now on that holds ``text``; AssertionError if none comes."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._queue.get(timeout=0.5)
            except queue.Empty:
                continue
            if line is None:
                break
            self.lines.append(line)
            if text in line:
                return line
        raise AssertionError(f"{text!r} never came:\n" + "\n".join(self.lines))

    def finish(self, timeout: float = 60) -> int:
        """Wait for the process to end by itself and read the rest: its exit code."""
        code = self.proc.wait(timeout=timeout)
        while (line := self._queue.get(timeout=5)) is not None:
            self.lines.append(line)
        return code

    def stop(self) -> int:
        """SIGINT (Ctrl-C), then :meth:`finish`."""
        self.proc.send_signal(signal.SIGINT)
        return self.finish()

    @property
    def output(self) -> str:
        """The lines read so far, one text."""
        return "\n".join(self.lines)

    @property
    def errors(self) -> list[str]:
        """The lines read so far that were logged at ERROR."""
        return [line for line in self.lines if " ERROR " in line]

    def kill(self) -> None:
        """Kill the process if it still runs, and reap it."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.kill()
