"""A cohort: the watchers of one stream key, subscribed and restarted together, and
the two filter paths' way into the event store (one :class:`_Payloads` for both).

The runner (:mod:`.runner`) makes one cohort per stream key and runs them; a cohort
sees the runner only through :class:`CohortHost`, the few things it uses.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import AcklaneError, BrokerAuthError, ConnectorError
from ..events import EventRecord, EventStore
from ..manager import (
    CONSUMER_CLOSED,
    FILTER_RETURNED,
    BoundEvent,
    HookChain,
    InlineSubscription,
    SharedStreamManager,
    hook_of,
)
from ..observe.health import CohortStatus, Health
from ..observe.progress import Progress
from ..observe.tracing import MessageTracer
from ..trigger import SharedStreamError, TriggerEvent, reject_shared_stream_event
from .poison import Failure, PoisonPolicy, max_attempts_of
from .watcher import WatcherTrigger

if TYPE_CHECKING:
    from ..config import AcklaneConfig

__all__ = ["CohortHost", "RestartsExhausted", "WatcherLeft", "stream_key_text"]

# the runner's logger: a cohort's lines are the runner's, as they always were
log = logging.getLogger("acklane.core.pipeline.runner")


class CohortHost(Protocol):
    """What a cohort uses of the runner that runs it (:class:`.runner.Runner`)."""

    config: AcklaneConfig
    stopping: bool
    poison: PoisonPolicy
    manager: SharedStreamManager
    health: Health
    progress: Progress
    hooks: HookChain
    tracer: MessageTracer | None

    @property
    def store(self) -> EventStore: ...

    @property
    def stopped(self) -> asyncio.Event: ...

    def give_up(self, error: BaseException, message: str) -> None: ...


def stream_key_text(key: Hashable) -> str:
    """The text form of a shared stream key kept with each stored event."""
    if isinstance(key, tuple):
        return json.dumps(list(key), default=str, separators=(",", ":"))
    return json.dumps(key, default=str)


class RestartsExhausted(AcklaneError):
    """A cohort failed more than ``engine.max_restarts`` times in a row without progress
    (nothing advanced, no failure attributable to a message); the runner gave up."""


class WatcherLeft(SharedStreamError):
    """A watcher left its cohort while the pipeline ran (its filter returned, or it failed
    outside the engine, say in the event store); what its siblings' iterators raise.

    The group was failed *before* the watcher detached: an orderly leave would ack the
    event it was on and take it out of every later broadcast, so the siblings would let
    the broker advance past messages it never saw. Failed, the cohort restarts together
    and the broker redelivers from its last advanced position.
    """


class _Cohort:
    """The watchers of one stream key, subscribed and restarted together."""

    def __init__(self, runner: CohortHost, key: Hashable, watchers: list[WatcherTrigger]) -> None:
        self.runner = runner
        self.key = key
        self.key_text = stream_key_text(key)
        self.watchers = watchers
        self.delay = runner.config.engine.restart_backoff_initial
        streams = ",".join(sorted({w.stream for w in watchers}))
        # readiness (/readyz) and progress lines, per stream key
        self.status = CohortStatus(streams, self.key_text, tuple(w.name for w in watchers))
        runner.health.cohorts[self.key_text] = self.status
        self.progress = runner.progress.add(key, streams, self.key_text)
        # the poison policy's books of this key (failed attempts, restarts)
        self.attempts = runner.poison.stream(
            key, self.key_text, max_attempts_of(watchers[0].stream_config())
        )
        self.stalled = 0  # restarts in a row without progress (engine.max_restarts)
        tracer = runner.tracer
        if tracer is not None:
            stream = runner.config.streams.get(watchers[0].stream)
            broker = "" if stream is None else stream.connector_name
            tracer.describe(key, broker, sorted({w.stream for w in watchers}), self.key_text)

    async def run(self) -> None:
        engine = self.runner.config.engine
        while not self.runner.stopping:
            # the failed attempts on record, written first (the last failure included)
            await self.runner.poison.load(self.key)
            started = time.monotonic()
            self.status.set("polling")
            error = await self._attempt()
            if isinstance(error, BrokerAuthError) and not self.runner.stopping:
                self.runner.give_up(error, self._auth_failure(error))
            if self.runner.stopping:
                self.status.set("stopped")
                return
            ran_well = time.monotonic() - started > engine.restart_backoff_max
            if ran_well:
                self.delay = engine.restart_backoff_initial  # it ran well for a while
            failure = self.attempts.take_failure()
            if self._gives_up(error, failure, ran_well):
                self.status.set("stopped")
                return
            delay = self.delay
            self.delay = min(self.delay * 2, engine.restart_backoff_max)
            self.status.set("restarting", _why(error))
            self.progress.restarts += 1
            self.attempts.restarts += 1
            log.warning(
                "Restarting watchers %s of key=%s in %.1fs: %s",
                ", ".join(w.name for w in self.watchers),
                self.key_text,
                delay,
                _why(error) if failure is None else failure.describe(),
            )
            self.runner.hooks.cohort_failed(self.key, error, delay)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay + engine.shutdown_timeout):
                    # the old group's producer leaves the broker before a new one joins
                    await self.runner.manager.wait_key_closed(self.key)
            self.runner.hooks.abandoned(self.key, _why(error))  # (never advanced)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self.runner.stopped.wait()

    def _gives_up(self, error: BaseException, failure: Failure | None, ran_well: bool) -> bool:
        """Count a restart without progress; past ``engine.max_restarts`` the runner gives up.

        Progress: something was advanced, or the attempt ran longer than
        ``restart_backoff_max``. A failure attributed to a message is no step towards
        giving up: the poison policy bounds those (``max_attempts``).
        """
        if self.attempts.take_progress() > 0 or ran_well:
            self.stalled = 0
        elif failure is None:
            self.stalled += 1
        limit = self.runner.config.engine.max_restarts
        if limit is None or self.stalled <= limit:
            return False
        names = ", ".join(w.name for w in self.watchers)
        text = (
            f"watchers {names} of key={self.key_text} failed {self.stalled} times in a row "
            f"without progress (engine.max_restarts={limit}); last error: {_why(error)}"
        )
        self.runner.give_up(RestartsExhausted(text), f"Giving up: {text}")
        return True

    def _auth_failure(self, error: BrokerAuthError) -> str:
        """One line: which stream, what the broker said, which settings to check."""
        streams = sorted({w.stream for w in self.watchers})
        check = ", ".join(f"streams.{s}.{field}" for s in streams for field in error.settings)
        return (
            f"stream {', '.join(streams)}: {error}"
            + (f" (check {check})" if check else "")
            + "; stopping: authentication and authorisation errors are not retried"
        )

    async def _attempt(self) -> BaseException:
        """Run every watcher until one fails; return why (the first failure)."""
        first: list[BaseException] = []
        inline = self.runner.config.engine.inline_filters
        tasks = [
            asyncio.create_task(
                self._watch_inline(w, first) if inline and w.inline else self._watch(w, first),
                name=f"acklane-watcher-{w.name}",
            )
            for w in self.watchers
        ]
        # a watcher stuck in its own code never sees its group fail: learn of it here
        failed = asyncio.create_task(
            self.runner.manager.wait_failed(self.key), name=f"acklane-failed-{self.key_text}"
        )
        try:
            await asyncio.wait([*tasks, failed], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (*tasks, failed):
                task.cancel()
            await asyncio.gather(*tasks, failed, return_exceptions=True)
        if first:
            return first[0]
        if failed.done() and not failed.cancelled():
            return failed.result()
        return RuntimeError("a watcher's filter returned; a watcher must run until stopped")

    async def _watch(self, trigger: WatcherTrigger, first: list[BaseException]) -> None:
        runner = self.runner
        manager = runner.manager
        store = runner.store
        fired = hook_of(runner.hooks, "fired")  # (a display's, or None)
        name = trigger.name
        key = self.key
        key_text = self.key_text
        payloads = _Payloads(self, name)
        try:
            # manager.events() without its generator step per event: the filter's own
            # iterator, and the subscription's failure and close done here
            subscription = manager.subscription(trigger_id=name, trigger=trigger, key=key)
            how = CONSUMER_CLOSED
            step = subscription.events.__anext__
            try:
                while True:
                    try:
                        event = await step()
                    except StopAsyncIteration:
                        how = FILTER_RETURNED
                        break
                    except BaseException as exc:  # the filter's (or its cancellation)
                        subscription.failed(exc)
                        raise
                    try:
                        bound = manager.bind_event(trigger_id=name, key=key)
                        message_id = None if bound is None else bound.message_id
                        if fired is not None:
                            fired(name, event, message_id)
                        record = EventRecord(
                            name,
                            key_text,
                            event.payload,
                            message_id,
                            0 if bound is None else bound.position,
                        )
                        try:
                            await store.put(record, None if bound is None else bound.seq)
                        except TypeError as exc:
                            # (its binding window is still open: the filter's reject)
                            payloads.refused(exc, bound, reject_shared_stream_event)
                        else:
                            payloads.stored(bound)
                    except Exception as exc:
                        # Leaving on an error of its own (the event store, an observer):
                        # fail the group while this watcher is still subscribed, so that
                        # nothing is advanced without it; only then does it detach.
                        if not runner.stopping:
                            first.append(exc)
                            manager.fail_group(
                                key, WatcherLeft(f"watcher {name} failed: {_why(exc)}")
                            )
                        raise
            finally:
                await subscription.aclose(how)
            # The filter returned: the engine called _on_subscriber_leaving, which failed
            # the group before this watcher detached.
            if not runner.stopping:
                first.append(
                    WatcherLeft(f"watcher {name}: its filter returned; it must run until stopped")
                )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            _watcher_failed(runner, name, exc, first)

    async def _watch_inline(self, trigger: WatcherTrigger, first: list[BaseException]) -> None:
        """A watcher with a synchronous filter: the group evaluates it as it broadcasts
        (``manager.inline_subscription``); this task only waits for the subscription's
        end. The same rules as :meth:`_watch`, event by event, in :func:`_inline_emitter`."""
        runner = self.runner
        manager = runner.manager
        name = trigger.name
        compiled = trigger.compiled_filter
        subscription: InlineSubscription | None = None

        def reject(reason: str) -> None:
            assert subscription is not None
            subscription.reject(reason)

        emit = _inline_emitter(
            _Payloads(self, name), reject, first, shared=not compiled.calls_user_code
        )
        try:
            subscription = manager.inline_subscription(
                trigger_id=name,
                trigger=trigger,
                key=self.key,
                evaluate=compiled.evaluator,
                emit=emit,
                ready=runner.store.room,
                windowed=compiled.calls_user_code,
            )
            how = CONSUMER_CLOSED
            try:
                await subscription.wait()
                how = FILTER_RETURNED  # closed in order: as a filter whose stream ended
            finally:
                await subscription.aclose(how)
            if not runner.stopping:
                first.append(
                    WatcherLeft(f"watcher {name}: its filter returned; it must run until stopped")
                )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            _watcher_failed(runner, name, exc, first)


def _watcher_failed(
    runner: CohortHost, name: str, exc: Exception, first: list[BaseException]
) -> None:
    """A watcher's task ended on ``exc`` (either path): logged once, kept as the first."""
    if isinstance(exc, ConnectorError):
        # the broker's error: the group's and the restart's lines name it; the traceback
        # only helps at DEBUG
        log.debug("Watcher %s failed", name, exc_info=exc)
    elif not isinstance(exc, SharedStreamError):  # the engine logged its own already
        log.error("Watcher %s failed", name, exc_info=exc)
    if not runner.stopping and not any(e is exc for e in first):
        first.append(exc)


class _Payloads:
    """One watcher's trigger events on their way into the event store, whichever filter
    path made them (:meth:`_Cohort._watch`, :func:`_inline_emitter`): what is counted
    once one is queued, and what a payload that is not JSON does (it can never be
    stored: its raw event is rejected, dead-lettered, instead of looping on it)."""

    __slots__ = ("hooks", "key", "key_text", "manager", "name", "on_stored", "progress", "runner")

    def __init__(self, cohort: _Cohort, name: str) -> None:
        self.runner = cohort.runner
        self.manager = cohort.runner.manager
        self.hooks = cohort.runner.hooks
        self.on_stored = hook_of(self.hooks, "stored")  # (tracing's, or None)
        self.name = name
        self.key = cohort.key
        self.key_text = cohort.key_text
        self.progress = cohort.progress
        self.progress.watcher_events.setdefault(name, 0)

    def stored(self, bound: BoundEvent | None) -> None:
        """The event store queued a trigger event (bound to its message, or not)."""
        progress = self.progress
        progress.events += 1
        progress.watcher_events[self.name] += 1
        on_stored = self.on_stored
        if on_stored is not None:
            on_stored(self.key, self.name, bound)

    def refused(
        self, exc: TypeError, bound: BoundEvent | None, reject: Callable[[str], object]
    ) -> None:
        """The event store refused a payload that is not JSON: its raw event is
        rejected (``reject``, while its binding window is open) and its binding let go."""
        name = self.name
        log.error("Watcher %s yielded an event that cannot be stored: %s", name, exc)
        reject(f"watcher {name}: {exc}")
        if bound is not None:
            self.manager.discard_pending_event(bound.seq)
        self.hooks.rejected_payload(name, exc)


def _inline_emitter(
    payloads: _Payloads,
    reject: Callable[[str], None],
    first: list[BaseException],
    *,
    shared: bool = False,
) -> Callable[[Any, BoundEvent | None], None]:
    """What an inline watcher does with each payload its filter returned, as
    :meth:`_Cohort._watch` does with each event: tell the observer, queue it in the
    event store (:class:`_Payloads`); any other error than a payload that is not JSON
    fails the group while the watcher is still subscribed (``WatcherLeft``).

    ``shared``: the filter is declarative, so what it returns is read-only (the
    message's decoded body, shared by the watchers that evaluate it in turn, or
    parts of it): the store may reuse the JSON text of the very object it was given
    just before, unless an observer of our caller's sees each event (it might change
    it)."""
    runner = payloads.runner
    manager = payloads.manager
    put = runner.store.put_event_nowait
    fired = hook_of(payloads.hooks, "fired")  # (a display's, or None)
    name = payloads.name
    key = payloads.key
    key_text = payloads.key_text
    stored = payloads.stored
    shared = shared and fired is None

    def emit(payload: Any, bound: BoundEvent | None) -> None:
        if type(payload) is TriggerEvent:
            payload = payload.payload
        try:
            message_id = None if bound is None else bound.message_id
            if fired is not None:
                fired(name, TriggerEvent(payload), message_id)
            try:
                if bound is None:
                    put(name, key_text, payload, None, 0, None, shared)
                else:
                    put(name, key_text, payload, message_id, bound.position, bound.seq, shared)
            except TypeError as exc:
                payloads.refused(exc, bound, reject)
            else:
                stored(bound)
        except Exception as exc:
            if not runner.stopping:
                first.append(exc)
                manager.fail_group(key, WatcherLeft(f"watcher {name} failed: {_why(exc)}"))
            raise

    return emit


def _why(error: BaseException) -> str:
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
