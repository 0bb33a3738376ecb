"""Untrusted text as the command line prints it.

Message bodies, rejection reasons, payloads, headers, message ids and the errors
services answer are written by someone else. Printed as they are, ``[/x]`` is Rich
markup (a closing tag with nothing open makes the command fail), and an escape
sequence is obeyed by the terminal (it can move the cursor, rewrite lines already
printed, set the window title, or hide text). Every table cell and line that shows
such text goes through :func:`shown` (a string) or :func:`cell` (a Rich ``Text``,
never parsed as markup), which write each control character as an escape instead.
"""

from __future__ import annotations

import re
from typing import Final

from rich.text import Text

__all__ = ["cell", "shown"]

#: What a terminal may act on rather than show: the C0 and C1 control characters and
#: DEL, the line and paragraph separators, and the bidirectional controls (which can
#: make a line read otherwise than it is).
_UNSAFE: Final = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)
_NAMED: Final = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(found: re.Match[str]) -> str:
    char = found.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def shown(text: object, *, lines: bool = False) -> str:
    """``text`` with its control characters written as escapes (``\\x1b``, ``\\n``,
    ``\\u202e``); with ``lines``, newlines are kept (a multi-line error or report)."""
    value = str(text)
    if lines:
        return "\n".join(_UNSAFE.sub(_escape, line) for line in value.split("\n"))
    return _UNSAFE.sub(_escape, value)


def cell(text: object, style: str = "", *, lines: bool = False) -> Text:
    """``text`` as a Rich ``Text`` for a table cell or a line: escaped as by
    :func:`shown`, and never read as markup."""
    return Text(shown(text, lines=lines), style=style)
