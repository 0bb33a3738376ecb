"""The ``connector: pubsub`` plugin: the YAML block, the shared stream key, the producer."""

from __future__ import annotations

from collections.abc import Hashable

from acklane.core.connectors import Connector

from ._config import PubSubConfig
from ._producer import PubSubStreamProducer

__all__ = ["PubSubConnector"]


class PubSubConnector(Connector[PubSubConfig]):
    """``connector: pubsub`` in a stream's YAML block."""

    name = "pubsub"
    config_model = PubSubConfig

    @classmethod
    def key(cls, config: PubSubConfig) -> tuple[Hashable, ...]:
        return config.stream_key()

    @classmethod
    def producer(cls, config: PubSubConfig) -> PubSubStreamProducer:
        return PubSubStreamProducer(config)

    @classmethod
    def description(cls, config: PubSubConfig) -> str:
        return config.describe()
