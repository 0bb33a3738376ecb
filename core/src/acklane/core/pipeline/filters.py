"""Watcher filters: the YAML ``filter:`` block compiled into something that runs per message.

A filter is either declarative (``match`` / ``reject`` / ``emit`` over paths into
the decoded JSON body and the message's attributes) or a Python function named
by its import path. Everything that can be checked is checked when the filter is
compiled (at configuration load), so a running watcher never meets a typo.

Paths: ``body`` (the decoded JSON body), ``body.a.b.0`` (fields and list
indexes), ``attributes`` / ``attributes.<name>`` (the whole rest is the attribute
name, dots included), ``key``, ``message_id`` (the message's identity, the same on
every broker), ``broker_message_id`` (the broker's own id, where it gives one),
``source``, ``delivery_attempt``.
"""

from __future__ import annotations

import base64
import contextlib
import difflib
import inspect
import json
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

import re2
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import AcklaneError
from ..manager import Rejected
from ..message import BodyDecodeError, RawMessage
from ..trigger import TriggerEvent, reject_shared_stream_event
from .schema import SchemaCheck, compile_schema

__all__ = [
    "OPERATORS",
    "PATH_ROOTS",
    "CompiledFilter",
    "FilterSpec",
    "FilterSpecError",
    "Rejected",
    "compile_filter",
    "import_object",
]

#: The operators a condition may use; a bare value means ``eq``.
OPERATORS: Final = (
    "eq",
    "ne",
    "gt",
    "gte",
    "lt",
    "lte",
    "in",
    "not_in",
    "exists",
    "regex",
    "contains",
)

#: Where a path may start.
PATH_ROOTS: Final = (
    "body",
    "attributes",
    "key",
    "message_id",
    "broker_message_id",
    "source",
    "delivery_attempt",
)

ProblemPath = tuple[str | int, ...]


class FilterSpec(BaseModel):
    """A watcher's ``filter:`` block as written; :func:`compile_filter` checks the rest."""

    model_config = ConfigDict(extra="forbid")

    match: dict[str, Any] | None = None
    reject: dict[str, Any] | None = None
    reject_invalid_json: bool | None = None
    emit: Any = None
    function: str | None = None
    #: ``schema:`` (a file or an inline JSON Schema) checked on the body before the rules
    #: (acklane.core.pipeline.schema); named so as not to shadow BaseModel.schema.
    json_schema: str | dict[str, Any] | bool | None = Field(default=None, alias="schema")
    on_schema_error: Literal["reject", "skip"] | None = None


class FilterSpecError(AcklaneError, ValueError):
    """A filter block that cannot be compiled; ``problems`` are (path in the block, message)."""

    def __init__(self, problems: Sequence[tuple[ProblemPath, str]]) -> None:
        self.problems = list(problems)
        super().__init__(
            "; ".join(f"{_dotted(path) or 'filter'}: {message}" for path, message in self.problems)
        )


_MISSING: Final = object()
#: The verdict "nothing fires" of a declarative filter, shared (never mutated).
_NOTHING: Final[list[Any]] = []


def _dotted(path: ProblemPath) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif "." in part or " " in part or not part:
            out += f"[{json.dumps(part)}]"
        else:
            out += f".{part}" if out else part
    return out


def _show(value: Any) -> str:
    """A value as it would be written in YAML/JSON, for messages."""
    try:
        return json.dumps(value, ensure_ascii=False, default=repr)
    except (TypeError, ValueError):  # pragma: no cover - default=repr makes this rare
        return repr(value)


# -- message view ---------------------------------------------------------------------


class _View:
    """One message as paths see it; decodes the body at most once."""

    __slots__ = ("_body", "message")

    def __init__(self, message: RawMessage, body: Any = _MISSING) -> None:
        self.message = message
        self._body = body

    def body(self) -> Any:
        if self._body is _MISSING:
            self._body = _lenient_body(self.message)
        return self._body

    def message_dict(self) -> dict[str, Any]:
        m = self.message
        return {
            "body": self.body(),
            "attributes": dict(m.attributes),
            "key": m.key,
            "message_id": m.message_id,
            "source": m.source,
        }


def _json_body(message: RawMessage) -> Any:
    """``message.json()``, decoded once per message (kept in ``message.json_memo``): the
    inline path evaluates every watcher of a message one after the other. The decoded
    body is shared: declarative filters only read it, and a stored payload is encoded
    at once."""
    memo = message.json_memo
    if memo is None:
        try:
            body = message.json()
        except BodyDecodeError as exc:
            message.json_memo = (None, exc)
            raise
        message.json_memo = (body, None)
        return body
    if memo[1] is not None:
        raise memo[1]
    return memo[0]


def _lenient_body(message: RawMessage) -> Any:
    """The body for a filter that accepts non-JSON: JSON, else text, else base64."""
    try:
        return _json_body(message)
    except BodyDecodeError:
        pass
    try:
        return message.text()
    except BodyDecodeError:
        return {"base64": base64.b64encode(message.body).decode("ascii")}


class _Path:
    __slots__ = ("parts", "root", "text")

    def __init__(self, text: str, root: str, parts: tuple[str, ...]) -> None:
        self.text = text
        self.root = root
        self.parts = parts

    @property
    def reads_body(self) -> bool:
        return self.root == "body"

    def get(self, view: _View) -> Any:
        root = self.root
        if root == "body":
            return _dig(view.body(), self.parts)
        message = view.message
        if root == "attributes":
            if not self.parts:
                return dict(message.attributes)
            return message.attributes.get(self.parts[0], _MISSING)
        value = getattr(message, root)
        return _MISSING if value is None else value


def _parse_path(text: Any) -> _Path:
    if not isinstance(text, str) or not text:
        raise ValueError(f"expected a path such as body.type, got {_show(text)}")
    root, _, rest = text.partition(".")
    if root not in PATH_ROOTS:
        hint = difflib.get_close_matches(root, PATH_ROOTS, n=1)
        also = f"; did you mean {hint[0]!r}?" if hint else ""
        raise ValueError(f"path {text!r} must start with one of {', '.join(PATH_ROOTS)}{also}")
    if root == "attributes":
        return _Path(text, root, (rest,) if rest else ())
    if root == "body":
        parts = tuple(rest.split(".")) if rest else ()
        if any(not p for p in parts):
            raise ValueError(f"path {text!r} has an empty segment")
        return _Path(text, root, parts)
    if rest:
        raise ValueError(f"path {text!r}: {root} is a single value and has no fields")
    return _Path(text, root, ())


# -- conditions -----------------------------------------------------------------------


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _same(a: Any, b: Any) -> bool:
    """JSON equality: booleans are not numbers, 1 == 1.0, containers compare deeply."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if _is_number(a) and _is_number(b):
        return bool(a == b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and bool(a == b)


def _comparable(a: Any, b: Any) -> bool:
    return (_is_number(a) and _is_number(b)) or (isinstance(a, str) and isinstance(b, str))


Test = Callable[[Any], bool]


def _make_test(op: str, operand: Any) -> Test:
    """The predicate of one operator; raises ValueError for an operand it cannot use."""
    if op == "eq":
        return lambda v: v is not _MISSING and _same(v, operand)
    if op == "ne":
        return lambda v: v is _MISSING or not _same(v, operand)
    if op in ("gt", "gte", "lt", "lte"):
        if not (_is_number(operand) or isinstance(operand, str)):
            raise ValueError(f"{op} expects a number or a string, got {_show(operand)}")
        if op == "gt":
            return lambda v: _comparable(v, operand) and v > operand
        if op == "gte":
            return lambda v: _comparable(v, operand) and v >= operand
        if op == "lt":
            return lambda v: _comparable(v, operand) and v < operand
        return lambda v: _comparable(v, operand) and v <= operand
    if op in ("in", "not_in"):
        if not isinstance(operand, list):
            raise ValueError(f"{op} expects a list of values, got {_show(operand)}")
        choices = list(operand)
        if op == "in":
            return lambda v: v is not _MISSING and any(_same(v, c) for c in choices)
        return lambda v: v is _MISSING or not any(_same(v, c) for c in choices)
    if op == "exists":
        if not isinstance(operand, bool):
            raise ValueError(f"exists expects true or false, got {_show(operand)}")
        return (lambda v: v is not _MISSING) if operand else (lambda v: v is _MISSING)
    if op == "regex":
        if not isinstance(operand, str):
            raise ValueError(f"regex expects a string, got {_show(operand)}")
        return _regex_test(operand)
    if op == "contains":
        if isinstance(operand, Mapping | list):
            raise ValueError(f"contains expects a single value, got {_show(operand)}")

        def contains(v: Any) -> bool:
            if isinstance(v, str):
                return isinstance(operand, str) and operand in v
            if isinstance(v, list):
                return any(_same(item, operand) for item in v)
            if isinstance(v, Mapping):
                return isinstance(operand, str) and operand in v
            return False

        return contains
    raise AssertionError(op)  # pragma: no cover - callers check the operator


# RE2 (docs/configuration.md, "Regular expressions"): a search takes time linear in the
# text, whatever the pattern, where Python's backtracking `re` can take exponential
# time on a message body and hold the event loop (and every watcher, the health
# endpoint and the ack timeouts) meanwhile. RE2 refuses at compile time what it cannot
# run so (backreferences, lookaround, possessive repetition...). No capture groups:
# a condition only asks whether the text matches. No error lines of RE2's own on
# stderr: the configuration error says it. The binding compiles and checks the
# pattern; its engine object is then called directly: the wrapper's search is two to
# five times slower, for a match object a condition does not read, and fails on a
# lone surrogate (which a JSON body may hold); the bytes given to the engine keep one
# as bytes that are not UTF-8, which RE2 reads without failing.
_RE2_OPTIONS: Final = re2.Options()
_RE2_OPTIONS.log_errors = False
_RE2_OPTIONS.never_capture = True
_UNANCHORED: Final = re2._re2.RE2.Anchor.UNANCHORED
#: How many verdicts a regex condition remembers, on texts of at most how many characters.
_REMEMBERED_VERDICTS: Final = 1024
_REMEMBERED_TEXT: Final = 128


def _regex_test(pattern: str) -> Test:
    """The ``regex`` operator: whether RE2 finds ``pattern`` in a string value; raises
    ValueError naming what RE2 refused."""
    try:
        compiled = re2.compile(pattern.encode("utf-8", "surrogatepass"), _RE2_OPTIONS)
    except re2.error as exc:
        reason = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else exc
        raise ValueError(
            f"invalid regular expression {pattern!r}: {reason} (regex runs on RE2, which "
            "has no backreferences, lookaround or possessive repetition)"
        ) from None
    match = compiled._regexp.Match
    null: Final = (-1, -1)
    # The verdicts on short texts, remembered: a search through the binding costs some
    # 0.5 us where Python's `re` took 0.15 us, and what a regex routes on (an event
    # type, a topic, a key) takes few distinct values. Bounded: emptied when full.
    verdicts: dict[str, bool] = {}

    def search(v: Any) -> bool:
        if not isinstance(v, str):
            return False
        found = verdicts.get(v)
        if found is not None:
            return found
        text = v.encode("utf-8", "surrogatepass")
        found = bool(match(_UNANCHORED, text, 0, len(text))[0] != null)
        if len(v) <= _REMEMBERED_TEXT:
            if len(verdicts) >= _REMEMBERED_VERDICTS:
                verdicts.clear()
            verdicts[v] = found
        return found

    return search


# -- the compiled form: a condition as one call on (message, decoded body) -------------

#: What a path reads, given the message and its decoded body (_MISSING when no path
#: of the filter reads the body).
Getter = Callable[[RawMessage, Any], Any]
#: A condition, compiled: whether it holds for (message, decoded body).
Check = Callable[[RawMessage, Any], bool]


def _dig(value: Any, parts: tuple[str, ...]) -> Any:
    """``body.a.0.b``'s walk from the body down (_Path.get's, and the compiled getters')."""
    for part in parts:
        if isinstance(value, Mapping):
            value = value.get(part, _MISSING)
        elif isinstance(value, list) and part.isdigit():
            index = int(part)
            value = value[index] if index < len(value) else _MISSING
        else:
            return _MISSING
        if value is _MISSING:
            return _MISSING
    return value


def _getter(path: _Path) -> Getter:
    """The path's read as one call: a decoded body is a plain dict (checked by its exact
    type, no ABC isinstance), whose one-level path is one ``dict.get``."""
    if path.root != "body":
        return lambda message, body: path.get(_View(message, body))
    parts = path.parts
    if not parts:
        return lambda message, body: body
    if len(parts) == 1:
        (part,) = parts

        def get_one(message: RawMessage, body: Any) -> Any:
            if type(body) is dict:
                return body.get(part, _MISSING)
            return _dig(body, parts)

        return get_one
    return lambda message, body: _dig(body, parts)


def _check(path: _Path, op: str, operand: Any, test: Test) -> Check:
    """The condition as one call; ``eq`` on a scalar compares exact JSON types directly
    (what _same decides for them), anything else goes through ``test``."""
    get = _getter(path)
    if op == "eq" and path.root == "body" and len(path.parts) == 1 and _plain_scalar(operand):
        return _eq_field(path.parts, operand)
    if op == "eq":
        if operand is None or type(operand) is bool:
            return lambda message, body: get(message, body) is operand
        if type(operand) is str:

            def eq_str(message: RawMessage, body: Any) -> bool:
                value = get(message, body)
                if type(value) is str:
                    return bool(value == operand)
                return value is not _MISSING and _same(value, operand)

            return eq_str
        if type(operand) is int or type(operand) is float:

            def eq_number(message: RawMessage, body: Any) -> bool:
                value = get(message, body)
                kind = type(value)
                if kind is int or kind is float:
                    return bool(value == operand)
                return value is not _MISSING and _same(value, operand)

            return eq_number
    return lambda message, body: test(get(message, body))


def _plain_scalar(value: Any) -> bool:
    """A str, int, float, bool or None of exactly that type (as YAML gives them)."""
    return value is None or type(value) in (str, int, float, bool)


def _eq_field(parts: tuple[str, ...], operand: Any) -> Check:
    """``body.<field>: <scalar>``, the commonest condition, as one call: a dict lookup
    and, when the value has the operand's JSON type, one comparison."""
    (part,) = parts
    missing = _MISSING
    if operand is None or type(operand) is bool:  # compared by identity

        def eq_singleton(message: RawMessage, body: Any) -> bool:
            if type(body) is dict:
                return body.get(part, missing) is operand
            return _dig(body, parts) is operand

        return eq_singleton
    kinds: tuple[type, ...] = (str,) if type(operand) is str else (int, float)

    def eq(message: RawMessage, body: Any) -> bool:
        value = body.get(part, missing) if type(body) is dict else _dig(body, parts)
        if type(value) in kinds:
            return bool(value == operand)
        return value is not missing and _same(value, operand)

    return eq


def _eq_field_filter(
    part: str, operand: Any, prefix: Callable[[str], str], label: str
) -> Callable[[RawMessage], list[Any] | Rejected]:
    """The whole of ``match: {body.<field>: <str or number>}`` (emitting the body) as one
    call: what :meth:`CompiledFilter._compile_declarative`'s closure and
    :func:`_eq_field` decide, fused (the commonest routing filter: one per watcher)."""
    missing = _MISSING
    parts = (part,)
    kinds: tuple[type, ...] = (str,) if type(operand) is str else (int, float)
    nothing = _NOTHING

    def evaluate(message: RawMessage) -> list[Any] | Rejected:
        if not isinstance(message, RawMessage):
            raise TypeError(f"{label}: expected a RawMessage, got {type(message).__name__}")
        memo = message.json_memo  # _json_body(), inlined: one call less per message
        if memo is None:
            try:
                body = message.json()
            except BodyDecodeError as exc:
                message.json_memo = (None, exc)
                return Rejected(prefix(str(exc)))
            message.json_memo = (body, None)
        elif memo[1] is not None:
            return Rejected(prefix(str(memo[1])))
        else:
            body = memo[0]
        value = body.get(part, missing) if type(body) is dict else _dig(body, parts)
        if type(value) in kinds:
            return [body] if value == operand else nothing
        return [body] if value is not missing and _same(value, operand) else nothing

    return evaluate


@dataclass(frozen=True, slots=True)
class _Condition:
    path: _Path
    op: str
    operand: Any
    test: Test

    @property
    def check(self) -> Check:
        return _check(self.path, self.op, self.operand, self.test)

    def holds(self, view: _View) -> bool:
        return self.test(self.path.get(view))

    def describe(self, view: _View) -> str:
        value = self.path.get(view)
        shown = "missing" if value is _MISSING else _show(value)
        return f"{self.path.text} {self.op} {_show(self.operand)} (value: {shown})"


def _compile_conditions(
    block: Mapping[str, Any], where: str, problems: list[tuple[ProblemPath, str]]
) -> list[_Condition]:
    conditions: list[_Condition] = []
    for path_text, spec in block.items():
        try:
            path = _parse_path(path_text)
        except ValueError as exc:
            problems.append(((where, path_text), str(exc)))
            continue
        if isinstance(spec, Mapping):
            if not spec:
                problems.append(
                    ((where, path_text), "empty condition; give a value or {operator: value}")
                )
                continue
            unknown = [op for op in spec if op not in OPERATORS]
            if unknown:
                for op in unknown:
                    hint = difflib.get_close_matches(str(op), OPERATORS, n=1)
                    also = f"did you mean {hint[0]!r}? " if hint else ""
                    problems.append(
                        (
                            (where, path_text, str(op)),
                            f"unknown operator {op!r}; {also}operators are "
                            f"{', '.join(OPERATORS)} (to compare with a mapping, "
                            "write {eq: {...}})",
                        )
                    )
                continue
            items = list(spec.items())
        else:
            items = [("eq", spec)]
        for op, operand in items:
            try:
                test = _make_test(op, operand)
            except ValueError as exc:
                loc: ProblemPath = (
                    (where, path_text, op)
                    if isinstance(spec, Mapping)
                    else (
                        where,
                        path_text,
                    )
                )
                problems.append((loc, str(exc)))
                continue
            conditions.append(_Condition(path, op, operand, test))
    return conditions


# -- emit -----------------------------------------------------------------------------

Emitter = Callable[[_View], Any]


def _compile_emit(emit: Any, problems: list[tuple[ProblemPath, str]]) -> tuple[Emitter, bool]:
    """The payload builder and whether it reads the body."""
    if emit is None:
        emit = "body"
    if emit == "message":
        return _View.message_dict, True
    if isinstance(emit, str):
        try:
            path = _parse_path(emit)
        except ValueError as exc:
            problems.append((("emit",), f"{exc} (or 'message')"))
            return _View.body, True
        return (lambda view: _none_if_missing(path.get(view))), path.reads_body
    if isinstance(emit, Mapping) and emit:
        fields: list[tuple[str, _Path]] = []
        for name, path_text in emit.items():
            if not isinstance(name, str) or not name:
                problems.append((("emit", str(name)), "expected a non-empty field name"))
                continue
            try:
                fields.append((name, _parse_path(path_text)))
            except ValueError as exc:
                problems.append((("emit", name), str(exc)))

        def build(view: _View) -> dict[str, Any]:
            return {name: _none_if_missing(path.get(view)) for name, path in fields}

        return build, any(p.reads_body for _, p in fields)
    problems.append(
        (
            ("emit",),
            "expected body, message, a path such as body.order, or a mapping of "
            f"name: path, got {_show(emit)}",
        )
    )
    return _View.body, True


def _none_if_missing(value: Any) -> Any:
    return None if value is _MISSING else value


# -- functions ------------------------------------------------------------------------


def import_object(path: str) -> Any:
    """The object named ``package.module:attr.sub`` (or ``package.module.attr``).

    Raises ValueError naming the module or attribute that could not be found.
    """
    if not isinstance(path, str) or not path.strip():
        raise ValueError(f"expected an import path such as mypkg.filters:my_filter, got {path!r}")
    if ":" in path:
        module_name, _, attr_path = path.partition(":")
    else:
        module_name, _, attr_path = path.rpartition(".")
    if not module_name or not attr_path:
        raise ValueError(f"{path!r} is not an import path; write package.module:function")
    from .._imports import import_user_module

    try:
        obj: Any = import_user_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import module {module_name!r} (from {path!r}): {exc}") from None
    except Exception as exc:
        raise ValueError(
            f"importing module {module_name!r} (from {path!r}) failed: {type(exc).__name__}: {exc}"
        ) from None
    for attr in attr_path.split("."):
        try:
            obj = getattr(obj, attr)
        except AttributeError:
            raise ValueError(
                f"module {module_name!r} has no attribute {attr_path!r} (from {path!r})"
            ) from None
    return obj


def _check_signature(fn: Callable[..., Any], n: int, path: str, shape: str) -> str | None:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins without a signature: trust them
        return None
    try:
        signature.bind(*([None] * n))
    except TypeError as exc:
        return f"{path} cannot be called as {shape}: {exc}"
    return None


# -- the compiled filter --------------------------------------------------------------


class CompiledFilter:
    """A watcher's filter, ready to run over the raw stream.

    ``evaluate(message)`` gives the verdict for one message (a list of payloads,
    empty when nothing fires, or :class:`Rejected`); ``run(stream, watcher)`` is the
    async generator a trigger's ``filter_shared_stream`` delegates to.
    """

    __slots__ = (
        "_conditions",
        "_emit",
        "_emit_body",
        "_evaluate",
        "_function",
        "_function_kind",
        "_rejects",
        "_schema",
        "label",
        "reads_body",
        "reject_invalid_json",
    )

    def __init__(
        self,
        *,
        label: str,
        conditions: Sequence[_Condition] = (),
        rejects: Sequence[_Condition] = (),
        emit: Emitter = _View.body,
        reads_body: bool = True,
        reject_invalid_json: bool = True,
        function: Callable[..., Any] | None = None,
        function_kind: str | None = None,
        schema: SchemaCheck | None = None,
        emit_body: bool = False,
    ) -> None:
        self.label = label
        self._schema = schema
        self._emit_body = emit_body  # emit is the decoded body itself (the default)
        self._conditions = tuple(conditions)
        self._rejects = tuple(rejects)
        self._emit = emit
        self.reads_body = reads_body
        self.reject_invalid_json = reject_invalid_json
        self._function = function
        self._function_kind = function_kind
        self._evaluate: Callable[[RawMessage], list[Any] | Rejected] = (
            self._compile_declarative() if function_kind is None else self._evaluate_function
        )

    @property
    def evaluator(self) -> Callable[[RawMessage], list[Any] | Rejected]:
        """:meth:`evaluate` as one call, for an engine that calls it per message; the
        lists it returns are the caller's to read, not to change (an empty one is
        shared)."""
        return self._evaluate

    def _compile_declarative(self) -> Callable[[RawMessage], list[Any] | Rejected]:
        """The declarative filter as one closure: the body decoded once (shared by the
        watchers that evaluate one message in turn), each condition one call."""
        rejects = tuple((c.check, c) for c in self._rejects)
        checks = tuple(c.check for c in self._conditions)
        emit = self._emit
        emit_body = self._emit_body
        prefix = self._prefix
        label = self.label or "filter"
        decode = self.reads_body and self.reject_invalid_json
        lenient = self.reads_body and not decode

        schema = self._schema
        field = self._single_eq_field()
        if field is not None and decode and not rejects and emit_body and schema is None:
            return _eq_field_filter(field[0], field[1], prefix, label)

        def evaluate(message: RawMessage) -> list[Any] | Rejected:
            if not isinstance(message, RawMessage):
                raise TypeError(f"{label}: expected a RawMessage, got {type(message).__name__}")
            body: Any
            if decode:
                memo = message.json_memo  # _json_body(), inlined: one call less per message
                if memo is None:
                    try:
                        body = message.json()
                    except BodyDecodeError as exc:
                        message.json_memo = (None, exc)
                        return Rejected(prefix(str(exc)))
                    message.json_memo = (body, None)
                elif memo[1] is not None:
                    return Rejected(prefix(str(memo[1])))
                else:
                    body = memo[0]
            elif lenient:
                body = _lenient_body(message)
            else:
                body = _MISSING
            if schema is not None:  # the body's JSON Schema, before the rules
                failure = schema.failure(None if body is _MISSING else body)
                if failure is not None:
                    return _NOTHING if schema.skip else Rejected(prefix(failure))
            for check, rule in rejects:
                if check(message, body):
                    reason = f"reject rule matched: {rule.describe(_View(message, body))}"
                    return Rejected(prefix(reason))
            for check in checks:
                if not check(message, body):
                    return _NOTHING
            if emit_body and body is not _MISSING:
                return [body]
            return [emit(_View(message, body))]

        return evaluate

    def _single_eq_field(self) -> tuple[str, Any] | None:
        """(field, operand) when the filter's one condition is ``body.<field>: <scalar>``."""
        if len(self._conditions) != 1:
            return None
        c = self._conditions[0]
        operand = c.operand
        if (
            c.op == "eq"
            and c.path.root == "body"
            and len(c.path.parts) == 1
            and type(operand) in (str, int, float)
        ):
            return c.path.parts[0], operand
        return None

    @property
    def inline(self) -> bool:
        """True for a synchronous filter (declarative, a plain ``def``): the engine may
        evaluate it as it broadcasts (:meth:`evaluate`), with no generator of its own."""
        return self._function_kind is None or self._function_kind == "plain"

    @property
    def calls_user_code(self) -> bool:
        """True for a function filter (it may call ``reject_shared_stream_event``)."""
        return self._function_kind is not None

    @property
    def takes_over_stream(self) -> bool:
        """True for an async generator function ``fn(stream, watcher)``."""
        return self._function_kind == "stream"

    def _prefix(self, text: str) -> str:
        return f"{self.label}: {text}" if self.label else text

    def evaluate(self, message: RawMessage) -> list[Any] | Rejected:
        """The verdict for one message (declarative filters and plain sync functions)."""
        verdict = self._evaluate(message)
        return [] if verdict is _NOTHING else verdict  # a list of the caller's own

    def _evaluate_function(self, message: RawMessage) -> list[Any] | Rejected:
        """The verdict of a plain sync function filter (an async one cannot give one)."""
        kind = self._function_kind
        if kind == "plain":
            assert self._function is not None
            try:
                return _payloads(self._function(message))
            except BodyDecodeError as exc:
                if self.reject_invalid_json:
                    return Rejected(self._prefix(str(exc)))
                raise
        raise TypeError(
            f"{self.label or 'filter'}: an async filter cannot be evaluated synchronously"
        )

    async def _evaluate_async(self, message: RawMessage) -> list[Any] | Rejected:
        assert self._function is not None
        try:
            return _payloads(await self._function(message))
        except BodyDecodeError as exc:
            if self.reject_invalid_json:
                return Rejected(self._prefix(str(exc)))
            raise

    async def run(self, stream: AsyncIterator[Any], watcher: Any) -> AsyncIterator[TriggerEvent]:
        """Turn the raw stream into trigger events, rejecting what must be dead-lettered."""
        if self._function_kind == "stream":
            assert self._function is not None
            # aclosing: when the engine closes this wrapper, the user's generator is
            # closed now, in this task (its finally blocks run before the watcher leaves).
            async with contextlib.aclosing(self._function(stream, watcher)) as events:
                async for item in events:
                    yield item if isinstance(item, TriggerEvent) else TriggerEvent(item)
            return
        if self._function_kind is None:
            # declarative: the compiled verdict, in this generator
            evaluate = self._evaluate
            async for message in stream:
                verdict = evaluate(message)
                if type(verdict) is list:
                    if verdict:
                        event = verdict[0]
                        yield event if isinstance(event, TriggerEvent) else TriggerEvent(event)
                else:
                    assert isinstance(verdict, Rejected)
                    reject_shared_stream_event(verdict.reason)
            return
        asynchronous = self._function_kind == "async"
        async for message in stream:
            verdict = (
                await self._evaluate_async(message) if asynchronous else self.evaluate(message)
            )
            if isinstance(verdict, Rejected):
                reject_shared_stream_event(verdict.reason)
                continue
            for payload in verdict:
                yield payload if isinstance(payload, TriggerEvent) else TriggerEvent(payload)


def _payloads(result: Any) -> list[Any]:
    if result is None:
        return []
    if isinstance(result, list):
        return [p for p in result if p is not None]
    return [result]


def _spec_problems(exc: ValidationError) -> list[tuple[ProblemPath, str]]:
    return [(tuple(e["loc"]), e["msg"]) for e in exc.errors()]


def compile_filter(
    spec: FilterSpec | Mapping[str, Any] | None,
    *,
    label: str = "",
    base_dir: Path | None = None,
) -> CompiledFilter:
    """Compile a ``filter:`` block; raises :class:`FilterSpecError` listing every problem.

    ``label`` (usually ``watcher <name>``) prefixes rejection reasons. A function
    filter is imported here, so a bad import path fails now rather than at run time.
    ``base_dir`` is where a relative ``schema:`` file is found (the configuration's
    directory; the working directory by default).
    """
    if spec is None:
        spec = FilterSpec()
    elif not isinstance(spec, FilterSpec):
        try:
            spec = FilterSpec.model_validate(spec)
        except ValidationError as exc:
            raise FilterSpecError(_spec_problems(exc)) from None
    problems: list[tuple[ProblemPath, str]] = []

    if spec.function is not None:
        return _compile_function(spec, label, problems)

    schema = compile_schema(spec.json_schema, spec.on_schema_error, base_dir, problems)
    conditions = _compile_conditions(spec.match or {}, "match", problems)
    rejects = _compile_conditions(spec.reject or {}, "reject", problems)
    emit, emit_reads_body = _compile_emit(spec.emit, problems)
    if problems:
        raise FilterSpecError(problems)
    reads_body = (
        emit_reads_body
        or schema is not None
        or any(c.path.reads_body for c in (*conditions, *rejects))
    )
    reject_invalid_json = (
        reads_body if spec.reject_invalid_json is None else spec.reject_invalid_json
    )
    return CompiledFilter(
        label=label,
        conditions=conditions,
        rejects=rejects,
        emit=emit,
        reads_body=reads_body or reject_invalid_json,
        reject_invalid_json=reject_invalid_json,
        schema=schema,
        emit_body=spec.emit is None or spec.emit == "body",
    )


def _compile_function(
    spec: FilterSpec, label: str, problems: list[tuple[ProblemPath, str]]
) -> CompiledFilter:
    path = spec.function
    assert path is not None
    mixed = [name for name in ("match", "reject", "emit") if getattr(spec, name) is not None]
    mixed += [name for name, v in (("schema", spec.json_schema),) if v is not None]
    for name in mixed:
        problems.append(
            ((name,), f"cannot be combined with function ({path}); the function decides alone")
        )
    try:
        fn = import_object(path)
    except ValueError as exc:
        problems.append((("function",), str(exc)))
        raise FilterSpecError(problems) from None
    if not callable(fn):
        problems.append((("function",), f"{path} is a {type(fn).__name__}, not a function"))
        raise FilterSpecError(problems)
    if inspect.isasyncgenfunction(fn):
        kind = "stream"
        bad = _check_signature(fn, 2, path, "an async generator fn(stream, watcher)")
        if spec.reject_invalid_json is not None:
            problems.append(
                (
                    ("reject_invalid_json",),
                    f"does not apply to the async generator {path}, which reads the stream itself",
                )
            )
    else:
        kind = "async" if inspect.iscoroutinefunction(fn) else "plain"
        bad = _check_signature(fn, 1, path, "fn(message)")
    if bad:
        problems.append((("function",), bad))
    if problems:
        raise FilterSpecError(problems)
    return CompiledFilter(
        label=label,
        reads_body=False,
        reject_invalid_json=True if spec.reject_invalid_json is None else spec.reject_invalid_json,
        function=fn,
        function_kind=kind,
    )
