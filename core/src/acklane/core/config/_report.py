"""Problems reported as sentences at their line, and raised all at once.

pydantic's errors become one sentence each (:mod:`._messages`), the errors of a
union's members one sentence for the value, each bad key of a mapping field its own
problem; :func:`_raise` ends a parse with every problem found, secrets masked.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from ..observe.redact import redact
from ._errors import ConfigError, Loc
from ._messages import _describe, _field_names, _model_at
from ._secrets import _remember_secrets
from ._yaml import _Reader


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


def _raise(reader: _Reader, data: Any = None) -> NoReturn:
    """Raise the problems found, with every secret of the file masked in them."""
    _remember_secrets(reader, data)
    problems = [p._replace(message=redact(p.message)) for p in reader.problems]
    raise ConfigError(list(dict.fromkeys(problems)))
