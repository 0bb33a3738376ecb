"""The pydantic models of the YAML sections: what each field accepts, and its default."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationInfo, field_validator

from .._dbconf import DEFAULT_RETENTION, DEFAULT_URL, unsupported_url, url_parts
from ..durations import Duration
from ..names import NAME_PATTERN, NAME_RULE
from ..observe.redact import redact_url

_NAME_RE: Final = re.compile(NAME_PATTERN)
_NAME_RULE: Final = NAME_RULE


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EngineSettings(_Settings):
    """``engine:``: the shared stream manager and the runner."""

    ack_timeout: float = Field(default=300.0, gt=0)
    subscriber_queue_size: int = Field(default=1024, ge=1)
    cohort_grace_period: float = Field(default=0.0, ge=0)
    #: What a full subscriber queue does: "pause" the poll until it drains (a stuck
    #: watcher is still failed by ack_timeout), or "fail" that watcher (Airflow's rule).
    overflow: Literal["pause", "fail"] = "pause"
    restart_backoff_initial: float = Field(default=1.0, gt=0)
    restart_backoff_max: float = Field(default=60.0, gt=0)
    #: Restarts of one stream's watchers in a row without progress (nothing advanced,
    #: not a failure of one message, which max_attempts bounds) before acklane gives
    #: up and ``acklane run`` exits 1; null = never give up.
    max_restarts: int | None = Field(default=10, ge=0)
    shutdown_timeout: float = Field(default=30.0, gt=0)
    #: Seconds between two INFO progress lines per stream while running; 0 = none.
    progress_interval: float = Field(default=60.0, ge=0)
    #: Seconds between two reads of each stream's backlog on its broker (the
    #: acklane_stream_lag metrics, /readyz, progress lines); 0 = never read it.
    lag_interval: float = Field(default=5.0, ge=0)
    #: Synchronous filters (declarative, a plain def) evaluated by the poll as it
    #: broadcasts, with no queue or task per watcher (docs/engine.md); false = each
    #: watcher runs as an async generator in its own task, as async filters do.
    inline_filters: bool = True

    @field_validator("restart_backoff_max")
    @classmethod
    def _max_not_below_initial(cls, value: float, info: ValidationInfo) -> float:
        initial = info.data.get("restart_backoff_initial")
        if initial is not None and value < initial:
            raise ValueError(
                f"must be at least restart_backoff_initial ({initial:g}), got {value:g}"
            )
        return value


class StoreSettings(_Settings):
    """``store:``: the event store's database."""

    url: str = Field(default=DEFAULT_URL, min_length=1)
    commit_interval_ms: float = Field(default=2.0, ge=0)
    #: Trigger events older than this are pruned (seconds, or "7d", "12h"); null = kept.
    retention: Annotated[Duration, Field(gt=0)] | None = DEFAULT_RETENTION
    #: How often a running engine prunes (seconds, or "1h"); only with a retention.
    prune_interval: Annotated[Duration, Field(gt=0)] = 3600.0

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        for name, value in super().__repr_args__():
            yield name, redact_url(value) if name == "url" and isinstance(value, str) else value

    @field_validator("url")
    @classmethod
    def _parses(cls, value: str) -> str:
        try:
            url_parts(value)
        except ValueError:
            raise ValueError(
                "expected a database URL such as sqlite:///acklane.db or "
                "postgresql://user@host:5432/db"
            ) from None
        unsupported = unsupported_url(value)
        if unsupported is not None:
            raise ValueError(unsupported)
        return value


class MetricsSettings(_Settings):
    """``metrics:``: the Prometheus exporter and the health probes (off when ``port`` is
    null)."""

    port: int | None = Field(default=None, ge=1, le=65535)
    #: The address the endpoints listen on: this host only unless the deployment says
    #: otherwise (a container whose probes and scrapes come from outside: ``0.0.0.0``).
    #: They are unauthenticated, and /readyz tells what the pipeline connects to.
    host: str = Field(default="127.0.0.1", min_length=1)


class TracingSettings(_Settings):
    """``tracing:``: OpenTelemetry spans of each message (docs/tracing.md).

    A field left unset falls back to the standard ``OTEL_*`` variable, then to the
    default; ``enabled`` unset means "on when ``OTEL_TRACES_EXPORTER`` names an exporter".
    """

    enabled: bool | None = None
    exporter: Literal["otlp", "console"] | None = None
    #: OTLP/HTTP URL of the collector (``/v1/traces`` added when it has no path).
    endpoint: str | None = Field(default=None, min_length=1)
    #: Headers of every export request (an API key, ``Authorization``): secrets.
    headers: dict[str, SecretStr] = Field(default_factory=dict)
    service_name: str | None = Field(default=None, min_length=1)
    #: Share of new traces recorded (a message with a sampled traceparent follows it).
    sample_ratio: float | None = Field(default=None, ge=0, le=1)

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        for name, value in super().__repr_args__():
            shown = redact_url(value) if name == "endpoint" and isinstance(value, str) else value
            yield name, shown

    @field_validator("endpoint")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(
                "expected an http:// or https:// URL of an OTLP/HTTP receiver, such as "
                "http://localhost:4318"
            )
        return value


class WatcherSettings(_Settings):
    """One entry of ``watchers:`` as written."""

    name: Annotated[str, Field(pattern=NAME_PATTERN, max_length=200)]
    stream: str = Field(min_length=1)
    asset: str | None = Field(default=None, min_length=1)
    #: Checked as a :class:`~acklane.core.pipeline.filters.FilterSpec` on its own, so that its
    #: problems are reported along with the others of the watcher.
    filter: dict[str, Any] | None = None
    #: Names of entries of ``sinks:`` that each stored event of this watcher is delivered to.
    sinks: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list)


_SECTIONS: Final[dict[str, type[_Settings]]] = {
    "engine": EngineSettings,
    "store": StoreSettings,
    "metrics": MetricsSettings,
    "tracing": TracingSettings,
}
_TOP_LEVEL: Final = (
    "pipeline",
    "engine",
    "store",
    "state",
    "metrics",
    "tracing",
    "streams",
    "watchers",
    "sinks",
)
