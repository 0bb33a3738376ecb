"""The ``kafka`` entry of the ``acklane.connectors`` registry."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from acklane.core.connectors import Connector, Publisher
from acklane.core.connectors.dlq import DeadLetterReader

from ._check import check_connection, offline_problems
from ._config import KafkaConfig
from ._lag import KafkaBacklogProbe
from ._producer import KafkaStreamProducer
from ._publish import KafkaPublisher, publish_topic

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

    @classmethod
    def publisher(cls, config: KafkaConfig, *, destination: str | None = None) -> Publisher:
        return KafkaPublisher(config, publish_topic(config, destination))

    @classmethod
    def backlog_probe(cls, config: KafkaConfig) -> KafkaBacklogProbe:
        return KafkaBacklogProbe(config)

    @classmethod
    def offline_problems(cls, config: KafkaConfig) -> Sequence[tuple[str, str]]:
        return offline_problems(config)

    @classmethod
    async def check_connection(cls, config: KafkaConfig, *, call_timeout: float) -> str:
        return await check_connection(config, call_timeout)

    @classmethod
    def dead_letter_reader(
        cls, config: KafkaConfig, *, options: Mapping[str, Any] | None = None
    ) -> DeadLetterReader:
        from ._deadletters import KafkaDeadLetterReader

        return KafkaDeadLetterReader(config, **dict(options or {}))
