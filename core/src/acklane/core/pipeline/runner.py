"""The runner: builds watchers from a configuration and keeps them running.

Watchers that share a stream key form a **cohort**. A cohort subscribes together
(so every member is in the first event's snapshot) and, when any member fails
(group failure, ack timeout, overflow, a crashing filter) or leaves (its filter
returns, the event store raises), the whole cohort is restarted together after a
capped exponential backoff: a member that rejoined alone would miss what was
broadcast while it was away, and the others would let the broker advance past it.
A member that leaves fails the group *before* it detaches (the engine's orderly
leave would ack the event it is on and take it out of later broadcasts), so
nothing is advanced without it. On restart the broker redelivers from its last
advanced position; the event store drops the duplicates.

Shutdown (SIGINT/SIGTERM, or :meth:`Runner.request_stop`) is graceful and bounded
by ``engine.shutdown_timeout``: stop pulling, let watchers finish what is queued,
flush the event store (confirmations arrive), advance what is resolved, close the
producers, close the stores. A stop requested before :meth:`Runner.run` makes it
return at once, having started nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from collections.abc import Hashable, Iterator, Sequence
from typing import TYPE_CHECKING, Final

from ..events import EventStore
from ..manager import (
    HookChain,
    Hooks,
    SharedStreamManager,
    hook_of,
)
from ..observe.health import Health
from ..observe.lag import LagMonitor
from ..observe.progress import Progress
from ..observe.tracing import MessageTracer, start_tracing
from ..producer import AdvanceItem
from ..sinks import Dispatcher, build_sinks
from ._cohort import RestartsExhausted, WatcherLeft, _Cohort, _why, stream_key_text
from .poison import PoisonPolicy
from .watcher import WatcherTrigger, build_watchers

#: The PostgreSQL channel event writers NOTIFY and sink dispatchers LISTEN on.
SINK_CHANNEL = "acklane_events"

if TYPE_CHECKING:
    from ..config import AcklaneConfig
    from ..stores import StateBackend

__all__ = ["RestartsExhausted", "RunObserver", "Runner", "WatcherLeft", "stream_key_text"]

log = logging.getLogger("acklane.core.pipeline.runner")

#: Seconds the event store may take to close after a second signal forced the stop.
FORCED_CLOSE_TIMEOUT: Final = 2.0


class RunObserver(Hooks):
    """Hooks for displays (the demo, progress bars): the engine's :class:`Hooks`, of
    which a display overrides what it shows (``fired``, ``advanced``, ``cohort_failed``,
    ``rejected_payload``, ...); every method is optional."""


class _Reactions(Hooks):
    """The runner's own hooks: what it counts and does when the engine tells it.

    First in the runner's :class:`HookChain`: the poison policy's progress books, then
    a failed or leaving watcher fails its whole group (a cohort restarts together).
    """

    def __init__(self, runner: Runner) -> None:
        self.runner = runner

    def advanced(self, key: Hashable, batch: Sequence[AdvanceItem]) -> None:
        self.runner.poison.advanced(key, len(batch))

    def subscriber_failed(self, key: Hashable, trigger_id: str, error: BaseException) -> None:
        # The failed watcher is out of every later snapshot: if its siblings went on,
        # the broker would advance past events it never saw. Fail the whole group at
        # once (nothing more is advanced) and let the cohort restart together.
        runner = self.runner
        if not runner.stopping:
            runner.progress.sample()  # the group's counters, before it goes
            runner.manager.fail_group(key, error)

    def subscriber_leaving(self, key: Hashable, trigger_id: str, how: str) -> None:
        # Called before the subscription detaches. While the pipeline runs a watcher
        # never leaves in order (only a shutdown ends it): an orderly leave would ack the
        # event it is on and let its siblings advance past what is broadcast after it.
        runner = self.runner
        if runner.stopping:
            return
        log.error(
            "Watcher %s left while the pipeline runs (%s); failing its cohort so that "
            "nothing is committed without it",
            trigger_id,
            how,
        )
        runner.progress.sample()  # the group's counters, before it goes
        runner.manager.fail_group(key, WatcherLeft(f"watcher {trigger_id} left: {how}"))


#: The cyclic garbage collector's first threshold while a runner runs (CPython's default
#: is 700): the engine allocates a few short-lived objects per message, nearly all freed
#: by reference counting, and collecting every 700 of them spent ~15% of the loop's
#: time in the collector (bench/README.md, "Inline filters").
GC_THRESHOLD: Final = 20_000


@contextlib.contextmanager
def _collector_tuned() -> Iterator[None]:
    """While the pipeline runs: what exists at its start (modules, configuration) moved
    out of the collector's sight (``gc.freeze``), and young collections rarer. Both
    undone after."""
    old = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(max(old[0], GC_THRESHOLD), old[1], old[2])
    try:
        yield
    finally:
        gc.set_threshold(*old)
        gc.unfreeze()


class Runner:
    """Runs a configuration's watchers until stopped."""

    def __init__(
        self,
        config: AcklaneConfig,
        *,
        observer: RunObserver | None = None,
        handle_signals: bool = True,
        deliver_sinks: bool = True,
    ) -> None:
        self.config = config
        #: False: the events of watchers with sinks are stored (and announced to other
        #: processes) but delivered by another process (``acklane sinks run``).
        self.deliver_sinks = deliver_sinks
        self.observer = observer or RunObserver()
        self.handle_signals = handle_signals
        self.stopping = False
        #: Why the runner gave up (an error no restart can fix), or None; set by
        #: :meth:`give_up`. ``acklane run`` exits with code 1 when it is set.
        self.failure: BaseException | None = None
        #: The signal that forced an immediate stop (a second SIGINT/SIGTERM), if any.
        self.forced_by: signal.Signals | None = None
        self._main_task: asyncio.Task[object] | None = None
        self._stopped: asyncio.Event | None = None
        #: Failed attempts per message, restarts per stream (see acklane.core.pipeline.poison).
        self.poison = PoisonPolicy()
        self.manager = SharedStreamManager(
            max_subscriber_queue=config.engine.subscriber_queue_size,
            ack_timeout=config.engine.ack_timeout,
            cohort_grace_period=config.engine.cohort_grace_period,
            overflow=config.engine.overflow,
            poison_policy=self.poison,
        )
        self._store: EventStore | None = None
        #: The sinks' dispatcher while the pipeline runs and has sinks (metrics read it).
        self.sinks: Dispatcher | None = None
        self.state_backend: StateBackend | None = None
        self.watchers = build_watchers(config)
        #: What /healthz and /readyz read (acklane.core.observe.metrics serves them).
        self.health = Health()
        #: Per-stream counters of the periodic progress lines (engine.progress_interval).
        self.progress = Progress(self.manager.group_stats)
        #: Each stream's backlog on its broker, read every engine.lag_interval seconds.
        self.lag = LagMonitor()
        self.health.lag = self.lag
        #: OpenTelemetry spans of each message while the pipeline runs (None: tracing off).
        self.tracer: MessageTracer | None = None
        #: Everything that watches the engine, in this order: the runner's own
        #: reactions, the progress counters, the observer, the tracer (while on).
        self.hooks = self._hooks()
        self.manager.hooks = self.hooks

    def _hooks(self) -> HookChain:
        """The runner's :class:`HookChain`, in its fixed order."""
        tracer = [] if self.tracer is None else [self.tracer]
        return HookChain(_Reactions(self), self.progress, self.observer, *tracer)

    @property
    def stopped(self) -> asyncio.Event:
        if self._stopped is None:
            self._stopped = asyncio.Event()
        return self._stopped

    @property
    def store(self) -> EventStore:
        if self._store is None:
            raise RuntimeError("the runner is not running")
        return self._store

    def _on_confirmed_hooked(self, seqs: Sequence[int]) -> None:
        """The store committed ``seqs``: the hooks first (tracing's spans), then the
        engine's books."""
        try:
            self.hooks.committed(seqs)
        except Exception:  # a hook must never hold back a confirmation
            log.exception("tracing the event store's commit failed")
        self.manager.confirm_persisted(seqs)

    def give_up(self, error: BaseException, message: str) -> None:
        """Stop for good because of ``error`` (the first one wins): log ``message`` once,
        at ERROR, and shut down gracefully; :attr:`failure` tells the caller why."""
        if self.failure is None:
            self.failure = error
            log.error("%s", message)
            log.debug("giving up on", exc_info=error)
        self.request_stop()

    def request_stop(self) -> None:
        """Begin a graceful shutdown (idempotent; safe from a signal handler)."""
        if not self.stopping:
            log.info(
                "Stopping: finishing what is in flight (at most %.0fs)",
                self.config.engine.shutdown_timeout,
            )
        self.stopping = True
        self.stopped.set()

    def _cohorts(self) -> list[_Cohort]:
        by_key: dict[Hashable, list[WatcherTrigger]] = {}
        for w in self.watchers:
            by_key.setdefault(w.shared_stream_key(), []).append(w)
        return [_Cohort(self, key, ws) for key, ws in by_key.items()]

    def _open_state_backend(self) -> StateBackend:
        # Opened even when no watcher has an asset: a long-running engine is where
        # the task and asset stores' garbage is collected (state.gc_interval).
        from ..stores import AssetStore, open_backend, set_default_backend

        backend = open_backend(self.config.store.url, self.config.state)
        self.state_backend = backend
        set_default_backend(backend)
        for w in self.watchers:
            if w.asset:
                w.asset_store = AssetStore(asset=w.asset, backend=backend, writer="watcher")
        return backend

    async def run(self) -> None:
        """Run until :meth:`request_stop` or a signal; then shut down gracefully.

        A stop requested before this is called (``acklane run`` forwards a signal that
        came during its start-up) is honoured: it returns without starting anything.
        """
        if self.stopping:
            log.info("Stopped before the pipeline started: nothing to finish")
            return
        loop = asyncio.get_running_loop()
        self._main_task = asyncio.current_task()
        installed: list[signal.Signals] = []
        if self.handle_signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.add_signal_handler(sig, self._on_signal, sig)
                    installed.append(sig)
        try:
            with _collector_tuned():
                await self._run()
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)

    async def _run(self) -> None:
        health = self.health
        health.phase = "starting"
        self.tracer = start_tracing(self.config.tracing)
        self.manager.hooks = self.hooks = self._hooks()
        store = EventStore(
            self.config.store.url,
            on_confirmed=(
                self.manager.confirm_persisted
                if hook_of(self.hooks, "committed") is None
                else self._on_confirmed_hooked
            ),
            commit_interval=self.config.store.commit_interval_ms / 1000.0,
            pipeline=self.config.pipeline,
        )
        try:
            await store.open()
        except BaseException:
            health.phase = "stopped"
            await self._stop_tracing()
            raise
        self._store = store
        health.store = store
        await self._warn_if_pipeline_shared(store)
        backend: StateBackend | None = None
        dispatcher: Dispatcher | None = None
        try:
            dispatcher = await self._start_sinks(store)
            await self.poison.open(self.config.store.url, pipeline=self.config.pipeline)
            backend = self._open_state_backend()
            cohorts = self._cohorts()
            for c in cohorts:
                log.info(
                    "Watching key=%s with %s", c.key_text, ", ".join(w.name for w in c.watchers)
                )
            self._add_backlog_probes(cohorts)
            async with asyncio.TaskGroup() as tg:
                tasks = [
                    tg.create_task(c.run(), name=f"acklane-cohort-{c.key_text}") for c in cohorts
                ]
                helpers = [
                    tg.create_task(backend.run_gc_forever(), name="acklane-state-gc"),
                    tg.create_task(self.poison.run_forever(), name="acklane-poison-writer"),
                    *self._start_helpers(tg),
                ]
                health.phase = "running"
                await self.stopped.wait()
                health.phase = "stopping"
                self.progress.sample()  # the live groups' counters, before they close
                await self._shutdown(tasks)
                if dispatcher is not None:  # after the last events are stored
                    await dispatcher.aclose()
                for task in helpers:
                    task.cancel()
                for c in cohorts:
                    c.status.set("stopped")
            if self.config.engine.progress_interval > 0:
                # the totals, once more at the end
                self.progress.report(self._cohort_state, self._lag_of)
        finally:
            health.phase = "stopped"
            if dispatcher is not None:
                await dispatcher.aclose()  # idempotent; here when the run failed
            try:
                # a forced stop (second signal) does not wait for the whole timeout
                close_within = FORCED_CLOSE_TIMEOUT if self.forced_by else None
                async with asyncio.timeout(close_within or self.config.engine.shutdown_timeout):
                    await store.close()
            except TimeoutError:
                # unconfirmed records were never acked upstream: they will be redelivered
                log.warning("The event store did not close in time; in-flight events dropped")
            self._store = None
            try:  # what the last moments counted, written
                async with asyncio.timeout(self.config.engine.shutdown_timeout):
                    await self.poison.close()
            except Exception as exc:  # TimeoutError included: those counts are lost
                log.warning("Closing the failed-attempt table failed: %s", _why(exc))
            if backend is not None:
                from ..stores import set_default_backend

                set_default_backend(None)
                await backend.aclose()
            await self._stop_tracing()

    async def _stop_tracing(self) -> None:
        """Export the last spans (in a thread: the exporter blocks) and stop tracing."""
        tracer, self.tracer = self.tracer, None
        self.manager.hooks = self.hooks = self._hooks()
        if tracer is None:
            return
        try:
            async with asyncio.timeout(self.config.engine.shutdown_timeout):
                await asyncio.to_thread(tracer.shutdown)
        except Exception as exc:  # TimeoutError included: those spans are lost
            log.warning("Exporting the last spans failed: %s", _why(exc))

    async def _warn_if_pipeline_shared(self, store: EventStore) -> None:
        """Warn when this pipeline's newest stored event of a watcher came from another
        stream than the watcher reads now: another configuration with the same
        ``pipeline:`` (``default`` when unset) writes to this store, and its events and
        this one's are one pipeline's (each one's sinks deliver the other's), or the
        stream's settings changed since. One indexed read per watcher; a failure to
        read only skips the check."""
        from ..events import storable_stream_key

        pipeline = self.config.pipeline
        for watcher in self.config.watchers:
            stream = self.config.streams.get(watcher.stream)
            if stream is None:
                continue
            mine = storable_stream_key(stream_key_text(stream.key))
            try:
                newest = await store.list_events(
                    trigger_id=watcher.name, limit=1, newest_first=True
                )
            except Exception as exc:
                log.debug("pipeline %s: checking for a shared name failed: %s", pipeline, exc)
                return
            if newest and newest[0].stream_key != mine:
                log.warning(
                    "Pipeline %r: the newest stored event of watcher %s came from stream "
                    "key %s, not %s (stream %s of %s). Another configuration with the "
                    "pipeline name %r shares this store, and the two are one pipeline to "
                    "it (each one's sinks deliver the other's events), or the stream's "
                    "settings changed since. Give each configuration its own pipeline: name "
                    "(docs/configuration.md, pipeline).",
                    pipeline,
                    watcher.name,
                    newest[0].stream_key,
                    mine,
                    watcher.stream,
                    self.config.source,
                    pipeline,
                )

    async def _start_sinks(self, store: EventStore) -> Dispatcher | None:
        """The sinks' dispatcher, woken by each commit of new events (and, on PostgreSQL,
        by the commits of other processes), when some watcher has sinks."""
        sinks = build_sinks(self.config)
        for sink, _ in sinks:
            sink.spans_from = self.tracer  # its delivery spans (None: tracing off)
        if not sinks:
            return None
        store.notify_channel = SINK_CHANNEL  # a dispatcher elsewhere wakes too (PostgreSQL)
        if not self.deliver_sinks:
            log.info("Sinks are delivered by another process (acklane sinks run)")
            return None
        dispatcher = Dispatcher(
            self.config.store.url,
            sinks,
            shutdown_timeout=self.config.engine.shutdown_timeout,
            notify_channel=SINK_CHANNEL,
            pipeline=self.config.pipeline,
            streams={w.name: w.stream for w in self.config.watchers},
        )
        store.notify_channel = SINK_CHANNEL
        store.add_commit_listener(dispatcher.wake)
        await dispatcher.start()
        self.health.sinks = dispatcher
        self.sinks = dispatcher
        for sink, watchers in sinks:
            log.info(
                "Sink %s (%s) delivers the events of %s", sink.name, sink.kind, ", ".join(watchers)
            )
        return dispatcher

    def _start_helpers(self, tg: asyncio.TaskGroup) -> list[asyncio.Task[None]]:
        """The heartbeat (and store check), the progress lines and retention: tasks of
        ``tg``, cancelled by :meth:`_run` once the cohorts have stopped."""
        engine, store_settings = self.config.engine, self.config.store
        tasks: list[asyncio.Task[None]] = [
            tg.create_task(self.health.run_forever(on_beat=self._on_beat), name="acklane-health")
        ]
        if engine.progress_interval > 0:
            tasks.append(
                tg.create_task(
                    self.progress.run_forever(
                        engine.progress_interval, self._cohort_state, self._lag_of
                    ),
                    name="acklane-progress",
                )
            )
        if engine.lag_interval > 0 and self.lag.streams:
            tasks.append(
                tg.create_task(self.lag.run_forever(engine.lag_interval), name="acklane-lag")
            )
        if store_settings.retention is not None:
            tasks.append(
                tg.create_task(
                    self.store.run_retention_forever(
                        store_settings.retention, store_settings.prune_interval
                    ),
                    name="acklane-retention",
                )
            )
        return tasks

    def _add_backlog_probes(self, cohorts: list[_Cohort]) -> None:
        """One backlog probe per stream key whose connector offers one (read by the
        ``acklane-lag`` task, never on the hot path)."""
        if self.config.engine.lag_interval <= 0:
            return
        from ..connectors import load_connector

        for c in cohorts:
            first = c.watchers[0]
            try:
                probe = load_connector(first.connector).backlog_probe(first.stream_config())
            except Exception as exc:  # no lag figures is no reason not to run
                log.warning("No backlog figures for stream %s: %s", c.status.streams, _why(exc))
                continue
            if probe is not None:
                self.lag.add(c.key, c.status.streams, c.key_text, probe)

    def _lag_of(self, key_text: str) -> float | None:
        entry = self.lag.of_key_text(key_text)
        return None if entry is None else entry.total

    def _on_beat(self) -> None:
        """Every heartbeat: each stream's broker problem (for /readyz), then the
        progress counters."""
        problems = {stream_key_text(k): p for k, p in self.manager.broker_problems().items()}
        for status in list(self.health.cohorts.values()):
            status.broker_problem = problems.get(status.key_text)
        self.progress.sample()

    def _cohort_state(self, key_text: str) -> str | None:
        status = self.health.cohorts.get(key_text)
        return None if status is None else status.state

    def _on_signal(self, sig: signal.Signals = signal.SIGTERM) -> None:
        if self.stopping:
            log.warning("Second signal: stopping now; unadvanced messages will be redelivered")
            self.forced_by = sig
            for task in asyncio.all_tasks():
                name = task.get_name()
                # the event store's writer commits what it holds as the store closes
                if name.startswith("acklane-") and name != "acklane-event-store-writer":
                    task.cancel()
            if self._main_task is not None:
                self._main_task.cancel()  # the graceful stop itself: `acklane run` exits
            return
        self.request_stop()

    async def _shutdown(self, cohort_tasks: list[asyncio.Task[None]]) -> None:
        manager = self.manager
        manager.stop_polling()
        try:
            async with asyncio.timeout(self.config.engine.shutdown_timeout):
                while not manager.idle():  # noqa: ASYNC110 - idleness has no event to wait on
                    await asyncio.sleep(0.01)
                await self.store.flush()
        except TimeoutError:
            log.warning(
                "Shutdown timeout (%.0fs): what is still in flight will be redelivered",
                self.config.engine.shutdown_timeout,
            )
        except Exception:
            log.exception("Draining the event store failed; unconfirmed events are redelivered")
        try:
            async with asyncio.timeout(self.config.engine.shutdown_timeout):
                await manager.stop_all()
        except TimeoutError:
            log.warning("Producers did not close in time (stuck advance or aclose); cancelling")
            await manager.abort_all()
        for task in cohort_tasks:
            task.cancel()
