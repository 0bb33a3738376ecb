"""The resolved configuration as a document, every secret masked (``acklane config show``)."""

from __future__ import annotations

from typing import Any

from ..redact import redact_structure
from ._result import AcklaneConfig


def config_document(config: AcklaneConfig) -> dict[str, Any]:
    """Every section with its defaults filled in and variables substituted, as JSON-able
    data; secrets (acklane.core.redact's rule) are ``***``."""
    streams = {
        name: {"connector": stream.connector_name, **redact_structure(stream.config)}
        for name, stream in config.streams.items()
    }
    watchers = [
        {
            "name": w.name,
            "stream": w.stream,
            "asset": w.asset,
            "filter": redact_structure(w.filter) if w.filter is not None else None,
            **({"sinks": list(w.sinks)} if w.sinks else {}),
        }
        for w in config.watchers
    ]
    document: dict[str, Any] = {
        "pipeline": config.pipeline,
        "engine": redact_structure(config.engine),
        "store": redact_structure(config.store),
        "state": redact_structure(config.state),
        "metrics": redact_structure(config.metrics),
        "streams": streams,
        "watchers": watchers,
    }
    if config.sinks:
        document["sinks"] = [redact_structure(s) for s in config.sinks.values()]
    if config.tracing.model_fields_set:  # shown when the file has a tracing block
        document["tracing"] = redact_structure(config.tracing)
    return document
