"""Sink kinds by name: ``kind: webhook`` finds its class here, imported only when used."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Final, Protocol

from ._base import SinkError

if TYPE_CHECKING:
    from ..connectors._stream import StreamConfig
    from ._base import Sink
    from ._settings import SinkSettings

__all__ = ["KINDS", "UnknownSinkKind", "build_sinks", "sink_class"]

#: kind -> "module:Class" of its :class:`~acklane.core.sinks.Sink` subclass.
KINDS: Final[dict[str, str]] = {
    "airflow": "acklane.core.sinks.airflow:AirflowSink",
    "broker": "acklane.core.sinks.broker:BrokerSink",
    "function": "acklane.core.sinks.function:FunctionSink",
    "webhook": "acklane.core.sinks.webhook:WebhookSink",
}


class UnknownSinkKind(SinkError, LookupError):
    """``kind:`` names no sink kind."""


def sink_class(kind: str) -> type[Sink]:
    """The class of ``kind``; :class:`UnknownSinkKind` names the kinds there are."""
    target = KINDS.get(kind)
    if target is None:
        raise UnknownSinkKind(
            f"unknown sink kind {kind!r} (expected one of: {', '.join(sorted(KINDS))})"
        )
    module, _, name = target.partition(":")
    cls: type[Sink] = getattr(importlib.import_module(module), name)
    return cls


class _Watcher(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def asset(self) -> str | None: ...
    @property
    def sinks(self) -> tuple[str, ...]: ...


class SinksConfig(Protocol):
    """What :func:`build_sinks` reads of an :class:`~acklane.core.config.AcklaneConfig`.

    Named by its shape, not imported: the configuration sits above the sinks in core's
    layers (docs/architecture.md), so the sinks cannot import it.
    """

    @property
    def source(self) -> str: ...
    @property
    def sinks(self) -> Mapping[str, SinkSettings]: ...
    @property
    def streams(self) -> Mapping[str, StreamConfig]: ...
    @property
    def watchers(self) -> tuple[_Watcher, ...]: ...
    def sink_watchers(self, sink: str) -> tuple[str, ...]: ...


def build_sinks(config: SinksConfig) -> list[tuple[Sink, tuple[str, ...]]]:
    """The configuration's sinks that some watcher names, each with those watchers (a
    sink no watcher names delivers nothing and is left out)."""
    from ._base import SinkContext

    source = config.source
    folder = Path(source).parent if source and not source.startswith("<") else None
    built: list[tuple[Sink, tuple[str, ...]]] = []
    for name, settings in config.sinks.items():
        watchers = config.sink_watchers(name)
        if not watchers:
            continue
        context = SinkContext(
            streams=config.streams,
            watcher_assets={w.name: w.asset for w in config.watchers if name in w.sinks},
            config_dir=folder,
        )
        built.append((sink_class(settings.kind)(settings, context), watchers))
    return built
