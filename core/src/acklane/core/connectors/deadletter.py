"""What a connector adds to a dead-letter copy: its names, and a reason bounded to fit.

A rejected message is copied to a dead-letter destination with a few words of
origin (headers on a log broker, message attributes on a queue) and the reasons
its watchers gave. Every connector takes the names from here, so a consumer of any
dead-letter destination reads the same ones.

The reasons are free text from user code; unbounded, they could push a copy that
was near the broker's size limit over it, and then the copy fails on every
redelivery. They may also quote what must not leave the process (a filter's error
naming a connection URL with its password, a token the configuration holds): the
text is redacted as a log line is (:func:`acklane.core.redact.redact`)
before it is bounded. Every connector builds its reason text here, so the bound,
the redaction and the default wording are the same everywhere.

:class:`DeadLetterStep` is the step itself, as every connector takes it: a reject
is copied, *then* settled; with no destination it is settled and counted dropped
(a warning names the setting that would have kept it); a copy the destination
refuses as too large is counted ``dead_letter_refused``, the original is kept and
the group fails with a :class:`~acklane.core.errors.DeadLetterRefused` naming
what to raise.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from ..errors import AdvanceError, DeadLetterRefused
from ..producer import reject_reasons_of
from ..redact import redact
from ._actions import Action

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
    "REDRIVE_COUNT",
    "REJECT_REASON",
    "TRUNCATED_MARK",
    "DeadLetterStep",
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
#: How many times ``acklane dlq redrive`` sent the message back to its source, in decimal.
#: A redriven copy carries it; a dead-letter copy keeps it (it is one of the original's).
REDRIVE_COUNT = "acklane.redrive.count"

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
    none gave a reason). The result is redacted, then at most :data:`REASON_MAX_BYTES`
    bytes (redacted first: a cut could split a secret so it is no longer recognised).
    """
    text = redact("; ".join(r for r in reasons if r))
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


class DeadLetterStep:
    """The counts and the words of one producer's dead-letter step (see the module).

    ``broker`` and ``source`` start every line (``"SQS"``, the queue URL);
    ``destination`` is where copies go (``None``: nowhere, rejects are dropped);
    ``setting`` is the field that names it (``dead_letter``). A connector
    whose callers catch its own error classes passes them as ``refused_error`` and
    ``failed_error``.
    """

    def __init__(
        self,
        broker: str,
        source: str,
        destination: str | None,
        setting: str,
        *,
        logger: logging.Logger | None = None,
        refused_error: type[DeadLetterRefused] = DeadLetterRefused,
        failed_error: type[AdvanceError] = AdvanceError,
    ) -> None:
        self._refused_error = refused_error
        self._failed_error = failed_error
        self.broker = broker
        self.source = source
        self.destination = destination
        self.setting = setting
        self._log = logger or logging.getLogger("acklane.connectors")
        #: Rejects copied to the destination.
        self.dead_lettered = 0
        #: Rejects settled with no destination (lost on purpose).
        self.dropped = 0
        #: Copies refused as too large (the original is kept, the group fails).
        self.refused = 0

    def announce(self, settled: str, instead: str | None = None) -> None:
        """Tell, at start, what becomes of rejects without a destination: ``instead``
        (INFO: the broker's own dead-lettering), else settled (``settled``: the
        broker's word) and dropped (WARNING)."""
        if self.destination is not None:
            return
        if instead is not None:
            self._log.info("%s %s: rejected messages are %s", self.broker, self.source, instead)
            return
        self._log.warning(
            "%s %s has no dead-letter destination (%s, or the broker's own policy): "
            "rejected messages will be %s and counted as dropped",
            self.broker,
            self.source,
            self.setting,
            settled,
        )

    def drop(self, message_id: str, reason: str, *, why: str = "") -> None:
        """A reject settled without a copy: counted and told (WARNING)."""
        self.dropped += 1
        self._log.warning(
            "%s message %s from %s rejected (%s) and DROPPED: %s",
            self.broker,
            message_id,
            self.source,
            reason,
            why or f"no dead-letter destination (set {self.setting})",
        )

    def copied(self, message_id: str, reason: str, count: int = 1) -> None:
        """``count`` copies landed (the rejects may be settled now)."""
        self.dead_lettered += count
        self._log.info(
            "%s message %s from %s rejected (%s): sent to dead-letter destination %s",
            self.broker,
            message_id,
            self.source,
            reason,
            self.destination,
        )

    def too_large(
        self,
        message_id: str,
        size: int,
        limit: int | str | None,
        *,
        raise_: Sequence[str],
        said: str = "",
        kept: str = "",
    ) -> DeadLetterRefused:
        """A copy refused for its size: counted, told (ERROR); returns the error to raise.

        ``raise_`` names the limits to raise (settings, or the destination's own);
        ``said`` is what the broker answered; ``kept`` what becomes of the original.
        """
        most = f"at most {limit} bytes" if limit is not None else "less"
        text = (
            f"{self.broker} dead-letter destination {self.destination} cannot take the copy "
            f"of rejected message {message_id} from {self.source}: the copy is {size} bytes "
            f"and it takes {most}{f' ({said})' if said else ''}. Raise "
            f"{' and/or '.join(raise_)}. The message is not settled"
            f"{f': {kept}' if kept else ''}; it fails its group each time it is rejected"
        )
        return self.refuse(text, settings=raise_)

    def refuse(
        self, text: str, *, settings: Sequence[str] = (), count: int = 1
    ) -> DeadLetterRefused:
        """``count`` copies refused for their size, in the connector's own words (ERROR)."""
        self.refused += count
        self._log.error("%s", text)
        return self._refused_error(text, settings=tuple(settings))

    def failed(self, message_id: str, why: str) -> AdvanceError:
        """A copy that did not land for another reason: the error to raise."""
        return self._failed_error(
            f"{self.broker} dead-letter destination {self.destination}: the copy of rejected "
            f"message {message_id} from {self.source} was not sent: {why}; it was not settled"
        )

    def counters(self) -> dict[str, float]:
        return {
            Action.DEAD_LETTERED: self.dead_lettered,
            Action.DEAD_LETTER_REFUSED: self.refused,
            Action.DROPPED: self.dropped,
        }
