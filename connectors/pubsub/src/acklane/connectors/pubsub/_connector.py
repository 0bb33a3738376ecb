"""The ``connector: pubsub`` plugin: the YAML block, the shared stream key, the producer."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from acklane.core.connectors import Connector, Publisher
from acklane.core.connectors.dlq import DeadLetterReader

from ._check import check_connection, offline_problems
from ._config import PubSubConfig
from ._producer import PubSubStreamProducer
from ._publish import PubSubPublisher

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

    @classmethod
    def publisher(cls, config: PubSubConfig, *, destination: str | None = None) -> Publisher:
        return PubSubPublisher(config, destination)

    @classmethod
    def offline_problems(cls, config: PubSubConfig) -> Sequence[tuple[str, str]]:
        return offline_problems(config)

    @classmethod
    async def check_connection(cls, config: PubSubConfig, *, call_timeout: float) -> str:
        return await check_connection(config, call_timeout)

    @classmethod
    def dead_letter_reader(
        cls, config: PubSubConfig, *, options: Mapping[str, Any] | None = None
    ) -> DeadLetterReader:
        from ._deadletters import PubSubDeadLetterReader

        return PubSubDeadLetterReader(config, **dict(options or {}))
