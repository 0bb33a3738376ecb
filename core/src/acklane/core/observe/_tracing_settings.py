"""``tracing:``, the section that configures OpenTelemetry (docs/tracing.md).

Its model lives beside the tracing it configures, in ``observe``, so that tracing
needs nothing of the configuration, which sits above it in core's layers
(docs/architecture.md); ``acklane.core.config.TracingSettings`` is the same class.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator

from .._section import SectionModel
from ..redact import redact_url

__all__ = ["TracingSettings"]


class TracingSettings(SectionModel):
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
