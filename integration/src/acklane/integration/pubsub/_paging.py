"""The page tokens of the emulator's List calls: the offset of the next page, as text."""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def paginate(items: list[T], size: int, token: str) -> tuple[list[T], str]:
    """The page of ``items`` that ``token`` starts (``size`` 0: 1000), and the next token
    (empty on the last page)."""
    start = int(token) if token.isdigit() else 0
    size = size if size > 0 else 1000
    end = start + size
    return items[start:end], str(end) if end < len(items) else ""
