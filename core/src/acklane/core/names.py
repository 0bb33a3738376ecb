"""The one rule for names in the YAML (streams, watchers, sinks): watcher names are
trigger ids, stream and sink names label metrics and database rows."""

from __future__ import annotations

from typing import Final

__all__ = ["NAME_PATTERN", "NAME_RULE"]

NAME_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$"
NAME_RULE: Final = "letters, digits, '_', '.' and '-', starting with a letter or digit"
