"""The dispatcher: stored events delivered to each sink, at least once, crash or not.

One :class:`SinkWorker` per sink. A worker delivers only while its process holds
the sink's lease (a row in the store's database, renewed every third of its
time-to-live), so processes sharing a PostgreSQL store share the sinks without
delivering an event twice, and a process that dies has its sinks taken over once
its lease lapses. Holding the lease, a worker repeats rounds:

1. pick the work: events due again (retrying, replayed, or parked and retried),
   then events beyond the sink's cursor, in store order; an ordered sink takes
   nothing new while an event retries (it holds the ones behind it);
2. record how far it may send (``claimed_to``), then send, ``batch_size`` events
   per request, one request at a time (ordered) or ``concurrency`` at once; an
   exactly-once sink first asks the destination which of the unsure ones
   (retried, or beyond the cursor after a takeover) it already has;
3. settle in one transaction: the cursor past what was attempted, the failed
   events as rows (retry at a backoff, or parked with the reason).

A round starts when the event store commits new rows (in this process, or through
PostgreSQL's ``NOTIFY`` in another), when a retry falls due, or at the latest every
``poll_interval`` (the safety net).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from bisect import bisect_left
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from time import monotonic as _monotonic

from sqlalchemy.ext.asyncio import AsyncEngine

from ..names import DEFAULT_PIPELINE
from ..redact import redact
from ..sql import async_engine
from ._base import Delivery, DeliveryResult, RefusedDelivery, Sink
from ._outbox import Failure, LeaseLost, Outbox, SinkStatus, StoredWork, sink_status
from ._policy import judge
from ._settings import SinkSettings

__all__ = ["LATENCY_BUCKETS", "Dispatcher", "SinkStats", "SinkWorker", "worker_owner"]

log = logging.getLogger("acklane.core.sinks")

#: Upper bounds (seconds) of the stored -> delivered latency histogram.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def worker_owner() -> str:
    """This process's name in the sinks' lease column: host, pid and a random part."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass(slots=True)
class SinkStats:
    """Plain counters and gauges of one sink, read by /metrics and /readyz from another
    thread (replace, never mutate in place)."""

    sink: str
    kind: str
    delivered: int = 0
    retried: int = 0
    parked: int = 0
    #: Events an exactly-once sink found already delivered (not sent again).
    found_delivered: int = 0
    latency_buckets: list[int] = field(default_factory=lambda: [0] * len(LATENCY_BUCKETS))
    latency_count: int = 0
    latency_sum: float = 0.0
    #: Why the sink cannot deliver now (unreachable, refusing everything), or None.
    problem: str | None = None
    #: Whether this process holds the sink's lease.
    holding: bool = False
    #: The last status read from the database (lag, oldest pending, parked), or None.
    status: SinkStatus | None = None

    def observe_latency(self, seconds: float) -> None:
        self.latency_count += 1
        self.latency_sum += seconds
        i = bisect_left(LATENCY_BUCKETS, seconds)
        if i < len(LATENCY_BUCKETS):
            self.latency_buckets[i] += 1


class SinkWorker:
    """Delivers one sink's events while this process holds its lease."""

    def __init__(
        self,
        sink: Sink,
        watchers: Sequence[str],
        engine: AsyncEngine,
        owner: str,
        *,
        lease_ttl: float = 15.0,
        poll_interval: float = 2.0,
        window: int | None = None,
        pipeline: str = DEFAULT_PIPELINE,
        streams: Mapping[str, str] | None = None,
    ) -> None:
        self.sink = sink
        self.settings: SinkSettings = sink.settings
        self.outbox = Outbox(
            engine,
            sink.name,
            watchers,
            owner,
            start=self.settings.start,
            pipeline=pipeline,
            streams=streams,
        )
        self.stats = SinkStats(sink.name, sink.kind)
        self.lease_ttl = lease_ttl
        self.poll_interval = poll_interval
        s = self.settings
        per_round = s.batch_size * (1 if s.ordered else s.concurrency)
        # A round settles once per window: several requests' worth, so that the two
        # transactions of a round are shared by many events.
        self.window = window if window is not None else max(per_round, min(1000, per_round * 8))
        self._wake = asyncio.Event()
        self._stopping = False
        self._next_due: datetime | None = None
        self._failing = False
        #: Whether retrying rows may exist (this worker wrote some and has not seen them
        #: go), and when the table was last looked at.
        self._may_have_rows = True
        self._rows_checked = 0.0

    # -- control -----------------------------------------------------------------------

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        """Finish the round in progress, then give the lease up and return."""
        self._stopping = True
        self._wake.set()

    # -- the loop ----------------------------------------------------------------------

    async def run(self) -> None:
        """Open the sink and deliver until :meth:`stop`; retries what fails (the database,
        the sink's opening) with a capped backoff, and never raises but cancellation."""
        pause = _Backoff()
        opened = registered = False
        try:
            while not self._stopping:
                try:
                    if not opened:
                        await self.sink.open()
                        opened = True
                    if not registered:  # again after a database error, until it is done
                        await self.outbox.register()
                        registered = True
                    if await self.outbox.acquire(self.lease_ttl):
                        self.stats.holding = True
                        log.info(
                            "sink %s: delivering to %s (from event %d)",
                            self.sink.name,
                            self.sink.destination,
                            self.outbox.cursor,
                        )
                        await self._serve()
                    else:
                        await self._sleep(self.lease_ttl / 3)
                    pause.reset()
                except LeaseLost:
                    log.warning("sink %s: another process took the lease over", self.sink.name)
                except Exception as exc:
                    _raise_if_cancelling()
                    delay = next(pause)
                    while isinstance(exc, ExceptionGroup) and len(exc.exceptions) == 1:
                        exc = exc.exceptions[0]  # the round's own error, not its TaskGroup's
                    self.stats.problem = redact(f"{type(exc).__name__}: {exc}")
                    log.warning(
                        "sink %s: %s; retrying in %.1f s",
                        self.sink.name,
                        self.stats.problem,
                        delay,
                    )
                    log.debug("sink %s failed", self.sink.name, exc_info=True)
                    await self._sleep(delay)
                finally:
                    self.stats.holding = False
        finally:
            await self._leave(opened)

    async def _leave(self, opened: bool) -> None:
        try:
            await asyncio.shield(self.outbox.release())
        except Exception as exc:
            log.debug("sink %s: releasing the lease failed: %s", self.sink.name, exc)
        if opened:
            try:
                await self.sink.aclose()
            except Exception as exc:
                log.warning("sink %s: closing failed: %s", self.sink.name, redact(str(exc)))

    async def _serve(self) -> None:
        """Rounds while the lease is held; a keeper renews it beside them."""
        try:
            async with asyncio.TaskGroup() as tg:
                keeper = tg.create_task(
                    self._keep_lease(), name=f"acklane-sink-{self.sink.name}-lease"
                )
                try:
                    while not self._stopping:
                        self._wake.clear()
                        if not await self._round():
                            await self._idle()
                finally:
                    keeper.cancel()
        except* LeaseLost:
            raise LeaseLost(self.sink.name) from None

    async def _keep_lease(self) -> None:
        interval = self.lease_ttl / 3
        held_until = _now().timestamp() + self.lease_ttl
        while True:
            await asyncio.sleep(interval)
            try:
                await self.outbox.renew(self.lease_ttl)
                held_until = _now().timestamp() + self.lease_ttl
            except LeaseLost:
                raise
            except Exception as exc:
                _raise_if_cancelling()
                if _now().timestamp() >= held_until:
                    log.warning(
                        "sink %s: the lease could not be renewed before it lapsed: %s",
                        self.sink.name,
                        exc,
                    )
                    raise LeaseLost(self.sink.name) from exc
                log.debug("sink %s: renewing the lease failed (retrying): %s", self.sink.name, exc)

    async def _idle(self) -> None:
        timeout = self.poll_interval
        if self._next_due is not None:
            timeout = max(0.0, min(timeout, (self._next_due - _now()).total_seconds()))
        await self._sleep(timeout)

    async def _sleep(self, seconds: float) -> None:
        if self._stopping:
            return
        try:
            async with asyncio.timeout(seconds):
                await self._wake.wait()
        except TimeoutError:
            pass

    # -- one round ---------------------------------------------------------------------

    async def _round(self) -> bool:
        """Pick, send and settle one window of work; False when there was nothing due."""
        ob = self.outbox
        waiting = 0
        if self._may_have_rows or _monotonic() >= self._rows_checked + self.poll_interval:
            # Rows appear through this worker's settlements, or through `sinks retry` and
            # `events replay` in another process: those are looked for once a poll.
            waiting, first_due = await ob.retrying()
            self._next_due = first_due
            self._may_have_rows = waiting > 0
            self._rows_checked = _monotonic()
        work: list[StoredWork] = await ob.due(self.window) if waiting else []
        if self.settings.ordered:
            if waiting and not work:
                return False  # the first retry is not due: the events behind it wait
            if not waiting:
                work = await ob.fresh(self.window)
        elif len(work) < self.window:
            work += await ob.fresh(self.window - len(work))
        if not work:
            return False
        fresh = [w.delivery.store_id for w in work if not w.from_row]
        if fresh and self.sink.exactly_once:
            # What the next holder must look up if this process dies before settling
            # (an at-least-once sink sends it again anyway: no write needed).
            await ob.claim(max(fresh))
        results = await self._send(work)
        await self._settle(work, results)
        return True

    async def _send(self, work: Sequence[StoredWork]) -> list[DeliveryResult | _NotSent]:
        """One result per item of ``work`` (``_NOT_SENT`` for an ordered round's items
        after a failed request: they are attempted in a later round)."""
        results: list[DeliveryResult | _NotSent] = [_NOT_SENT] * len(work)
        batches = list(_chunks(range(len(work)), self.sink.max_batch))
        if self.settings.ordered:
            for batch in batches:
                got = await self._attempt([work[i] for i in batch])
                for i, result in zip(batch, got, strict=True):
                    results[i] = result
                if any(r is not None for r in got):
                    break  # hold what follows: order per sink
            return results
        gate = asyncio.Semaphore(self.settings.concurrency)

        async def one(batch: range) -> None:
            async with gate:
                got = await self._attempt([work[i] for i in batch])
            for i, result in zip(batch, got, strict=True):
                results[i] = result

        async with asyncio.TaskGroup() as tg:
            for batch in batches:
                tg.create_task(one(batch))
        return results

    async def _attempt(self, items: Sequence[StoredWork]) -> list[DeliveryResult]:
        """Send one request's worth; an exactly-once sink first skips what it has."""
        sink = self.sink
        results: list[DeliveryResult] = [None] * len(items)
        todo = list(range(len(items)))
        if sink.exactly_once:
            unsure = [i for i in todo if items[i].unsure or items[i].attempts > 0]
            if unsure:
                try:
                    have = await sink.delivered_already([items[i].delivery for i in unsure])
                except Exception as exc:
                    _raise_if_cancelling()
                    for i in unsure:
                        results[i] = exc
                    skip = set(unsure)
                    todo = [i for i in todo if i not in skip]
                else:
                    found = {i for i in unsure if items[i].delivery.event_id in have}
                    self.stats.found_delivered += len(found)
                    todo = [i for i in todo if i not in found]
        if not todo:
            return results
        got = await self._deliver([items[i].delivery for i in todo])
        if len(todo) > 1 and all(isinstance(r, RefusedDelivery) for r in got):
            # One bad event must not park its batch: each alone tells which it is.
            got = [(await self._deliver([items[i].delivery]))[0] for i in todo]
        for i, result in zip(todo, got, strict=True):
            results[i] = result
        return results

    async def _deliver(self, batch: list[Delivery]) -> list[DeliveryResult]:
        try:
            got = await self.sink.deliver(batch)
        except Exception as exc:  # a sink that raises for its whole batch
            _raise_if_cancelling()
            return [exc] * len(batch)
        if len(got) != len(batch):
            error = RuntimeError(
                f"sink {self.sink.name}: deliver() gave {len(got)} result(s) for "
                f"{len(batch)} event(s)"
            )
            return [error] * len(batch)
        return list(got)

    async def _settle(
        self, work: Sequence[StoredWork], results: Sequence[DeliveryResult | _NotSent]
    ) -> None:
        now = _now()
        stats = self.stats
        cursor = self.outbox.cursor
        delivered = 0
        cleared: list[int] = []
        failures: list[Failure] = []
        last_reason: str | None = None
        observe = stats.observe_latency
        for item, result in zip(work, results, strict=True):
            if isinstance(result, _NotSent):
                continue
            d = item.delivery
            if not item.from_row and d.store_id > cursor:
                cursor = d.store_id
            if result is None:  # delivered: the common case, without a verdict object
                delivered += 1
                if item.from_row:
                    cleared.append(d.store_id)
                observe((now - d.created_at).total_seconds())
                continue
            verdict = judge(
                result,
                attempts=item.attempts + 1,
                stored_at=d.created_at,
                now=now,
                settings=self.settings,
            )
            if verdict.outcome == "delivered":
                delivered += 1
                if item.from_row:
                    cleared.append(d.store_id)
                stats.observe_latency((now - d.created_at).total_seconds())
                continue
            last_reason = verdict.reason
            failures.append(
                Failure(
                    d.store_id,
                    verdict.outcome,
                    verdict.attempts,
                    redact(verdict.reason or ""),
                    verdict.next_attempt_at,
                    unsure=self.sink.exactly_once,
                )
            )
            if verdict.outcome == "parked":
                log.warning(
                    "sink %s: event %s (watcher %s, store id %d) parked after %d attempt(s): %s",
                    self.sink.name,
                    d.event_id,
                    d.watcher,
                    d.store_id,
                    verdict.attempts,
                    redact(verdict.reason or ""),
                )
        await self.outbox.settle(
            cursor=cursor, delivered=delivered, cleared=cleared, failures=failures
        )
        if any(f.state == "retry" for f in failures) or cleared:
            self._may_have_rows = True
        stats.delivered += delivered
        stats.retried += sum(1 for f in failures if f.state == "retry")
        stats.parked += sum(1 for f in failures if f.state == "parked")
        self._tell(delivered, failures, last_reason)

    def _tell(self, delivered: int, failures: Sequence[Failure], reason: str | None) -> None:
        """Log a sink's trouble once when it starts and once when it ends."""
        retrying = [f for f in failures if f.state == "retry"]
        if retrying and not delivered:
            self.stats.problem = redact(f"deliveries failing: {reason}")
            if not self._failing:
                self._failing = True
                log.warning(
                    "sink %s: delivery to %s failing, retrying with backoff: %s",
                    self.sink.name,
                    self.sink.destination,
                    self.stats.problem,
                )
        elif delivered and self._failing:
            self._failing = False
            self.stats.problem = None
            log.info("sink %s: delivering again", self.sink.name)
        elif delivered:
            self.stats.problem = None


class _NotSent:
    """The result of an item an ordered round did not get to."""


_NOT_SENT = _NotSent()


class Dispatcher:
    """All of a pipeline's sinks: one worker each, wake-ups, status for metrics.

    ``async with Dispatcher(...) as d:`` starts the workers (tasks the dispatcher owns
    and awaits); :meth:`wake` is the event store's commit listener; leaving stops the
    workers (each finishes its round, bounded by ``shutdown_timeout``) and releases
    their leases.
    """

    def __init__(
        self,
        url: str,
        sinks: Sequence[tuple[Sink, Sequence[str]]],
        *,
        owner: str | None = None,
        lease_ttl: float = 15.0,
        poll_interval: float = 2.0,
        status_interval: float = 5.0,
        shutdown_timeout: float = 30.0,
        notify_channel: str | None = None,
        pipeline: str = DEFAULT_PIPELINE,
        streams: Mapping[str, str] | None = None,
    ) -> None:
        self.url = url
        #: The pipeline whose events the sinks deliver (and whose rows they keep).
        self.pipeline = pipeline
        #: Each watcher's stream name (``stream`` of what the sinks send).
        self.streams = streams
        self.owner = owner or worker_owner()
        self._specs = list(sinks)
        self._lease_ttl = lease_ttl
        self._poll_interval = poll_interval
        self._status_interval = status_interval
        self._shutdown_timeout = shutdown_timeout
        self._notify_channel = notify_channel
        self._engine: AsyncEngine | None = None
        self.workers: list[SinkWorker] = []
        self._tasks: list[asyncio.Task[None]] = []

    def stats(self) -> list[SinkStats]:
        return [w.stats for w in self.workers]

    def problems(self) -> Mapping[str, str]:
        """Sinks that cannot deliver now, and why (for /readyz)."""
        return {w.sink.name: w.stats.problem for w in self.workers if w.stats.problem}

    def wake(self) -> None:
        for worker in self.workers:
            worker.wake()

    async def __aenter__(self) -> Dispatcher:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        engine = async_engine(self.url)
        self._engine = engine
        self.workers = [
            SinkWorker(
                sink,
                watchers,
                engine,
                self.owner,
                lease_ttl=self._lease_ttl,
                poll_interval=self._poll_interval,
                pipeline=self.pipeline,
                streams=self.streams,
            )
            for sink, watchers in self._specs
        ]
        for worker in self.workers:
            self._tasks.append(
                asyncio.create_task(worker.run(), name=f"acklane-sink-{worker.sink.name}")
            )
        self._tasks.append(asyncio.create_task(self._refresh_status(), name="acklane-sink-status"))
        if self._notify_channel is not None and engine.dialect.name == "postgresql":
            self._tasks.append(
                asyncio.create_task(self._listen(self._notify_channel), name="acklane-sink-listen")
            )

    async def aclose(self) -> None:
        """Stop every worker after its round, release the leases, dispose the engine."""
        for worker in self.workers:
            worker.stop()
        workers = self._tasks[: len(self.workers)]
        helpers = self._tasks[len(self.workers) :]
        for task in helpers:
            task.cancel()
        if workers:
            _, late = await asyncio.wait(workers, timeout=self._shutdown_timeout)
            for task in late:
                log.warning("sink %s: still delivering at shutdown; cancelled", task.get_name())
                task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self._engine is not None:
            await self._engine.dispose()
            self._engine = None

    async def _refresh_status(self) -> None:
        assert self._engine is not None
        while True:
            try:
                statuses = await sink_status(
                    self._engine,
                    {w.sink.name: w.outbox.watchers for w in self.workers},
                    pipeline=self.pipeline,
                )
            except Exception as exc:
                _raise_if_cancelling()
                log.debug("sinks: reading their status failed: %s", exc)
            else:
                for worker, status in zip(self.workers, statuses, strict=True):
                    worker.stats.status = status
            await asyncio.sleep(self._status_interval)

    async def _listen(self, channel: str) -> None:
        """Wake on ``NOTIFY channel`` from event writers in other processes."""
        import psycopg

        from ..sql import normalize_url

        conninfo = normalize_url(self.url, asynchronous=False).set(drivername="postgresql")
        pause = _Backoff()
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    conninfo.render_as_string(hide_password=False), autocommit=True
                )
                async with conn:
                    await conn.execute(f"LISTEN {channel}")
                    pause.reset()
                    self.wake()  # whatever was committed while not listening
                    async for _ in conn.notifies():
                        self.wake()
            except Exception as exc:
                _raise_if_cancelling()
                delay = next(pause)
                log.debug("sinks: LISTEN %s failed (%s); again in %.1f s", channel, exc, delay)
                await asyncio.sleep(delay)


class _Backoff:
    """0.5 s doubling to 30 s; reset after a success."""

    def __init__(self) -> None:
        self._next = 0.5

    def __next__(self) -> float:
        delay = self._next
        self._next = min(30.0, self._next * 2)
        return delay

    def reset(self) -> None:
        self._next = 0.5


def _chunks(items: range, size: int) -> Iterator[range]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _now() -> datetime:
    return datetime.now(UTC)


def _raise_if_cancelling() -> None:
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
