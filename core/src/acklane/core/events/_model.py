"""What the event store takes and gives back, and the checks a record passes at ``put``."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NoReturn

import msgspec

__all__ = [
    "MAX_MESSAGE_ID_BYTES",
    "MAX_POSITION",
    "EncodedRow",
    "EventRecord",
    "StoredEvent",
    "checked_message_id",
    "encode_fields",
    "encode_payload",
    "encode_record",
    "storable_message_id",
    "storable_pair",
    "storable_stream_key",
]

# The largest value of the INTEGER ``position`` column on both backends.
MAX_POSITION = 2**31 - 1
# The indexed text columns stay below PostgreSQL's b-tree entry limit (2704 bytes)
# together: the dedupe index holds all three, plus the position.
MAX_TRIGGER_ID_BYTES = 512
MAX_MESSAGE_ID_BYTES = 1024
MAX_STREAM_KEY_BYTES = 1024


@dataclass(frozen=True, slots=True)
class EventRecord:
    """One trigger event to persist, bound to the upstream message it came from."""

    trigger_id: str
    #: Text form of the shared stream key. Part of the dedupe scope: a message id is
    #: only trusted within the stream it came from.
    stream_key: str
    #: A JSON value (dict, list, str, int, float, bool, None).
    payload: Any
    #: Upstream message identity (unique per connector: see docs/connectors), or None.
    message_id: str | None
    #: 0-based index among the trigger events this trigger yielded for that message.
    position: int


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """One persisted trigger event, as read back from the store."""

    id: int
    trigger_id: str
    stream_key: str
    payload: Any
    message_id: str | None
    position: int
    #: When the batch holding the event was written (tz-aware, UTC).
    created_at: datetime


# A record ready for the INSERT: (trigger_id, stream_key, payload JSON, message_id, position).
EncodedRow = tuple[str, str, str, str | None, int]


def encode_record(record: EventRecord) -> EncodedRow:
    """Check a record and serialize its payload; raise before anything is queued.

    A payload that is not a JSON value raises :class:`TypeError` naming the trigger
    and the offending type (and where in the payload it sits). Text fields must be
    strings that every backend can store (valid UTF-8, no NUL character), so that a
    batch can never be refused by the database for its content and block the writer.
    """
    if not isinstance(record, EventRecord):
        raise TypeError(f"EventStore.put() takes an EventRecord, not {type(record).__qualname__}")
    return encode_fields(
        record.trigger_id, record.stream_key, record.payload, record.message_id, record.position
    )


def encode_fields(
    trigger_id: str, stream_key: str, payload: Any, message_id: str | None, position: int
) -> EncodedRow:
    """:func:`encode_record` of a record's fields, without the record (the same checks)."""
    # A watcher puts every event with the same two: checked once (while they are
    # exact strs, so that the lookup itself cannot fail), then found here.
    pair = (trigger_id, stream_key)
    storable_key = (
        _CHECKED_PAIRS.get(pair) if type(trigger_id) is str and type(stream_key) is str else None
    )
    if storable_key is None:
        storable_key = _check_pair(trigger_id, stream_key)
    if message_id is not None:
        message_id = checked_message_id(trigger_id, message_id)
    if type(position) is not int or not 0 <= position <= MAX_POSITION:
        raise ValueError(
            f"trigger {trigger_id!r}: position must be an int in [0, {MAX_POSITION}], "
            f"not {position!r}"
        )
    return (trigger_id, storable_key, encode_payload(trigger_id, payload), message_id, position)


def checked_message_id(trigger_id: str, message_id: Any) -> str:
    """A record's message id as stored (see :func:`storable_message_id`); TypeError
    when it is not a str."""
    if not isinstance(message_id, str):
        raise TypeError(
            f"trigger {trigger_id!r}: message_id must be a str or None, "
            f"not {type(message_id).__qualname__}"
        )
    return storable_message_id(message_id)


def encode_payload(trigger_id: str, payload: Any) -> str:
    """The JSON text of a record's payload; :class:`TypeError` (naming the trigger and
    where the offending value sits) when it is not a JSON value."""
    # Only JSON values are stored, exactly: a read gives back what was put. Checked
    # first, since both encoders quietly take more (tuples as arrays, int keys as
    # strings; msgspec also NaN as null, datetimes, dataclasses...).
    try:
        strict = _is_strict_json(payload)
    except RecursionError:
        strict = False
    if not strict:
        _payload_error(trigger_id, payload)
    try:
        return _fast_dumps(payload).decode()
    except (TypeError, ValueError, UnicodeDecodeError, RecursionError):
        # what msgspec refuses (a lone surrogate, an int subclass, too deep) the
        # standard library decides, as before
        try:
            return _ENCODER.encode(payload)
        except (TypeError, ValueError, RecursionError):
            _payload_error(trigger_id, payload)


def storable_pair(trigger_id: str, stream_key: str) -> str:
    """Check a record's trigger id and stream key (as :func:`encode_fields` does); the
    storable stream key. Remembered for exact strs, so a second call is one lookup."""
    if type(trigger_id) is str and type(stream_key) is str:
        found = _CHECKED_PAIRS.get((trigger_id, stream_key))
        if found is not None:
            return found
    return _check_pair(trigger_id, stream_key)


# (trigger_id, stream_key) already checked -> the storable stream key. Bounded.
_CHECKED_PAIRS: dict[tuple[str, str], str] = {}
_CHECKED_PAIRS_MAX = 4096


def _check_pair(trigger_id: Any, stream_key: Any) -> str:
    """Check a record's trigger id and stream key; the storable stream key."""
    _check_text("trigger_id", trigger_id, trigger_id, max_bytes=MAX_TRIGGER_ID_BYTES)
    if not trigger_id:
        raise ValueError("trigger_id must not be empty")
    _check_text("stream_key", stream_key, trigger_id, max_bytes=None)
    storable = storable_stream_key(stream_key)
    if (
        type(trigger_id) is str
        and type(stream_key) is str
        and len(_CHECKED_PAIRS) < _CHECKED_PAIRS_MAX
    ):
        _CHECKED_PAIRS[(trigger_id, stream_key)] = storable
    return storable


def _refuse(obj: object) -> NoReturn:
    raise TypeError(type(obj).__qualname__)


# One encoder for all: json.dumps with options builds a new one per call.
_ENCODER = json.JSONEncoder(allow_nan=False, separators=(",", ":"), default=_refuse)
# msgspec's encoder (docs/engine.md, "JSON"): compact like _ENCODER, several times
# faster; given only what _is_strict_json passed. Its text keeps non-ASCII
# characters as UTF-8 where json.dumps escapes them: the same value once read.
_fast_dumps = msgspec.json.Encoder().encode


def storable_message_id(message_id: str) -> str:
    """``message_id`` itself, or ``sha256:<hex>`` of it when the database could not
    store or index it (longer than MAX_MESSAGE_ID_BYTES, a NUL, broken unicode).

    The id only serves equality, and the digest keeps it: a redelivered copy still
    maps to the same row, and no broker's odd id can make a batch fail forever.
    """
    return _storable(message_id, MAX_MESSAGE_ID_BYTES)


def storable_stream_key(stream_key: str) -> str:
    """``stream_key`` itself, or ``sha256:<hex>`` of it when it is longer than
    MAX_STREAM_KEY_BYTES (many topics or brokers): the key is part of the dedupe
    index, whose entries PostgreSQL bounds. Equality, hence dedupe, is kept; reads
    filtering on a stream key map it the same way."""
    return _storable(stream_key, MAX_STREAM_KEY_BYTES)


def _storable(value: str, max_bytes: int) -> str:
    if value.isascii():
        if len(value) <= max_bytes and "\x00" not in value:
            return value
        raw = value.encode("ascii")
    else:
        try:
            raw = value.encode("utf-8")
            if len(raw) <= max_bytes and "\x00" not in value:
                return value
        except UnicodeEncodeError:
            raw = value.encode("utf-8", "surrogatepass")
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def _check_text(field: str, value: object, trigger_id: object, *, max_bytes: int | None) -> None:
    if not isinstance(value, str):
        raise TypeError(
            f"trigger {trigger_id!r}: {field} must be a str, not {type(value).__qualname__}"
        )
    if "\x00" in value:
        raise ValueError(f"trigger {trigger_id!r}: {field} contains a NUL character")
    size = len(value)
    if not value.isascii():
        try:
            size = len(value.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise ValueError(
                f"trigger {trigger_id!r}: {field} is not valid unicode text ({exc.reason})"
            ) from None
    if max_bytes is not None and size > max_bytes:
        raise ValueError(
            f"trigger {trigger_id!r}: {field} is {size} bytes long, more than {max_bytes}"
        )


# (float is not one: it must be finite, checked on its own)
_SCALARS = frozenset((str, int, bool, type(None)))


def _is_strict_json(value: Any) -> bool:
    """True only for a JSON value: dicts with str keys, lists, str, int, finite float,
    bool, None (str/int/float subclasses, enums say, included, as json.dumps takes
    them); False for a tuple, a non-str key, NaN/Infinity, any other type."""
    kind = type(value)
    if kind in _SCALARS:
        return True
    if kind is float:
        return bool(value - value == 0.0)  # finite (NaN and the infinities give NaN)
    if kind is dict or isinstance(value, dict):
        for key, child in value.items():
            if type(key) is not str and not isinstance(key, str):
                return False
            if type(child) not in _SCALARS and not _is_strict_json(child):
                return False
        return True
    if kind is list or isinstance(value, list):
        for child in value:
            if type(child) not in _SCALARS and not _is_strict_json(child):
                return False
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, str | int)


def _payload_error(trigger_id: str, payload: Any) -> NoReturn:
    path, reason = _find_non_json(payload, "payload", 0) or ("payload", "cannot be serialized")
    raise TypeError(
        f"trigger {trigger_id!r}: payload is not a JSON value: {path} {reason} "
        "(allowed: dict with str keys, list, str, int, finite float, bool, None)"
    ) from None


def _find_non_json(value: Any, path: str, depth: int) -> tuple[str, str] | None:
    """Where the first non-JSON part of ``value`` sits and what it is, e.g.
    ``("payload['rows'][3]", "is a datetime")``."""
    if depth > 200:
        return path, "nests deeper than 200 levels (circular?)"
    if value is None or isinstance(value, str | bool | int):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else (path, f"is a float {value!r}")
    if isinstance(value, dict):
        for key, child in value.items():
            if not isinstance(key, str):
                return path, f"has a key {key!r} of type {type(key).__qualname__}"
            found = _find_non_json(child, f"{path}[{key!r}]", depth + 1)
            if found:
                return found
        return None
    if isinstance(value, list):
        for index, child in enumerate(value):
            found = _find_non_json(child, f"{path}[{index}]", depth + 1)
            if found:
                return found
        return None
    return path, f"is a {type(value).__qualname__}"
