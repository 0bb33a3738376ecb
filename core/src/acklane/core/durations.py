"""Durations as the configuration and the CLI accept them: seconds, or ``7d``, ``12h``...

A number is seconds. A string is a number followed by a unit: ``s`` (seconds), ``m``
(minutes), ``h`` (hours), ``d`` (days) or ``w`` (weeks), such as ``90s``, ``15m``,
``12h``, ``7d``, ``1.5d``; a bare number in a string is seconds too.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Final

from pydantic import BeforeValidator

__all__ = ["Duration", "format_duration", "parse_duration"]

_UNITS: Final = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PATTERN: Final = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([smhdw]?)\s*$", re.IGNORECASE)


def parse_duration(value: object) -> float:
    """Seconds of ``value`` (a number of seconds, or text such as ``"7d"``).

    Raises :class:`ValueError` with a message that says what is accepted; booleans,
    negative, infinite and NaN values are refused.
    """
    if isinstance(value, bool):
        raise ValueError(_expected(value))
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        match = _PATTERN.match(value)
        if match is None:
            raise ValueError(_expected(value))
        seconds = float(match.group(1)) * _UNITS[(match.group(2) or "s").lower()]
    else:
        raise ValueError(_expected(value))
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(_expected(value))
    return seconds


def format_duration(seconds: float) -> str:
    """A short text for a number of seconds: ``7d``, ``12h``, ``90s``, ``1.5h``."""
    for unit in ("w", "d", "h", "m"):
        size = _UNITS[unit]
        if seconds >= size and (seconds / size) == round(seconds / size, 1):
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def _expected(value: object) -> str:
    return (
        f"expected a duration: seconds (a number >= 0) or a number with a unit s, m, h, "
        f"d or w such as '12h' or '7d', got {value!r}"
    )


#: A duration field of a pydantic model: seconds, or a number with a unit ("90s",
#: "15m", "12h", "7d", "2w").
Duration = Annotated[float, BeforeValidator(parse_duration)]
