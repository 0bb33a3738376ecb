"""Pydantic's validation errors rewritten as plain sentences: "expected X, got Y"."""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Union

from pydantic import BaseModel
from pydantic_core import ErrorDetails

from ..names import NAME_PATTERN
from ._errors import Loc
from ._models import _NAME_RULE


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
