"""Prometheus metrics, read from the engine's plain counters at scrape time, and the
health probes served beside them.

The hot path only bumps integers; this collector turns them into metric families
when Prometheus scrapes, so metrics cost nothing per event. One small HTTP server
(the standard library's wsgiref, in a daemon thread) answers ``/metrics``,
``/healthz`` and ``/readyz`` (see :mod:`acklane.core.observe.health`).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Hashable, Iterable, Iterator
from datetime import UTC, datetime
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import make_wsgi_app
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import REGISTRY, Collector, CollectorRegistry

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from ..pipeline.runner import Runner

__all__ = ["EngineCollector", "MetricsServer", "health_app", "start_metrics_server"]


def _key(key: Hashable) -> str:
    from ..pipeline.runner import stream_key_text

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
        yield from _poison_metrics(self.runner)
        yield from _stream_metrics(self.runner)
        yield from _lag_metrics(self.runner)
        yield from _sink_metrics(self.runner)
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


def _poison_metrics(runner: Runner) -> Iterator[Metric]:
    """Per stream key: cohort restarts, failed attempts of messages, poison messages."""
    restarts = CounterMetricFamily(
        "acklane_cohort_restarts",
        "Restarts of a stream's watchers (a watcher failed, or the group did)",
        labels=["key"],
    )
    failures = CounterMetricFamily(
        "acklane_message_failures",
        "Failed attempts attributed to one message (its filter raised, or timed out on it)",
        labels=["key"],
    )
    poisoned = CounterMetricFamily(
        "acklane_poison_messages",
        "Messages rejected for dead-lettering because they failed max_attempts times",
        labels=["key"],
    )
    for book in list(runner.poison.streams().values()):
        restarts.add_metric([book.key_text], book.restarts)
        failures.add_metric([book.key_text], book.failures)
        poisoned.add_metric([book.key_text], book.poisoned)
    yield from (restarts, failures, poisoned)


def _stream_metrics(runner: Runner) -> Iterator[Metric]:
    """Per stream (by its name, as the YAML gives it): the progress lines' counts, its
    state, and each watcher's events; what ``acklane top``, the Grafana dashboard and
    the alert rules read."""
    messages = CounterMetricFamily(
        "acklane_stream_messages",
        "Messages of the stream: received (broadcast to its watchers), and handed back "
        "to the connector as acked, rejected (dead-lettered or dropped) or failed",
        labels=["stream", "outcome"],
    )
    events = CounterMetricFamily(
        "acklane_stream_events", "Trigger events the stream's watchers stored", labels=["stream"]
    )
    restarts = CounterMetricFamily(
        "acklane_stream_restarts", "Restarts of the stream's watchers", labels=["stream"]
    )
    state = GaugeMetricFamily(
        "acklane_stream_state",
        "1 for the stream's current state (starting, polling, restarting, stopped)",
        labels=["stream", "state"],
    )
    ready = GaugeMetricFamily(
        "acklane_stream_ready",
        "1 when the stream polls and its broker answers (as /readyz says), else 0",
        labels=["stream"],
    )
    watcher = CounterMetricFamily(
        "acklane_watcher_events",
        "Trigger events each watcher stored",
        labels=["stream", "watcher"],
    )
    statuses = {s.key_text: s for s in list(runner.health.cohorts.values())}
    for progress in list(runner.progress.streams.values()):
        stream = progress.streams
        for outcome, count in progress.counts().items():
            if outcome != "events":
                messages.add_metric([stream, outcome], count)
        events.add_metric([stream], progress.events)
        restarts.add_metric([stream], progress.restarts)
        for name, count in list(progress.watcher_events.items()):
            watcher.add_metric([stream, name], count)
        status = statuses.get(progress.key_text)
        if status is not None:
            for name in ("starting", "polling", "restarting", "stopped"):
                state.add_metric([stream, name], 1.0 if status.state == name else 0.0)
            up = status.state == "polling" and status.broker_problem is None
            ready.add_metric([stream], 1.0 if up else 0.0)
    yield from (messages, events, restarts, state, ready, watcher)


def _lag_metrics(runner: Runner) -> Iterator[Metric]:
    """Per stream and partition (or queue): what waits for it on its broker, as its
    probe last read it (:mod:`acklane.core.observe.lag`); shaped for KEDA's
    Prometheus scaler and an HPA on an external metric (one series per partition,
    ``sum by (stream)`` is the stream's lag)."""
    labels = ["broker", "stream", "partition"]
    lag = GaugeMetricFamily(
        "acklane_stream_lag",
        "Messages waiting for the stream on its broker (Kafka: log end minus committed "
        "offset; SQS: visible; Service Bus: active), at the last read",
        labels=labels,
    )
    backlog = GaugeMetricFamily(
        "acklane_stream_backlog",
        "The broker's own counts by state (SQS: visible, in_flight, delayed), at the last read",
        labels=[*labels, "state"],
    )
    age = GaugeMetricFamily(
        "acklane_stream_lag_age_seconds",
        "Seconds since the stream's backlog was last read (it grows while reads fail)",
        labels=["broker", "stream"],
    )
    failures = CounterMetricFamily(
        "acklane_stream_lag_read_failures",
        "Reads of the stream's backlog that failed",
        labels=["broker", "stream"],
    )
    for entry in list(runner.lag.streams.values()):
        stream = entry.streams
        failures.add_metric([entry.broker, stream], entry.failures)
        seconds = entry.age()
        if seconds is None:
            continue
        age.add_metric([entry.broker, stream], seconds)
        for b in entry.backlog:
            lag.add_metric([entry.broker, stream, b.partition], b.lag)
            for state, value in b.states:
                backlog.add_metric([entry.broker, stream, b.partition, state], value)
    yield from (lag, backlog, age, failures)


def _sink_metrics(runner: Runner) -> Iterator[Metric]:
    """Per sink: deliveries by outcome, lag, the oldest pending event's age, parked events,
    whether this process delivers it, and the stored -> delivered latency. The gauges
    counted from the store's rows say whose rows they counted (``pipeline``)."""
    dispatcher = runner.sinks
    if dispatcher is None:
        return
    from ..sinks import LATENCY_BUCKETS

    deliveries = CounterMetricFamily(
        "acklane_sink_deliveries",
        "Delivery attempts by outcome (delivered, retried, parked, found: already there)",
        labels=["sink", "outcome"],
    )
    lag = GaugeMetricFamily(
        "acklane_sink_lag_events",
        "Stored events not yet delivered nor parked (pending, in flight, retrying)",
        labels=["pipeline", "sink"],
    )
    oldest = GaugeMetricFamily(
        "acklane_sink_oldest_pending_seconds",
        "Age of the oldest event not yet delivered nor parked (0 when none)",
        labels=["pipeline", "sink"],
    )
    parked = GaugeMetricFamily(
        "acklane_sink_parked_events", "Events parked for the sink", labels=["pipeline", "sink"]
    )
    holding = GaugeMetricFamily(
        "acklane_sink_delivering",
        "1 when this process holds the sink's lease (it delivers), else 0",
        labels=["sink"],
    )
    latency = HistogramMetricFamily(
        "acklane_sink_delivery_latency_seconds",
        "From an event's commit in the store to its delivery",
        labels=["sink"],
    )
    now = datetime.now(UTC)
    for s in dispatcher.stats():
        deliveries.add_metric([s.sink, "delivered"], s.delivered)
        deliveries.add_metric([s.sink, "retried"], s.retried)
        deliveries.add_metric([s.sink, "parked"], s.parked)
        deliveries.add_metric([s.sink, "found"], s.found_delivered)
        holding.add_metric([s.sink], 1.0 if s.holding else 0.0)
        status = s.status
        if status is not None:
            row = [dispatcher.pipeline, s.sink]
            lag.add_metric(row, status.lag)
            parked.add_metric(row, status.parked)
            first = status.oldest_pending_at
            oldest.add_metric(row, 0.0 if first is None else (now - first).total_seconds())
        cumulative, buckets = 0, []
        for bound, n in zip(LATENCY_BUCKETS, list(s.latency_buckets), strict=True):
            cumulative += n
            buckets.append((repr(bound), cumulative))
        buckets.append(("+Inf", s.latency_count))
        latency.add_metric([s.sink], buckets, s.latency_sum)
    yield from (deliveries, lag, oldest, parked, holding, latency)


_WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def health_app(runner: Runner, metrics: _WsgiApp) -> _WsgiApp:
    """``/healthz`` and ``/readyz`` from ``runner.health`` (200, or 503 with a JSON body
    saying what is wrong); every other path goes to ``metrics``."""
    from .redact import redact

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or "/"
        if path == "/healthz":
            ok, body = runner.health.liveness()
        elif path == "/readyz":
            ok, body = runner.health.readiness()
        else:
            return metrics(environ, start_response)
        data = (redact(json.dumps(body, default=str)) + "\n").encode()
        start_response(
            "200 OK" if ok else "503 Service Unavailable",
            [
                ("Content-Type", "application/json"),
                ("Content-Length", str(len(data))),
                ("Cache-Control", "no-store"),
            ],
        )
        return [] if environ.get("REQUEST_METHOD") == "HEAD" else [data]

    return app


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Probes every few seconds would flood stderr."""


class MetricsServer:
    """The running server; :meth:`close` stops it (the process's exit does too)."""

    def __init__(self, server: WSGIServer, thread: threading.Thread) -> None:
        self.server = server
        self.thread = thread

    @property
    def port(self) -> int:
        return int(self.server.server_port)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def start_metrics_server(
    port: int,
    runner: Runner,
    registry: CollectorRegistry = REGISTRY,
    *,
    addr: str = "0.0.0.0",  # a scrape target listens on every interface
) -> MetricsServer:
    """Serve ``/metrics``, ``/healthz`` and ``/readyz`` on ``port`` (0: any free port)
    from a daemon thread."""
    registry.register(EngineCollector(runner))
    app = health_app(runner, make_wsgi_app(registry))
    server = make_server(addr, port, app, _ThreadingServer, handler_class=_QuietHandler)
    thread = threading.Thread(
        target=server.serve_forever, name="acklane-metrics-server", daemon=True
    )
    thread.start()
    return MetricsServer(server, thread)
