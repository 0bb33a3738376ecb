"""The words of ``acklane_connector_actions{key,action}``: what a connector did on its broker."""

from __future__ import annotations

import enum

__all__ = ["Action"]


class Action(enum.StrEnum):
    """The action names a producer's ``counters()`` may use, and nothing else.

    Each counts messages (past participles) unless it says otherwise; a connector
    reports the ones that apply to its broker. A new action is added here, with its
    meaning, before a connector reports it.
    """

    #: Messages handed to the engine.
    DELIVERED = "delivered"
    #: Messages sent back to be delivered again: a seek back to a held message
    #: (Kafka), a release to the queue (SQS), a delivery after the first (memory).
    REDELIVERED = "redelivered"
    #: Failed or unclaimed messages that held their lane (nothing past them advanced).
    HELD = "held"
    #: Commits that landed (one per commit call, not per message).
    COMMITTED = "committed"
    #: Messages deleted from their queue.
    DELETED = "deleted"
    #: Rejected messages copied to the dead-letter destination.
    DEAD_LETTERED = "dead_lettered"
    #: Dead-letter copies the destination refused as too large (the original is kept).
    DEAD_LETTER_REFUSED = "dead_letter_refused"
    #: Rejected messages acted past with no dead-letter destination (lost on purpose).
    DROPPED = "dropped"
    #: Advanced messages of partitions this consumer no longer owns (left alone).
    SKIPPED_REVOKED = "skipped_revoked"
    #: Commits refused because the group was rebalancing (one per commit call).
    COMMIT_SKIPPED = "commit_skipped"
    #: Times fetching paused because too many messages were outstanding.
    PAUSED = "paused"
    #: Lease (visibility) extensions of messages the watchers still work on.
    EXTENDED = "extended"
    #: Unresolved messages whose lease was kept, at close, for the next producer.
    PARKED = "parked"
    #: Parked messages a producer took over from the previous one.
    TAKEN_OVER = "taken_over"
    #: Requests sent to the broker's API (what a pay-per-request broker bills).
    API_CALLS = "api_calls"
