"""acklane's engine: shared upstream polls with a producer-side ack channel.

The public names keep Apache Airflow 3.3's shapes, so a producer or a trigger
written for one runs under the other.
"""

from .errors import (
    AcklaneError,
    ConfigError,
    ConnectorError,
    SharedStreamError,
    StateStoreError,
)
from .manager import BoundEvent, GroupStats, SharedStreamManager
from .message import BodyDecodeError, RawMessage
from .producer import AdvanceItem, AdvanceOutcome, SharedStreamProducer
from .trigger import (
    AckTimeout,
    BaseEventTrigger,
    StreamEnded,
    SubscriberOverflow,
    TriggerEvent,
    reject_shared_stream_event,
)

__all__ = [
    "AckTimeout",
    "AcklaneError",
    "AdvanceItem",
    "AdvanceOutcome",
    "BaseEventTrigger",
    "BodyDecodeError",
    "BoundEvent",
    "ConfigError",
    "ConnectorError",
    "GroupStats",
    "RawMessage",
    "SharedStreamError",
    "SharedStreamManager",
    "SharedStreamProducer",
    "StateStoreError",
    "StreamEnded",
    "SubscriberOverflow",
    "TriggerEvent",
    "reject_shared_stream_event",
]
