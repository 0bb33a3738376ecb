"""Sink kinds by name: ``kind: webhook`` finds its class here, imported only when used."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from ._base import Sink

__all__ = ["KINDS", "UnknownSinkKind", "sink_class"]

#: kind -> "module:Class" of its :class:`~acklane.core.sinks.Sink` subclass.
KINDS: Final[dict[str, str]] = {
    "airflow": "acklane.core.sinks.airflow:AirflowSink",
    "broker": "acklane.core.sinks.broker:BrokerSink",
    "function": "acklane.core.sinks.function:FunctionSink",
    "webhook": "acklane.core.sinks.webhook:WebhookSink",
}


class UnknownSinkKind(LookupError):
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
