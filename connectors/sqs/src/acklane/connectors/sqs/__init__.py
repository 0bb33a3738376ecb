"""acklane's Amazon SQS connector (aioboto3).

``connector: sqs`` in a stream's YAML block; :class:`SqsMessageTrigger` for
watchers written in Python. See ``docs/connectors/sqs.md``.
"""

from acklane.core.deprecation import old_names

from ._config import MAX_VISIBILITY_TIMEOUT, RedeliveryBackoff, SqsConfig, SqsHeartbeat
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
    "RedeliveryBackoff",
    "SqsAdvanceError",
    "SqsConfig",
    "SqsConnector",
    "SqsConnectorError",
    "SqsDelivery",
    "SqsHeartbeat",
    "SqsMessage",
    "SqsMessageTrigger",
    "SqsStreamProducer",
]

#: Names of earlier releases: still importable, with a DeprecationWarning.
__getattr__ = old_names(__name__, {"HeartbeatSettings": SqsHeartbeat})
