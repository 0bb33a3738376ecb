"""What may be stored: keys, JSON values, and the errors that refuse everything else.

Validation happens before anything touches a backend, so a refused value never
leaves a partial write behind. Values must round-trip exactly: a tuple would come
back as a list and a datetime as nothing at all, so they are refused with a hint
rather than silently converted.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeAlias, cast

from ._errors import (
    InvalidKeyError,
    InvalidValueError,
    ValueTooLargeError,
    ValueTypeError,
    _type_name,
)

__all__ = [
    "MAX_KEY_LENGTH",
    "MAX_NESTING",
    "EncodedValue",
    "JsonInput",
    "JsonValue",
    "decode_value",
    "encode_value",
    "validate_key",
]

JsonValue: TypeAlias = "str | int | float | bool | list[JsonValue] | dict[str, JsonValue] | None"
"""A JSON value as the stores return it."""

JsonInput: TypeAlias = (
    "str | int | float | bool | Sequence[JsonInput] | Mapping[str, JsonInput] | None"
)
"""What ``set`` accepts statically (covariant, so ``dict[str, list[str]]`` fits); at run
time only ``list`` and ``dict`` pass, since a tuple would not come back as one."""

MAX_KEY_LENGTH = 512
MAX_NESTING = 200


def validate_key(key: object) -> str:
    """Return ``key`` if it can name a value: a non-empty str of at most 512 characters."""
    if type(key) is not str:
        raise TypeError(f"state key must be a str, got {_type_name(key)}: {key!r}")
    if not key:
        raise InvalidKeyError("state key must not be empty")
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidKeyError(
            f"state key {key[:40]!r}... is {len(key)} characters long; at most "
            f"{MAX_KEY_LENGTH} are allowed"
        )
    if "\x00" in key:
        raise InvalidKeyError(f"state key {key!r} contains a NUL character")
    try:
        key.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidKeyError(
            f"state key {key!r} is not valid Unicode (lone surrogate at {exc.start})"
        ) from None
    return key


@dataclass(frozen=True, slots=True)
class EncodedValue:
    """A validated value with its canonical JSON text and that text's size in UTF-8 bytes."""

    value: JsonValue
    text: str
    nbytes: int


def _hint_for(obj: object) -> str:
    if isinstance(obj, tuple):
        return "store a list instead"
    if isinstance(obj, set | frozenset):
        return "store a sorted list instead"
    if isinstance(obj, bytes | bytearray | memoryview):
        return "decode it to str or base64-encode it"
    if isinstance(obj, _dt.datetime | _dt.date | _dt.time):
        return "store an ISO-8601 string (value.isoformat())"
    if isinstance(obj, _dt.timedelta):
        return "store a number of seconds (value.total_seconds())"
    if isinstance(obj, decimal.Decimal):
        return "store a str (exact) or a float"
    return "convert it to a JSON type first"


def _path_item(path: str, key: str) -> str:
    if key.isidentifier():
        return f"{path}.{key}"
    return f"{path}[{json.dumps(key, ensure_ascii=False)}]"


def _check(key: str, obj: object, path: str, depth: int, active: set[int]) -> None:
    t = type(obj)
    if t is str or t is bool or t is int:
        return
    if t is float:
        if not math.isfinite(cast(float, obj)):
            raise InvalidValueError(key, path, f"{obj!r} is not a JSON number")
        return
    if obj is None:
        if depth == 0:
            raise InvalidValueError(
                key, path, "None cannot be stored as a value (use delete() to remove the key)"
            )
        return
    if t is list or t is dict:
        if depth >= MAX_NESTING:
            raise InvalidValueError(key, path, f"nested deeper than {MAX_NESTING} levels")
        ident = id(obj)
        if ident in active:
            raise InvalidValueError(key, path, "contains a reference cycle")
        active.add(ident)
        if t is list:
            for index, item in enumerate(cast(list[object], obj)):
                _check(key, item, f"{path}[{index}]", depth + 1, active)
        else:
            for name, item in cast(dict[object, object], obj).items():
                if type(name) is not str:
                    raise ValueTypeError(
                        key,
                        path,
                        name,
                        f"dict key {name!r} is not a str: JSON object keys must be strings",
                    )
                _check(key, item, _path_item(path, name), depth + 1, active)
        active.discard(ident)
        return
    raise ValueTypeError(key, path, obj, _hint_for(obj))


def encode_value(key: str, value: object, *, max_bytes: int | None) -> EncodedValue:
    """Validate ``value`` for ``key`` and encode it; raise if it cannot be stored exactly.

    ``max_bytes=None`` skips the size limit (the caller offloads large values).
    """
    _check(key, value, "$", 0, set())
    text = json.dumps(
        value, ensure_ascii=False, separators=(",", ":"), allow_nan=False, check_circular=False
    )
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = exc.object[exc.start : exc.end]
        raise InvalidValueError(
            key, "$", f"contains a string that is not valid Unicode (lone surrogate {bad!r})"
        ) from None
    if max_bytes is not None and len(data) > max_bytes:
        raise ValueTooLargeError(key, len(data), max_bytes)
    return EncodedValue(value=cast(JsonValue, value), text=text, nbytes=len(data))


def decode_value(text: str) -> JsonValue:
    """Decode JSON text written by :func:`encode_value`."""
    value: JsonValue = json.loads(text)
    return value
