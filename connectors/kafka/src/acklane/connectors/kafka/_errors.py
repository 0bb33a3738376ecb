"""What the Kafka producer raises: a consume that failed, an advance that failed.

Apart from the producer's modules so that each of them (the commits, the
dead-letter copies, the cluster identity) raises them without importing another.
"""

from __future__ import annotations

from acklane.core.errors import AdvanceError, DeadLetterRefused, ReceiveError

__all__ = ["KafkaAdvanceError", "KafkaReceiveError"]


class KafkaReceiveError(ReceiveError):
    """Consuming failed: the group fails and the runner restarts it."""


class KafkaAdvanceError(AdvanceError):
    """A commit, dead-letter copy or seek failed: the group fails; the broker redelivers."""


class _Refused(KafkaAdvanceError, DeadLetterRefused):
    """The DLQ topic (or the DLQ producer) refused a copy as too large."""
