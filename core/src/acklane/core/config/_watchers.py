"""``watchers:``: each entry validated, its stream and name cross-checked, its
filter compiled (a relative ``schema:`` file read from the configuration's folder).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import ValidationError

from ..pipeline.filters import FilterSpec, FilterSpecError, compile_filter
from ._errors import Loc
from ._messages import _got
from ._models import WatcherSettings
from ._report import _report
from ._result import StreamConfig, WatcherConfig
from ._sections import _folder
from ._yaml import _Reader


class _WatcherEntry(NamedTuple):
    position: int
    raw: dict[str, Any]
    settings: WatcherSettings | None  # None when the entry has problems


def _watcher_entries(reader: _Reader, data: Mapping[str, Any]) -> list[_WatcherEntry]:
    if "watchers" not in data:
        reader.problem(("watchers",), "required field is missing")
        return []
    raw = data["watchers"]
    if not isinstance(raw, list):
        reader.problem(("watchers",), f"expected a list of watchers, got {_got(raw)}")
        return []
    if not raw:
        reader.problem(("watchers",), "expected at least one watcher")
    entries: list[_WatcherEntry] = []
    for index, item in enumerate(raw):
        if not isinstance(item, dict):
            reader.problem(
                ("watchers", index),
                f"expected a mapping (name, stream, asset, filter), got {_got(item)}",
            )
            continue
        try:
            settings: WatcherSettings | None = WatcherSettings.model_validate(item)
        except ValidationError as exc:
            _report(reader, exc, WatcherSettings, ("watchers", index))
            settings = None
        entries.append(_WatcherEntry(index, item, settings))
    return entries


def _watchers(
    reader: _Reader,
    entries: Sequence[_WatcherEntry],
    streams: Mapping[str, StreamConfig],
    *,
    known_streams: Sequence[str],
) -> list[WatcherConfig]:
    """Cross-check and compile each watcher; each field is checked even if another failed."""
    watchers: list[WatcherConfig] = []
    seen: dict[str, int | None] = {}
    for index, raw, settings in entries:
        loc: Loc = ("watchers", index)
        ok = settings is not None
        name, stream = raw.get("name"), raw.get("stream")
        if isinstance(name, str):
            if name in seen:
                reader.problem(
                    (*loc, "name"),
                    f"duplicate watcher name {name!r} (first at line {seen[name]}); "
                    "watcher names are trigger ids and must be unique",
                )
                ok = False
            else:
                seen[name] = reader.line_of((*loc, "name"))
        if isinstance(stream, str) and stream and stream not in known_streams:
            hint = difflib.get_close_matches(stream, known_streams, n=1)
            also = f"did you mean {hint[0]!r}? " if hint else ""
            reader.problem(
                (*loc, "stream"),
                f"unknown stream {stream!r}; {also}known streams: "
                f"{', '.join(known_streams) or 'none'}",
            )
            ok = False
        spec = _filter_spec(reader, raw.get("filter"), (*loc, "filter"))
        if spec is None:
            continue
        spec = _schema_file_resolved(spec, reader.source)
        try:
            compiled = compile_filter(
                spec, label=f"watcher {name}", base_dir=_folder(reader.source)
            )
        except FilterSpecError as exc:
            for sub, message in exc.problems:
                reader.problem((*loc, "filter", *sub), message)
            continue
        if ok and settings is not None and settings.stream in streams:
            watchers.append(
                WatcherConfig(
                    name=settings.name,
                    stream=settings.stream,
                    asset=settings.asset,
                    filter=None
                    if settings.filter is None
                    else spec.model_dump(exclude_none=True, by_alias=True),
                    compiled_filter=compiled,
                    line=reader.line_of(loc),
                    sinks=tuple(dict.fromkeys(settings.sinks)),
                )
            )
    return watchers


def _filter_spec(reader: _Reader, raw: Any, loc: Loc) -> FilterSpec | None:
    """The filter block validated, or None after reporting its problems."""
    if raw is None:
        return FilterSpec()
    if not isinstance(raw, dict):
        return None  # reported by WatcherSettings
    try:
        return FilterSpec.model_validate(raw)
    except ValidationError as exc:
        _report(reader, exc, FilterSpec, loc)
        return None


def _schema_file_resolved(spec: FilterSpec, source: str) -> FilterSpec:
    """The spec with a relative ``schema:`` file made absolute (from the configuration's
    directory), so the watcher's kwargs find it from any working directory."""
    schema, folder = spec.json_schema, _folder(source)
    if not isinstance(schema, str) or not schema.strip() or folder is None:
        return spec
    path = Path(schema).expanduser()
    if path.is_absolute():
        return spec
    return spec.model_copy(update={"json_schema": str(folder / path)})
