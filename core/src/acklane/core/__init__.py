"""acklane's engine: shared upstream polls with a producer-side ack channel.

The public names keep Apache Airflow 3.3's shapes, so a producer or a trigger
written for one runs under the other.
"""

from .manager import BoundEvent, GroupStats, SharedStreamManager
from .message import BodyDecodeError, RawMessage
from .producer import AdvanceItem, AdvanceOutcome, SharedStreamProducer
from .trigger import (
    AckTimeout,
    BaseEventTrigger,
    SharedStreamError,
    StreamEnded,
    SubscriberOverflow,
    TriggerEvent,
    reject_shared_stream_event,
)

__all__ = [
    "AckTimeout",
    "AdvanceItem",
    "AdvanceOutcome",
    "BaseEventTrigger",
    "BodyDecodeError",
    "BoundEvent",
    "GroupStats",
    "RawMessage",
    "SharedStreamError",
    "SharedStreamManager",
    "SharedStreamProducer",
    "StreamEnded",
    "SubscriberOverflow",
    "TriggerEvent",
    "reject_shared_stream_event",
]
