"""The AMQP details the SDK relies on: addresses as entity paths, the shapes its
values come in (arrays, lock tokens as UUIDs, text), timestamps, and batches (a
message whose data sections are messages).
"""

from __future__ import annotations

import urllib.parse
import uuid
from typing import Any

from proton import (
    Array,
    Data,
    timestamp,
)

from ._broker import decode_message

__all__ = ["split_batch"]

_DOTNET_EPOCH_TICKS = 621355968000000000
_DATA_SECTION = 0x75
_SECTION_PREFIX = b"\x00\x53"


def _path_of(address: str | None) -> str:
    if not address:
        return ""
    if "://" in address:
        return urllib.parse.urlparse(address).path.strip("/")
    return address.strip("/")


def _values(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, Array):
        return list(value.elements)
    if isinstance(value, list | tuple):
        return list(value)
    return [value]


def _uuid(value: Any) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return uuid.UUID(bytes_le=bytes(value))
    return uuid.UUID(str(value))


def _text(value: Any) -> str:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", errors="replace")
    return "" if value is None else str(value)


def _ms(seconds: float) -> timestamp:
    return timestamp(int(seconds * 1000))


def split_batch(raw: bytes) -> list[bytes] | None:
    """The encoded messages of a batch (a message whose data sections are messages), else None."""
    parts: list[bytes] = []
    sections = 0
    offset = 0
    while offset < len(raw):
        data = Data()
        try:
            used = data.decode(raw[offset:])
        except Exception:
            return None
        offset += used
        data.rewind()
        if data.next() != Data.DESCRIBED:
            return None
        data.enter()
        data.next()
        # only the descriptor is read: a section's value may be one proton cannot turn
        # into Python objects (see decode_message)
        descriptor = int(data.get_ulong()) if data.type() == Data.ULONG else -1
        sections += 1
        if descriptor == _DATA_SECTION:
            data.next()
            if data.type() != Data.BINARY:
                return None
            body = bytes(data.get_binary())
            if not body.startswith(_SECTION_PREFIX):
                return None
            parts.append(body)
        elif descriptor in (0x74, 0x77, 0x76):  # application properties or a non-data body
            return None
    if not parts:
        return None
    for part in parts:
        try:
            decode_message(part)
        except Exception:
            return None
    return parts
