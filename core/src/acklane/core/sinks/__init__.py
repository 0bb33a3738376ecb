"""Sinks: stored trigger events delivered onward, at least once per sink, crash or not.

A watcher with ``sinks: [name, ...]`` has each of its stored events delivered to
every named sink: an Airflow asset event (``airflow``), an HTTP POST (``webhook``),
a message on any configured broker (``broker``), or a Python callable
(``function``). The event store is the outbox; the dispatcher delivers from it.
See docs/sinks.md.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_names
from ._base import (
    Delivery,
    DeliveryError,
    DeliveryResult,
    RefusedDelivery,
    RetryableDelivery,
    Sink,
    SinkContext,
    SinkError,
    event_id_for,
)
from ._registry import KINDS, UnknownSinkKind, build_sinks, sink_class
from ._settings import SinkSettings

if TYPE_CHECKING:
    from ._dispatcher import LATENCY_BUCKETS, Dispatcher, SinkStats, worker_owner
    from ._outbox import (
        ParkedEvent,
        SinkStatus,
        parked_events,
        replay_events,
        retry_parked,
        sink_status,
    )

#: What reads or writes the event store (SQLAlchemy), imported when first asked for:
#: the configuration's validation needs the sink kinds, not the dispatcher.
__getattr__ = lazy_names(
    __name__,
    {
        "_dispatcher": ("LATENCY_BUCKETS", "Dispatcher", "SinkStats", "worker_owner"),
        "_outbox": (
            "ParkedEvent",
            "SinkStatus",
            "parked_events",
            "replay_events",
            "retry_parked",
            "sink_status",
        ),
    },
)
__all__ = [
    "KINDS",
    "LATENCY_BUCKETS",
    "Delivery",
    "DeliveryError",
    "DeliveryResult",
    "Dispatcher",
    "ParkedEvent",
    "RefusedDelivery",
    "RetryableDelivery",
    "Sink",
    "SinkContext",
    "SinkError",
    "SinkSettings",
    "SinkStats",
    "SinkStatus",
    "UnknownSinkKind",
    "build_sinks",
    "event_id_for",
    "parked_events",
    "replay_events",
    "retry_parked",
    "sink_class",
    "sink_status",
    "worker_owner",
]
