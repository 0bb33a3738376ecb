"""ConfigProblem and ConfigError: every problem names the file, the line and the field.

:class:`ConfigError` is defined with acklane's other root errors in
:mod:`acklane.core.errors` and re-exported here.
"""

from __future__ import annotations

import json
from typing import NamedTuple

from ..errors import ConfigError

__all__ = ["ConfigError", "ConfigProblem", "Loc", "format_path"]

#: A location in the document: mapping keys and list indexes, from the top.
Loc = tuple[str | int, ...]


class ConfigProblem(NamedTuple):
    """One problem in a configuration: where (file, line, field path) and what."""

    source: str
    line: int | None
    path: str
    message: str

    def __str__(self) -> str:
        where = f"{self.source}:{self.line}" if self.line is not None else self.source
        return f"{where}: {self.path}: {self.message}" if self.path else f"{where}: {self.message}"


def format_path(loc: Loc) -> str:
    """``watchers[2].filter.match["body.amount"]``: dotted fields, indexes, quoted odd keys."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not part or any(c in part for c in ". []\"'"):
            out += f"[{json.dumps(part)}]"
        else:
            out += f".{part}" if out else part
    return out
