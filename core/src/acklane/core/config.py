"""The YAML configuration: pydantic models, loading, and errors that say where.

Every problem is reported as ``file:line: field.path: what was expected``, and all
of a file's problems are reported at once in one :class:`ConfigError`. Loading
checks everything that can be checked without connecting: field types, cross
references (a watcher's stream), each stream's block against its connector's
``config_model``, and each watcher's filter (import paths included).

Top-level keys starting with ``x-`` are ignored (a place for YAML anchors).
String values may use ``${NAME}`` and ``${NAME:-default}`` (the default applies
when the variable is unset or empty) to keep secrets out of the file; ``$${``
writes a literal ``${``.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import types
import typing
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Final, Literal, NamedTuple, Union

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_core import ErrorDetails
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from .connectors import Connector, UnknownConnector, available_connectors, load_connector
from .filters import CompiledFilter, FilterSpec, FilterSpecError, compile_filter
from .sql import DEFAULT_URL
from .stores.settings import StateStoreSettings

__all__ = [
    "NAME_PATTERN",
    "AcklaneConfig",
    "ConfigError",
    "ConfigProblem",
    "EngineSettings",
    "MetricsSettings",
    "StoreSettings",
    "StreamConfig",
    "WatcherConfig",
    "WatcherSettings",
    "load_config",
    "parse_config",
]

#: Stream and watcher names (watcher names are trigger ids, stream names label metrics).
NAME_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$"
_NAME_RE: Final = re.compile(NAME_PATTERN)
_NAME_RULE: Final = "letters, digits, '_', '.' and '-', starting with a letter or digit"

#: Connectors acklane ships as extras, for the install hint.
_KNOWN_EXTRAS: Final = ("kafka", "sqs", "pubsub", "servicebus")

Loc = tuple[str | int, ...]


# -- errors ---------------------------------------------------------------------------


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


# -- the models -----------------------------------------------------------------------


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EngineSettings(_Settings):
    """``engine:``: the shared stream manager and the runner."""

    ack_timeout: float = Field(default=300.0, gt=0)
    subscriber_queue_size: int = Field(default=1024, ge=1)
    cohort_grace_period: float = Field(default=0.0, ge=0)
    #: What a full subscriber queue does: "pause" the poll until it drains (a stuck
    #: watcher is still failed by ack_timeout), or "fail" that watcher (Airflow's rule).
    overflow: Literal["pause", "fail"] = "pause"
    restart_backoff_initial: float = Field(default=1.0, gt=0)
    restart_backoff_max: float = Field(default=60.0, gt=0)
    shutdown_timeout: float = Field(default=30.0, gt=0)

    @field_validator("restart_backoff_max")
    @classmethod
    def _max_not_below_initial(cls, value: float, info: ValidationInfo) -> float:
        initial = info.data.get("restart_backoff_initial")
        if initial is not None and value < initial:
            raise ValueError(
                f"must be at least restart_backoff_initial ({initial:g}), got {value:g}"
            )
        return value


class StoreSettings(_Settings):
    """``store:``: the event store's database."""

    url: str = Field(default=DEFAULT_URL, min_length=1)
    commit_interval_ms: float = Field(default=2.0, ge=0)

    @field_validator("url")
    @classmethod
    def _parses(cls, value: str) -> str:
        try:
            make_url(value)
        except (ArgumentError, ValueError):
            raise ValueError(
                "expected a database URL such as sqlite:///acklane.db or "
                "postgresql://user@host:5432/db"
            ) from None
        return value


class MetricsSettings(_Settings):
    """``metrics:``: the Prometheus exporter (off when ``port`` is null)."""

    port: int | None = Field(default=None, ge=1, le=65535)


class WatcherSettings(_Settings):
    """One entry of ``watchers:`` as written."""

    name: Annotated[str, Field(pattern=NAME_PATTERN, max_length=200)]
    stream: str = Field(min_length=1)
    asset: str | None = Field(default=None, min_length=1)
    #: Checked as a :class:`~acklane.core.filters.FilterSpec` on its own, so that its
    #: problems are reported along with the others of the watcher.
    filter: dict[str, Any] | None = None


_SECTIONS: Final[dict[str, type[_Settings]]] = {
    "engine": EngineSettings,
    "store": StoreSettings,
    "metrics": MetricsSettings,
}
_TOP_LEVEL: Final = ("engine", "store", "state", "metrics", "streams", "watchers")


# -- the typed result -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StreamConfig:
    """One named stream: its connector class and its validated block."""

    name: str
    connector_name: str
    connector: type[Connector]
    config: BaseModel
    #: The block as written (variables substituted), without ``connector``: JSON-able,
    #: what a watcher carries so that the connector can validate it again.
    options: dict[str, Any]
    line: int | None = None

    @property
    def key(self) -> tuple[Hashable, ...]:
        """The shared stream key of every watcher on this stream."""
        return ("acklane", self.connector_name, *self.connector.stream_key(self.config))

    def describe(self) -> str:
        return self.connector.describe(self.config)


@dataclass(frozen=True, slots=True)
class WatcherConfig:
    """One watcher, its filter compiled."""

    name: str
    stream: str
    asset: str | None
    #: The ``filter:`` block (normalized, JSON-able), or None for "every message fires".
    filter: dict[str, Any] | None
    compiled_filter: CompiledFilter
    line: int | None = None


@dataclass(frozen=True, slots=True)
class AcklaneConfig:
    """A validated configuration, ready for the runner."""

    source: str
    engine: EngineSettings
    store: StoreSettings
    state: StateStoreSettings
    metrics: MetricsSettings
    streams: Mapping[str, StreamConfig]
    watchers: tuple[WatcherConfig, ...]

    def watcher(self, name: str) -> WatcherConfig:
        for w in self.watchers:
            if w.name == name:
                return w
        raise KeyError(f"no watcher named {name!r} in {self.source}")


# -- YAML with line numbers -----------------------------------------------------------


class _Loader(yaml.SafeLoader):
    """SafeLoader without timestamp resolution: dates stay strings (JSON-able)."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}

_VARIABLE = re.compile(r"\$(\$?)\{([^{}]*)\}")
_VARIABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class _Reader:
    """Builds plain Python data from the YAML node tree, recording the line of every path."""

    _loader: _Loader

    def __init__(self, text: str, source: str, env: Mapping[str, str]) -> None:
        self.text = text
        self.source = source
        self.env = env
        self.lines: dict[Loc, int] = {}
        self.problems: list[ConfigProblem] = []
        self._active: set[int] = set()

    # locations and problems

    def line_of(self, loc: Loc) -> int | None:
        """The line of ``loc``, or of its nearest ancestor that is written in the file."""
        loc = tuple(loc)
        while True:
            line = self.lines.get(loc)
            if line is not None or not loc:
                return line
            loc = loc[:-1]

    def problem(self, loc: Loc, message: str, *, line: int | None = None) -> None:
        self.problems.append(
            ConfigProblem(
                self.source,
                line if line is not None else self.line_of(loc),
                format_path(loc),
                message,
            )
        )

    # parsing

    def read(self) -> Any:
        try:
            self._loader = _Loader(self.text)  # checks the characters at once
            try:
                node = self._loader.get_single_node()
                if node is None:
                    return None
                self.lines[()] = node.start_mark.line + 1
                return self._build(node, ())
            finally:
                self._loader.dispose()
        except yaml.MarkedYAMLError as exc:
            self._syntax_problem(exc)
        except yaml.reader.ReaderError as exc:
            line = self.text.count("\n", 0, exc.position) + 1
            self.problem(
                (), f"YAML syntax error: {exc.reason} (character {exc.character!r})", line=line
            )
        except yaml.YAMLError as exc:  # pragma: no cover - every PyYAML error above is marked
            self.problem((), f"YAML syntax error: {exc}")
        return None

    def _syntax_problem(self, exc: yaml.MarkedYAMLError) -> None:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        what = exc.problem or exc.context or "invalid YAML"
        kind = (
            "YAML error"
            if isinstance(exc, yaml.constructor.ConstructorError)
            else "YAML syntax error"
        )
        details = [f"column {mark.column + 1}"] if mark is not None else []
        if exc.context and exc.problem and exc.context_mark is not None:
            details.append(f"{exc.context} at line {exc.context_mark.line + 1}")
        detail = f" ({'; '.join(details)})" if details else ""
        self.problem((), f"{kind}: {what}{detail}", line=line)

    def _build(self, node: yaml.Node, loc: Loc) -> Any:
        if id(node) in self._active:
            self.problem(loc, "a YAML alias refers to itself; recursive structures are not allowed")
            return None
        self._active.add(id(node))
        try:
            if isinstance(node, yaml.MappingNode) and node.tag == "tag:yaml.org,2002:map":
                return self._build_mapping(node, loc)
            if isinstance(node, yaml.SequenceNode) and node.tag == "tag:yaml.org,2002:seq":
                items = []
                for index, item in enumerate(node.value):
                    self.lines[(*loc, index)] = item.start_mark.line + 1
                    items.append(self._build(item, (*loc, index)))
                return items
            value = self._loader.construct_object(node, deep=True)
            if isinstance(value, str) and "$" in value:
                value = self._substitute(value, loc, node.start_mark.line + 1)
            return value
        finally:
            self._active.discard(id(node))

    def _build_mapping(self, node: yaml.MappingNode, loc: Loc) -> dict[Any, Any]:
        own = {id(k) for k, _ in node.value if k.tag != "tag:yaml.org,2002:merge"}
        self._loader.flatten_mapping(node)
        result: dict[Any, Any] = {}
        first: dict[Any, tuple[int, bool]] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            key = self._loader.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                self.problem(
                    loc, "a mapping key must be a plain value, not a mapping or list", line=line
                )
                continue
            child = (*loc, key)
            merged = id(key_node) not in own
            if key in first:
                first_line, first_merged = first[key]
                if not first_merged:
                    self.problem(
                        child,
                        f"duplicate key {key!r} (first at line {first_line}); "
                        "remove one, YAML would silently keep the last",
                        line=line,
                    )
                    continue
            first[key] = (line, merged)
            self.lines[child] = line
            result[key] = self._build(value_node, child)
        return result

    def _substitute(self, value: str, loc: Loc, line: int) -> str:
        def replace(match: re.Match[str]) -> str:
            escaped, inner = match.group(1), match.group(2)
            if escaped:
                return "${" + inner + "}"
            name, sep, default = inner.partition(":-")
            if not _VARIABLE_NAME.match(name):
                self.problem(
                    loc,
                    f"invalid variable reference ${{{inner}}}: expected ${{NAME}} or "
                    "${NAME:-default} (write $${ for a literal ${)",
                    line=line,
                )
                return match.group(0)
            current = self.env.get(name)
            if current:
                return current
            if sep:
                return default
            if current is None:
                self.problem(
                    loc,
                    f"environment variable {name} is not set (write ${{{name}:-default}} "
                    "to give a default)",
                    line=line,
                )
                return match.group(0)
            return current

        return _VARIABLE.sub(replace, value)


# -- describing pydantic errors -------------------------------------------------------


def _got(value: Any) -> str:
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    if value is None:
        return "null (an empty value)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return f"the number {_number(value)}"
    if isinstance(value, str):
        shown = value if len(value) <= 60 else value[:57] + "..."
        return f"the string {shown!r}"
    return f"a {type(value).__name__}"


def _number(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _unwrap(tp: Any) -> Any:
    """Strip Annotated and Optional; of a union, keep its first model member."""
    while True:
        origin = typing.get_origin(tp)
        if origin is Annotated:
            tp = typing.get_args(tp)[0]
            continue
        if origin is Union or origin is types.UnionType:
            members = [a for a in typing.get_args(tp) if a is not type(None)]
            models = [m for m in members if isinstance(m, type) and issubclass(m, BaseModel)]
            tp = (models or members or [Any])[0]
            continue
        return tp


def _model_at(root: type[BaseModel], loc: Loc) -> type[BaseModel] | None:
    """The model class that sits at ``loc`` under ``root``, if it can be told."""
    tp: Any = root
    for part in loc:
        tp = _unwrap(tp)
        origin = typing.get_origin(tp)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            field = tp.model_fields.get(str(part))
            if field is None:
                field = next((f for f in tp.model_fields.values() if f.alias == part), None)
            if field is None:
                return None
            tp = field.annotation
        elif origin in (list, tuple, Sequence, typing.Sequence) and isinstance(part, int):
            tp = typing.get_args(tp)[0] if typing.get_args(tp) else Any
        elif origin in (dict, Mapping, typing.Mapping):
            args = typing.get_args(tp)
            tp = args[1] if len(args) == 2 else Any
        else:
            return None
    tp = _unwrap(tp)
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None


def _field_names(model: type[BaseModel]) -> list[str]:
    return [f.alias or name for name, f in model.model_fields.items()]


def _describe(
    error: ErrorDetails, root: type[BaseModel], loc: Loc, extra: Sequence[str] = ()
) -> str:
    kind = error["type"]
    value = error.get("input")
    ctx: dict[str, Any] = dict(error.get("ctx") or {})
    got = _got(value)
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        model = _model_at(root, loc[:-1])
        if model is None:
            return "unknown field"
        names = [*_field_names(model), *extra]
        hint = difflib.get_close_matches(str(loc[-1]), names, n=1)
        also = f"; did you mean {hint[0]!r}?" if hint else ""
        return f"unknown field{also} (expected one of: {', '.join(names)})"
    if kind in ("dict_type", "model_type", "model_attributes_type", "mapping_type"):
        return f"expected a mapping, got {got}"
    if kind in ("list_type", "tuple_type", "set_type", "frozen_set_type", "iterable_type"):
        return f"expected a list, got {got}"
    if kind == "string_type":
        return f"expected a string, got {got}"
    if kind in ("int_type", "int_parsing", "int_from_float", "int_parsing_size"):
        return f"expected an integer, got {got}"
    if kind in ("float_type", "float_parsing", "decimal_type", "decimal_parsing"):
        return f"expected a number, got {got}"
    if kind in ("bool_type", "bool_parsing"):
        return f"expected true or false, got {got}"
    bounds = {
        "greater_than": ("greater than", "gt"),
        "greater_than_equal": ("at least", "ge"),
        "less_than": ("less than", "lt"),
        "less_than_equal": ("at most", "le"),
    }
    if kind in bounds:
        words, key = bounds[kind]
        return f"expected a number {words} {_number(ctx.get(key))}, got {got}"
    if kind == "string_too_short":
        n = ctx.get("min_length", 1)
        return "expected a non-empty string" if n == 1 else f"expected at least {n} characters"
    if kind == "string_too_long":
        return f"expected at most {ctx.get('max_length')} characters, got {len(str(value))}"
    if kind == "too_short":
        n = ctx.get("min_length", 1)
        return (
            f"expected at least {n} item{'s' if n != 1 else ''}, got {ctx.get('actual_length', 0)}"
        )
    if kind == "too_long":
        return f"expected at most {ctx.get('max_length')} items, got {ctx.get('actual_length')}"
    if kind == "string_pattern_mismatch":
        if ctx.get("pattern") == NAME_PATTERN:
            return f"expected a name of {_NAME_RULE}, got {got}"
        return f"expected a string matching {ctx.get('pattern')}, got {got}"
    if kind in ("literal_error", "enum"):
        return f"expected {ctx.get('expected')}, got {got}"
    message = error["msg"]
    for prefix in ("Value error, ", "Assertion failed, "):
        if message.startswith(prefix):
            return message[len(prefix) :]
    return f"{message} (got {got})"


def _report(
    reader: _Reader,
    exc: ValidationError,
    root: type[BaseModel],
    prefix: Loc = (),
    extra: Sequence[str] = (),
) -> None:
    for error in exc.errors():
        loc: Loc = tuple(p for p in error["loc"] if p != "[key]")
        reader.problem((*prefix, *loc), _describe(error, root, loc, extra))


# -- loading --------------------------------------------------------------------------


def load_config(
    path: str | os.PathLike[str], *, env: Mapping[str, str] | None = None
) -> AcklaneConfig:
    """Read and validate a YAML configuration file; raises :class:`ConfigError`."""
    source = os.fspath(path)
    try:
        text = Path(source).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            [
                ConfigProblem(
                    source, None, "", f"cannot read the configuration: {exc.strerror or exc}"
                )
            ]
        ) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            [ConfigProblem(source, None, "", f"the configuration is not UTF-8 text: {exc}")]
        ) from None
    return parse_config(text, source=source, env=env)


def parse_config(
    text: str, *, source: str = "<string>", env: Mapping[str, str] | None = None
) -> AcklaneConfig:
    """Validate a configuration given as YAML text; ``source`` names it in errors."""
    reader = _Reader(text, source, os.environ if env is None else env)
    data = reader.read()
    if reader.problems and data is None:
        raise ConfigError(reader.problems)
    if data is None:
        reader.problem(
            (), "the configuration is empty; expected a mapping with streams and watchers"
        )
        raise ConfigError(reader.problems)
    if not isinstance(data, dict):
        reader.problem(
            (), f"expected a mapping with streams and watchers at the top, got {_got(data)}"
        )
        raise ConfigError(reader.problems)

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
    state = _state(reader, state_raw or {})
    if reader.problems:
        raise ConfigError(reader.problems)
    engine, store, metrics = sections["engine"], sections["store"], sections["metrics"]
    assert isinstance(engine, EngineSettings)
    assert isinstance(store, StoreSettings)
    assert isinstance(metrics, MetricsSettings)
    return AcklaneConfig(
        source=source,
        engine=engine,
        store=store,
        state=state,
        metrics=metrics,
        streams=streams,
        watchers=tuple(watchers),
    )


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
        options = {k: v for k, v in block.items() if k != "connector"}
        try:
            config = connector.config_model.model_validate(options)
        except ValidationError as exc:
            _report(reader, exc, connector.config_model, loc, extra=("connector",))
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
        try:
            compiled = compile_filter(spec, label=f"watcher {name}")
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
                    filter=None if settings.filter is None else spec.model_dump(exclude_none=True),
                    compiled_filter=compiled,
                    line=reader.line_of(loc),
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


def _state(reader: _Reader, raw: dict[str, Any]) -> StateStoreSettings:
    try:
        return StateStoreSettings.model_validate(raw)
    except ValidationError as exc:
        _report(reader, exc, StateStoreSettings, ("state",))
        return StateStoreSettings()
