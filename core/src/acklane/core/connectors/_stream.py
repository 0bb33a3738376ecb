"""One named stream of a configuration: its connector class and its validated block.

The configuration builds these, and the runner, the ``broker`` sink and the command
line read them. It is defined here, beside :class:`Connector`, rather than with the
rest of the configuration so that the sinks, which sit below the configuration in
core's layers (docs/architecture.md), can name the stream they publish to.
``acklane.core.config.StreamConfig`` is the same class.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from ._connector import Connector

__all__ = ["StreamConfig"]


@dataclass(frozen=True, slots=True)
class StreamConfig:
    """One named stream: its connector class and its validated block."""

    name: str
    connector_name: str
    connector: type[Connector]
    config: BaseModel
    #: The block as written (variables substituted), without ``connector``: JSON-able,
    #: what a watcher carries so that the connector can validate it again.
    options: dict[str, Any] = field(repr=False)
    line: int | None = None

    @property
    def key(self) -> tuple[Hashable, ...]:
        """The shared stream key of every watcher on this stream."""
        return ("acklane", self.connector_name, *self.connector.stream_key(self.config))

    def describe(self) -> str:
        return self.connector.describe(self.config)
