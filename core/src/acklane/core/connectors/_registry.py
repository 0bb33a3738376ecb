"""The registry of connectors: the entry-point group ``acklane.connectors``."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from ..errors import ConnectorError
from ._connector import Connector

__all__ = ["ENTRY_POINT_GROUP", "UnknownConnector", "available_connectors", "load_connector"]

ENTRY_POINT_GROUP = "acklane.connectors"


class UnknownConnector(ConnectorError, LookupError):
    """No installed distribution registers a connector of that name."""


def available_connectors() -> dict[str, str]:
    """Installed connector names and the object each entry point names."""
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def load_connector(name: str) -> type[Connector[Any]]:
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
