"""``acklane dlq list / redrive / purge CONFIG STREAM``: a stream's dead letters.

They read the stream's dead-letter destination with the stream's own settings,
through its connector's :class:`~acklane.core.connectors.dlq.DeadLetterReader`:
``list`` shows what it holds with acklane's origin and reason, ``redrive`` sends
the chosen letters back to the stream's source (copy, confirm, then remove: at
least once), ``purge`` removes them for good (after a confirmation, or ``--yes``).
See docs/dead-letters.md.

Exit codes: 0 done; 1 the broker refused or failed (what was done before is
told); 2 a usage or configuration problem, or a connector without a reader.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable, Coroutine
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..observe.redact import redact
from ._args import ConfigArg
from ._exit import FAILED, USAGE, fail
from ._load import load
from ._text import cell, shown

if TYPE_CHECKING:
    from ..connectors.dlq import DeadLetter, DeadLetterReader, RedriveReport, Selection

__all__ = ["app"]

app = typer.Typer(
    name="dlq",
    help="Read a stream's dead letters, send them back to its source, or purge them.",
    no_args_is_help=True,
)

_out = Console(highlight=False, soft_wrap=True)
_err = Console(stderr=True, highlight=False, soft_wrap=True)

_T = TypeVar("_T")

#: Default of ``--max-redrives``: a letter sent back this many times stays.
MAX_REDRIVES = 3
#: Characters of a body the table shows.
_BODY_PREVIEW = 60


class Format(StrEnum):
    TEXT = "text"
    JSON = "json"


StreamArg = Annotated[str, typer.Argument(help="The name of a stream of the configuration.")]
ReasonOption = Annotated[
    str | None,
    typer.Option(
        "--reason",
        help="Only letters whose reason contains this text (case-insensitive).",
        show_default=False,
    ),
]
WatcherOption = Annotated[
    str | None,
    typer.Option("--watcher", help="Only letters rejected by this watcher.", show_default=False),
]
IdOption = Annotated[
    list[str] | None,
    typer.Option(
        "--id",
        help="Only this letter (its id in the dead-letter destination, or its origin "
        "message id); repeatable.",
        show_default=False,
    ),
]
FormatOption = Annotated[
    Format,
    typer.Option(
        "--format", case_sensitive=False, help="text: a table; json: one document on stdout."
    ),
]
SubscriptionOption = Annotated[
    str | None,
    typer.Option(
        "--subscription",
        help="Pub/Sub: the subscription that reads the dead-letter topic (default: the "
        "topic's only subscription).",
        show_default=False,
    ),
]
HoldOption = Annotated[
    int | None,
    typer.Option(
        "--hold",
        min=1,
        max=43200,
        help="SQS and Pub/Sub: seconds a letter read stays held (visibility timeout, ack "
        "deadline); a killed command's letters come back after it. Default 300.",
        show_default=False,
    ),
]

#: The connectors whose readers take ``hold``.
_HOLDING = ("sqs", "pubsub")


def _selection(reason: str | None, watcher: str | None, ids: list[str] | None) -> Selection:
    from ..connectors.dlq import Selection

    return Selection(reason=reason, watcher=watcher, ids=frozenset(ids or ()))


def _reader(
    config: Path, stream: str, subscription: str | None, hold: int | None = None
) -> DeadLetterReader:
    """The stream's reader, or exit 2 saying why there is none."""
    from ..connectors.dlq import DeadLettersNotSupported
    from ..errors import ConnectorError

    cfg = load(config)
    if stream not in cfg.streams:
        known = ", ".join(sorted(cfg.streams)) or "none"
        fail(f"{config}: no stream named {stream!r} (streams: {known})", USAGE)
    chosen = cfg.streams[stream]
    options: dict[str, Any] = {}
    if subscription is not None:
        if chosen.connector.name != "pubsub":
            fail("--subscription is for a Pub/Sub stream only", USAGE)
        options["subscription"] = subscription
    if hold is not None and chosen.connector.name in _HOLDING:
        options["hold"] = hold
    try:
        return chosen.connector.create_dead_letter_reader(chosen.config, options=options)
    except DeadLettersNotSupported as exc:
        fail(f"stream {stream!r}: {exc}", USAGE)
    except ConnectorError as exc:
        fail(f"stream {stream!r}: {exc}", USAGE)


def _run(reader: DeadLetterReader, stream: str, work: Callable[[], Coroutine[Any, Any, _T]]) -> _T:
    """Run ``work`` with the reader open; a broker failure exits 1."""

    async def main() -> _T:
        async with reader:
            return await work()

    from ..connectors.dlq import DeadLettersNotSupported

    try:
        return asyncio.run(main())
    except typer.Exit:
        raise
    except DeadLettersNotSupported as exc:  # found once connected (a policy, a redrive target)
        fail(f"stream {stream!r}: {exc}", USAGE)
    except Exception as exc:
        fail(
            f"stream {stream!r}, {reader.destination}: {type(exc).__name__}: {exc}",
            FAILED,
        )


def _preview(body: bytes) -> str:
    text = shown(body.decode("utf-8", "replace").replace("\n", " "))
    return text if len(text) <= _BODY_PREVIEW else text[: _BODY_PREVIEW - 3] + "..."


def _table(letters: list[DeadLetter], title: str) -> Table:
    table = Table(title=title)
    for column in ("id", "time", "origin id", "watcher", "reason", "redrives", "body"):
        table.add_column(column, overflow="fold")
    for letter in letters:
        # Text cells, escaped: a broker's ids, a reason and a body are anyone's text
        table.add_row(
            cell(letter.id),
            letter.time.strftime("%Y-%m-%d %H:%M:%S") if letter.time else "-",
            cell(letter.origin_id or "-"),
            cell(", ".join(letter.watchers) or "-"),
            cell(letter.reason or "-"),
            str(letter.redrives),
            cell(_preview(letter.body)),
        )
    return table


def _print_table(table: Table) -> None:
    # redacted as text: a body or a reason may quote a secret
    with _out.capture() as captured:
        _out.print(table)
    typer.echo(redact(captured.get().rstrip("\n")))


def _echo_json(document: dict[str, Any]) -> None:
    typer.echo(redact(json.dumps(document, ensure_ascii=False, default=str)))


class _Progress:
    """A spinner with the counts on stderr while a long command runs (a terminal only)."""

    def __init__(self, verb: str) -> None:
        self.verb = verb
        self._progress: Any = None
        self._task: Any = None

    def __enter__(self) -> Callable[[RedriveReport], None]:
        if _err.is_terminal:
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                TimeElapsedColumn(),
                console=_err,
                transient=True,
            )
            self._progress.__enter__()
            self._task = self._progress.add_task(f"{self.verb} 0")
        return self.update

    def update(self, report: RedriveReport) -> None:
        if self._progress is not None:
            text = f"{self.verb} {len(report.redriven)}, skipped {len(report.skipped)}"
            self._progress.update(self._task, description=f"{text}, kept {report.kept}")

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.__exit__(None, None, None)


@app.command("list")
def list_command(
    config: ConfigArg,
    stream: StreamArg,
    reason: ReasonOption = None,
    watcher: WatcherOption = None,
    ids: IdOption = None,
    limit: Annotated[
        int | None,
        typer.Option("--limit", min=1, help="Show at most this many.", show_default=False),
    ] = None,
    output: FormatOption = Format.TEXT,
    subscription: SubscriptionOption = None,
    hold: HoldOption = None,
) -> None:
    """Show what STREAM's dead-letter destination holds, with watcher and reason.

    Each letter's id, time, origin message id, watchers, reason, redrive count and
    body. Nothing is removed (what reading costs per broker: docs/dead-letters.md).
    """
    from ..connectors.dlq import list_letters

    reader = _reader(config, stream, subscription, hold)
    selection = _selection(reason, watcher, ids)
    letters = _run(reader, stream, lambda: list_letters(reader, selection, limit=limit))
    if output is Format.JSON:
        _echo_json(
            {
                "stream": stream,
                "destination": reader.destination,
                "count": len(letters),
                "letters": [letter.document() for letter in letters],
            }
        )
        return
    _print_table(_table(letters, f"{reader.destination}: {len(letters)} dead letter(s)"))
    if reader.reading_cost:
        _err.print(Text(redact(reader.reading_cost), style="dim"))


@app.command("redrive")
def redrive_command(
    config: ConfigArg,
    stream: StreamArg,
    reason: ReasonOption = None,
    watcher: WatcherOption = None,
    ids: IdOption = None,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Show what would be sent back; send and remove nothing."),
    ] = False,
    max_messages: Annotated[
        int | None,
        typer.Option("--max", min=1, help="Send back at most this many.", show_default=False),
    ] = None,
    max_redrives: Annotated[
        int,
        typer.Option(
            "--max-redrives",
            min=1,
            help="A letter already sent back this many times stays where it is (skipped).",
        ),
    ] = MAX_REDRIVES,
    output: FormatOption = Format.TEXT,
    subscription: SubscriptionOption = None,
    hold: HoldOption = None,
) -> None:
    """Send STREAM's chosen dead letters back to its source, at least once.

    Each is copied (body, key, attributes, one more redrive count), confirmed by the
    broker, then removed from the dead-letter destination: a crash in between repeats
    a copy, loses none. A letter redriven --max-redrives times already stays.
    """
    from ..connectors.dlq import redrive

    reader = _reader(config, stream, subscription, hold)
    selection = _selection(reason, watcher, ids)
    with _Progress("checked" if dry_run else "redriven") as progress:
        report = _run(
            reader,
            stream,
            lambda: redrive(
                reader,
                selection,
                max_messages=max_messages,
                max_redrives=max_redrives,
                dry_run=dry_run,
                on_progress=progress,
            ),
        )
    if output is Format.JSON:
        _echo_json(
            {
                "stream": stream,
                "destination": reader.destination,
                "source": reader.source,
                "dry_run": dry_run,
                **report.document(),
            }
        )
        return
    if dry_run:
        _print_table(_table(report.redriven, f"would redrive {len(report.redriven)} letter(s)"))
    verb = "would redrive" if dry_run else "redrove"
    line = (
        f"{verb} {len(report.redriven)} dead letter(s) from {reader.destination} to "
        f"{reader.source} (stream {stream}); {len(report.skipped)} skipped (redriven "
        f"{max_redrives} times already), {report.kept} not chosen"
    )
    _out.print(Text(redact(line)))
    for letter in report.skipped:
        _out.print(cell(redact(f"skipped {letter.id}: redriven {letter.redrives} times")))


@app.command("purge")
def purge_command(
    config: ConfigArg,
    stream: StreamArg,
    reason: ReasonOption = None,
    watcher: WatcherOption = None,
    ids: IdOption = None,
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="Do not ask for a confirmation.")
    ] = False,
    output: FormatOption = Format.TEXT,
    subscription: SubscriptionOption = None,
    hold: HoldOption = None,
) -> None:
    """Remove STREAM's chosen dead letters for good (asks first, unless --yes)."""
    from ..connectors.dlq import purge

    reader = _reader(config, stream, subscription, hold)
    selection = _selection(reason, watcher, ids)
    chosen = (
        "every dead letter"
        if selection == _selection(None, None, None)
        else "the chosen dead letters"
    )
    if not yes:
        if not sys.stdin.isatty():
            fail(f"purge removes {chosen} for good: confirm with --yes", USAGE)
        if not typer.confirm(redact(f"Remove {chosen} of {reader.destination} for good?")):
            fail("nothing purged", FAILED)
    with _Progress("purged") as progress:
        report = _run(reader, stream, lambda: purge(reader, selection, on_progress=progress))
    if output is Format.JSON:
        _echo_json(
            {
                "stream": stream,
                "destination": reader.destination,
                "purged": len(report.redriven),
                "kept": report.kept,
                "ids": [letter.id for letter in report.redriven],
            }
        )
        return
    line = (
        f"purged {len(report.redriven)} dead letter(s) from {reader.destination} "
        f"(stream {stream}); {report.kept} not chosen"
    )
    _out.print(Text(redact(line)))
