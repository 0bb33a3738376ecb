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

from ..connectors import Connector, ConnectorTrigger, load_connector
from ..trigger import TriggerEvent
from .filters import CompiledFilter, compile_filter

if TYPE_CHECKING:
    from ..config import AcklaneConfig

__all__ = ["WatcherTrigger", "build_watchers"]


class WatcherTrigger(ConnectorTrigger[BaseModel]):
    """A configured watcher: its stream's connector decides the key, its filter the events.

    Its connector is the one registered under ``connector``, and its configuration
    is the stream block ``connector_config``, validated (as every connector trigger)
    when the watcher is constructed. The block is the whole configuration: a key that
    is not one of its fields is an error, as in the YAML.
    """

    name: str
    stream: str
    connector: str
    connector_config: dict[str, Any]
    filter_spec: dict[str, Any] | None
    asset: str | None

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
        super().__init__(
            name=name,
            stream=stream,
            connector=connector,
            connector_config=dict(connector_config),
            filter_spec=None if filter_spec is None else dict(filter_spec),
            asset=asset,
        )
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

    # -- ConnectorTrigger: the connector by name, the configuration in its own kwarg

    @classmethod
    def connector_for(cls, kwargs: Mapping[str, Any]) -> type[Connector]:
        return load_connector(kwargs["connector"])

    @classmethod
    def config_for(cls, connector: type[Connector], kwargs: Mapping[str, Any]) -> BaseModel:
        return connector.config_model.model_validate(kwargs["connector_config"])

    def shared_stream_key(self) -> Hashable:
        connector, config = self._bound()
        return ("acklane", self.connector, *connector.stream_key(config))

    # -- the filter

    @property
    def compiled_filter(self) -> CompiledFilter:
        if self._filter is None:
            self._filter = compile_filter(self.filter_spec, label=f"watcher {self.name}")
        return self._filter

    @property
    def inline(self) -> bool:
        """Whether the engine may evaluate this watcher's filter inline: a synchronous
        filter (declarative, a plain ``def``), and no subclass's own
        ``filter_shared_stream`` in the way (that one runs as a generator)."""
        return (
            self.compiled_filter.inline
            and type(self).filter_shared_stream is WatcherTrigger.filter_shared_stream
        )

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
        trigger._filter = watcher.compiled_filter
        triggers.append(trigger)
    return triggers
