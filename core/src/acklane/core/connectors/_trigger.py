"""The trigger of a connector's stream: one class for YAML watchers and Python triggers."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any, Generic

from ..producer import SharedStreamProducer
from ..trigger import BaseEventTrigger
from ._connector import ConfigT, Connector

__all__ = ["ConnectorTrigger"]


class ConnectorTrigger(BaseEventTrigger, Generic[ConfigT]):
    """A trigger that watches one connector's stream; triggers of one key share its poll.

    A broker's Python trigger class sets ``connector_class`` and takes the fields of
    the connector's configuration as keyword arguments (with any of a subclass's
    own, which the configuration ignores). The configuration is validated when the
    trigger is constructed, so a bad one is refused before anything starts; the
    shared stream key, the settings triggers of one key must agree on and the
    group's producer all come from the connector.
    """

    #: The connector whose stream this trigger watches.
    connector_class: type[Connector[ConfigT]]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._bind(kwargs)

    # -- what a subclass may change: where its kwargs keep the connector and its config

    @classmethod
    def connector_for(cls, kwargs: Mapping[str, Any]) -> type[Connector[ConfigT]]:
        """The connector of a trigger with these kwargs (default: ``connector_class``)."""
        return cls.connector_class

    @classmethod
    def config_for(cls, connector: type[Connector[ConfigT]], kwargs: Mapping[str, Any]) -> ConfigT:
        """The validated configuration in a trigger's kwargs (default: the kwargs that
        are fields of the connector's configuration; the others are ignored)."""
        return connector.config(kwargs)

    # -- the helpers

    def stream_config(self) -> ConfigT:
        """This trigger's validated configuration."""
        return self._bound()[1]

    def shared_stream_key(self) -> Hashable:
        """The connector's stream key: triggers with equal keys share one poll."""
        connector, config = self._bound()
        return connector.stream_key(config)

    def shared_stream_settings(self) -> ConfigT:
        """The whole configuration: triggers of one key must agree on all of it."""
        return self._bound()[1]

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
        """The group's producer, from its first trigger's kwargs."""
        connector = cls.connector_for(kwargs)
        return connector.create_producer(cls.config_for(connector, kwargs))

    # -- validated once, at construction

    def _bind(self, kwargs: Mapping[str, Any]) -> tuple[type[Connector[ConfigT]], ConfigT]:
        connector = self.connector_for(kwargs)
        bound = self._binding = (connector, self.config_for(connector, kwargs))
        return bound

    def _bound(self) -> tuple[type[Connector[ConfigT]], ConfigT]:
        bound: tuple[type[Connector[ConfigT]], ConfigT] | None = getattr(self, "_binding", None)
        if bound is None:  # a subclass whose __init__ did not call ours
            bound = self._bind(vars(self))
        return bound
