"""acklane's Kafka connector (confluent-kafka): one consumer group per shared stream.

Commits follow the engine: a partition's offset moves only past records that every
watcher finished (or that were dead-lettered); a failed record holds its partition
and is redelivered. See ``docs/connectors/kafka.md``.
"""

from ._config import KafkaConfig
from ._connector import KafkaConnector
from ._errors import KafkaAdvanceError, KafkaReceiveError
from ._message import KafkaDelivery, KafkaMessage, message_id_of
from ._producer import KafkaStreamProducer
from ._stats import KafkaStreamStats
from ._trigger import KafkaMessageTrigger

__all__ = [
    "KafkaAdvanceError",
    "KafkaConfig",
    "KafkaConnector",
    "KafkaDelivery",
    "KafkaMessage",
    "KafkaMessageTrigger",
    "KafkaReceiveError",
    "KafkaStreamProducer",
    "KafkaStreamStats",
    "message_id_of",
]
