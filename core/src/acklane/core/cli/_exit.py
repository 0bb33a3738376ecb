"""How a command gives up: one message on stderr, then the exit code that says why.

Every command ends a failure the same way, so a person and a script see one shape:
a red title (``error`` unless the command names the problem, as ``invalid
configuration``), the message, secrets masked (acklane.core.observe.redact), control
characters escaped (a message may quote a broker's or a database's answer, see
:mod:`._text`), never wrapped (a log collector keeps it one record). The codes are
the ones docs/configuration.md documents for each command: :data:`FAILED` when what
was asked did not happen, :data:`USAGE` when the command line or its files are wrong.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, NoReturn

import typer

from ..observe.redact import redact

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["FAILED", "USAGE", "error", "fail", "stderr"]

#: What was asked did not happen (a broker refused, a key is missing, a case failed).
FAILED: Final = 1
#: The command line, or a file it names, is wrong: nothing was tried.
USAGE: Final = 2


def stderr() -> Console:
    """A console on stderr, soft-wrapped, made when a command first writes to it (rich
    is not imported by a command that never fails)."""
    from rich.console import Console

    return Console(stderr=True, soft_wrap=True, highlight=False)


def error(message: str, *, title: str | None = "error") -> None:
    """``title: message`` on stderr (a multi-line message starts on its own line)."""
    from rich.text import Text

    from ._text import cell

    text = Text()
    if title:
        text.append(redact(title), style="red")
        text.append("\n" if "\n" in message else ": ")
    text.append(cell(redact(message), lines=True))
    stderr().print(text)


def fail(message: str, code: int, *, title: str = "error") -> NoReturn:
    """Tell ``message`` on stderr and exit with ``code``."""
    error(message, title=title)
    raise typer.Exit(code)
