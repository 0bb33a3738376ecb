"""``acklane events``: look at the trigger events the event store persisted.

``list`` shows stored events; ``tail`` follows new ones as they are committed;
``prune`` deletes the old ones (retention). All read the store named by ``--url`` or
by the ``store.url`` of CONFIG (only the ``store`` section, ``pipeline:`` and the
watchers' streams of that file are read: a broker's unset variables do not matter).
They see one pipeline's events: the configuration's, or ``--pipeline`` with ``--url``.
They never create a database. Messages mask secrets (acklane.core.observe.redact).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from ..durations import format_duration, parse_duration
from ..events import (
    DEFAULT_PRUNE_BATCH,
    DEFAULT_RETENTION,
    TABLE_NAME,
    EventReader,
    StoredEvent,
    count_older_than,
    cutoff_for,
    prune_older_than,
)
from ..names import DEFAULT_PIPELINE, check_pipeline_name
from ..observe.redact import redact, redact_url
from ..sql import DEFAULT_URL, async_engine
from ._args import OldConfigOption, OptionalConfigArg, config_given
from ._exit import FAILED, fail
from ._load import load_store
from ._text import shown

__all__ = ["app", "store_problem"]

app = typer.Typer(
    name="events",
    help="Inspect the trigger events persisted by the event store.",
    no_args_is_help=True,
    add_completion=False,
)

_out = Console(highlight=False)
_err = Console(stderr=True, highlight=False)

UrlOption = Annotated[
    str | None,
    typer.Option(
        "--url",
        help=f"Database URL of the event store (sqlite:///PATH or postgresql://...). "
        f"Default: {DEFAULT_URL}",
        show_default=False,
    ),
]
PipelineOption = Annotated[
    str | None,
    typer.Option(
        "--pipeline",
        help=f"With --url: the pipeline whose events to read (default {DEFAULT_PIPELINE!r}); "
        "CONFIG names its pipeline: field.",
        show_default=False,
    ),
]
TriggerOption = Annotated[
    str | None, typer.Option("--trigger", "-t", help="Only the events of this trigger id.")
]
JsonOption = Annotated[
    bool, typer.Option("--json", help="One JSON object per line instead of a table.")
]


class _CliError(Exception):
    """A problem the user can fix; printed without a traceback."""


def display_url(url: str) -> str:
    """The URL without its password (nor secret-named query parameters)."""
    return redact(redact_url(url))


@dataclass(frozen=True, slots=True)
class _Target:
    """What a command reads: the store, its settings (with CONFIG), whose events."""

    url: str
    settings: Any
    pipeline: str
    #: watcher -> stream name (with CONFIG), to show stream names
    streams: Mapping[str, str]


def resolve_url(url: str | None, config: Path | None) -> str:
    """The store URL from ``--url``, or from the configuration file, or the default."""
    return _resolve_store(url, config).url


def _resolve_store(url: str | None, config: Path | None, pipeline: str | None = None) -> _Target:
    """The store URL, pipeline and, with CONFIG, the file's ``store`` settings."""
    if url and config:
        raise _CliError("give CONFIG or --url, not both")
    if config is not None and pipeline is not None:
        raise _CliError("give --pipeline with --url; CONFIG names its pipeline: field")
    if config is None:
        try:
            chosen = check_pipeline_name(DEFAULT_PIPELINE if pipeline is None else pipeline)
        except ValueError as exc:
            raise _CliError(f"--pipeline: {exc}") from None
        return _Target(url or DEFAULT_URL, None, chosen, {})
    loaded = load_store(config, code=FAILED)
    return _Target(loaded.store.url, loaded.store, loaded.pipeline, dict(loaded.watcher_streams))


def _check_url(url: str) -> None:
    """Refuse what cannot be an event store before connecting (a read never creates one)."""
    try:
        parsed = make_url(url)
    except Exception as exc:
        raise _CliError(f"invalid URL {display_url(url)!r}: {exc}") from None
    backend = parsed.get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        raise _CliError(f"unsupported URL {display_url(url)}: use sqlite:// or postgresql://")
    database = parsed.database
    in_memory = database in (None, "", ":memory:")
    if backend == "sqlite" and not in_memory and not Path(str(database)).exists():
        raise _CliError(f"no SQLite database at {database} (acklane run creates it)")


def store_problem(url: str) -> str | None:
    """Why ``url`` cannot be an existing event store to read (a SQLite file that does
    not exist, an unsupported URL), or None: the check of every command that reads the
    store and must not create it (``acklane events``, ``acklane sinks status``...)."""
    try:
        _check_url(url)
    except _CliError as exc:
        return str(exc)
    return None


async def _open_reader(
    url: str, pipeline: str = DEFAULT_PIPELINE
) -> tuple[EventReader, AsyncEngine]:
    """A reader of ``pipeline``'s events on an existing store; never creates a table."""
    engine = async_engine(url)
    reader = EventReader(engine, pipeline=pipeline)
    try:
        exists = await reader.table_exists()
    except Exception as exc:
        await engine.dispose()
        raise _CliError(f"cannot read {display_url(url)}: {exc}") from None
    if not exists:
        await engine.dispose()
        raise _CliError(f"{display_url(url)} holds no event store (no table {TABLE_NAME})")
    return reader, engine


def event_to_json(event: StoredEvent, streams: Mapping[str, str] | None = None) -> dict[str, Any]:
    return {
        "id": event.id,
        "created_at": event.created_at.isoformat(),
        "trigger_id": event.trigger_id,
        "stream": _stream_of(event, streams),
        "stream_key": event.stream_key,
        "message_id": event.message_id,
        "position": event.position,
        "payload": event.payload,
    }


def _stream_of(event: StoredEvent, streams: Mapping[str, str] | None) -> str:
    """The stream's name (its watcher's ``stream:`` in the configuration), or the
    stored key when the configuration is not known (``--url``)."""
    return (streams or {}).get(event.trigger_id, event.stream_key)


def _table(
    events: Sequence[StoredEvent], *, header: bool = True, streams: Mapping[str, str] | None = None
) -> Table:
    table = Table(show_header=header, header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for name, options in _COLUMNS.items():
        table.add_column(name, **options)
    for event in events:
        # Text, not str: payloads and keys may hold [brackets] rich would parse.
        table.add_row(*(Text(cell) for cell in _cells(event, streams)))
    return table


def _emit(
    events: Sequence[StoredEvent],
    *,
    as_json: bool,
    header: bool = True,
    streams: Mapping[str, str] | None = None,
) -> None:
    if as_json:
        for event in events:
            print(json.dumps(event_to_json(event, streams), ensure_ascii=False), flush=True)
    elif events and not _out.is_terminal:
        # piped or redirected: one tab-separated line per event, never wrapped or folded
        if header:
            print("\t".join(_COLUMNS), flush=True)
        for event in events:
            print("\t".join(_cells(event, streams)), flush=True)
    elif events:
        _out.print(_table(events, header=header, streams=streams))


#: The columns of an event, with their options in the terminal's table.
_COLUMNS: dict[str, dict[str, Any]] = {
    "id": {"justify": "right", "no_wrap": True},
    "created (UTC)": {"no_wrap": True},
    "trigger": {"max_width": 24, "overflow": "fold"},
    "stream": {"max_width": 24, "overflow": "fold"},
    "message": {"max_width": 28, "overflow": "fold"},
    "pos": {"justify": "right", "no_wrap": True},
    "payload": {"min_width": 16, "overflow": "fold"},
}


def _cells(event: StoredEvent, streams: Mapping[str, str] | None = None) -> list[str]:
    """An event's columns as text on one line: a tab or a newline in one becomes a space,
    any other control character an escape (ids and payloads are anyone's text)."""
    cells = [
        str(event.id),
        event.created_at.strftime("%Y-%m-%d %H:%M:%S"),
        event.trigger_id,
        _stream_of(event, streams),
        event.message_id if event.message_id is not None else "-",
        str(event.position),
        json.dumps(event.payload, ensure_ascii=False),
    ]
    return [shown(c.replace("\t", " ").replace("\n", " ")) for c in cells]


def _run(
    main: Callable[[_Target], Coroutine[Any, Any, None]],
    url: str | None,
    config: Path | None,
    pipeline: str | None,
) -> None:
    try:
        target = _resolve_store(url, config, pipeline)
        _check_url(target.url)
        asyncio.run(main(target))
    except _CliError as exc:
        fail(str(exc), FAILED)
    except KeyboardInterrupt:  # Ctrl-C: stop quietly
        raise typer.Exit(0) from None


@app.command("list")
def list_events(
    config: OptionalConfigArg = None,
    url: UrlOption = None,
    old_config: OldConfigOption = None,
    trigger: TriggerOption = None,
    limit: Annotated[
        int, typer.Option("--limit", "-n", min=1, help="How many events at most.")
    ] = 20,
    after: Annotated[
        int | None,
        typer.Option("--after", help="Events with an id above this one (oldest first)."),
    ] = None,
    as_json: JsonOption = False,
    pipeline: PipelineOption = None,
) -> None:
    """List stored events: the latest ones, or the first ones after --after."""

    async def main(target: _Target) -> None:
        reader, engine = await _open_reader(target.url, target.pipeline)
        try:
            if after is None:
                events = await reader.list_events(
                    trigger_id=trigger, limit=limit, newest_first=True
                )
                events.reverse()
            else:
                events = await reader.list_events(trigger_id=trigger, after_id=after, limit=limit)
            total = await reader.count(trigger_id=trigger)
        finally:
            await engine.dispose()
        _emit(events, as_json=as_json, streams=target.streams)
        if not as_json:
            _err.print(Text(f"{len(events)} of {total} event(s)", style="dim"))

    _run(main, url, config_given(config, old_config), pipeline)


@app.command("tail")
def tail_events(
    config: OptionalConfigArg = None,
    url: UrlOption = None,
    old_config: OldConfigOption = None,
    trigger: TriggerOption = None,
    lines: Annotated[
        int, typer.Option("--lines", "-n", min=0, help="Show the last N events first.")
    ] = 10,
    interval: Annotated[
        float, typer.Option("--interval", min=0.01, help="Seconds between two polls when idle.")
    ] = 0.5,
    as_json: JsonOption = False,
    pipeline: PipelineOption = None,
) -> None:
    """Follow new events as they are committed (Ctrl-C stops)."""

    async def main(target: _Target) -> None:
        reader, engine = await _open_reader(target.url, target.pipeline)
        try:
            last = await reader.last_id(trigger_id=trigger)
            first = []
            if lines:
                first = await reader.list_events(trigger_id=trigger, limit=lines, newest_first=True)
                first.reverse()
            _emit(first, as_json=as_json, streams=target.streams)
            header = not first
            async for events in reader.tail_batches(
                trigger_id=trigger, after_id=last, poll_interval=interval
            ):
                _emit(events, as_json=as_json, header=header, streams=target.streams)
                header = False
        finally:
            await engine.dispose()

    _run(main, url, config_given(config, old_config), pipeline)


@app.command("prune")
def prune_events(
    config: OptionalConfigArg = None,
    url: UrlOption = None,
    old_config: OldConfigOption = None,
    older_than: Annotated[
        str | None,
        typer.Option(
            "--older-than",
            help="Delete events created longer ago than this: seconds, or '12h', '7d', '2w'. "
            "Default: the store.retention of CONFIG, else "
            f"{format_duration(DEFAULT_RETENTION)}.",
            show_default=False,
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Only count what would be deleted.")
    ] = False,
    batch_size: Annotated[
        int, typer.Option("--batch-size", min=1, help="Rows deleted per transaction.")
    ] = DEFAULT_PRUNE_BATCH,
    pipeline: PipelineOption = None,
) -> None:
    """Delete one pipeline's trigger events older than a window (what store.retention
    does while running).

    A redelivered message whose events were pruned is stored again: keep events
    longer than the broker can redeliver (docs/event-store.md, Retention).
    """
    try:
        target = _resolve_store(url, config_given(config, old_config), pipeline)
        window = _prune_window(older_than, target.settings)
        _check_url(target.url)
        asyncio.run(
            _prune(
                target.url,
                window,
                dry_run=dry_run,
                batch_size=batch_size,
                pipeline=target.pipeline,
            )
        )
    except _CliError as exc:
        fail(str(exc), FAILED)
    except KeyboardInterrupt:  # Ctrl-C: what was committed stays deleted
        raise typer.Exit(130) from None


def _prune_window(older_than: str | None, settings: Any) -> float:
    if older_than is not None:
        try:
            seconds = parse_duration(older_than)
        except ValueError as exc:
            raise _CliError(f"--older-than: {exc}") from None
        if seconds <= 0:
            raise _CliError("--older-than must be more than 0 (it would delete every event)")
        return seconds
    if settings is None:
        return DEFAULT_RETENTION
    retention = getattr(settings, "retention", DEFAULT_RETENTION)
    if retention is None:
        raise _CliError(
            "store.retention is null in the configuration (events are kept forever); "
            "give --older-than to prune anyway"
        )
    return float(retention)


async def _prune(url: str, window: float, *, dry_run: bool, batch_size: int, pipeline: str) -> None:
    reader, engine = await _open_reader(url, pipeline)
    del reader
    cutoff = cutoff_for(window)
    when = f"created before {cutoff.strftime('%Y-%m-%d %H:%M:%S')} UTC"
    try:
        total = await count_older_than(engine, cutoff, pipeline=pipeline)
        if dry_run:
            _out.print(
                Text(
                    f"would delete {total} event(s) {when} (older than "
                    f"{format_duration(window)}; dry run, nothing deleted)"
                ),
                soft_wrap=True,
            )
            return
        show = _err.is_terminal and total > batch_size
        with Progress(
            TextColumn("pruning"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=_err,
            transient=True,
            disable=not show,
        ) as bar:
            task = bar.add_task("pruning", total=total)
            deleted = await prune_older_than(
                engine,
                cutoff,
                batch_size=batch_size,
                pipeline=pipeline,
                on_batch=lambda n: bar.advance(task, n),
            )
    except _CliError:
        raise
    except Exception as exc:
        raise _CliError(f"pruning {display_url(url)} failed: {type(exc).__name__}: {exc}") from None
    finally:
        await engine.dispose()
    _out.print(
        Text(f"deleted {deleted} event(s) {when} (older than {format_duration(window)})"),
        soft_wrap=True,
    )
