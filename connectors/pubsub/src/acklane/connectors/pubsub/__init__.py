"""acklane's Google Cloud Pub/Sub connector (google-cloud-pubsub, unary pull).

``connector: pubsub`` in a stream's YAML block; :class:`PubSubMessageTrigger` for
watchers written in Python. See ``docs/connectors/pubsub.md``.
"""

from ._config import MAX_ACK_DEADLINE, PubSubConfig, RedeliveryBackoff
from ._connector import PubSubConnector
from ._message import PubSubDelivery, PubSubMessage
from ._producer import (
    DEAD_LETTER_ATTRIBUTES,
    ORIGIN_PUBLISH_TIME,
    PubSubConnectorError,
    PubSubStreamProducer,
)
from ._trigger import PubSubMessageTrigger

__all__ = [
    "DEAD_LETTER_ATTRIBUTES",
    "MAX_ACK_DEADLINE",
    "ORIGIN_PUBLISH_TIME",
    "PubSubConfig",
    "PubSubConnector",
    "PubSubConnectorError",
    "PubSubDelivery",
    "PubSubMessage",
    "PubSubMessageTrigger",
    "PubSubStreamProducer",
    "RedeliveryBackoff",
]
