"""The generic watcher: one configured watcher as a trigger that shares its stream's poll.

Every watcher of the YAML becomes a :class:`WatcherTrigger`. Its kwargs (what
``serialize()`` returns) are plain JSON: the watcher and stream names, the
connector's name and the stream block as written, and the filter block. Watchers
whose connector derives the same stream key share one upstream poll; the
producer is built from the first subscriber's kwargs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Hashable, Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from .connectors import Connector, load_connector
from .filters import CompiledFilter, compile_filter
from .producer import SharedStreamProducer
from .trigger import BaseEventTrigger, TriggerEvent

if TYPE_CHECKING:
    from .config import AcklaneConfig

__all__ = ["WatcherTrigger", "build_watchers"]


class WatcherTrigger(BaseEventTrigger):
    """A configured watcher: its stream's connector decides the key, its filter the events."""

    def __init__(
        self,
        *,
        name: str,
        stream: str,
        connector: str,
        connector_config: Mapping[str, Any],
        filter_spec: Mapping[str, Any] | None = None,
        asset: str | None = None,
    ) -> None:
        super().__init__()
        self.name = name
        self.stream = stream
        self.connector = connector
        self.connector_config = dict(connector_config)
        self.filter_spec = None if filter_spec is None else dict(filter_spec)
        self.asset = asset
        self._connector_class: type[Connector] | None = None
        self._validated: BaseModel | None = None
        self._filter: CompiledFilter | None = None

    @property
    def trigger_id(self) -> str:
        """The watcher's name: its identity in the engine and the event store."""
        return self.name

    def __repr__(self) -> str:
        return (
            f"WatcherTrigger(name={self.name!r}, stream={self.stream!r}, "
            f"connector={self.connector!r})"
        )

    # -- configuration, validated once and cached

    def _connector_and_config(self) -> tuple[type[Connector], BaseModel]:
        if self._connector_class is None or self._validated is None:
            cls = load_connector(self.connector)
            self._validated = cls.config_model.model_validate(self.connector_config)
            self._connector_class = cls
        return self._connector_class, self._validated

    @property
    def compiled_filter(self) -> CompiledFilter:
        if self._filter is None:
            self._filter = compile_filter(self.filter_spec, label=f"watcher {self.name}")
        return self._filter

    # -- BaseEventTrigger

    def shared_stream_key(self) -> Hashable:
        cls, config = self._connector_and_config()
        return ("acklane", self.connector, *cls.stream_key(config))

    def shared_stream_settings(self) -> BaseModel:
        """The stream's validated block (the YAML loader already refuses a mismatch)."""
        return self._connector_and_config()[1]

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
        connector = load_connector(kwargs["connector"])
        config = connector.config_model.model_validate(kwargs["connector_config"])
        return connector.create_producer(config)

    async def filter_shared_stream(self, stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        async for event in self.compiled_filter.run(stream, self):
            yield event


def build_watchers(config: AcklaneConfig) -> list[WatcherTrigger]:
    """One trigger per configured watcher, in file order, filters already compiled."""
    triggers: list[WatcherTrigger] = []
    for watcher in config.watchers:
        stream = config.streams[watcher.stream]
        trigger = WatcherTrigger(
            name=watcher.name,
            stream=watcher.stream,
            connector=stream.connector_name,
            connector_config=stream.options,
            filter_spec=watcher.filter,
            asset=watcher.asset,
        )
        trigger._connector_class = stream.connector
        trigger._validated = stream.config
        trigger._filter = watcher.compiled_filter
        triggers.append(trigger)
    return triggers
