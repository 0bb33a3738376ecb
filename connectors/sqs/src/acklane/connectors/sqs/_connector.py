"""The ``connector: sqs`` plugin: the YAML block, the shared stream key, the producer."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any, ClassVar

from acklane.core.connectors import Connector

from ._config import SqsConfig
from ._producer import SqsStreamProducer

__all__ = ["SqsConnector", "sqs_config"]


def sqs_config(config: Any) -> SqsConfig:
    """An :class:`SqsConfig` from itself, or from a mapping holding its fields (others ignored)."""
    if isinstance(config, SqsConfig):
        return config
    if isinstance(config, Mapping):
        fields = SqsConfig.model_fields
        return SqsConfig.model_validate({k: v for k, v in config.items() if k in fields})
    raise TypeError(
        f"expected an SqsConfig or a mapping of its fields, got {type(config).__name__}"
    )


class SqsConnector(Connector):
    """``connector: sqs`` in a stream's YAML block."""

    name: ClassVar[str] = "sqs"
    config_model: ClassVar[type[SqsConfig]] = SqsConfig

    @classmethod
    def stream_key(cls, config: Any) -> tuple[Hashable, ...]:
        return sqs_config(config).stream_key()

    @classmethod
    def create_producer(cls, config: Any) -> SqsStreamProducer:
        return SqsStreamProducer(sqs_config(config))

    @classmethod
    def describe(cls, config: Any) -> str:
        return sqs_config(config).describe()
