"""The ``connector: sqs`` plugin: the YAML block, the shared stream key, the producer."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

from acklane.core.connectors import Connector, Publisher, PublishError
from acklane.core.connectors.dlq import DeadLetterReader

from ._check import check_connection
from ._config import SqsConfig
from ._lag import SqsBacklogProbe
from ._producer import SqsStreamProducer
from ._publish import SqsPublisher

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

    @classmethod
    def backlog_probe(cls, config: SqsConfig) -> SqsBacklogProbe:
        return SqsBacklogProbe(config)

    @classmethod
    def publisher(cls, config: SqsConfig, *, destination: str | None = None) -> Publisher:
        if destination is not None:
            raise PublishError("an SQS stream reads one queue: it takes no --topic")
        return SqsPublisher(config)

    @classmethod
    async def check_connection(cls, config: SqsConfig, *, call_timeout: float) -> str:
        return await check_connection(config, call_timeout)

    @classmethod
    def dead_letter_reader(
        cls, config: SqsConfig, *, options: Mapping[str, Any] | None = None
    ) -> DeadLetterReader:
        from ._deadletters import SqsDeadLetterReader

        return SqsDeadLetterReader(config, **dict(options or {}))
