"""The global logging options, and each command's own level on top of them.

``acklane --log-level ... COMMAND`` sets them once (the top-level callback); a
command that logs picks its default level (INFO for run, WARNING otherwise) and its
own ``--log-level`` wins over the global one. See acklane.core.observe.logs.
"""

from __future__ import annotations

from typing import Annotated

import typer

from ..observe.logs import LogFormat, LogLevel, configure_logging

__all__ = ["LogLevelOption", "LogOptions", "setup_logging"]

LogLevelOption = Annotated[
    LogLevel | None,
    typer.Option(
        "--log-level",
        case_sensitive=False,
        help="Level of acklane's logs (overrides the global --log-level).",
        show_default=False,
    ),
]


class LogOptions:
    """The global logging options, for commands that pick their own default level."""

    level: LogLevel | None = None
    log_format: LogFormat | None = None
    third_party: LogLevel = LogLevel.WARNING


def setup_logging(own: LogLevel | None, default: LogLevel) -> None:
    """Configure the logs: the command's --log-level, else the global one, else ``default``."""
    configure_logging(
        own or LogOptions.level or default,
        LogOptions.log_format,
        third_party=LogOptions.third_party,
    )
