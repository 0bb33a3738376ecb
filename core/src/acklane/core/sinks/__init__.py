"""Sinks: stored trigger events delivered onward, at least once per sink, crash or not.

A watcher with ``sinks: [name, ...]`` has each of its stored events delivered to
every named sink: an Airflow asset event (``airflow``), an HTTP POST (``webhook``),
a message on any configured broker (``broker``), or a Python callable
(``function``). The event store is the outbox; the dispatcher delivers from it.
See docs/sinks.md.
"""

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
from ._dispatcher import LATENCY_BUCKETS, Dispatcher, SinkStats, worker_owner
from ._outbox import (
    ParkedEvent,
    SinkStatus,
    parked_events,
    replay_events,
    retry_parked,
    sink_status,
)
from ._registry import KINDS, UnknownSinkKind, build_sinks, sink_class
from ._settings import SinkSettings

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
