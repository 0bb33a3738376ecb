"""Checks beyond the file: the tracing extra when tracing is on, and, for
``acklane validate``, what this machine offers without the network (the SQLite
folder, the PostgreSQL driver, the files a stream names).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from .._dbconf import offline_url_problem
from ._errors import Loc
from ._models import StoreSettings, TracingSettings, _Settings
from ._result import StreamConfig
from ._yaml import _Reader


def _tracing_installed() -> bool:
    """Whether OpenTelemetry's SDK and OTLP/HTTP exporter are installed (not imported)."""
    import importlib.util

    try:
        return all(
            importlib.util.find_spec(name) is not None
            for name in ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http")
        )
    except (ImportError, ValueError):
        return False


def _tracing_problem(
    reader: _Reader, tracing: _Settings | None, env: Mapping[str, str] | None
) -> None:
    """Tracing on (by the file or ``OTEL_TRACES_EXPORTER``) without the ``tracing`` extra."""
    from ..observe.tracing import enabled_by

    if not isinstance(tracing, TracingSettings):
        return
    if enabled_by(tracing, os.environ if env is None else env) and not _tracing_installed():
        reader.problem(
            ("tracing",),
            'tracing is on but OpenTelemetry is not installed: pip install "acklane[tracing]"',
        )


def _offline_checks(
    reader: _Reader, store: _Settings | None, streams: Mapping[str, StreamConfig]
) -> None:
    """Problems found on this machine without the network, reported like the others."""
    if isinstance(store, StoreSettings):
        problem = offline_url_problem(store.url)
        if problem is not None:
            reader.problem(("store", "url"), problem)
    for name, stream in streams.items():
        try:
            found = list(stream.connector.offline_problems(stream.config))
        except Exception as exc:  # a connector's bug must not hide the other problems
            found = [("", f"connector {stream.connector_name!r}: offline check failed: {exc}")]
        for field, message in found:
            loc: Loc = ("streams", name, field) if field else ("streams", name)
            reader.problem(loc, message)
