"""The words of ``acklane_connector_actions{key,action}``: what a connector did on its broker."""

from __future__ import annotations

import enum

__all__ = ["Action"]


class Action(enum.StrEnum):
    """The action names a producer's ``counters()`` may use, and nothing else.

    Each word means one thing on every broker that reports it, and counts messages
    (past participles) unless it says otherwise; a connector reports the ones that
    apply to its broker. Where brokers name one step differently (an SQS delete, a
    Pub/Sub ack, a Service Bus complete), each has its own word rather than one
    word meaning three things. A new action is added here, with its meaning, before
    a connector reports it.
    """

    #: Messages handed to the engine (deliveries after the first included).
    DELIVERED = "delivered"
    #: Messages given back to the broker to be delivered again: released (SQS,
    #: visibility changed), nacked (Pub/Sub), abandoned (Service Bus).
    REDELIVERED = "redelivered"
    #: Seeks back to a held offset (Kafka, memory), one per partition each time: the
    #: held record and the records after it are delivered again.
    SOUGHT_BACK = "sought_back"
    #: Failed or unclaimed messages that held their lane (nothing past them advanced),
    #: and the messages held behind them.
    HELD = "held"
    #: Commits that landed (one per commit call, not per message).
    COMMITTED = "committed"
    #: Messages deleted from their queue (SQS).
    DELETED = "deleted"
    #: Messages acknowledged (Pub/Sub).
    ACKED = "acked"
    #: Messages completed (Service Bus).
    COMPLETED = "completed"
    #: Rejected messages copied to the dead-letter destination (or, on Service Bus,
    #: moved to the entity's dead-letter sub-queue).
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
    #: Lease (visibility, ack deadline, lock) extensions of messages the watchers
    #: still work on.
    EXTENDED = "extended"
    #: Messages whose lease (lock) was lost before they were settled: the broker
    #: delivers them again by itself.
    LEASE_LOST = "lease_lost"
    #: Unresolved messages whose lease was kept, at close, for the next producer.
    PARKED = "parked"
    #: Parked messages a producer took over from the previous one.
    TAKEN_OVER = "taken_over"
    #: Requests sent to the broker's API (what a pay-per-request broker bills).
    API_CALLS = "api_calls"
