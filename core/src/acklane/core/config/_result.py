"""The validated configuration the runner gets: frozen dataclasses, filters compiled.

:class:`StreamConfig` is the connector kit's (``acklane.core.connectors._stream``),
named here too: the sinks below the configuration read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..connectors._stream import StreamConfig
from ..names import DEFAULT_PIPELINE
from ..pipeline.filters import CompiledFilter
from ..sinks import SinkSettings
from ..stores.settings import StateStoreSettings
from ._errors import ConfigProblem
from ._models import EngineSettings, MetricsSettings, StoreSettings, TracingSettings

__all__ = ["AcklaneConfig", "StoreConfig", "StreamConfig", "WatcherConfig"]


@dataclass(frozen=True, slots=True)
class WatcherConfig:
    """One watcher, its filter compiled."""

    name: str
    stream: str
    asset: str | None
    #: The ``filter:`` block (normalized, JSON-able), or None for "every message fires".
    filter: dict[str, Any] | None
    compiled_filter: CompiledFilter
    line: int | None = None
    #: The sinks each stored event of this watcher is delivered to (names in ``sinks``).
    sinks: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class AcklaneConfig:
    """A validated configuration, ready for the runner."""

    source: str
    engine: EngineSettings
    store: StoreSettings
    state: StateStoreSettings
    metrics: MetricsSettings
    streams: Mapping[str, StreamConfig]
    watchers: tuple[WatcherConfig, ...]
    #: The secret values of the file (acklane.core.redact's rule), masked in all output.
    secrets: frozenset[str] = field(default=frozenset(), repr=False)
    #: ``sinks:`` by name, in the file's order (each its kind's settings model).
    sinks: Mapping[str, SinkSettings] = field(default_factory=dict)
    #: Old names of settings the file uses (they still work), each at its file:line.
    deprecations: tuple[ConfigProblem, ...] = ()
    #: ``tracing:`` (OpenTelemetry; off unless enabled here or by ``OTEL_TRACES_EXPORTER``).
    tracing: TracingSettings = field(default_factory=TracingSettings)
    #: Settings that work but expose a credential or trust any server (``verify_tls:
    #: false``, a password sent to an ``http://`` URL), each at its file:line.
    warnings: tuple[ConfigProblem, ...] = ()
    #: ``pipeline:``: the name that scopes this configuration's rows in the store.
    pipeline: str = DEFAULT_PIPELINE

    def watcher(self, name: str) -> WatcherConfig:
        for w in self.watchers:
            if w.name == name:
                return w
        raise KeyError(f"no watcher named {name!r} in {self.source}")

    def sink_watchers(self, sink: str) -> tuple[str, ...]:
        """The watchers whose events go to ``sink``, in the file's order."""
        return tuple(w.name for w in self.watchers if sink in w.sinks)


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """The ``store`` and ``state`` sections alone (:func:`load_store_config`)."""

    source: str
    store: StoreSettings
    state: StateStoreSettings
    secrets: frozenset[str] = field(default=frozenset(), repr=False)
    #: ``pipeline:`` (see :attr:`AcklaneConfig.pipeline`).
    pipeline: str = DEFAULT_PIPELINE
    #: Each watcher's ``stream:`` as written (names shown by ``acklane events``).
    watcher_streams: Mapping[str, str] = field(default_factory=dict)
