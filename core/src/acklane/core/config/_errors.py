"""ConfigProblem and ConfigError: every problem names the file, the line and the field."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import NamedTuple

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


class ConfigError(ValueError):
    """The configuration is invalid; ``problems`` lists every problem found, by line."""

    def __init__(self, problems: Sequence[ConfigProblem]) -> None:
        self.problems = sorted(problems, key=lambda p: (p.line is None, p.line or 0))
        if len(self.problems) == 1:
            text = str(self.problems[0])
        else:
            source = self.problems[0].source if self.problems else "configuration"
            text = f"{len(self.problems)} problems in {source}:\n" + "\n".join(
                f"  {p}" for p in self.problems
            )
        super().__init__(text)


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
