"""acklane's Amazon SQS connector (aioboto3).

``connector: sqs`` in a stream's YAML block; :class:`SqsMessageTrigger` for
watchers written in Python. See ``docs/connectors/sqs.md``.
"""

from ._config import MAX_VISIBILITY_TIMEOUT, HeartbeatSettings, RedeliveryBackoff, SqsConfig
from ._connector import SqsConnector
from ._message import SqsDelivery, SqsMessage
from ._producer import (
    DEAD_LETTER_ATTRIBUTES,
    PACKED_ATTRIBUTES,
    SqsAdvanceError,
    SqsConnectorError,
    SqsStreamProducer,
)
from ._trigger import SqsMessageTrigger

__all__ = [
    "DEAD_LETTER_ATTRIBUTES",
    "MAX_VISIBILITY_TIMEOUT",
    "PACKED_ATTRIBUTES",
    "HeartbeatSettings",
    "RedeliveryBackoff",
    "SqsAdvanceError",
    "SqsConfig",
    "SqsConnector",
    "SqsConnectorError",
    "SqsDelivery",
    "SqsMessage",
    "SqsMessageTrigger",
    "SqsStreamProducer",
]
