"""What a producer does with one resolved message: the one rule every connector follows."""

from __future__ import annotations

import enum

from ..producer import AdvanceOutcome

__all__ = ["Verdict", "verdict"]


class Verdict(enum.Enum):
    """What to do on the broker with one resolved message."""

    #: Every watcher accepted it: ack, delete, commit past it.
    COMMIT = "commit"
    #: A watcher rejected it and none failed: copy it to the dead-letter destination
    #: (or, with none, count it dropped), then act as for :attr:`COMMIT`.
    DEAD_LETTER = "dead_letter"
    #: A watcher failed, or nobody received it: never act past it; it comes again
    #: (a nack, a release, a hold of its lane and a seek back).
    REDELIVER = "redeliver"


def verdict(outcome: AdvanceOutcome) -> Verdict:
    """The verdict of an outcome.

    Failed by any watcher, or accepted by nobody (``acked == rejected == 0``):
    :attr:`Verdict.REDELIVER`; else rejected by any: :attr:`Verdict.DEAD_LETTER`;
    else (``outcome.is_clean``): :attr:`Verdict.COMMIT`. A failure outweighs a
    rejection: a message is dead-lettered only once every watcher has decided.
    """
    if outcome.is_clean:
        return Verdict.COMMIT
    if outcome.failed > 0 or outcome.rejected == 0:
        return Verdict.REDELIVER
    return Verdict.DEAD_LETTER
