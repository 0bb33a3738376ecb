"""The ``connector: servicebus`` plugin: the YAML block, the shared stream key, the producer."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

from acklane.core.connectors import Connector, Publisher, PublishError
from acklane.core.connectors.dlq import DeadLetterReader

from ._check import check_connection
from ._config import ServiceBusConfig
from ._lag import ServiceBusBacklogProbe
from ._producer import ServiceBusStreamProducer
from ._publish import ServiceBusPublisher

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

    @classmethod
    def backlog_probe(cls, config: ServiceBusConfig) -> ServiceBusBacklogProbe | None:
        # a session-enabled entity cannot be peeked without naming a session
        return None if config.sessions else ServiceBusBacklogProbe(config)

    @classmethod
    def publisher(cls, config: ServiceBusConfig, *, destination: str | None = None) -> Publisher:
        if destination is not None:
            raise PublishError("a Service Bus stream reads one entity: it takes no --topic")
        return ServiceBusPublisher(config)

    @classmethod
    async def check_connection(cls, config: ServiceBusConfig, *, call_timeout: float) -> str:
        # no retries: one answer, or why not, within the call_timeout
        once = config.model_copy(
            update={"client_options": {**config.client_options, "retry_total": 0}}
        )
        client = once.make_client()
        return await check_connection(config, call_timeout, client)

    @classmethod
    def dead_letter_reader(
        cls, config: ServiceBusConfig, *, options: Mapping[str, Any] | None = None
    ) -> DeadLetterReader:
        from ._deadletters import ServiceBusDeadLetterReader

        return ServiceBusDeadLetterReader(config, **dict(options or {}))
