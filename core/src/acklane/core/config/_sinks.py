"""``sinks:``: each entry validated against its kind's settings, and each
watcher's ``sinks:`` checked against them (and each kind's own checks).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import ValidationError

from ..sinks import KINDS, Sink, SinkContext, SinkSettings, UnknownSinkKind, sink_class
from ._errors import Loc
from ._messages import _got
from ._report import _report
from ._result import StreamConfig, WatcherConfig
from ._secrets import _secret_fields
from ._watchers import _WatcherEntry
from ._yaml import _Reader


class _SinkEntry(NamedTuple):
    position: int
    settings: SinkSettings
    kind: type[Sink]


def _sinks(reader: _Reader, data: Mapping[str, Any]) -> dict[str, _SinkEntry]:
    """``sinks:``: each entry validated against its kind's settings model."""
    raw = data.get("sinks")
    if raw is None:
        return {}
    if not isinstance(raw, list):
        reader.problem(("sinks",), f"expected a list of sinks, got {_got(raw)}")
        return {}
    sinks: dict[str, _SinkEntry] = {}
    for index, item in enumerate(raw):
        loc: Loc = ("sinks", index)
        if not isinstance(item, dict):
            reader.problem(
                loc, f"expected a mapping (name, kind, and its fields), got {_got(item)}"
            )
            continue
        kind = item.get("kind")
        if isinstance(item.get("name"), str) and not (isinstance(kind, str) and kind in KINDS):
            reader.known_bad_sinks.add(item["name"])
        if not isinstance(kind, str):
            reader.problem(
                (*loc, "kind"),
                "required field is missing"
                if kind is None
                else f"expected a string, got {_got(kind)}",
            )
            continue
        try:
            cls = sink_class(kind)
        except UnknownSinkKind as exc:
            reader.problem((*loc, "kind"), str(exc))
            continue
        except Exception as exc:  # the kind's module failed to import: say so, go on
            reader.problem(
                (*loc, "kind"),
                f"sink kind {kind!r} could not be loaded: {type(exc).__name__}: {exc}",
            )
            continue
        model = cls.settings_model
        reader.secrets.update(
            str(item[field]) for field in _secret_fields(model) if isinstance(item.get(field), str)
        )
        try:
            settings = model.model_validate(item)
        except ValidationError as exc:
            _report(reader, exc, model, loc)
            if isinstance(item.get("name"), str):  # its problems are told: not "unknown" too
                reader.known_bad_sinks.add(item["name"])
            continue
        twin = sinks.get(settings.name)
        if twin is not None:
            reader.problem(
                (*loc, "name"),
                f"duplicate sink name {settings.name!r} (first at line "
                f"{reader.line_of(('sinks', twin.position, 'name'))})",
            )
            continue
        sinks[settings.name] = _SinkEntry(index, settings, cls)
    return sinks


def _sink_references(
    reader: _Reader,
    entries: Sequence[_WatcherEntry],
    sinks: Mapping[str, _SinkEntry],
    streams: Mapping[str, StreamConfig],
    watchers: Sequence[WatcherConfig],
    source: str,
) -> None:
    """Each watcher names known sinks; each sink's own checks against the rest of the file."""
    names = list(sinks)
    for index, _raw, settings in entries:
        if settings is None:
            continue
        for position, name in enumerate(settings.sinks):
            if name not in sinks and name not in reader.known_bad_sinks:
                hint = difflib.get_close_matches(name, names, n=1)
                also = f"did you mean {hint[0]!r}? " if hint else ""
                reader.problem(
                    ("watchers", index, "sinks", position),
                    f"unknown sink {name!r}; {also}known sinks: {', '.join(names) or 'none'}",
                )
    folder = Path(source).parent if source and not source.startswith("<") else None
    for name, entry in sinks.items():
        context = SinkContext(
            streams=streams,
            watcher_assets={w.name: w.asset for w in watchers if name in w.sinks},
            config_dir=folder,
        )
        try:
            found = entry.kind.config_problems(entry.settings, context)
        except Exception as exc:  # a sink kind's bug must not hide the other problems
            found = [("", f"sink {name!r}: checking it failed: {type(exc).__name__}: {exc}")]
        for field, message in found:
            reader.problem(("sinks", entry.position, *(field.split(".") if field else ())), message)
