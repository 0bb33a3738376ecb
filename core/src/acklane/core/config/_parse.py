"""Loading: read the YAML, validate each section, cross-check, and report all problems at once."""

from __future__ import annotations

import difflib
import os
import stat
import warnings
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, NamedTuple, NoReturn

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from .._dbconf import is_sqlite_memory, offline_url_problem, sqlite_url_from
from .._imports import HELD, add_import_roots, held_imports
from ..connectors import (
    UnknownConnector,
    available_connectors,
    deprecated_names,
    load_connector,
    rename_fields,
)
from ..names import DEFAULT_PIPELINE, MAX_PIPELINE_LENGTH, check_pipeline_name
from ..observe.redact import redact, remember, secrets_in
from ..pipeline.filters import FilterSpec, FilterSpecError, compile_filter
from ..sinks import KINDS, Sink, SinkContext, SinkSettings, UnknownSinkKind, sink_class
from ..stores.settings import StateStoreSettings
from ._errors import ConfigError, ConfigProblem, Loc
from ._insecure import insecure_settings
from ._messages import _describe, _field_names, _got, _model_at
from ._models import (
    _NAME_RE,
    _NAME_RULE,
    _SECTIONS,
    _TOP_LEVEL,
    EngineSettings,
    MetricsSettings,
    StoreSettings,
    TracingSettings,
    WatcherSettings,
    _Settings,
)
from ._result import AcklaneConfig, StoreConfig, StreamConfig, WatcherConfig
from ._yaml import MAX_BYTES, _Reader

#: Connectors acklane ships as extras, for the install hint.
_KNOWN_EXTRAS: Final = ("kafka", "sqs", "pubsub", "servicebus")


def _report(
    reader: _Reader,
    exc: ValidationError,
    root: type[BaseModel],
    prefix: Loc = (),
    extra: Sequence[str] = (),
) -> None:
    _report_errors(reader, exc.errors(), root, prefix, extra)


def _report_errors(
    reader: _Reader,
    errors: Sequence[ErrorDetails],
    root: type[BaseModel],
    prefix: Loc = (),
    extra: Sequence[str] = (),
    *,
    at: Loc | None = None,
) -> int:
    """Report each of pydantic's errors once, as a sentence at its line; returns how many.

    The members of a union each fail on a wrong value (``bool``, ``int``, ``str``...):
    their errors are merged into one, ``expected true or false, an integer or a
    string, got a list``. ``at`` reports them all at that location instead of theirs.
    """
    described: list[tuple[Loc, str, Any]] = []
    for error in errors:
        loc: Loc = tuple(p for p in error["loc"] if p != "[key]")
        message = _describe(error, root, loc, extra)
        described.append((loc, message, error.get("input")))
    count = 0
    for loc, message in _merge_union_members(described, root):
        if at is not None:
            loc = at
        reader.problem((*prefix, *loc), message)
        count += 1
    return count


def _merge_union_members(
    described: list[tuple[Loc, str, Any]], root: type[BaseModel]
) -> list[tuple[Loc, str]]:
    """Errors of one value's union members (one input, tags that are not fields) as one."""
    groups: dict[Loc, list[tuple[Loc, str, Any]]] = {}
    for item in described:
        loc = item[0]
        if loc and isinstance(loc[-1], str):
            groups.setdefault(loc[:-1], []).append(item)
    merged: dict[Loc, str] = {}
    for parent, items in groups.items():
        if len(items) < 2:
            continue
        model = _model_at(root, parent)
        fields = set() if model is None else set(_field_names(model)) | set(model.model_fields)
        first_input = items[0][2]
        members = all(i[2] is first_input and i[0][-1] not in fields for i in items)
        shaped = all(i[1].startswith("expected ") and ", got " in i[1] for i in items)
        wanted = list(
            dict.fromkeys(i[1][len("expected ") : i[1].rindex(", got ")] for i in items if shaped)
        )
        if not (members and shaped and len(wanted) > 1):
            continue
        got = items[0][1][items[0][1].rindex(", got ") + len(", got ") :]
        either = ", ".join(wanted[:-1]) + f" or {wanted[-1]}"
        merged[parent] = f"expected {either}, got {got}"
    out: list[tuple[Loc, str]] = []
    done: set[Loc] = set()
    for loc, message, _ in described:
        parent = loc[:-1]
        if loc and parent in merged:
            if parent not in done:
                done.add(parent)
                out.append((parent, merged[parent]))
            continue
        if (loc, message) not in out:
            out.append((loc, message))
    return out


def _split_mapping_errors(
    reader: _Reader,
    exc: ValidationError,
    model: type[BaseModel],
    options: Mapping[str, Any],
    prefix: Loc,
    extra: Sequence[str],
) -> None:
    """Report a connector block's errors, each bad key of a mapping field on its own.

    A validator of a mapping field (Kafka's ``client:``) stops at the first bad key.
    For such an error the block is validated again with that field holding one key at
    a time, so that every bad key is reported, at its own line; an error that no
    single key causes is reported as it was.
    """
    rest: list[ErrorDetails] = []
    for error in exc.errors():
        loc = tuple(error["loc"])
        value = options.get(str(loc[0])) if len(loc) == 1 else None
        if not (isinstance(value, dict) and value):
            rest.append(error)
            continue
        field = loc[0]
        found = 0
        for key, item in value.items():
            try:
                model.model_validate({**options, field: {key: item}})
            except ValidationError as one:
                own = [e for e in one.errors() if tuple(e["loc"]) == (field,)]
                found += _report_errors(reader, own, model, prefix, extra, at=(field, key))
        if not found:
            rest.append(error)
    if rest:
        _report_errors(reader, rest, model, prefix, extra)


def _secret_fields(model: type[BaseModel]) -> list[str]:
    """The fields of ``model`` typed SecretStr (possibly optional)."""
    names = []
    for name, field in model.model_fields.items():
        if "SecretStr" in repr(field.annotation) or "SecretBytes" in repr(field.annotation):
            names.append(field.alias or name)
    return names


def _raise(reader: _Reader, data: Any = None) -> NoReturn:
    """Raise the problems found, with every secret of the file masked in them."""
    _remember_secrets(reader, data)
    problems = [p._replace(message=redact(p.message)) for p in reader.problems]
    raise ConfigError(list(dict.fromkeys(problems)))


def _remember_secrets(reader: _Reader, data: Any, *more: str) -> frozenset[str]:
    found = set(reader.secrets) | set(more)
    if data is not None:
        found.update(secrets_in(data))
    found.discard("")
    remember(found)
    return frozenset(found)


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


def _read_file(path: str | os.PathLike[str]) -> tuple[str, str]:
    """The file's text, read only if it is a regular file of at most :data:`MAX_BYTES`.

    A FIFO would block the reader until someone writes, ``/dev/zero`` never ends:
    the file is opened without blocking and looked at before a byte is read.
    """
    source = os.fspath(path)

    def refused(message: str) -> ConfigError:
        return ConfigError([ConfigProblem(source, None, "", message)])

    try:
        fd = os.open(source, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise refused(f"cannot read the configuration: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as file:
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise refused(
                    "the configuration is not a regular file (a directory, a FIFO or a "
                    "device); give the path of a YAML file"
                )
            data = file.read(MAX_BYTES + 1)
        except OSError as exc:
            raise refused(f"cannot read the configuration: {exc.strerror or exc}") from None
    if len(data) > MAX_BYTES:
        raise refused(f"the configuration is larger than {MAX_BYTES} bytes (the limit)")
    try:
        return source, data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise refused(f"the configuration is not UTF-8 text: {exc}") from None


def load_config(
    path: str | os.PathLike[str],
    *,
    env: Mapping[str, str] | None = None,
    offline_checks: bool = False,
) -> AcklaneConfig:
    """Read and validate a YAML configuration file; raises :class:`ConfigError`.

    Function filters (``function: mypipeline.filters:big_orders``) are imported from
    the configuration file's directory, then the working directory, after the
    standard library and the installed packages (see ``acklane.core._imports``); only once the
    rest of the file is valid. ``offline_checks`` (``acklane validate``): see
    :func:`parse_config`.
    """
    source, text = _read_file(path)
    return parse_config(
        text,
        source=source,
        env=env,
        offline_checks=offline_checks,
        import_roots=(Path(source).resolve().parent, Path.cwd()),
    )


def load_store_config(
    path: str | os.PathLike[str], *, env: Mapping[str, str] | None = None
) -> StoreConfig:
    """Read only the ``store`` and ``state`` sections of a configuration file.

    For the commands that only open the database (``acklane events``, ``acklane
    store``): the streams' variables (a broker's credentials) need not be set, and
    problems elsewhere in the file are not reported. Raises :class:`ConfigError`.
    """
    source, text = _read_file(path)
    return parse_store_config(text, source=source, env=env)


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


def _tracing_installed() -> bool:
    """Whether OpenTelemetry's SDK and OTLP/HTTP exporter are installed (not imported)."""
    import importlib.util

    try:
        return all(
            importlib.util.find_spec(name) is not None
            for name in ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http")
        )
    except (ImportError, ValueError):
        return False


def _tracing_problem(
    reader: _Reader, tracing: _Settings | None, env: Mapping[str, str] | None
) -> None:
    """Tracing on (by the file or ``OTEL_TRACES_EXPORTER``) without the ``tracing`` extra."""
    from ..observe.tracing import enabled_by

    if not isinstance(tracing, TracingSettings):
        return
    if enabled_by(tracing, os.environ if env is None else env) and not _tracing_installed():
        reader.problem(
            ("tracing",),
            'tracing is on but OpenTelemetry is not installed: pip install "acklane[tracing]"',
        )


def _offline_checks(
    reader: _Reader, store: _Settings | None, streams: Mapping[str, StreamConfig]
) -> None:
    """Problems found on this machine without the network, reported like the others."""
    if isinstance(store, StoreSettings):
        problem = offline_url_problem(store.url)
        if problem is not None:
            reader.problem(("store", "url"), problem)
    for name, stream in streams.items():
        try:
            found = list(stream.connector.offline_problems(stream.config))
        except Exception as exc:  # a connector's bug must not hide the other problems
            found = [("", f"connector {stream.connector_name!r}: offline check failed: {exc}")]
        for field, message in found:
            loc: Loc = ("streams", name, field) if field else ("streams", name)
            reader.problem(loc, message)


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


def _stream_blocks(reader: _Reader, data: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    raw = _mapping(reader, data, "streams", required=True)
    if raw is None:
        return {}
    if not raw:
        reader.problem(("streams",), "expected at least one stream (name: {connector: ..., ...})")
    blocks: dict[str, dict[str, Any]] = {}
    for name, block in raw.items():
        if not isinstance(name, str):
            reader.problem(("streams", name), f"stream names are strings, got {_got(name)}")
        elif not isinstance(block, dict):
            reader.problem(
                ("streams", name),
                f"expected a mapping (connector: ..., and its fields), got {_got(block)}",
            )
        else:
            blocks[name] = block
    return blocks


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


def _streams(reader: _Reader, blocks: Mapping[str, dict[str, Any]]) -> dict[str, StreamConfig]:
    streams: dict[str, StreamConfig] = {}
    by_key: dict[tuple[Hashable, ...], StreamConfig] = {}
    for name, block in blocks.items():
        loc: Loc = ("streams", name)
        if not _NAME_RE.match(name):
            reader.problem(loc, f"stream names are made of {_NAME_RULE}; got {name!r}")
        connector_name = block.get("connector")
        if connector_name is None:
            installed = sorted(available_connectors())
            reader.problem(
                (*loc, "connector"),
                f"required field is missing: the connector that reads stream {name!r} "
                f"(installed: {', '.join(installed) or 'none'})",
            )
            continue
        if not isinstance(connector_name, str):
            reader.problem(
                (*loc, "connector"), f"expected a connector name, got {_got(connector_name)}"
            )
            continue
        try:
            connector = load_connector(connector_name)
        except UnknownConnector:
            installed = sorted(available_connectors())
            hint = difflib.get_close_matches(connector_name, installed, n=1)
            text = f"stream {name!r} uses connector {connector_name!r}, which is not installed"
            text += f"; did you mean {hint[0]!r}?" if hint else ""
            text += f" (installed: {', '.join(installed) or 'none'})"
            if connector_name in _KNOWN_EXTRAS:
                text += f'; install it with: pip install "acklane[{connector_name}]"'
            reader.problem((*loc, "connector"), text)
            continue
        except Exception as exc:
            reader.problem(
                (*loc, "connector"),
                f"stream {name!r}: connector {connector_name!r} could not be loaded: "
                f"{type(exc).__name__}: {exc}",
            )
            continue
        model = connector.config_model
        named = _new_names(reader, model, {k: v for k, v in block.items() if k != "connector"}, loc)
        if named is None:
            continue
        options = named
        reader.secrets.update(
            str(options[field]) for field in _secret_fields(model) if options.get(field)
        )
        try:
            config = model.model_validate(options)
        except ValidationError as exc:
            _split_mapping_errors(reader, exc, model, options, loc, ("connector",))
            continue
        stream = StreamConfig(name, connector_name, connector, config, options, reader.line_of(loc))
        try:
            key = stream.key
            hash(key)
        except Exception as exc:
            reader.problem(
                loc, f"connector {connector_name!r} could not derive a stream key: {exc}"
            )
            continue
        twin = by_key.get(key)
        if twin is not None and twin.config != config:
            reader.problem(
                loc,
                f"reads the same upstream as stream {twin.name!r} (line {twin.line}) with "
                "different settings; they would share one poll with the settings of whichever "
                "starts first: make the two blocks identical or use one stream",
            )
        by_key.setdefault(key, stream)
        streams[name] = stream
    return streams


def _new_names(
    reader: _Reader, model: type[BaseModel], options: dict[str, Any], loc: Loc
) -> dict[str, Any] | None:
    """A stream block with the old names of its settings replaced by the new ones.

    Each old name is warned at its line (it still works); a problem about the new name
    is reported at the old one's line. None after a problem (an old name given with
    its new one).
    """
    if not any(old in options for old in deprecated_names(model)):
        return options
    current: list[str] = []

    def found(old: str, new: str) -> None:
        current[:] = [old]
        reader.deprecated((*loc, old), new)
        line = reader.line_of((*loc, old))
        if line is not None:
            reader.lines.setdefault((*loc, *new.split(".")), line)

    try:
        return rename_fields(model, options, found)
    except ValueError as exc:
        reader.problem((*loc, *current), str(exc))
        return None


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


def _state(reader: _Reader, raw: dict[str, Any]) -> StateStoreSettings:
    try:
        return StateStoreSettings.model_validate(raw)
    except ValidationError as exc:
        _report(reader, exc, StateStoreSettings, ("state",))
        return StateStoreSettings()
