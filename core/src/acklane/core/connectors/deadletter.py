"""What a connector adds to a dead-letter copy: its names, and a reason bounded to fit.

A rejected message is copied to a dead-letter destination with a few words of
origin (headers on a log broker, message attributes on a queue) and the reasons
its watchers gave. Every connector takes the names from here, so a consumer of any
dead-letter destination reads the same ones.

The reasons are free text from user code; unbounded, they could push a copy that
was near the broker's size limit over it, and then the copy fails on every
redelivery. Every connector builds its reason text here, so the bound and the
default wording are the same everywhere.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..producer import reject_reasons_of

if TYPE_CHECKING:
    from ..producer import AdvanceOutcome

__all__ = [
    "ORIGIN_GROUP",
    "ORIGIN_MESSAGE_ID",
    "ORIGIN_OFFSET",
    "ORIGIN_PARTITION",
    "ORIGIN_PREFIX",
    "ORIGIN_QUEUE",
    "ORIGIN_TOPIC",
    "REASON_MAX_BYTES",
    "REJECT_REASON",
    "TRUNCATED_MARK",
    "bounded_text",
    "log_origin",
    "outcome_reason",
    "reject_reason",
]

#: Every origin name starts so: where the copied message came from.
ORIGIN_PREFIX = "acklane.origin."
#: The topic of a log broker's message (Kafka, memory).
ORIGIN_TOPIC = ORIGIN_PREFIX + "topic"
#: Its partition, in decimal.
ORIGIN_PARTITION = ORIGIN_PREFIX + "partition"
#: Its offset, in decimal.
ORIGIN_OFFSET = ORIGIN_PREFIX + "offset"
#: The consumer group that rejected it (Kafka).
ORIGIN_GROUP = ORIGIN_PREFIX + "group"
#: The queue a queue broker's message came from (SQS: its URL).
ORIGIN_QUEUE = ORIGIN_PREFIX + "queue"
#: The broker's own id of the message there (SQS: its ``MessageId``).
ORIGIN_MESSAGE_ID = ORIGIN_PREFIX + "message_id"
#: Why: the watchers' reasons joined with ``"; "``, see :func:`reject_reason`.
REJECT_REASON = "acklane.reject.reason"

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


def outcome_reason(outcome: AdvanceOutcome) -> str:
    """The reason text of a dead-letter copy of a message that resolved as ``outcome``.

    Airflow's ``AdvanceOutcome`` (no ``reject_reasons``) gives the default text.
    """
    return reject_reason(reject_reasons_of(outcome), outcome.rejected)


def log_origin(topic: str, partition: int, offset: int) -> list[tuple[str, str]]:
    """The origin names and values of a log broker's message: topic, partition, offset."""
    return [
        (ORIGIN_TOPIC, topic),
        (ORIGIN_PARTITION, str(partition)),
        (ORIGIN_OFFSET, str(offset)),
    ]
