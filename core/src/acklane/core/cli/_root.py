"""The ``acklane`` Typer application: the global options and every command.

Global options (before the command): ``--version``, ``--log-level`` (or
``ACKLANE_LOG_LEVEL``), ``--log-format`` (``ACKLANE_LOG_FORMAT``) and
``--log-third-party`` (``ACKLANE_LOG_THIRD_PARTY``); see acklane.core.observe.logs. Every
output goes through acklane.core.observe.redact. ``validate``, ``config show`` and
``run`` are defined here (their modules import nothing slow); the other commands
are built when asked for (:mod:`._commands`).
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from ..observe.logs import LogFormat, LogLevel, restore_logging
from ..observe.redact import guard_std_streams
from ._commands import LazyGroup
from ._logging import LogOptions, setup_logging
from .run import run
from .show import config_app
from .validate import validate

__all__ = ["app"]

app = typer.Typer(
    name="acklane",
    help="Consume message queues for event-driven pipelines without losing a message.",
    no_args_is_help=True,
    add_completion=True,
    # a traceback's local variables may hold a configuration's secrets
    pretty_exceptions_show_locals=False,
    cls=LazyGroup,
)


def _version_text() -> str:
    from importlib.metadata import PackageNotFoundError, distributions, version

    def of(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    core = of("acklane-core") or "unknown"
    others = []
    for d in distributions():
        # the name its dist-info directory gives, where it does: no metadata file read
        # for each of the environment's distributions (a hundred take 80 ms)
        quick = getattr(d, "_normalized_name", None)
        if isinstance(quick, str) and not quick.startswith("acklane"):
            continue
        name = d.metadata["Name"] or ""
        if name.startswith("acklane-") and name != "acklane-core":
            others.append(f"{name} {d.version}")
    others.sort()
    parts = [f"acklane-core {core}", *others, f"Python {sys.version.split()[0]}"]
    return f"acklane {of('acklane') or core} ({', '.join(parts)})"


def _show_version(value: bool) -> None:
    if value:
        typer.echo(_version_text())
        raise typer.Exit()


@app.callback()
def _main(
    ctx: typer.Context,
    log_level: Annotated[
        LogLevel | None,
        typer.Option(
            "--log-level",
            envvar="ACKLANE_LOG_LEVEL",
            case_sensitive=False,
            help="Level of acklane's logs, for every command. "
            "Default: INFO for run, WARNING otherwise.",
            show_default=False,
        ),
    ] = None,
    log_format: Annotated[
        LogFormat | None,
        typer.Option(
            "--log-format",
            envvar="ACKLANE_LOG_FORMAT",
            case_sensitive=False,
            help="rich (columns for a terminal), text (one line per record) or json "
            "(one object per line). Default: rich on a terminal, text otherwise.",
            show_default=False,
        ),
    ] = None,
    log_third_party: Annotated[
        LogLevel,
        typer.Option(
            "--log-third-party",
            envvar="ACKLANE_LOG_THIRD_PARTY",
            case_sensitive=False,
            help="Level of other libraries' logs (aiosqlite, botocore, urllib3, asyncio, "
            "sqlalchemy...).",
        ),
    ] = LogLevel.WARNING,
    show_version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_show_version,
            is_eager=True,
            help="Print acklane's version (and its installed distributions) and exit.",
        ),
    ] = False,
) -> None:
    """Consume message queues for event-driven pipelines without losing a message."""
    LogOptions.level = log_level
    LogOptions.log_format = log_format
    LogOptions.third_party = log_third_party
    # Secrets known to the process are masked in everything written to stdout/stderr.
    ctx.with_resource(guard_std_streams())
    ctx.call_on_close(restore_logging)
    setup_logging(None, LogLevel.WARNING)


app.command()(validate)
app.add_typer(config_app, name="config")
app.command()(run)
