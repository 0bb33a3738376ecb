"""The ``kafka`` entry of the ``acklane.connectors`` registry."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, ClassVar

from acklane.core.connectors import Connector

from ._config import KafkaConfig
from ._producer import KafkaStreamProducer

__all__ = ["KafkaConnector"]


def _config(config: Any) -> KafkaConfig:
    return config if isinstance(config, KafkaConfig) else KafkaConfig.model_validate(config)


class KafkaConnector(Connector):
    """``connector: kafka`` in a stream's YAML block."""

    name: ClassVar[str] = "kafka"
    config_model: ClassVar[type[KafkaConfig]] = KafkaConfig

    @classmethod
    def stream_key(cls, config: Any) -> tuple[Hashable, ...]:
        return _config(config).stream_key()

    @classmethod
    def create_producer(cls, config: Any) -> KafkaStreamProducer:
        return KafkaStreamProducer(_config(config))

    @classmethod
    def describe(cls, config: Any) -> str:
        return _config(config).describe()
