"""The ``kafka`` entry of the ``acklane.connectors`` registry."""

from __future__ import annotations

from collections.abc import Hashable

from acklane.core.connectors import Connector

from ._config import KafkaConfig
from ._producer import KafkaStreamProducer

__all__ = ["KafkaConnector"]


class KafkaConnector(Connector[KafkaConfig]):
    """``connector: kafka`` in a stream's YAML block."""

    name = "kafka"
    config_model = KafkaConfig

    @classmethod
    def key(cls, config: KafkaConfig) -> tuple[Hashable, ...]:
        return config.stream_key()

    @classmethod
    def producer(cls, config: KafkaConfig) -> KafkaStreamProducer:
        return KafkaStreamProducer(config)

    @classmethod
    def description(cls, config: KafkaConfig) -> str:
        return config.describe()
