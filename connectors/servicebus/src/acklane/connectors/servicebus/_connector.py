"""The ``connector: servicebus`` plugin: the YAML block, the shared stream key, the producer."""

from __future__ import annotations

from collections.abc import Hashable

from acklane.core.connectors import Connector

from ._config import ServiceBusConfig
from ._producer import ServiceBusStreamProducer

__all__ = ["ServiceBusConnector"]


class ServiceBusConnector(Connector[ServiceBusConfig]):
    """``connector: servicebus`` in a stream's YAML block."""

    name = "servicebus"
    config_model = ServiceBusConfig

    @classmethod
    def key(cls, config: ServiceBusConfig) -> tuple[Hashable, ...]:
        return config.stream_key()

    @classmethod
    def producer(cls, config: ServiceBusConfig) -> ServiceBusStreamProducer:
        return ServiceBusStreamProducer(config)

    @classmethod
    def description(cls, config: ServiceBusConfig) -> str:
        return config.describe()
