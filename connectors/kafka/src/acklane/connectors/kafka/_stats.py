"""The counters of one Kafka stream producer (what its ``counters()`` reports)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["KafkaStreamStats"]


@dataclass(slots=True)
class KafkaStreamStats:
    """Counters of one producer, for tests, logs and metrics; each field is named by
    its :class:`~acklane.core.connectors.Action` (what ``counters()`` reports)."""

    delivered: int = 0  # records handed to the engine
    committed: int = 0  # successful commit calls
    held: int = 0  # failed / unclaimed records that held their partition
    sought_back: int = 0  # seeks back to a held offset
    dead_lettered: int = 0  # rejected records copied to the DLQ topic
    dead_letter_refused: int = 0  # DLQ copies refused as too large (the group fails on them)
    dropped: int = 0  # rejected records committed past with no DLQ topic
    skipped_revoked: int = 0  # advanced records of partitions no longer owned
    commit_skipped: int = 0  # commits refused because the group was rebalancing
    paused: int = 0  # times fetching paused at max_outstanding
