"""The small top-level sections: a mapping section validated against its model,
``state:``, ``pipeline:``, the watchers' stream names, and paths read from the
configuration's folder.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from .._dbconf import sqlite_url_from
from ..names import DEFAULT_PIPELINE, MAX_PIPELINE_LENGTH, check_pipeline_name
from ..stores.settings import StateStoreSettings
from ._messages import _got
from ._models import _NAME_RULE, StoreSettings, _Settings
from ._report import _report
from ._yaml import _Reader


def _mapping(
    reader: _Reader, data: Mapping[str, Any], name: str, *, required: bool
) -> dict[str, Any] | None:
    """A top-level mapping section (an empty one counts as ``{}``), or None after a problem."""
    if name not in data:
        if required:
            reader.problem((name,), "required field is missing")
        return None if required else {}
    value = data[name]
    if value is None:
        return {}
    if not isinstance(value, dict):
        reader.problem((name,), f"expected a mapping, got {_got(value)}")
        return None
    return value


def _section(
    reader: _Reader, data: Mapping[str, Any], name: str, model: type[_Settings]
) -> _Settings | None:
    raw = _mapping(reader, data, name, required=False)
    if raw is None:
        return None
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        _report(reader, exc, model, (name,))
        return None


def _state(reader: _Reader, raw: dict[str, Any]) -> StateStoreSettings:
    try:
        return StateStoreSettings.model_validate(raw)
    except ValidationError as exc:
        _report(reader, exc, StateStoreSettings, ("state",))
        return StateStoreSettings()


def _pipeline(reader: _Reader, data: Mapping[str, Any]) -> str:
    """``pipeline:``: the name that scopes the configuration's rows in the store."""
    if "pipeline" not in data:
        return DEFAULT_PIPELINE
    name = data["pipeline"]
    try:
        return check_pipeline_name(name)
    except ValueError:
        reader.problem(
            ("pipeline",),
            f"expected a name ({_NAME_RULE}, at most {MAX_PIPELINE_LENGTH} characters), "
            f"got {_got(name)}",
        )
        return DEFAULT_PIPELINE


def _watcher_streams(data: Mapping[str, Any]) -> dict[str, str]:
    """Each watcher's stream name, read as written (nothing checked: the commands that
    only read the store show stream names with it, and fall back to the stored key)."""
    entries = data.get("watchers")
    if not isinstance(entries, list):
        return {}
    return {
        entry["name"]: entry["stream"]
        for entry in entries
        if isinstance(entry, dict)
        and isinstance(entry.get("name"), str)
        and isinstance(entry.get("stream"), str)
    }


def _store_resolved(store: StoreSettings, source: str) -> StoreSettings:
    """``store:`` with a relative SQLite path read from the configuration's directory."""
    folder = _folder(source)
    if folder is None:
        return store
    url = sqlite_url_from(store.url, folder)
    return store if url == store.url else store.model_copy(update={"url": url})


def _folder(source: str) -> Path | None:
    """The directory of the configuration file (None for YAML given as text)."""
    return Path(source).resolve().parent if source and not source.startswith("<") else None
