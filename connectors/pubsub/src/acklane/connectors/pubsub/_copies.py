"""The dead-letter copy of a rejected Pub/Sub message: its data, attributes and key.

The copy keeps the original's data, attributes and ordering key, and adds
acklane's origin and reason attributes (``DEAD_LETTER_ATTRIBUTES``); Pub/Sub
takes at most 100 attributes a message, so one with too many of its own cannot
be copied (an :class:`~acklane.core.errors.AdvanceError`: it is not acked).
"""

from __future__ import annotations

from typing import Any

from acklane.core.connectors.deadletter import (
    ORIGIN_MESSAGE_ID,
    ORIGIN_PREFIX,
    ORIGIN_QUEUE,
    ORIGIN_TOPIC,
    REJECT_REASON,
)
from acklane.core.errors import AdvanceError

from ._message import PubSubDelivery

__all__ = ["DEAD_LETTER_ATTRIBUTES", "MAX_ATTRIBUTES", "ORIGIN_PUBLISH_TIME", "dead_letter_copy"]

#: The publish time of the original message (RFC 3339), on a dead-letter copy.
ORIGIN_PUBLISH_TIME = ORIGIN_PREFIX + "publish_time"
#: The attributes acklane adds to a dead-letter copy.
DEAD_LETTER_ATTRIBUTES = (
    ORIGIN_TOPIC,
    ORIGIN_QUEUE,
    ORIGIN_MESSAGE_ID,
    ORIGIN_PUBLISH_TIME,
    REJECT_REASON,
)
#: Pub/Sub's limit of attributes per message.
MAX_ATTRIBUTES = 100


def dead_letter_copy(
    delivery: PubSubDelivery, topic: str, subscription: str, destination: str, reason: str
) -> Any:
    """The ``PubsubMessage`` to publish to ``destination`` for a rejected delivery."""
    from google.pubsub_v1 import types

    message = delivery.message
    ours = {
        ORIGIN_TOPIC: topic or "-",
        ORIGIN_QUEUE: subscription,
        ORIGIN_MESSAGE_ID: delivery.message_id,
        ORIGIN_PUBLISH_TIME: delivery.publish_stamp or "-",
        REJECT_REASON: reason,
    }
    attributes = {k: v for k, v in message.attributes.items() if k not in ours}
    if len(attributes) + len(ours) > MAX_ATTRIBUTES:
        raise AdvanceError(
            f"Pub/Sub message {delivery.message_id} on {subscription}: its {len(attributes)} "
            f"attributes and acklane's {len(ours)} exceed Pub/Sub's {MAX_ATTRIBUTES}; it "
            f"cannot be dead-lettered to {destination} (it is not acked and comes again)"
        )
    return types.PubsubMessage(
        data=message.body, attributes={**attributes, **ours}, ordering_key=message.key or ""
    )
