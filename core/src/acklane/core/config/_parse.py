"""Parsing: read the YAML, validate each section, cross-check, and report all
problems at once.

The sections' own parsers are :mod:`._sections`, :mod:`._streams`, :mod:`._watchers`
and :mod:`._sinks`; what is checked on this machine is :mod:`._checks`.
"""

from __future__ import annotations

import difflib
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .._dbconf import is_sqlite_memory
from .._imports import HELD, add_import_roots, held_imports
from ..observe.redact import secrets_in
from ._checks import _offline_checks, _tracing_problem
from ._errors import ConfigError
from ._insecure import insecure_settings
from ._messages import _got
from ._models import (
    _SECTIONS,
    _TOP_LEVEL,
    EngineSettings,
    MetricsSettings,
    StoreSettings,
    TracingSettings,
)
from ._report import _raise
from ._result import AcklaneConfig, StoreConfig
from ._secrets import _remember_secrets
from ._sections import _mapping, _pipeline, _section, _state, _store_resolved, _watcher_streams
from ._sinks import _sink_references, _sinks
from ._streams import _stream_blocks, _streams
from ._watchers import _watcher_entries, _watchers
from ._yaml import _Reader


def _read(text: str, source: str, env: Mapping[str, str] | None) -> tuple[_Reader, dict[Any, Any]]:
    """The document as a mapping, or a ConfigError."""
    reader = _Reader(text, source, os.environ if env is None else env)
    data = reader.read()
    if reader.problems and data is None:
        _raise(reader)
    if data is None:
        reader.problem(
            (), "the configuration is empty; expected a mapping with streams and watchers"
        )
        _raise(reader)
    if not isinstance(data, dict):
        reader.problem(
            (), f"expected a mapping with streams and watchers at the top, got {_got(data)}"
        )
        _raise(reader, data)
    return reader, data


def parse_store_config(
    text: str, *, source: str = "<string>", env: Mapping[str, str] | None = None
) -> StoreConfig:
    """:func:`load_store_config` of YAML text."""
    reader, data = _read(text, source, env)
    wanted = ("store", "state")
    # Problems of other sections (an unset broker password...) are not ours to report.
    kept = [
        (loc, p)
        for loc, p in zip(reader.problem_locs, reader.problems, strict=True)
        if not loc or loc[0] in wanted
    ]
    reader.problem_locs = [loc for loc, _ in kept]
    reader.problems = [p for _, p in kept]
    part = {k: data[k] for k in wanted if k in data}
    store = _section(reader, data, "store", StoreSettings)
    state = _state(reader, _mapping(reader, data, "state", required=False) or {})
    pipeline = _pipeline(reader, data)
    if reader.problems:
        _raise(reader, part)
    assert isinstance(store, StoreSettings)
    secrets = _remember_secrets(reader, part)
    return StoreConfig(
        source=source,
        store=_store_resolved(store, source),
        state=state,
        secrets=secrets,
        pipeline=pipeline,
        watcher_streams=_watcher_streams(data),
    )


def parse_config(
    text: str,
    *,
    source: str = "<string>",
    env: Mapping[str, str] | None = None,
    offline_checks: bool = False,
    import_roots: Sequence[Path] = (),
) -> AcklaneConfig:
    """Validate a configuration given as YAML text; ``source`` names it in errors.

    The file is checked first with the user's modules held back (function filters and
    sinks, Protobuf classes: trusted code that runs on import): a file with other
    problems imports none of them. Only then are ``import_roots`` added to the import
    path and the file checked again, importing; ``offline_checks``: see
    :func:`_parse_config`.
    """
    with held_imports() as held:
        try:
            config = _parse_config(text, source=source, env=env, offline_checks=offline_checks)
        except ConfigError as exc:
            others = [p for p in exc.problems if HELD not in p.message]
            if others or not held:
                raise ConfigError(others or exc.problems) from None
    if not held:
        return config
    add_import_roots(*import_roots)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # warned on the first pass
        return _parse_config(text, source=source, env=env, offline_checks=offline_checks)


def _parse_config(
    text: str,
    *,
    source: str = "<string>",
    env: Mapping[str, str] | None = None,
    offline_checks: bool = False,
) -> AcklaneConfig:
    """:func:`parse_config`'s one pass.

    ``offline_checks`` also looks at this machine, without the network: the SQLite
    file's directory exists and is writable, the PostgreSQL driver is installed, the
    files a stream's settings name exist (each connector's ``offline_problems``).
    """
    reader, data = _read(text, source, env)
    for key in data:
        if isinstance(key, str) and key.startswith("x-"):
            continue  # extension fields: a place for YAML anchors, ignored
        if key not in _TOP_LEVEL:
            hint = difflib.get_close_matches(str(key), _TOP_LEVEL, n=1)
            also = f"; did you mean {hint[0]!r}?" if hint else ""
            reader.problem(
                (key,), f"unknown field{also} (expected one of: {', '.join(_TOP_LEVEL)})"
            )
    sections = {name: _section(reader, data, name, model) for name, model in _SECTIONS.items()}
    state_raw = _mapping(reader, data, "state", required=False)
    stream_blocks = _stream_blocks(reader, data)
    watcher_entries = _watcher_entries(reader, data)

    streams = _streams(reader, stream_blocks)
    watchers = _watchers(reader, watcher_entries, streams, known_streams=list(stream_blocks))
    sinks = _sinks(reader, data)
    _sink_references(reader, watcher_entries, sinks, streams, watchers, source)
    store_settings = sections["store"]
    if isinstance(store_settings, StoreSettings):
        # before the offline checks, which look at the SQLite file's folder
        store_settings = sections["store"] = _store_resolved(store_settings, source)
    if sinks and isinstance(store_settings, StoreSettings) and is_sqlite_memory(store_settings.url):
        reader.problem(
            ("store", "url"),
            "sinks deliver from the event store, and an in-memory database dies with its "
            "process: use a SQLite file or PostgreSQL",
        )
    state = _state(reader, state_raw or {})
    pipeline = _pipeline(reader, data)
    _tracing_problem(reader, sections["tracing"], env)
    if offline_checks:
        _offline_checks(reader, sections["store"], streams)
    if reader.problems:
        _raise(reader, data)
    engine, store, metrics = sections["engine"], sections["store"], sections["metrics"]
    assert isinstance(engine, EngineSettings)
    assert isinstance(store, StoreSettings)
    assert isinstance(metrics, MetricsSettings)
    tracing = sections["tracing"]
    assert isinstance(tracing, TracingSettings)
    secrets = _remember_secrets(
        reader,
        data,
        *(s for stream in streams.values() for s in secrets_in(stream.config)),
        *(s for entry in sinks.values() for s in secrets_in(entry.settings)),
        *secrets_in(tracing),
    )
    return AcklaneConfig(
        source=source,
        pipeline=pipeline,
        engine=engine,
        store=store,
        state=state,
        metrics=metrics,
        streams=streams,
        watchers=tuple(watchers),
        secrets=secrets,
        sinks={name: entry.settings for name, entry in sinks.items()},
        deprecations=tuple(reader.deprecations),
        tracing=tracing,
        warnings=tuple(insecure_settings(reader, data)),
    )
