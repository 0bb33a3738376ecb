"""Where a command writes for a person: stdout's and stderr's consoles, and an error.

Rich is imported when a console is first written to, not when a command is: start-up
is part of every command (``acklane --version`` imports the command line and little
else).
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

from ..redact import redact

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["console", "error"]


@cache
def console(stderr: bool = False) -> Console:
    """The console of stdout (or of stderr: soft-wrapped), made when first written to."""
    from rich.console import Console

    return Console(stderr=True, soft_wrap=True) if stderr else Console()


def error(message: str, *, title: str | None = None) -> None:
    """An error for a person, on stderr, secrets masked, never wrapped."""
    from rich.text import Text

    text = Text()
    if title:
        text.append(redact(title), style="red")
        text.append("\n" if "\n" in message else ": ")
    text.append(redact(message), style=None if title else "red")
    console(stderr=True).print(text)
