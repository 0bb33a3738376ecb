"""Prometheus metrics, read from the engine's plain counters at scrape time, and the
health probes served beside them.

The hot path only bumps integers; this collector turns them into metric families
when Prometheus scrapes, so metrics cost nothing per event. One small HTTP server
answers ``/metrics``, ``/healthz`` and ``/readyz`` (see
:mod:`acklane.core.observe.health`): aiohttp's (a dependency already, for the sinks),
on an event loop of its own in a daemon thread. A connection costs no thread, so a
crowd of slow or idle clients cannot starve the probes; each has a few seconds to send
its request (:data:`REQUEST_TIMEOUT`), the connections are bounded
(:func:`connection_limit`), and ``/metrics`` is rendered by a small pool of threads.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
from collections.abc import Hashable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import REGISTRY, Collector, CollectorRegistry

from ..errors import AcklaneError
from .redact import redact

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from ..pipeline.runner import Runner

__all__ = [
    "CONNECTION_TIMEOUT",
    "MAX_CONNECTIONS",
    "REQUEST_TIMEOUT",
    "EngineCollector",
    "MetricsPortUnavailable",
    "MetricsServer",
    "connection_limit",
    "start_metrics_server",
]


def _key(key: Hashable) -> str:
    from ..pipeline.runner import stream_key_text

    return stream_key_text(key)


class EngineCollector(Collector):
    """Per group: events broadcast, outcomes, advances, lane heads waiting, queue depths,
    and what its connector did on the broker."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner

    def collect(self) -> Iterator[Metric]:
        """Every family with its label values redacted as log lines are: a label names a
        stream by its key, which holds what its connector connects to (an SQS queue URL
        with a password in it), and a scrape is output like any other."""
        redacted: dict[str, str] = {}
        for metric in self._collect():
            metric.samples = [
                sample._replace(labels=_redact_labels(sample.labels, redacted))
                for sample in metric.samples
            ]
            yield metric

    def _collect(self) -> Iterator[Metric]:
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


def _redact_labels(labels: dict[str, str], seen: dict[str, str]) -> dict[str, str]:
    """``labels`` with each value redacted (``seen``: the values this scrape redacted
    already, as most label values repeat across families)."""
    out = {}
    for name, value in labels.items():
        shown = seen.get(value)
        if shown is None:
            shown = seen[value] = redact(value)
        out[name] = shown
    return out


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


#: Seconds a client has to send its request after it connects; then it is dropped.
REQUEST_TIMEOUT: Final = 5.0
#: Seconds a connection may last in all (its response written included); then it is
#: dropped. One request per connection: every response closes it.
CONNECTION_TIMEOUT: Final = 30.0
#: The most connections open at once, whatever the file descriptor limit allows.
MAX_CONNECTIONS: Final = 1024
#: Connections the kernel queues until the server accepts them.
ACCEPT_QUEUE: Final = 1024
#: Threads that render ``/metrics`` (the probes are answered on the server's loop).
RENDER_THREADS: Final = 2


log = logging.getLogger("acklane.core.observe.metrics")
#: aiohttp's server tells of each malformed request here (see :class:`_AtDebug`).
_requests_log = logging.getLogger("acklane.core.observe.metrics.requests")


class _AtDebug(logging.Filter):
    """aiohttp's server logs a malformed request (a TLS hello, an overlong line) at ERROR
    with a traceback: a client's garbage is no error of the pipeline, and a flood of it
    would flood the log. Such records pass at DEBUG, when DEBUG is on."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return _requests_log.isEnabledFor(logging.DEBUG)


_requests_log.addFilter(_AtDebug())


class MetricsPortUnavailable(AcklaneError, OSError):
    """``metrics.port`` (on ``metrics.host``) cannot be listened on: busy, or not allowed."""


def connection_limit() -> int:
    """:data:`MAX_CONNECTIONS`, or a quarter of the process's file descriptors when that
    is fewer: the endpoints must never take the descriptors the engine's own broker and
    database connections need."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on Windows
        return MAX_CONNECTIONS
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(8, min(MAX_CONNECTIONS, soft // 4))


class _Gate:
    """Who is connected, and for how long they may stay (on the server's loop only).

    A connection that has not sent its request within :data:`REQUEST_TIMEOUT` is dropped,
    and any after :data:`CONNECTION_TIMEOUT`. At the limit, a new connection takes the
    place of the oldest one still sending its request: a probe arriving behind a crowd
    of slow clients is let in and answered, while they wait out their timeouts or are
    dropped one by one. (Left in the kernel's accept queue, it would wait behind them.)
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int) -> None:
        self._loop = loop
        self.limit = limit
        #: connection -> its transport, oldest first
        self._open: dict[object, asyncio.Transport] = {}
        self._answering: set[object] = set()

    def admit(self, handler: object, transport: asyncio.Transport) -> None:
        if len(self._open) >= self.limit:
            waiting = next((h for h in self._open if h not in self._answering), None)
            if waiting is None:  # every one is being answered: the newcomer waits its turn
                transport.abort()
                return
            self.drop(waiting)
        self._open[handler] = transport
        self._loop.call_later(REQUEST_TIMEOUT, self._request_due, handler)

    def answering(self, handler: object) -> None:
        """The connection's request arrived whole: it is answered, not dropped for space."""
        self._answering.add(handler)

    def left(self, handler: object) -> None:
        self._open.pop(handler, None)
        self._answering.discard(handler)

    def drop(self, handler: object) -> None:
        transport = self._open.pop(handler, None)
        self._answering.discard(handler)
        if transport is not None:
            transport.abort()  # not close(): a client that reads nothing would keep it

    def drop_all(self) -> None:
        for handler in list(self._open):
            self.drop(handler)

    def _request_due(self, handler: object) -> None:
        if handler not in self._open:
            return
        if handler not in self._answering:
            self.drop(handler)
            return
        rest = CONNECTION_TIMEOUT - REQUEST_TIMEOUT
        self._loop.call_later(rest, self.drop, handler)


class _GatedServer(web.Server):
    """aiohttp's low-level server, telling the gate of each connection."""

    def __init__(self, gate: _Gate, handler: Any, **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self.gate = gate

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        self.gate.admit(handler, transport)

    def connection_lost(self, handler: RequestHandler, exc: BaseException | None = None) -> None:
        self.gate.left(handler)
        super().connection_lost(handler, exc)


class _Endpoints:
    """``/healthz`` and ``/readyz`` from ``runner.health`` (200, or 503 with a JSON body
    saying what is wrong, redacted); every other path is ``/metrics``."""

    def __init__(self, runner: Runner, registry: CollectorRegistry, gate: _Gate) -> None:
        self.runner = runner
        self.registry = registry
        self.gate = gate
        self.pool = ThreadPoolExecutor(RENDER_THREADS, thread_name_prefix="acklane-metrics")

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        self.gate.answering(request.protocol)
        path = request.path
        try:
            if path == "/healthz":
                response = self._probe(*self.runner.health.liveness())
            elif path == "/readyz":
                response = self._probe(*self.runner.health.readiness())
            else:
                response = await self._metrics(request)
        except Exception:
            # acklane's own bug, told at ERROR here (aiohttp's log of requests is at DEBUG)
            log.exception("Answering %s failed", path)
            response = web.Response(status=500, text="internal error\n")
        response.force_close()
        return response

    def _probe(self, ok: bool, body: dict[str, Any]) -> web.Response:
        return web.Response(
            status=200 if ok else 503,
            text=redact(json.dumps(body, default=str)) + "\n",
            content_type="application/json",
            headers={"Cache-Control": "no-store"},
        )

    async def _metrics(self, request: web.BaseRequest) -> web.Response:
        """The exposition Prometheus asks for (its Accept header; ``name[]`` picks
        families), rendered in the pool so that a large scrape keeps no probe waiting."""
        accept = request.headers.get("Accept", "")
        names = request.query.getall("name[]", [])
        loop = asyncio.get_running_loop()
        data, content_type = await loop.run_in_executor(self.pool, self._render, accept, names)
        response = web.Response(body=data, headers={"Content-Type": content_type})
        if "gzip" in request.headers.get("Accept-Encoding", ""):
            response.enable_compression()
        return response

    def _render(self, accept: str, names: list[str]) -> tuple[bytes, str]:
        encoder, content_type = choose_encoder(accept)
        registry = self.registry.restricted_registry(names) if names else self.registry
        return encoder(registry), content_type


class MetricsServer:
    """The running server; :meth:`close` stops it (the process's exit does too)."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, stop: asyncio.Event, thread: threading.Thread
    ) -> None:
        self._loop = loop
        self._stop = stop
        self.thread = thread
        #: Where it listens (the port is the one chosen when asked for port 0).
        self.host = ""
        self.port = 0
        #: The most connections it keeps open (:func:`connection_limit`).
        self.limit = 0

    def close(self) -> None:
        if self.thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self.thread.join()


def start_metrics_server(
    port: int,
    runner: Runner,
    registry: CollectorRegistry = REGISTRY,
    *,
    addr: str = "127.0.0.1",
) -> MetricsServer:
    """Serve ``/metrics``, ``/healthz`` and ``/readyz`` on ``addr:port`` (port 0: any
    free one) from a daemon thread with an event loop of its own, so that a hung engine
    loop shows as a stale heartbeat rather than as a probe that hangs.

    Raises :class:`MetricsPortUnavailable` naming the port and the setting when it
    cannot listen there.
    """
    collector = EngineCollector(runner)
    registry.register(collector)
    started: Future[MetricsServer] = Future()
    thread = threading.Thread(
        target=lambda: asyncio.run(_serve(addr, port, runner, registry, started, thread)),
        name="acklane-metrics-server",
        daemon=True,
    )
    thread.start()
    try:
        server = started.result()
    except OSError as exc:
        thread.join()
        registry.unregister(collector)
        # asyncio's bind error repeats the address; an unknown host has no errno
        why = os.strerror(exc.errno) if exc.errno and exc.errno > 0 else exc.strerror or exc
        raise MetricsPortUnavailable(
            f"metrics.port {port}: cannot listen on {addr}:{port} (metrics.host): {why}; "
            "set a free port and an address of this host, or metrics.port: null to serve "
            "no metrics"
        ) from None
    return server


async def _serve(
    addr: str,
    port: int,
    runner: Runner,
    registry: CollectorRegistry,
    started: Future[MetricsServer],
    thread: threading.Thread,
) -> None:
    loop = asyncio.get_running_loop()
    gate = _Gate(loop, connection_limit())
    endpoints = _Endpoints(runner, registry, gate)
    try:
        web_server = _GatedServer(gate, endpoints.handle, access_log=None, logger=_requests_log)
        # asyncio accepts up to ``backlog`` connections per turn of its loop, and the
        # gate sees them a few turns later: an eighth of the limit a turn keeps what a
        # flood holds before the gate drops any within half the limit again
        burst = max(1, gate.limit // 8)
        listening = await loop.create_server(web_server, addr, port, backlog=burst)
    except BaseException as exc:  # told to the caller, which waits for the outcome
        endpoints.pool.shutdown(wait=False)
        started.set_exception(exc)
        return
    for listener in listening.sockets:
        # ... while the kernel's queue stays long: a probe queued behind a crowd is
        # accepted once the gate has made room, rather than refused and retried
        with listener.dup() as same:
            same.listen(ACCEPT_QUEUE)
    stop = asyncio.Event()
    server = MetricsServer(loop, stop, thread)
    server.host, server.port = listening.sockets[0].getsockname()[:2]
    server.limit = gate.limit
    started.set_result(server)
    try:
        await stop.wait()
    finally:
        listening.close()
        gate.drop_all()
        await web_server.shutdown(1.0)
        endpoints.pool.shutdown(wait=False, cancel_futures=True)
