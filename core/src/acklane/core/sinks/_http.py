"""What the HTTP sinks (``webhook``, ``airflow``) share at their boundary with a server
they do not control: how much of an answer they read, and how long a ``Retry-After``
may hold an event back.

A receiver's answer is untrusted input. Its body is read up to a limit, never whole
(an error page of 200 MB would otherwise sit in memory, and a body that never ends
would hold the sink until its timeout); its ``Retry-After`` is capped at the sink's
``backoff_max`` (``Retry-After: 99999999999`` would park nothing and hold an ordered
sink for millennia; 400 digits would not even make a finite number of seconds).
"""

from __future__ import annotations

import email.utils
import re
import time
from datetime import UTC
from typing import Final

import aiohttp

__all__ = ["parse_retry_after", "read_up_to"]

# delta-seconds, a fraction accepted too; ASCII digits only (\d would take "٣")
_SECONDS: Final = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*")


def parse_retry_after(value: str | None, *, cap: float, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` value, at most ``cap``: delta-seconds
    (``120``) or an HTTP date (``Wed, 21 Oct 2026 07:28:00 GMT``; 0 once it has
    passed). None when absent or unreadable (a negative number, digits of another
    script), so the sink's own backoff applies."""
    if value is None:
        return None
    match = _SECONDS.fullmatch(value)
    if match is not None:
        seconds = float(match.group(1))  # inf for hundreds of digits: capped below
    else:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        if when.tzinfo is None:  # HTTP dates are GMT
            when = when.replace(tzinfo=UTC)
        current = time.time() if now is None else now
        seconds = max(0.0, when.timestamp() - current)
    return min(seconds, cap)  # neither form can be NaN


async def read_up_to(response: aiohttp.ClientResponse, limit: int) -> tuple[bytes, bool]:
    """At most ``limit`` bytes of ``response``'s body, and whether there was more.

    What is left unread stays in the socket: leaving the response's ``async with``
    then closes the connection instead of returning it to the pool, so the rest is
    never received."""
    chunks: list[bytes] = []
    left = limit + 1  # one byte past the limit tells "more" from "exactly limit"
    while left > 0:
        chunk = await response.content.read(left)
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    raw = b"".join(chunks)
    return raw[:limit], len(raw) > limit
