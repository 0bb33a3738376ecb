"""``acklane events``: look at the trigger events the event store persisted.

``list`` shows stored events; ``tail`` follows new ones as they are committed.
Both read the store named by ``--url`` or by the ``store.url`` of ``--config`` (only
the ``store`` section of that file is read: a broker's unset variables do not
matter). They never create a database. Messages mask secrets (acklane.core.redact).
"""

from __future__ import annotations

import asyncio
import importlib
import json
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from .events import EventReader, StoredEvent
from .events._schema import TABLE_NAME
from .redact import redact, redact_url
from .sql import DEFAULT_URL, async_engine

__all__ = ["app"]

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
ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", help="An acklane YAML configuration; its store.url is used."),
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


def _fail(message: str) -> NoReturn:
    _err.print(Text(redact(f"error: {message}"), style="red"), soft_wrap=True)
    raise typer.Exit(1)


def resolve_url(url: str | None, config: Path | None) -> str:
    """The store URL from ``--url``, or from the configuration file, or the default."""
    if url and config:
        raise _CliError("give --url or --config, not both")
    if config is None:
        return url or DEFAULT_URL
    try:
        module: Any = importlib.import_module("acklane.core.config")
        # only the store section (older versions: the whole file)
        load_config = getattr(module, "load_store_config", None) or module.load_config
    except (ImportError, AttributeError) as exc:
        raise _CliError(
            f"--config needs acklane.core.config.load_config, which is not available "
            f"({exc}); pass --url instead"
        ) from None
    try:
        loaded = load_config(config)
    except Exception as exc:
        message = str(exc)
        raise _CliError(message if str(config) in message else f"{config}: {message}") from None
    try:
        return str(loaded.store.url)
    except AttributeError:
        raise _CliError(f"{config}: the configuration has no store.url") from None


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


async def _open_reader(url: str) -> tuple[EventReader, AsyncEngine]:
    """A reader on an existing store; never creates a table."""
    engine = async_engine(url)
    reader = EventReader(engine)
    try:
        exists = await reader.table_exists()
    except Exception as exc:
        await engine.dispose()
        raise _CliError(f"cannot read {display_url(url)}: {exc}") from None
    if not exists:
        await engine.dispose()
        raise _CliError(f"{display_url(url)} holds no event store (no table {TABLE_NAME})")
    return reader, engine


def event_to_json(event: StoredEvent) -> dict[str, Any]:
    return {
        "id": event.id,
        "created_at": event.created_at.isoformat(),
        "trigger_id": event.trigger_id,
        "stream_key": event.stream_key,
        "message_id": event.message_id,
        "position": event.position,
        "payload": event.payload,
    }


def _table(events: Sequence[StoredEvent], *, header: bool = True) -> Table:
    table = Table(show_header=header, header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("id", justify="right", no_wrap=True)
    table.add_column("created (UTC)", no_wrap=True)
    table.add_column("trigger", max_width=24, overflow="fold")
    table.add_column("stream key", max_width=24, overflow="fold")
    table.add_column("message", max_width=28, overflow="fold")
    table.add_column("pos", justify="right", no_wrap=True)
    table.add_column("payload", min_width=16, overflow="fold")
    for event in events:
        table.add_row(
            str(event.id),
            event.created_at.strftime("%Y-%m-%d %H:%M:%S"),
            # Text, not str: payloads and keys may hold [brackets] rich would parse.
            Text(event.trigger_id),
            Text(event.stream_key),
            Text(event.message_id if event.message_id is not None else "-"),
            str(event.position),
            Text(json.dumps(event.payload, ensure_ascii=False)),
        )
    return table


def _emit(events: Sequence[StoredEvent], *, as_json: bool, header: bool = True) -> None:
    if as_json:
        for event in events:
            print(json.dumps(event_to_json(event), ensure_ascii=False), flush=True)
    elif events:
        _out.print(_table(events, header=header))


def _run(
    main: Callable[[str], Coroutine[Any, Any, None]], url: str | None, config: Path | None
) -> None:
    try:
        store_url = resolve_url(url, config)
        _check_url(store_url)
        asyncio.run(main(store_url))
    except _CliError as exc:
        _fail(str(exc))
    except KeyboardInterrupt:  # Ctrl-C: stop quietly
        raise typer.Exit(0) from None


@app.command("list")
def list_events(
    url: UrlOption = None,
    config: ConfigOption = None,
    trigger: TriggerOption = None,
    limit: Annotated[
        int, typer.Option("--limit", "-n", min=1, help="How many events at most.")
    ] = 20,
    after: Annotated[
        int | None,
        typer.Option("--after", help="Events with an id above this one (oldest first)."),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """List stored events: the latest ones, or the first ones after --after."""

    async def main(store_url: str) -> None:
        reader, engine = await _open_reader(store_url)
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
        _emit(events, as_json=as_json)
        if not as_json:
            _err.print(Text(f"{len(events)} of {total} event(s)", style="dim"))

    _run(main, url, config)


@app.command("tail")
def tail_events(
    url: UrlOption = None,
    config: ConfigOption = None,
    trigger: TriggerOption = None,
    lines: Annotated[
        int, typer.Option("--lines", "-n", min=0, help="Show the last N events first.")
    ] = 10,
    interval: Annotated[
        float, typer.Option("--interval", min=0.01, help="Seconds between two polls when idle.")
    ] = 0.5,
    as_json: JsonOption = False,
) -> None:
    """Follow new events as they are committed (Ctrl-C stops)."""

    async def main(store_url: str) -> None:
        reader, engine = await _open_reader(store_url)
        try:
            last = await reader.last_id(trigger_id=trigger)
            first = []
            if lines:
                first = await reader.list_events(trigger_id=trigger, limit=lines, newest_first=True)
                first.reverse()
            _emit(first, as_json=as_json)
            header = not first
            async for events in reader.tail_batches(
                trigger_id=trigger, after_id=last, poll_interval=interval
            ):
                _emit(events, as_json=as_json, header=header)
                header = False
        finally:
            await engine.dispose()

    _run(main, url, config)
