"""``acklane validate``: a configuration checked, every problem naming where it is.

Offline, it also checks this machine (the store URL's scheme, the SQLite file's
directory, the PostgreSQL driver, files a stream names); ``--connect`` reaches the
store and each stream's broker, read-only (:mod:`.checks`). Exit 0 when valid, 2 when
not, 3 when valid but a ``--connect`` check failed.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..observe.redact import redact, redact_url
from ._args import ConfigArg
from ._exit import USAGE, error
from ._load import INVALID, read

if TYPE_CHECKING:
    from ..config import AcklaneConfig, ConfigProblem
    from .checks import CheckResult

__all__ = ["OutputFormat", "validate"]

#: A check of ``--connect`` failed (the file itself is valid).
CONNECT_FAILED = 3


class OutputFormat(StrEnum):
    TEXT = "text"
    JSON = "json"


def _problem_document(problem: ConfigProblem) -> dict[str, Any]:
    return {
        "file": problem.source,
        "line": problem.line,
        "field": problem.path,
        "message": problem.message,
    }


def validate(
    config: ConfigArg,
    output: Annotated[
        OutputFormat,
        typer.Option(
            "--format",
            case_sensitive=False,
            help="text: a table, or the problems on stderr; json: one document on stdout "
            "with the problems as {file, line, field, message}.",
        ),
    ] = OutputFormat.TEXT,
    connect: Annotated[
        bool,
        typer.Option(
            "--connect",
            help="Also reach the event store and each stream's broker (read-only: nothing "
            "is received, sent, committed or created), one line per check.",
        ),
    ] = False,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout",
            min=0.1,
            help="With --connect: seconds each call to the store or a broker may take.",
        ),
    ] = 10.0,
) -> None:
    """Check a configuration: every problem names the file, the line and the field.

    Offline, it also checks this machine: the store URL's scheme, the SQLite file's
    directory (exists, writable), the PostgreSQL driver, files a stream names.
    Exit code 0 when valid, 2 when not, 3 when valid but a --connect check failed.
    """
    from ..config import ConfigError

    try:
        # old names of settings: reported below, with the rest, not as Python warnings
        cfg = read(config, offline_checks=True)
    except ConfigError as exc:
        if output is OutputFormat.JSON:
            problems = [_problem_document(p) for p in exc.problems]
            typer.echo(
                redact(json.dumps({"file": str(config), "valid": False, "problems": problems}))
            )
        else:
            error(str(exc), title=INVALID)
        raise typer.Exit(USAGE) from None
    keys = {cfg.streams[w.stream].key for w in cfg.watchers}
    store = redact(redact_url(cfg.store.url))
    checks = _connection_checks(cfg, timeout) if connect else None
    failed = checks is not None and not all(c.ok for c in checks)
    if output is OutputFormat.JSON:
        document: dict[str, Any] = {
            "file": str(config),
            "valid": True,
            "problems": [],
            "store": store,
            "upstream_polls": len(keys),
            "watchers": [
                {
                    "name": w.name,
                    "stream": w.stream,
                    "shared_poll": cfg.streams[w.stream].describe(),
                    "asset": w.asset,
                }
                for w in cfg.watchers
            ],
            "deprecations": [_problem_document(d) for d in cfg.deprecations],
            "warnings": [_problem_document(w) for w in cfg.warnings],
        }
        if checks is not None:
            document["connected"] = not failed
            document["checks"] = [c.document() for c in checks]
        typer.echo(redact(json.dumps(document)))
        if failed:
            raise typer.Exit(CONNECT_FAILED)
        return
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console()
    table = Table(title=f"{config}: valid")
    table.add_column("watcher")
    table.add_column("stream")
    table.add_column("shared poll (connector and key)")
    table.add_column("asset")
    for w in cfg.watchers:
        stream = cfg.streams[w.stream]
        table.add_row(w.name, w.stream, redact(stream.describe()), w.asset or "-")
    console.print(table)
    summary = (
        f"{len(cfg.watchers)} watchers share {len(keys)} upstream poll(s); events stored in {store}"
    )
    console.print(Text(summary), soft_wrap=True)
    for deprecation in cfg.deprecations:  # they work; say so, and their new names
        console.print(Text("old name ", style="yellow") + Text(str(deprecation)), soft_wrap=True)
    for warning in cfg.warnings:  # they work too, and expose what they carry
        console.print(Text("warning ", style="yellow") + Text(str(warning)), soft_wrap=True)
    if checks is not None:
        for check in checks:
            style = {"ok": "green", "failed": "red", "skipped": "yellow"}[check.status]
            line = Text(f"{check.status:<7}", style=style)
            line.append(redact(f" {check.target} ({check.setting}): {check.detail}"))
            console.print(line, soft_wrap=True)
        if failed:
            raise typer.Exit(CONNECT_FAILED)


def _connection_checks(cfg: AcklaneConfig, timeout: float) -> list[CheckResult]:
    """``validate --connect``: the store's and each upstream's check, each bounded."""
    import asyncio

    from .checks import run_checks

    return asyncio.run(run_checks(cfg, call_timeout=timeout))
