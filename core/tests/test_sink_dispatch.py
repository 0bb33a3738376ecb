"""The dispatcher's delivery rules, on SQLite and PostgreSQL, one rule per test.

The sink here is a recording double (the rules are the dispatcher's, not a
receiver's); each real sink kind has its own tests against a real receiver.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from acklane.core.events import EventRecord, EventStore, cutoff_for
from acklane.core.sinks import (
    Delivery,
    DeliveryResult,
    Dispatcher,
    RefusedDelivery,
    RetryableDelivery,
    Sink,
    SinkSettings,
    event_id_for,
    parked_events,
    replay_events,
    retry_parked,
    sink_status,
)
from acklane.core.sql import async_engine
from acklane.core.testing import eventually

pytestmark = pytest.mark.timeout(60)

STREAM = '["memory","orders"]'


class Recording(Sink):
    """Records each delivery; ``behave(delivery) -> result`` decides the outcome."""

    kind = "test"

    def __init__(
        self,
        name: str = "s",
        behave: Callable[[Delivery], DeliveryResult] | None = None,
        *,
        exactly_once: bool = False,
        **policy: Any,
    ) -> None:
        fast = {"backoff_initial": 0.01, "backoff_max": 0.05}
        settings = SinkSettings(name=name, kind="test", **(fast | policy))
        super().__init__(settings)
        self.behave = behave or (lambda d: None)
        self.sent: list[Delivery] = []
        self.delivered: list[Delivery] = []
        self.have: set[str] = set()
        self.lookups = 0
        type(self).exactly_once = exactly_once

    async def deliver(self, batch: Sequence[Delivery]) -> list[DeliveryResult]:
        out: list[DeliveryResult] = []
        for d in batch:
            self.sent.append(d)
            result = self.behave(d)
            if result is None:
                self.delivered.append(d)
                self.have.add(d.event_id)
            out.append(result)
        await asyncio.sleep(0)
        return out

    async def delivered_already(self, batch: Sequence[Delivery]) -> set[str]:
        self.lookups += 1
        return {d.event_id for d in batch if d.event_id in self.have}

    def numbers(self) -> list[int]:
        return [d.payload["n"] for d in self.delivered]


def rec(n: int, trigger: str = "w") -> EventRecord:
    return EventRecord(trigger, STREAM, {"n": n}, f"orders/0/{n}", 0)


async def put(store: EventStore, ns: range | Sequence[int], trigger: str = "w") -> None:
    for n in ns:
        await store.put(rec(n, trigger))
    await store.flush()


@asynccontextmanager
async def running(
    url: str, *sinks: Sink, watchers: Sequence[str] = ("w",), **options: Any
) -> AsyncIterator[tuple[EventStore, Dispatcher]]:
    async with EventStore(url) as store:
        options.setdefault("poll_interval", 0.5)  # rows written by "another process": seen soon
        dispatcher = Dispatcher(url, [(s, tuple(watchers)) for s in sinks], **options)
        store.add_commit_listener(dispatcher.wake)
        async with dispatcher:
            yield store, dispatcher


async def test_every_event_of_the_watchers_is_delivered_once_in_store_order(db_url: str) -> None:
    sink = Recording()
    async with running(db_url, sink) as (store, _):
        await put(store, range(20))
        await put(store, range(5), trigger="other")  # not the sink's watcher
        await eventually(lambda: len(sink.delivered) == 20)
        await asyncio.sleep(0.1)
    assert sink.numbers() == list(range(20))
    assert len({d.event_id for d in sink.delivered}) == 20


async def test_a_commit_wakes_the_dispatcher_without_waiting_for_the_poll(sqlite_url: str) -> None:
    sink = Recording()
    async with running(sqlite_url, sink, poll_interval=3600) as (store, _):
        await asyncio.sleep(0.1)  # the first round found nothing; the next poll is an hour off
        await put(store, [1])
        await eventually(lambda: len(sink.delivered) == 1, within=10)


async def test_a_failed_delivery_is_retried_then_delivered(db_url: str) -> None:
    failures = Counter[int]()

    def flaky(d: Delivery) -> DeliveryResult:
        n = d.payload["n"]
        if failures[n] < 2:
            failures[n] += 1
            return RetryableDelivery("HTTP 503")
        return None

    sink = Recording(behave=flaky)
    async with running(db_url, sink) as (store, _):
        await put(store, range(3))
        await eventually(lambda: len(sink.delivered) == 3)
    assert sorted(sink.numbers()) == [0, 1, 2]
    assert [d.attempt for d in sink.delivered] == [3, 3, 3]


async def test_retry_after_is_waited_for(sqlite_url: str) -> None:
    seen: list[datetime] = []

    def slow_down(d: Delivery) -> DeliveryResult:
        seen.append(datetime.now(UTC))
        return RetryableDelivery("HTTP 429", retry_after=1.0) if len(seen) == 1 else None

    # A retry_after is honoured up to backoff_max (test_hostile_sinks: an absurd one is capped)
    sink = Recording(behave=slow_down, backoff_max=5.0)
    async with running(sqlite_url, sink) as (store, _):
        await put(store, [1])
        await eventually(lambda: len(sink.delivered) == 1)
    assert seen[1] - seen[0] >= timedelta(seconds=1.0)


async def test_a_refused_event_is_parked_with_its_reason_and_the_next_ones_go_on(
    db_url: str,
) -> None:
    def refuse_two(d: Delivery) -> DeliveryResult:
        return RefusedDelivery("HTTP 400: bad order") if d.payload["n"] == 2 else None

    sink = Recording(behave=refuse_two)
    async with running(db_url, sink) as (store, _):
        await put(store, range(5))
        await eventually(lambda: len(sink.delivered) == 4)
        engine = async_engine(db_url)
        try:
            parked = await parked_events(engine, "s")
            (status,) = await sink_status(engine, {"s": ["w"]})
        finally:
            await engine.dispose()
    assert [p.delivery.payload["n"] for p in parked] == [2]
    assert parked[0].reason == "refused: HTTP 400: bad order"
    assert status.parked == 1 and status.delivered == 4 and status.lag == 0


async def test_an_event_is_parked_after_max_attempts_with_its_last_error(db_url: str) -> None:
    sink = Recording(behave=lambda d: RuntimeError("connection reset"), max_attempts=3)
    async with running(db_url, sink) as (store, _):
        await put(store, [7])
        await eventually(lambda: len(sink.sent) == 3)
        engine = async_engine(db_url)
        try:
            await eventually(lambda: len(sink.sent) == 3)
            parked: list[Any] = []

            async def is_parked() -> bool:
                parked[:] = await parked_events(engine, "s")
                return bool(parked)

            for _ in range(100):
                if await is_parked():
                    break
                await asyncio.sleep(0.05)
        finally:
            await engine.dispose()
    assert parked[0].attempts == 3
    assert parked[0].reason == "gave up after 3 attempt(s): RuntimeError: connection reset"
    assert len(sink.sent) == 3


async def test_an_ordered_sink_holds_later_events_behind_a_retrying_one(sqlite_url: str) -> None:
    tries = Counter[int]()

    def first_fails_thrice(d: Delivery) -> DeliveryResult:
        n = d.payload["n"]
        tries[n] += 1
        return RetryableDelivery("down") if n == 0 and tries[n] <= 3 else None

    sink = Recording(behave=first_fails_thrice)
    async with running(sqlite_url, sink) as (store, _):
        await put(store, range(6))
        await eventually(lambda: len(sink.delivered) == 6)
    assert sink.numbers() == list(range(6))
    assert [d.payload["n"] for d in sink.sent][:4] == [0, 0, 0, 0]


async def test_an_unordered_sink_lets_others_pass_a_retrying_one(sqlite_url: str) -> None:
    tries = Counter[int]()

    def first_fails_once(d: Delivery) -> DeliveryResult:
        tries[d.payload["n"]] += 1
        return RetryableDelivery("down") if d.payload["n"] == 0 and tries[0] == 1 else None

    sink = Recording(behave=first_fails_once, ordered=False, concurrency=4)
    async with running(sqlite_url, sink) as (store, _):
        await put(store, range(6))
        await eventually(lambda: len(sink.delivered) == 6)
    assert sink.numbers()[-1] == 0
    assert sorted(sink.numbers()) == list(range(6))


async def test_concurrent_requests_deliver_each_event_once(db_url: str) -> None:
    sink = Recording(ordered=False, concurrency=8, batch_size=3)
    async with running(db_url, sink) as (store, _):
        await put(store, range(200))
        await eventually(lambda: len(sink.delivered) == 200, within=30)
        await asyncio.sleep(0.2)
    assert sorted(sink.numbers()) == list(range(200))


async def test_a_refused_batch_parks_only_the_event_refused_alone(sqlite_url: str) -> None:
    def refuse_batches_with_three(d: Delivery) -> DeliveryResult:
        return RefusedDelivery("no") if d.payload["n"] == 3 else None

    class Batchy(Recording):
        async def deliver(self, batch: Sequence[Delivery]) -> list[DeliveryResult]:
            # the receiver takes a batch whole or not at all
            if any(d.payload["n"] == 3 for d in batch):
                self.sent.extend(batch)
                return [RefusedDelivery("no")] * len(batch)
            return await super().deliver(batch)

    sink = Batchy(behave=refuse_batches_with_three, batch_size=5)
    async with running(sqlite_url, sink) as (store, _):
        await put(store, range(5))
        await eventually(lambda: len(sink.delivered) == 4)
    assert sink.numbers() == [0, 1, 2, 4]


async def test_sinks_retry_delivers_a_parked_event(db_url: str) -> None:
    fixed = False
    sink = Recording(behave=lambda d: None if fixed else RefusedDelivery("HTTP 422"))
    async with running(db_url, sink) as (store, dispatcher):
        await put(store, [1, 2])
        engine = async_engine(db_url)
        try:
            for _ in range(200):
                if len(await parked_events(engine, "s")) == 2:
                    break
                await asyncio.sleep(0.05)
            fixed = True
            (one,) = [p for p in await parked_events(engine, "s") if p.delivery.payload["n"] == 1]
            assert await retry_parked(engine, "s", event_ids=[one.delivery.event_id]) == 1
            dispatcher.wake()
            await eventually(lambda: sink.numbers() == [1])
            assert await retry_parked(engine, "s") == 1
            dispatcher.wake()
            await eventually(lambda: sink.numbers() == [1, 2])
        finally:
            await engine.dispose()


async def test_a_replay_delivers_again_with_the_original_event_ids(db_url: str) -> None:
    sink = Recording()
    async with running(db_url, sink) as (store, dispatcher):
        await put(store, range(3))
        await eventually(lambda: len(sink.delivered) == 3)
        first = [d.event_id for d in sink.delivered]
        engine = async_engine(db_url)
        try:
            for _ in range(100):  # settled: the cursor is past them
                if (await sink_status(engine, {"s": ["w"]}))[0].delivered == 3:
                    break
                await asyncio.sleep(0.05)
            assert await replay_events(engine, "s", "w") == 3
        finally:
            await engine.dispose()
        dispatcher.wake()
        await eventually(lambda: len(sink.delivered) == 6)
    assert [d.event_id for d in sink.delivered[3:]] == first


async def test_retention_keeps_what_a_sink_has_not_delivered(db_url: str) -> None:
    sink = Recording(behave=lambda d: None if d.payload["n"] < 3 else RefusedDelivery("x"))
    async with running(db_url, sink) as (store, _):
        await put(store, range(5))
        await eventually(lambda: len(sink.sent) == 5)
        await asyncio.sleep(0.3)
    async with EventStore(db_url) as store:
        await put(store, [9], trigger="other")  # no sink: prunable
        engine = async_engine(db_url)
        try:
            async with engine.begin() as conn:
                await conn.exec_driver_sql("UPDATE acklane_sink_state SET cursor = 3")
        finally:
            await engine.dispose()
        deleted = await store.prune(cutoff_for(0.001, datetime.now(UTC) + timedelta(days=1)))
        left = sorted(e.payload["n"] for e in await store.list_events())
    # 0-2 delivered and 9 has no sink: pruned; 3 is parked and 4 beyond the cursor: kept
    assert deleted == 4
    assert left == [3, 4]


async def test_two_processes_share_a_sink_without_delivering_an_event_twice(pg_url: str) -> None:
    a, b = Recording(), Recording()
    async with (
        running(pg_url, a, lease_ttl=1.0) as (store, _),
        running(pg_url, b, lease_ttl=1.0),
    ):
        await put(store, range(50))
        await eventually(lambda: len(a.delivered) + len(b.delivered) == 50, within=30)
        await asyncio.sleep(0.3)
    ids = [d.event_id for d in a.delivered + b.delivered]
    assert len(ids) == len(set(ids)) == 50


async def test_a_dead_process_has_its_sink_taken_over_after_its_lease(pg_url: str) -> None:
    a, b = Recording(), Recording()
    async with EventStore(pg_url) as store:
        first = Dispatcher(pg_url, [(a, ("w",))], lease_ttl=1.0, owner="first")
        await first.start()
        await eventually(lambda: first.workers[0].stats.holding)
        for task in first._tasks:  # dies: no release, the lease stays until it lapses
            task.cancel()
        await asyncio.gather(*first._tasks, return_exceptions=True)
        async with Dispatcher(pg_url, [(b, ("w",))], lease_ttl=1.0, owner="second") as second:
            store.add_commit_listener(second.wake)
            await put(store, range(5))
            await eventually(lambda: len(b.delivered) == 5, within=20)
        assert first._engine is not None
        await first._engine.dispose()
    assert a.delivered == []


async def test_an_exactly_once_sink_looks_up_what_a_crash_left_unsure(sqlite_url: str) -> None:
    sink = Recording(exactly_once=True)
    async with EventStore(sqlite_url) as store:
        await put(store, range(4))
    engine = async_engine(sqlite_url)
    try:
        # a previous holder claimed 1-4, delivered 1 and 2 (the receiver has them) and died
        async with engine.begin() as conn:
            await conn.exec_driver_sql(
                "INSERT INTO acklane_sink_state (pipeline, sink, watchers, cursor, claimed_to, "
                "delivered, owner, lease_until, updated_at) VALUES ('default', 's', '[\"w\"]', "
                "0, 4, 0, NULL, NULL, '2026-01-01 00:00:00')"
            )
        async with EventStore(sqlite_url) as store:
            events = await store.list_events()
        sink.have = {
            event_id_for(
                watcher=e.trigger_id,
                stream=e.stream_key,
                message_id=e.message_id,
                position=e.position,
                store_id=e.id,
                created_at=e.created_at,
            )
            for e in events[:2]
        }
    finally:
        await engine.dispose()
    async with running(sqlite_url, sink) as (_, _dispatcher):
        await eventually(lambda: len(sink.delivered) == 2)
        await asyncio.sleep(0.1)
    assert sink.numbers() == [2, 3]
    assert sink.lookups >= 1


async def test_a_lease_held_by_a_dead_process_of_this_host_is_taken_at_once(
    sqlite_url: str,
) -> None:
    import socket

    child = await asyncio.create_subprocess_exec("true")  # a pid that existed and is gone
    await child.wait()
    dead = f"{socket.gethostname()}:{child.pid}:dead"
    sink = Recording()
    async with EventStore(sqlite_url) as store:
        await put(store, [1])
    engine = async_engine(sqlite_url)
    try:
        async with engine.begin() as conn:
            await conn.exec_driver_sql(
                "INSERT INTO acklane_sink_state (pipeline, sink, watchers, cursor, claimed_to, "
                "delivered, owner, lease_until, updated_at) VALUES ('default', 's', '[\"w\"]', "
                "0, 0, 0, ?, '2999-01-01 00:00:00', '2026-01-01 00:00:00')",
                (dead,),
            )
    finally:
        await engine.dispose()
    async with running(sqlite_url, sink, lease_ttl=3600):
        await eventually(lambda: len(sink.delivered) == 1, within=10)
