"""The ``memory`` entry of the ``acklane.connectors`` registry."""

from __future__ import annotations

from collections.abc import Hashable

from acklane.core.connectors import Connector, Publisher, PublishNotSupported

from ._config import MemoryConfig
from ._producer import MemoryStreamProducer

__all__ = ["MemoryConnector"]


class MemoryConnector(Connector[MemoryConfig]):
    """``connector: memory``: an in-process broker for demos, tests and local runs."""

    name = "memory"
    config_model = MemoryConfig

    @classmethod
    def key(cls, config: MemoryConfig) -> tuple[Hashable, ...]:
        return (config.broker, tuple(sorted(config.topics)), config.group_id)

    @classmethod
    def producer(cls, config: MemoryConfig) -> MemoryStreamProducer:
        return MemoryStreamProducer(config)

    @classmethod
    def description(cls, config: MemoryConfig) -> str:
        return (
            f"memory broker={config.broker} topics={','.join(config.topics)} "
            f"group={config.group_id}"
        )

    @classmethod
    def publisher(cls, config: MemoryConfig, *, destination: str | None = None) -> Publisher:
        """Never: the memory broker lives inside the process that runs the pipeline."""
        raise PublishNotSupported(
            f"the memory broker {config.broker!r} lives inside the process that runs the "
            "pipeline (acklane run): no other process, acklane publish included, can reach "
            "it. Publish from Python in that process (MemoryBroker.get"
            f"({config.broker!r}).publish(...)), or try a pipeline on a real broker's "
            "emulator: examples/kafka.yaml says how (acklane emulator start kafka)"
        )
