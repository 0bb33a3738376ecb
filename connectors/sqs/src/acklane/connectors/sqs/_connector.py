"""The ``connector: sqs`` plugin: the YAML block, the shared stream key, the producer."""

from __future__ import annotations

from collections.abc import Hashable

from acklane.core.connectors import Connector

from ._config import SqsConfig
from ._producer import SqsStreamProducer

__all__ = ["SqsConnector"]


class SqsConnector(Connector[SqsConfig]):
    """``connector: sqs`` in a stream's YAML block."""

    name = "sqs"
    config_model = SqsConfig

    @classmethod
    def key(cls, config: SqsConfig) -> tuple[Hashable, ...]:
        return config.stream_key()

    @classmethod
    def producer(cls, config: SqsConfig) -> SqsStreamProducer:
        return SqsStreamProducer(config)

    @classmethod
    def description(cls, config: SqsConfig) -> str:
        return config.describe()
