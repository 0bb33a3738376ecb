"""``acklane sinks``: where each sink stands, what it parked, and a second chance for it.

Every command reads the configuration (for the sinks and the watchers that feed
them) and its store; none needs the pipeline to be running, and none delivers
anything itself: ``retry`` and ``events replay`` queue events that the running
pipeline's dispatcher delivers at once (or on its next start).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..durations import format_duration, parse_duration
from ..observe.redact import redact
from ._args import ConfigArg
from ._exit import FAILED, USAGE, fail
from ._load import load
from ._text import cell

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from ..config import AcklaneConfig

__all__ = ["app", "replay"]

app = typer.Typer(
    name="sinks",
    help="See and steer the delivery of trigger events to sinks.",
    no_args_is_help=True,
    add_completion=False,
)

_out = Console(highlight=False)
_err = Console(stderr=True, highlight=False)


class Format(StrEnum):
    table = "table"
    json = "json"


SinkArg = Annotated[str, typer.Argument(help="A sink's name (from the configuration's sinks:).")]
FormatOption = Annotated[Format, typer.Option("--format", help="table (default) or json.")]


def _sinks_of(cfg: AcklaneConfig) -> dict[str, tuple[str, ...]]:
    sinks = {name: cfg.sink_watchers(name) for name in cfg.sinks}
    if not sinks:
        fail(f"{cfg.source} has no sinks: section", USAGE)
    return sinks


def _check_sink(cfg: AcklaneConfig, sink: str) -> None:
    if sink not in cfg.sinks:
        known = ", ".join(cfg.sinks) or "none"
        fail(f"{cfg.source} has no sink named {sink!r} (sinks: {known})", USAGE)


def _run(cfg: AcklaneConfig, main: Callable[[AsyncEngine], Coroutine[Any, Any, None]]) -> None:
    """Run ``main`` on an engine of the configuration's store (its tables made if missing).

    A SQLite file that does not exist is refused, as ``acklane events`` refuses it: a
    command that looks at delivery must not make an empty database and report zeros.
    """
    from .events import store_problem

    problem = store_problem(cfg.store.url)
    if problem is not None:
        fail(problem, FAILED)

    async def go() -> None:
        from ..events import EventStore
        from ..sql import async_engine

        # Opening the store creates the tables a store of an older version lacks.
        async with EventStore(cfg.store.url, pipeline=cfg.pipeline):
            pass
        engine = async_engine(cfg.store.url)
        try:
            await main(engine)
        finally:
            await engine.dispose()

    try:
        asyncio.run(go())
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    except typer.Exit:
        raise
    except Exception as exc:
        fail(f"{type(exc).__name__}: {exc}", FAILED)


def _age(when: datetime | None, now: datetime) -> str:
    return "-" if when is None else format_duration(max(0.0, (now - when).total_seconds()))


@app.command("status")
def status(config: ConfigArg, output: FormatOption = Format.table) -> None:
    """Per sink: delivered, pending, in flight, retrying, parked, the oldest pending
    event's age, and which process delivers it."""
    cfg = load(config)
    sinks = _sinks_of(cfg)

    async def main(engine: AsyncEngine) -> None:
        from ..sinks import sink_status

        rows = await sink_status(engine, sinks, pipeline=cfg.pipeline)
        now = datetime.now(UTC)
        if output is Format.json:
            for s in rows:
                doc = {
                    "sink": s.sink,
                    "kind": cfg.sinks[s.sink].kind,
                    "watchers": list(sinks[s.sink]),
                    "delivered": s.delivered,
                    "pending": s.pending,
                    "in_flight": s.in_flight,
                    "retrying": s.retrying,
                    "parked": s.parked,
                    "lag": s.lag,
                    "oldest_pending_at": None
                    if s.oldest_pending_at is None
                    else s.oldest_pending_at.isoformat(),
                    "owner": s.owner if _held(s.lease_until, now) else None,
                }
                print(json.dumps(doc), flush=True)
            return
        table = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
        for column in ("sink", "kind", "delivered", "pending", "in flight", "retrying"):
            table.add_column(column, justify="left" if column in ("sink", "kind") else "right")
        table.add_column("parked", justify="right")
        table.add_column("oldest pending", justify="right")
        table.add_column("delivering")
        for s in rows:
            table.add_row(
                Text(s.sink),
                Text(cfg.sinks[s.sink].kind),
                str(s.delivered),
                str(s.pending),
                str(s.in_flight),
                str(s.retrying),
                Text(str(s.parked), style="yellow" if s.parked else ""),
                _age(s.oldest_pending_at, now),
                cell(s.owner if s.owner and _held(s.lease_until, now) else "-"),
            )
        _out.print(table)

    _run(cfg, main)


def _held(until: datetime | None, now: datetime) -> bool:
    return until is not None and until > now


@app.command("parked")
def parked(
    config: ConfigArg,
    sink: SinkArg,
    limit: Annotated[int, typer.Option("--limit", min=1, help="At most this many.")] = 100,
    output: FormatOption = Format.table,
) -> None:
    """The events parked for SINK, oldest first, with the reason of each."""
    cfg = load(config)
    _check_sink(cfg, sink)

    async def main(engine: AsyncEngine) -> None:
        from ..sinks import parked_events

        rows = await parked_events(engine, sink, limit=limit, pipeline=cfg.pipeline)
        if output is Format.json:
            for p in rows:
                d = p.delivery
                doc = {
                    "event_id": d.event_id,
                    "store_id": d.store_id,
                    "watcher": d.watcher,
                    "message_id": d.message_id,
                    "attempts": p.attempts,
                    "parked_at": p.parked_at.isoformat(),
                    "reason": p.reason,
                }
                print(json.dumps(doc), flush=True)
            return
        if not rows:
            _err.print(f"no event is parked for sink {sink}")
            return
        table = Table(header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
        table.add_column("event id", no_wrap=True)
        table.add_column("store id", justify="right")
        table.add_column("watcher")
        table.add_column("attempts", justify="right")
        table.add_column("parked (UTC)", no_wrap=True)
        table.add_column("reason", overflow="fold")
        for p in rows:
            table.add_row(
                cell(p.delivery.event_id),
                str(p.delivery.store_id),
                cell(p.delivery.watcher),
                str(p.attempts),
                p.parked_at.strftime("%Y-%m-%d %H:%M:%S"),
                cell(redact(p.reason or "")),  # a service's answer, quoted: anyone's text
            )
        _out.print(table)

    _run(cfg, main)


@app.command("retry")
def retry(
    config: ConfigArg,
    sink: SinkArg,
    event: Annotated[
        list[str] | None,
        typer.Option("--event", help="An event id (from `sinks parked`); repeat for more."),
    ] = None,
    every: Annotated[bool, typer.Option("--all", help="Every event parked for SINK.")] = False,
) -> None:
    """Give parked events another round of attempts (delivered by the running pipeline)."""
    cfg = load(config)
    _check_sink(cfg, sink)
    if bool(event) == every:
        fail("give --event ID (one or more) or --all", USAGE)

    async def main(engine: AsyncEngine) -> None:
        from ..sinks import retry_parked

        n = await retry_parked(
            engine, sink, event_ids=None if every else event, pipeline=cfg.pipeline
        )
        if event and n < len(set(event)):
            _err.print(f"{len(set(event)) - n} of the given event(s) are not parked for {sink}")
        print(f"{n} event(s) queued for another delivery to {sink}", flush=True)

    _run(cfg, main)


def _since(value: str | None) -> datetime | None:
    """``--since``: an ISO time (UTC if it has no zone) or a duration ago (``2h``, ``7d``)."""
    if value is None:
        return None
    try:
        return datetime.now(UTC) - timedelta(seconds=parse_duration(value))
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        fail(
            f"--since {value!r}: expected an ISO time (2026-12-01T08:00) or a duration (2h)", USAGE
        )
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when


def replay(
    config: ConfigArg,
    watcher: Annotated[str, typer.Option("--watcher", help="Whose stored events to replay.")],
    sink: Annotated[str, typer.Option("--sink", help="The sink to deliver them to again.")],
    since: Annotated[
        str | None,
        typer.Option("--since", help="Only events stored since: an ISO time, or a duration ago."),
    ] = None,
) -> None:
    """Deliver stored events of WATCHER to SINK again, with their original event ids (a
    receiver that dedupes on them sees no repeat)."""
    cfg = load(config)
    _check_sink(cfg, sink)
    if watcher not in cfg.sink_watchers(sink):
        fail(f"watcher {watcher!r} does not deliver to sink {sink!r} (see its sinks:)", USAGE)
    start = _since(since)

    async def main(engine: AsyncEngine) -> None:
        from ..sinks import replay_events

        n = await replay_events(engine, sink, watcher, since=start, pipeline=cfg.pipeline)
        print(f"{n} event(s) of {watcher} queued for delivery to {sink} again", flush=True)

    _run(cfg, main)


@app.command("run")
def run_sinks(
    config: ConfigArg,
    poll_interval: Annotated[
        float,
        typer.Option(
            "--poll-interval",
            min=0.01,
            help="Seconds between looks for new events on SQLite (PostgreSQL wakes it at "
            "once through NOTIFY).",
        ),
    ] = 0.05,
) -> None:
    """Deliver the stored events to the sinks, apart from consumption (with `acklane run
    --no-sinks`), until SIGINT/SIGTERM. Several may run: the sinks' leases share them."""
    import logging
    import signal

    from ..sinks import Dispatcher, build_sinks

    cfg = load(config)
    sinks = build_sinks(cfg)
    if not sinks:
        fail(f"{cfg.source}: no watcher names a sink: nothing to deliver", USAGE)
    log = logging.getLogger("acklane.core.cli.sinks")

    async def main() -> None:
        from ..observe import tracing

        # delivery spans (their parents are the messages' spans only in the process
        # that stored the events: here each delivery starts a trace of its own)
        tracer = tracing.start_tracing(cfg.tracing)
        for sink, _ in sinks:
            sink.spans_from = tracer
        try:
            await deliver()
        finally:
            if tracer is not None:
                await asyncio.to_thread(tracer.shutdown)

    async def deliver() -> None:
        from ..events import EventStore
        from ..sql import async_engine, is_sqlite

        async with EventStore(cfg.store.url):  # tables of an older store, made
            pass
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        dispatcher = Dispatcher(
            cfg.store.url,
            sinks,
            shutdown_timeout=cfg.engine.shutdown_timeout,
            notify_channel="acklane_events",
            pipeline=cfg.pipeline,
            streams={w.name: w.stream for w in cfg.watchers},
        )
        async with dispatcher:
            log.info("Delivering to %s", ", ".join(sink.name for sink, _ in sinks))
            if not is_sqlite(cfg.store.url):
                await stop.wait()
                return
            # SQLite has no NOTIFY: a new highest event id is the signal
            engine = async_engine(cfg.store.url)
            try:
                seen = -1
                while not stop.is_set():
                    async with engine.connect() as conn:
                        top = (
                            await conn.exec_driver_sql("SELECT max(id) FROM acklane_trigger_events")
                        ).scalar()
                    if top != seen:
                        seen = top if isinstance(top, int) else 0
                        dispatcher.wake()
                    try:
                        async with asyncio.timeout(poll_interval):
                            await stop.wait()
                    except TimeoutError:
                        pass
            finally:
                await engine.dispose()
        log.info("Stopped delivering")

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
