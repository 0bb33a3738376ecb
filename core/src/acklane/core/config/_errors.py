"""ConfigProblem and ConfigError: every problem names the file, the line and the field.

:class:`ConfigError` and the :class:`ConfigProblem` it carries are defined with
acklane's other root errors in :mod:`acklane.core.errors` (which imports nothing of
acklane's) and re-exported here, beside the field paths the parser writes them with.
"""

from __future__ import annotations

import json

from ..errors import ConfigError, ConfigProblem

__all__ = ["ConfigError", "ConfigProblem", "Loc", "format_path"]

#: A location in the document: mapping keys and list indexes, from the top.
Loc = tuple[str | int, ...]


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
