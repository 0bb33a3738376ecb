"""YAML to plain data, recording the line of every path so that problems can say where.

A configuration file is input like any other: its size, its nesting and what its
aliases expand to are bounded (:data:`MAX_BYTES`, :data:`MAX_DEPTH`,
:data:`MAX_VALUES`), so that a few hundred bytes of anchors and aliases cannot take
minutes and gigabytes, and a deep nest cannot end in a RecursionError. Each limit is
reported as a problem naming the file, the line and the limit.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any, Final

import yaml

from ..redact import is_secret_name
from ._errors import ConfigProblem, Loc, format_path
from ._substitution import NULL_WORDS, is_one_reference, substitute

#: The largest configuration read, in bytes (text: characters): far above any real
#: pipeline, far below what would strain the process.
MAX_BYTES: Final = 1024 * 1024

#: The deepest nesting of mappings and lists, aliases expanded: real files stay
#: under 15; PyYAML's composer recurses per level, and Python's stack is ~1000 frames.
MAX_DEPTH: Final = 100

#: The most values (mappings, lists, scalars) the document may expand to, aliases
#: expanded: each alias repeats its anchor's whole content, so ten lines of aliases
#: can stand for a billion values. (PyYAML itself merges each ``<<`` key's pairs once.)
MAX_VALUES: Final = 100_000


class _LimitExceeded(Exception):
    """The document goes past one of the limits; ``line`` is where, when known."""

    def __init__(self, message: str, line: int | None) -> None:
        super().__init__(message)
        self.message = message
        self.line = line


class _Loader(yaml.SafeLoader):
    """SafeLoader without timestamp resolution (dates stay strings, JSON-able), its
    nesting bounded."""

    _depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise _LimitExceeded(
                    f"nested more than {MAX_DEPTH} levels deep (the limit)", mark.line + 1
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _too_many() -> str:
    return (
        f"expands to more than {MAX_VALUES} values (the limit): each YAML alias "
        "repeats its anchor's whole content"
    )


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


class _Reader:
    """Builds plain Python data from the YAML node tree, recording the line of every path."""

    _loader: _Loader

    def __init__(self, text: str, source: str, env: Mapping[str, str]) -> None:
        self.text = text
        self.source = source
        self.env = env
        self.lines: dict[Loc, int] = {}
        self.problems: list[ConfigProblem] = []
        #: Old names of settings found in the file (each also warned, at its line).
        self.deprecations: list[ConfigProblem] = []
        #: The location of each problem, in the order of ``problems``.
        self.problem_locs: list[Loc] = []
        #: Values that came from a ``${VAR}`` with a secret-like name.
        self.secrets: set[str] = set()
        #: Where a ``${VAR}`` could not be resolved: what is said about the value there
        #: afterwards (a wrong type...) is a consequence, not another problem.
        self.unresolved: set[Loc] = set()
        #: Sinks whose own entry has problems: a watcher naming one is not told "unknown".
        self.known_bad_sinks: set[str] = set()
        self._active: set[int] = set()
        self._values = 0

    # locations and problems

    def line_of(self, loc: Loc) -> int | None:
        """The line of ``loc``, or of its nearest ancestor that is written in the file."""
        loc = tuple(loc)
        while True:
            line = self.lines.get(loc)
            if line is not None or not loc:
                return line
            loc = loc[:-1]

    def consequence(self, loc: Loc) -> bool:
        """Whether a problem at ``loc`` follows from an unresolved variable."""
        return any(loc[: len(u)] == u for u in self.unresolved)

    def problem(self, loc: Loc, message: str, *, line: int | None = None) -> None:
        loc = tuple(loc)
        if self.consequence(loc):
            return
        self.problem_locs.append(loc)
        self.problems.append(
            ConfigProblem(
                self.source,
                line if line is not None else self.line_of(loc),
                format_path(loc),
                message,
            )
        )

    def deprecated(self, loc: Loc, new: str) -> None:
        """An old name at ``loc``, now called ``new``: it still works, and is warned
        (:class:`FutureWarning`) at its file and line."""
        line = self.line_of(loc)
        path = format_path(loc)
        message = f"deprecated, now called {new}; the old name still works for now"
        self.deprecations.append(ConfigProblem(self.source, line, path, message))
        warnings.warn_explicit(
            f"{path} is {message}", FutureWarning, filename=self.source, lineno=line or 0
        )

    # parsing

    def read(self) -> Any:
        if len(self.text) > MAX_BYTES:
            self.problem((), f"the configuration is larger than {MAX_BYTES} characters (the limit)")
            return None
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
        except _LimitExceeded as exc:
            self.problem((), exc.message, line=exc.line)
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
        self._values += 1
        if self._values > MAX_VALUES:
            raise _LimitExceeded(_too_many(), self._entry_line(loc))
        if len(loc) > MAX_DEPTH:  # aliases inside aliases nest deeper than the text
            raise _LimitExceeded(
                f"nested more than {MAX_DEPTH} levels deep (the limit), aliases expanded",
                self._entry_line(loc),
            )
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
            value = self._construct(node, loc)
            if isinstance(value, str) and "$" in value:
                line = node.start_mark.line + 1
                unresolved: list[str] = []
                # a plain (unquoted) scalar that is one reference is read as YAML reads
                # the same text written in place as to null: ``port: ${PORT:-null}``
                # and an empty PORT both leave the setting null (off); quoted, it is text
                plain = isinstance(node, yaml.ScalarNode) and node.style is None
                whole = plain and is_one_reference(value)
                value = substitute(value, self.env, unresolved.append, used=self._note_variable)
                for message in unresolved:
                    self.problem(loc, message, line=line)
                if unresolved:
                    self.unresolved.add(tuple(loc))
                elif whole and value in NULL_WORDS:
                    return None
            return value
        finally:
            self._active.discard(id(node))

    def _entry_line(self, loc: Loc) -> int | None:
        """The line of the top-level entry holding ``loc``: a node inside an expanded
        alias carries its anchor's line, the entry is where the expansion was asked for."""
        return self.line_of(loc[:1])

    def _construct(self, node: yaml.Node, loc: Loc) -> Any:
        """The node's value; one PyYAML takes but Python refuses (an integer of more
        than 4300 digits...) is a problem at its line, not a traceback."""
        try:
            return self._loader.construct_object(node, deep=True)
        except (ValueError, OverflowError) as exc:
            self.problem(loc, f"cannot read this value: {exc}", line=node.start_mark.line + 1)
            return None

    def _note_variable(self, name: str, text: str) -> None:
        if is_secret_name(name):
            self.secrets.add(text)

    def _build_mapping(self, node: yaml.MappingNode, loc: Loc) -> dict[Any, Any]:
        own = {id(k) for k, _ in node.value if k.tag != "tag:yaml.org,2002:merge"}
        self._loader.flatten_mapping(node)
        result: dict[Any, Any] = {}
        first: dict[Any, tuple[int, bool]] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            key = self._construct(key_node, loc)
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
