"""The connector plugin interface and its registry (entry-point group ``acklane.connectors``)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable
from importlib.metadata import entry_points
from typing import Any, ClassVar

from pydantic import BaseModel

from ..producer import SharedStreamProducer

__all__ = [
    "ENTRY_POINT_GROUP",
    "Connector",
    "UnknownConnector",
    "available_connectors",
    "load_connector",
]

ENTRY_POINT_GROUP = "acklane.connectors"


class UnknownConnector(LookupError):
    """No installed distribution registers a connector of that name."""


class Connector(ABC):
    """One broker's binding to the engine, found by name through entry points.

    ``config_model`` validates the stream's YAML block (every field except
    ``connector``); its validators refuse unsafe settings before anything connects.
    """

    name: ClassVar[str]
    config_model: ClassVar[type[BaseModel]]

    @classmethod
    @abstractmethod
    def stream_key(cls, config: Any) -> tuple[Hashable, ...]:
        """The shared stream key: only the fields that pick the upstream."""

    @classmethod
    @abstractmethod
    def create_producer(cls, config: Any) -> SharedStreamProducer:
        """A new producer for one group's poll; it must connect lazily."""

    @classmethod
    def describe(cls, config: Any) -> str:
        """A one-line, secret-free description for logs and the CLI."""
        return f"{cls.name} {cls.stream_key(config)!r}"


def available_connectors() -> dict[str, str]:
    """Installed connector names and the object each entry point names."""
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def load_connector(name: str) -> type[Connector]:
    """The connector class registered under ``name``."""
    for ep in entry_points(group=ENTRY_POINT_GROUP, name=name):
        obj = ep.load()
        if not (isinstance(obj, type) and issubclass(obj, Connector)):
            raise TypeError(f"entry point {name!r} ({ep.value}) is not an acklane Connector")
        return obj
    known = ", ".join(sorted(available_connectors())) or "none"
    raise UnknownConnector(
        f"no connector named {name!r} is installed (installed: {known}); "
        f'install its extra, e.g. pip install "acklane[{name}]"'
    )
