"""The ``memory`` entry of the ``acklane.connectors`` registry."""

from __future__ import annotations

from collections.abc import Hashable

from acklane.core.connectors import Connector

from ._config import MemoryConfig
from ._producer import MemoryProducer

__all__ = ["MemoryConnector"]


class MemoryConnector(Connector[MemoryConfig]):
    """``connector: memory``: an in-process broker for demos, tests and local runs."""

    name = "memory"
    config_model = MemoryConfig

    @classmethod
    def key(cls, config: MemoryConfig) -> tuple[Hashable, ...]:
        return (config.broker, tuple(sorted(config.topics)), config.group_id)

    @classmethod
    def producer(cls, config: MemoryConfig) -> MemoryProducer:
        return MemoryProducer(config)

    @classmethod
    def description(cls, config: MemoryConfig) -> str:
        return (
            f"memory broker={config.broker} topics={','.join(config.topics)} "
            f"group={config.group_id}"
        )
