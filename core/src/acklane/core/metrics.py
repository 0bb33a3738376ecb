"""Prometheus metrics, read from the engine's plain counters at scrape time.

The hot path only bumps integers; this collector turns them into metric families
when Prometheus scrapes, so metrics cost nothing per event.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import REGISTRY, Collector, CollectorRegistry

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from .runner import Runner

__all__ = ["EngineCollector", "start_metrics_server"]


def _key(key: Hashable) -> str:
    from .runner import stream_key_text

    return stream_key_text(key)


class EngineCollector(Collector):
    """Per group: events broadcast, outcomes, advances, lane heads waiting, queue depths,
    and what its connector did on the broker."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner

    def collect(self) -> Iterator[Metric]:
        manager = self.runner.manager
        broadcast = CounterMetricFamily(
            "acklane_events_broadcast", "Raw events broadcast per group", labels=["key"]
        )
        outcomes = CounterMetricFamily(
            "acklane_event_outcomes", "Subscriber resolutions by kind", labels=["key", "outcome"]
        )
        batches = CounterMetricFamily(
            "acklane_advance_batches", "advance() calls per group", labels=["key"]
        )
        advanced = CounterMetricFamily(
            "acklane_advanced_events", "Events handed to advance()", labels=["key"]
        )
        seconds = CounterMetricFamily(
            "acklane_advance_seconds", "Time spent in advance()", labels=["key"]
        )
        unclaimed = CounterMetricFamily(
            "acklane_events_unclaimed", "Events broadcast to an empty snapshot", labels=["key"]
        )
        for key, s in manager.group_stats().items():
            k = _key(key)
            broadcast.add_metric([k], s.broadcast)
            outcomes.add_metric([k, "acked"], s.acked)
            outcomes.add_metric([k, "failed"], s.failed)
            outcomes.add_metric([k, "rejected"], s.rejected)
            batches.add_metric([k], s.advance_batches)
            advanced.add_metric([k], s.advanced_events)
            seconds.add_metric([k], s.advance_seconds)
            unclaimed.add_metric([k], s.unclaimed)
        heads = GaugeMetricFamily(
            "acklane_lane_heads_waiting", "Lanes whose head is not resolved", labels=["key"]
        )
        for key, n in manager.lane_heads_waiting().items():
            heads.add_metric([_key(key)], n)
        depth = GaugeMetricFamily(
            "acklane_subscriber_queue_depth",
            "Raw events queued per subscriber",
            labels=["key", "trigger_id"],
        )
        for (key, tid), n in manager.queue_depths().items():
            depth.add_metric([_key(key), tid], n)
        actions = CounterMetricFamily(
            "acklane_connector_actions",
            "What each group's connector did on the broker (commits, dead-lettered, dropped, "
            "redelivered, ...)",
            labels=["key", "action"],
        )
        for key, counters in manager.producer_counters().items():
            k = _key(key)
            for action, count in counters.items():
                actions.add_metric([k, action], count)
        yield from (broadcast, outcomes, batches, advanced, seconds, unclaimed, heads, depth)
        yield actions
        store = self.runner._store
        if store is not None:
            persisted = CounterMetricFamily(
                "acklane_events_persisted",
                "Trigger events committed by the event store",
                labels=["kind"],
            )
            persisted.add_metric(["inserted"], store.stats.inserted)
            persisted.add_metric(["duplicate"], store.stats.duplicates)
            yield persisted


def start_metrics_server(port: int, runner: Runner, registry: CollectorRegistry = REGISTRY) -> None:
    """Serve ``/metrics`` on ``port`` (a daemon thread of prometheus-client's)."""
    registry.register(EngineCollector(runner))
    start_http_server(port, registry=registry)
