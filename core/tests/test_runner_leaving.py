"""A watcher that leaves its cohort while the pipeline runs must fail it, not leave in order.

An orderly leave (the engine's rule for a subscriber that unsubscribes) acks the
event the watcher is on and takes it out of every later broadcast: its siblings
would then let the broker commit messages it never saw. The runner fails the
group first, so nothing more is committed, and restarts the cohort.

Both ways of leaving are covered: the filter returns, and the event store raises
something the runner does not handle (it handles ``TypeError``, a payload that is
not JSON, by dead-lettering it).
"""

from __future__ import annotations

import asyncio
import json
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from runner_harness import all_committed

from acklane.connectors.memory import MemoryBroker
from acklane.core import RawMessage, TriggerEvent
from acklane.core.config import parse_config
from acklane.core.events import EventRecord, EventStore
from acklane.core.pipeline.runner import Runner
from acklane.core.pipeline.watcher import WatcherTrigger

pytestmark = pytest.mark.topics(orders=2)

GROUP = "g"


def _config(db: Path, broker: str, leaver_filter: str) -> Any:
    text = textwrap.dedent(
        f"""\
        engine:
          ack_timeout: 30
          restart_backoff_initial: 0.05
          restart_backoff_max: 0.2
          shutdown_timeout: 5
        store:
          url: sqlite:///{db}
        streams:
          orders:
            connector: memory
            broker: {broker}
            topics: [orders]
            group_id: {GROUP}
            partitions: 2
            batch_size: 4
            poll_interval: 0.01
        watchers:
          - name: leaver
            stream: orders
            filter: {leaver_filter}
          - name: sibling
            stream: orders
            filter: {{emit: {{id: body.id}}}}
        """
    )
    return parse_config(text, source="test.yaml")


def _publish(broker: MemoryBroker, partition: int, body: dict[str, Any]) -> int:
    """Publish one message; returns its offset."""
    _, offset = broker.publish("orders", json.dumps(body).encode(), partition=partition)
    return int(offset)


def _committed(broker: MemoryBroker, partition: int) -> int:
    return broker.committed(GROUP, "orders", partition)


async def _ids(db: Path, watcher: str) -> list[int]:
    async with EventStore(f"sqlite:///{db}") as store:
        events = await store.list_events(limit=10_000)
    return sorted(e.payload["id"] for e in events if e.trigger_id == watcher)


async def _until(cond: Any, task: asyncio.Task[None], timeout: float = 15.0) -> None:
    async with asyncio.timeout(timeout):
        while not cond():
            if task.done():
                task.result()
                raise AssertionError("the runner stopped")
            await asyncio.sleep(0.01)


async def _stop(runner: Runner, task: asyncio.Task[None]) -> None:
    runner.request_stop()
    async with asyncio.timeout(20):
        await task


# -- the filter returns --------------------------------------------------------------

LEFT_ON: set[str] = set()
SIBLING_DB: list[Path] = []


async def leave_once(stream: AsyncIterator[RawMessage], watcher: Any) -> AsyncIterator[Any]:
    """Fires for every message, but returns (once) on a message whose body says so.

    Before it returns it waits for the sibling to have stored its event for that
    message (so the sibling has acked it): the one ack still missing is the leaver's.
    """
    async for message in stream:
        body = message.json()
        if body.get("leave") and message.message_id not in LEFT_ON:
            LEFT_ON.add(str(message.message_id))
            async with asyncio.timeout(10):
                while body["id"] not in await _ids(SIBLING_DB[0], "sibling"):
                    await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)  # the store's confirmation reaches the engine
            return
        yield {"id": body["id"]}


async def test_a_filter_that_returns_fails_its_cohort_and_the_message_it_was_on_is_redelivered(
    tmp_path: Path, broker: MemoryBroker, caplog: pytest.LogCaptureFixture
) -> None:
    LEFT_ON.clear()
    db = tmp_path / "e.db"
    SIBLING_DB[:] = [db]
    runner = Runner(
        # this very module (its SIBLING_DB): by the name pytest imported it under
        _config(db, broker.name, f'{{function: "{__name__}:leave_once"}}'),
        handle_signals=False,
    )
    for i in range(3):
        _publish(broker, 0, {"id": i})
    _publish(broker, 0, {"id": 3, "leave": True})  # the leaver returns on it, once
    for i in range(4, 8):
        _publish(broker, 0, {"id": i})
    task = asyncio.create_task(runner.run())
    try:
        await _until(lambda: bool(LEFT_ON) and all_committed(broker, GROUP), task)
    finally:
        await _stop(runner, task)
    # Left in order, it would have acked message 3, and its sibling too: 3 committed
    # without the leaver ever firing for it.
    assert await _ids(db, "leaver") == list(range(8))
    assert await _ids(db, "sibling") == list(range(8))  # each once: redeliveries deduped
    assert "Watcher leaver left while the pipeline runs (its filter returned)" in caplog.text
    assert "Restarting watchers leaver, sibling" in caplog.text
    assert broker.stats(GROUP).redelivered > 0


# -- the event store raises ----------------------------------------------------------


class _StoreFailures:
    """Which (watcher, event id) the event store refuses, once each."""

    def __init__(self) -> None:
        self.armed: set[tuple[str, int]] = set()
        self.raised: list[tuple[str, int]] = []


def _failing_store(failures: _StoreFailures) -> type[EventStore]:
    class FailingStore(EventStore):
        async def put(self, record: EventRecord, seq: int | None = None) -> None:
            which = (record.trigger_id, record.payload["id"])
            if which in failures.armed:
                failures.armed.discard(which)
                failures.raised.append(which)
                raise ValueError("the event store is broken")
            await super().put(record, seq)

    return FailingStore


class _SlowToLeave(WatcherTrigger):
    """A watcher whose filter takes its time to clean up once it is closed.

    That keeps the window between the subscription detaching and the runner cancelling
    the siblings open long enough to observe what happens in it.
    """

    left: asyncio.Event
    resume: asyncio.Event

    async def filter_shared_stream(self, stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        try:
            async for event in super().filter_shared_stream(stream):
                yield event
        finally:
            self.left.set()
            await self.resume.wait()


def _slow_to_leave(runner: Runner, name: str) -> _SlowToLeave:
    for i, w in enumerate(runner.watchers):
        if w.name == name:
            slow = _SlowToLeave(
                name=w.name,
                stream=w.stream,
                connector=w.connector,
                connector_config=w.connector_config,
                filter_spec=w.filter_spec,
                asset=w.asset,
            )
            slow.left, slow.resume = asyncio.Event(), asyncio.Event()
            runner.watchers[i] = slow
            return slow
    raise AssertionError(name)


async def test_an_event_store_error_fails_the_cohort_before_the_watcher_detaches(
    tmp_path: Path, broker: MemoryBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    failures = _StoreFailures()
    monkeypatch.setattr("acklane.core.pipeline.runner.EventStore", _failing_store(failures))
    db = tmp_path / "e.db"
    runner = Runner(_config(db, broker.name, "{emit: {id: body.id}}"), handle_signals=False)
    leaver = _slow_to_leave(runner, "leaver")
    for i in range(4):
        _publish(broker, i % 2, {"id": i})
    task = asyncio.create_task(runner.run())
    try:
        await _until(lambda: all_committed(broker, GROUP), task)
        # The leaver's store write of 4 (partition 0) fails; it is left holding nothing
        # else, so partition 1 is free to advance past whatever comes next.
        failures.armed.add(("leaver", 4))
        _publish(broker, 0, {"id": 4})
        async with asyncio.timeout(15):
            await leaver.left.wait()
        # Broadcast after the leaver left: committed only once the leaver stored it.
        after = _publish(broker, 1, {"id": 5})
        await _until(lambda: _committed(broker, 1) > after, task)
        assert 5 in await _ids(db, "leaver"), (
            "message 5 was committed without the watcher that left"
        )
        leaver.resume.set()
        await _until(lambda: all_committed(broker, GROUP), task)
    finally:
        leaver.resume.set()
        await _stop(runner, task)
    assert failures.raised == [("leaver", 4)]
    assert await _ids(db, "leaver") == list(range(6))
    assert await _ids(db, "sibling") == list(range(6))


async def test_an_orderly_stop_is_not_a_failure(tmp_path: Path, broker: MemoryBroker) -> None:
    # Stopping, every watcher leaves in order: no cohort is failed, nothing restarts.
    db = tmp_path / "e.db"
    runner = Runner(_config(db, broker.name, "{emit: {id: body.id}}"), handle_signals=False)
    restarts: list[BaseException] = []
    runner.observer.cohort_failed = lambda key, error, delay: restarts.append(error)  # type: ignore[method-assign]
    for i in range(6):
        _publish(broker, i % 2, {"id": i})
    task = asyncio.create_task(runner.run())
    try:
        await _until(lambda: all_committed(broker, GROUP), task)
    finally:
        await _stop(runner, task)
    assert restarts == []
    assert await _ids(db, "leaver") == list(range(6))
