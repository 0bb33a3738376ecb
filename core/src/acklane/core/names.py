"""The one rule for names in the YAML (pipeline, streams, watchers, sinks): watcher names
are trigger ids, stream and sink names label metrics and database rows, and the pipeline
name scopes every row of the event store's database (docs/configuration.md)."""

from __future__ import annotations

import re
from typing import Final

__all__ = [
    "DEFAULT_PIPELINE",
    "MAX_PIPELINE_LENGTH",
    "NAME_PATTERN",
    "NAME_RULE",
    "check_pipeline_name",
]

NAME_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$"
NAME_RULE: Final = "letters, digits, '_', '.' and '-', starting with a letter or digit"

#: The pipeline of a configuration without ``pipeline:``, and of every row a store
#: written before pipelines existed holds (docs/event-store.md, "Pipelines").
DEFAULT_PIPELINE: Final = "default"
#: Longest pipeline name: it is stored in every row of the event table.
MAX_PIPELINE_LENGTH: Final = 100

_NAME_RE: Final = re.compile(NAME_PATTERN)


def check_pipeline_name(name: object) -> str:
    """``name`` when it follows the name rule (it is then safe as an SQL literal: no
    quote can pass), else :class:`ValueError` saying the rule."""
    if type(name) is not str or not _NAME_RE.fullmatch(name) or len(name) > MAX_PIPELINE_LENGTH:
        raise ValueError(
            f"a pipeline name is {NAME_RULE}, at most {MAX_PIPELINE_LENGTH} characters; "
            f"not {name!r}"
        )
    return name
