"""What a connector adds to a dead-letter copy, bounded so that the copy still fits.

A rejected message is copied to a dead-letter destination with a few words of
origin and the reasons its watchers gave. The reasons are free text from user
code; unbounded, they could push a copy that was near the broker's size limit
over it, and then the copy fails on every redelivery. Every connector builds its
reason text here, so the bound and the default wording are the same everywhere.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["REASON_MAX_BYTES", "TRUNCATED_MARK", "bounded_text", "reject_reason"]

#: The most bytes (UTF-8) of reason text a dead-letter copy carries.
REASON_MAX_BYTES = 1024
#: Ends a reason that was cut to :data:`REASON_MAX_BYTES`.
TRUNCATED_MARK = "...[truncated]"


def bounded_text(text: str, limit: int = REASON_MAX_BYTES) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes, marked when cut (never mid-character)."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    mark = TRUNCATED_MARK.encode("utf-8")
    keep = data[: max(0, limit - len(mark))].decode("utf-8", errors="ignore")
    return keep + TRUNCATED_MARK


def reject_reason(reasons: Iterable[str], rejected: int) -> str:
    """The reason text of a dead-letter copy: the watchers' reasons, or a default.

    ``rejected`` is how many watchers rejected the message (it names them when
    none gave a reason). The result is at most :data:`REASON_MAX_BYTES` bytes.
    """
    text = "; ".join(r for r in reasons if r)
    if not text:
        text = f"rejected by {rejected} watcher{'' if rejected == 1 else 's'}"
    return bounded_text(text)
