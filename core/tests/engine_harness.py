"""Test doubles for unit tests of engine logic: a scripted upstream and watchers.

The real brokers' tests live in integration/tests; these only exercise the
engine's bookkeeping, so the producer is a queue the test pushes into.

Its fixtures (``up``, ``manager``, ``stop_watchers``) are defined here, beside the
doubles they build, and exposed by the conftest of core/tests and of tests/ (both use
them).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Iterable, Sequence
from typing import Any

import pytest

from acklane.core import (
    AdvanceItem,
    BaseEventTrigger,
    SharedStreamManager,
    SharedStreamProducer,
    TriggerEvent,
    reject_shared_stream_event,
)
from acklane.core.manager import BoundEvent, Rejected

END = object()


class Upstream:
    """A fake broker for one key: push raw events, read what was advanced."""

    registry: dict[str, Upstream] = {}

    def __init__(self, name: str, *, batched: bool = False) -> None:
        self.name = name
        # the producer offers open_batches: what is queued is broadcast a batch at a time
        self.batched = batched
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.batches: list[list[AdvanceItem]] = []
        self.factory_calls = 0
        self.factory_kwargs: list[dict[str, Any]] = []
        self.opened = 0
        self.aclosed = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.advance_error: Exception | None = None
        self.aclose_error: Exception | None = None
        self.advance_gate: asyncio.Event | None = None
        self.lane_error: Exception | None = None
        Upstream.registry[name] = self

    def push(self, *payloads: Any) -> None:
        for p in payloads:
            self.queue.put_nowait(p)

    def end(self) -> None:
        self.queue.put_nowait(END)

    def raise_(self, exc: Exception) -> None:
        self.queue.put_nowait(exc)

    @property
    def items(self) -> list[AdvanceItem]:
        return [item for batch in self.batches for item in batch]

    def outcomes(self) -> dict[Any, tuple[int, int, int]]:
        return {
            _ident(i.broker_payload): (i.outcome.acked, i.outcome.failed, i.outcome.rejected)
            for i in self.items
        }


def _ident(payload: Any) -> Any:
    return payload["id"] if isinstance(payload, dict) else payload


class FakeProducer(SharedStreamProducer):
    def __init__(self, upstream: Upstream) -> None:
        self.up = upstream

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        self.up.opened += 1
        while True:
            item = await self.up.queue.get()
            if item is END:
                return
            if isinstance(item, Exception):
                raise item
            yield item, item

    def open_batches(self) -> AsyncIterator[Iterable[tuple[Any, Any]]] | None:
        return self._batches() if self.up.batched else None

    async def _batches(self) -> AsyncIterator[Iterable[tuple[Any, Any]]]:
        """Everything queued at once, as one batch (ending or raising after it)."""
        self.up.opened += 1
        queue = self.up.queue
        while True:
            batch: list[tuple[Any, Any]] = []
            item = await queue.get()
            while item is not END and not isinstance(item, Exception):
                batch.append((item, item))
                if queue.empty():
                    break
                item = queue.get_nowait()
            if batch:
                yield batch
            if item is END:
                return
            if isinstance(item, Exception):
                raise item

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        up = self.up
        up.in_flight += 1
        up.max_in_flight = max(up.max_in_flight, up.in_flight)
        try:
            if up.advance_gate is not None:
                await up.advance_gate.wait()
            if up.advance_error is not None:
                raise up.advance_error
            up.batches.append(list(batch))
        finally:
            up.in_flight -= 1

    def get_advance_lane(self, broker_payload: Any) -> Hashable:
        if self.up.lane_error is not None:
            raise self.up.lane_error
        if isinstance(broker_payload, dict):
            return broker_payload.get("lane")
        return None

    def message_id(self, broker_payload: Any) -> str | None:
        return f"m{_ident(broker_payload)}"

    async def aclose(self) -> None:
        self.up.aclosed += 1
        if self.up.aclose_error is not None:
            raise self.up.aclose_error


Behavior = Callable[[Any], Awaitable[list[Any] | str] | list[Any] | str]


def _is_async(behavior: Any) -> bool:
    """An async function, or an object whose ``__call__`` is one (a Gate)."""
    return inspect.iscoroutinefunction(behavior) or isinstance(behavior, Gate)


class AckTrigger(BaseEventTrigger):
    """Ack mode. ``behavior(raw)`` returns the payloads to yield, or "reject" (sync or async).

    With a synchronous behavior (or none) it is also a pure filter: :meth:`evaluate` is
    what an inline subscription runs (``Watcher.inline_mode``).
    """

    def __init__(self, upstream: str, behavior: Behavior | None = None) -> None:
        self.upstream = upstream
        self._behavior = behavior

    @property
    def inline_capable(self) -> bool:
        """The filter is pure: the stock one, with a synchronous behavior (or none)."""
        return type(self).filter_shared_stream is AckTrigger.filter_shared_stream and (
            self._behavior is None or not _is_async(self._behavior)
        )

    def evaluate(self, raw: Any) -> list[Any] | Rejected:
        """The inline form of :meth:`filter_shared_stream`."""
        result = [raw] if self._behavior is None else self._behavior(raw)
        assert not inspect.isawaitable(result)
        if result == "reject":
            return Rejected(f"rejected {_ident(raw)}")
        assert isinstance(result, list)
        return list(result)

    def shared_stream_key(self) -> Hashable:
        return ("fake", self.upstream)

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
        up = Upstream.registry[kwargs["upstream"]]
        up.factory_calls += 1
        up.factory_kwargs.append(kwargs)
        return FakeProducer(up)

    async def filter_shared_stream(self, stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        async for raw in stream:
            result = [raw] if self._behavior is None else self._behavior(raw)
            if inspect.isawaitable(result):
                result = await result
            if result == "reject":
                reject_shared_stream_event(reason=f"rejected {_ident(raw)}")
                continue
            for payload in result:
                yield TriggerEvent(payload)


class FastTrigger(BaseEventTrigger):
    """Fast path: ``open_shared_stream`` only; nothing is acknowledged."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream

    def shared_stream_key(self) -> Hashable:
        return ("fast", self.upstream)

    @classmethod
    async def open_shared_stream(cls, kwargs: dict[str, Any]) -> AsyncIterator[Any]:  # type: ignore[override]
        up = Upstream.registry[kwargs["upstream"]]
        up.opened += 1
        while True:
            item = await up.queue.get()
            if item is END:
                return
            yield item

    async def filter_shared_stream(self, stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        async for raw in stream:
            reject_shared_stream_event()  # only warns on the fast path
            yield TriggerEvent(raw)


class Watcher:
    """Drives one subscription like the runner does: iterate, bind, confirm.

    With ``Watcher.inline_mode`` set (the rule tests run both ways), a watcher whose
    trigger is a pure filter (``inline_capable``) subscribes inline instead, as the
    runner does a declarative watcher: the group evaluates it, ``emit`` binds and
    confirms; what the tests read (events, seqs, error) is the same.
    """

    running: set[asyncio.Task[None]] = set()
    inline_mode = False

    def __init__(
        self,
        manager: SharedStreamManager,
        trigger_id: str,
        trigger: BaseEventTrigger,
        *,
        auto_confirm: bool = True,
    ) -> None:
        self.manager = manager
        self.trigger_id = trigger_id
        self.trigger = trigger
        self.key = trigger.shared_stream_key()
        self.auto_confirm = auto_confirm
        self.events: list[Any] = []
        self.seqs: list[int | None] = []
        self.unconfirmed: list[int] = []
        self.error: BaseException | None = None
        self.task: asyncio.Task[None] | None = None
        self.inline = Watcher.inline_mode and bool(getattr(trigger, "inline_capable", False))

    def start(self) -> Watcher:
        self.task = asyncio.get_running_loop().create_task(self._run())
        Watcher.running.add(self.task)
        self.task.add_done_callback(Watcher.running.discard)
        return self

    @classmethod
    async def stop_everyone(cls) -> None:
        tasks = list(cls.running)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _took(self, payload: Any, seq: int | None) -> None:
        self.events.append(payload)
        self.seqs.append(seq)
        if seq is not None:
            if self.auto_confirm:
                self.manager.confirm_persisted([seq])
            else:
                self.unconfirmed.append(seq)

    async def _run_inline(self) -> None:
        def emit(payload: Any, bound: BoundEvent | None) -> None:
            self._took(payload, None if bound is None else bound.seq)

        evaluate = getattr(self.trigger, "evaluate")  # noqa: B009 - AckTrigger's
        try:
            subscription = self.manager.inline_subscription(
                trigger_id=self.trigger_id,
                trigger=self.trigger,
                key=self.key,
                evaluate=evaluate,
                emit=emit,
            )
            try:
                await subscription.wait()
            finally:
                await subscription.aclose()
        except Exception as exc:
            self.error = exc

    async def _run(self) -> None:
        if self.inline:
            await self._run_inline()
            return
        try:
            async for event in self.manager.events(
                trigger_id=self.trigger_id, trigger=self.trigger, key=self.key
            ):
                seq = self.manager.bind_pending_event(trigger_id=self.trigger_id, key=self.key)
                self.events.append(event.payload)
                self.seqs.append(seq)
                if seq is not None:
                    if self.auto_confirm:
                        self.manager.confirm_persisted([seq])
                    else:
                        self.unconfirmed.append(seq)
        except Exception as exc:
            self.error = exc

    def confirm_all(self) -> None:
        seqs, self.unconfirmed = self.unconfirmed, []
        self.manager.confirm_persisted(seqs)

    async def stop(self) -> None:
        assert self.task is not None
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task

    async def wait_failed(self, timeout: float = 5.0) -> BaseException:
        assert self.task is not None
        async with asyncio.timeout(timeout):
            await self.task
        assert self.error is not None
        return self.error


async def settle(rounds: int = 20) -> None:
    """Let every ready task run until the system is quiet."""
    for _ in range(rounds):
        await asyncio.sleep(0)


class Gate:
    """A behavior that holds each raw event until the test releases it."""

    def __init__(self, yields: int = 1) -> None:
        self.yields = yields
        self.released: dict[Any, asyncio.Event] = {}
        self.entered: list[Any] = []

    def release(self, ident: Any) -> None:
        self.released.setdefault(ident, asyncio.Event()).set()

    async def __call__(self, raw: Any) -> list[Any]:
        ident = _ident(raw)
        self.entered.append(ident)
        await self.released.setdefault(ident, asyncio.Event()).wait()
        return [raw] * self.yields


@pytest.fixture(params=["open_stream", "open_batches"])
def up(request: pytest.FixtureRequest) -> Upstream:
    """Every rule holds whether the producer yields records one by one or in batches."""
    return Upstream(f"up-{uuid.uuid4().hex[:8]}", batched=request.param == "open_batches")


@pytest.fixture
async def manager() -> AsyncIterator[SharedStreamManager]:
    m = SharedStreamManager(max_subscriber_queue=8, ack_timeout=30.0)
    yield m
    await m.stop_all()


@pytest.fixture
async def stop_watchers() -> AsyncIterator[None]:
    """Every ``Watcher`` a test started, stopped after it (apply with usefixtures)."""
    yield
    await Watcher.stop_everyone()
