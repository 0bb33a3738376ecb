"""The event store: every trigger event is committed before it is confirmed, once.

Store tests run on SQLite and PostgreSQL (``db_url``); checks that never reach the
database (payload validation, CLI parsing) run on SQLite only.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncConnection
from typer.testing import CliRunner

from acklane.core.cli.events import app as events_cli
from acklane.core.events import EventRecord, EventStore, StoredEvent, events_table
from acklane.core.events._store import backoff  # the pause rule alone; a store only waits it
from acklane.core.sql import sync_engine

# A safety net against hangs, never a measure of speed.
SAFETY = 30.0


def rec(
    n: int,
    *,
    trigger: str = "orders-watcher",
    message_id: str | None = "default",
    position: int = 0,
    payload: Any = None,
    stream_key: str = "('kafka', 'orders')",
) -> EventRecord:
    return EventRecord(
        trigger_id=trigger,
        stream_key=stream_key,
        payload={"n": n} if payload is None else payload,
        message_id=f"orders/0/{n}" if message_id == "default" else message_id,
        position=position,
    )


class Confirmations:
    """An on_confirmed callback that records each call."""

    def __init__(self) -> None:
        self.calls: list[list[int]] = []
        self.changed = asyncio.Event()

    def __call__(self, seqs: Sequence[int]) -> None:
        self.calls.append(list(seqs))
        self.changed.set()

    @property
    def seqs(self) -> list[int]:
        return [seq for call in self.calls for seq in call]

    async def wait_for(self, count: int) -> None:
        async with asyncio.timeout(SAFETY):
            while len(self.seqs) < count:
                self.changed.clear()
                await self.changed.wait()


class Gate:
    """A before_commit hook that holds the transaction open until released."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, conn: AsyncConnection) -> None:
        self.entered.set()
        await self.release.wait()


@pytest.fixture
async def confirmations() -> Confirmations:
    return Confirmations()


@pytest.fixture
async def store(db_url: str, confirmations: Confirmations) -> AsyncIterator[EventStore]:
    async with EventStore(db_url, on_confirmed=confirmations) as s:
        yield s


@pytest.fixture
async def sqlite_store(sqlite_url: str, confirmations: Confirmations) -> AsyncIterator[EventStore]:
    async with EventStore(sqlite_url, on_confirmed=confirmations) as s:
        yield s


# -- persistence and confirmation -------------------------------------------------------


async def test_flush_returns_when_every_put_event_is_stored_and_confirmed(
    store: EventStore, confirmations: Confirmations
) -> None:
    for n in range(3):
        await store.put(rec(n), seq=n)
    await store.flush()
    assert sorted(confirmations.seqs) == [0, 1, 2]
    stored = await store.list_events()
    assert [(e.payload, e.message_id) for e in stored] == [
        ({"n": n}, f"orders/0/{n}") for n in range(3)
    ]


async def test_stored_event_keeps_every_field_of_the_record(store: EventStore) -> None:
    payload = {"order": {"id": 7, "lines": [1, 2.5, None, True]}, "note": "ünïcode ✓ [x]"}
    await store.put(rec(7, trigger="w1", position=2, payload=payload, stream_key="k1"), seq=1)
    await store.flush()
    (event,) = await store.list_events()
    assert isinstance(event, StoredEvent)
    assert (
        event.trigger_id,
        event.stream_key,
        event.payload,
        event.message_id,
        event.position,
    ) == (
        "w1",
        "k1",
        payload,
        "orders/0/7",
        2,
    )
    assert event.id > 0


async def test_text_fields_keep_tabs_newlines_backslashes_and_copy_markers(
    store: EventStore,
) -> None:
    awkward = "tab\there\nnew line \\N back\\slash \r ✓"
    await store.put(EventRecord("w\t1", awkward, {"s": awkward}, "\\N", 0))
    await store.put(EventRecord("w\t1", awkward, awkward, None, 1))
    await store.flush()
    first, second = await store.list_events()
    assert (first.trigger_id, first.stream_key, first.message_id) == ("w\t1", awkward, "\\N")
    assert first.payload == {"s": awkward}
    assert (second.message_id, second.payload) == (None, awkward)


async def test_created_at_is_a_utc_aware_datetime(store: EventStore) -> None:
    before = datetime.now(UTC)
    await store.put(rec(1))
    await store.flush()
    (event,) = await store.list_events()
    assert event.created_at.utcoffset() == timedelta(0)
    assert before.replace(microsecond=0) <= event.created_at <= datetime.now(UTC)


async def test_unbound_events_are_stored_but_not_confirmed(
    store: EventStore, confirmations: Confirmations
) -> None:
    await store.put(rec(1), seq=None)
    await store.put(rec(2), seq=5)
    await store.flush()
    assert confirmations.calls == [[5]]
    assert await store.count() == 2


async def test_on_confirmed_runs_on_the_event_loop_thread(db_url: str) -> None:
    threads: list[int] = []
    async with EventStore(
        db_url, on_confirmed=lambda _: threads.append(threading.get_ident())
    ) as s:
        await s.put(rec(1), seq=1)
        await s.flush()
    assert threads == [threading.get_ident()]


async def test_a_raising_on_confirmed_does_not_stop_the_writer(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[list[int]] = []

    def confirm(seqs: Sequence[int]) -> None:
        calls.append(list(seqs))
        raise RuntimeError("engine bug")

    async with EventStore(db_url, on_confirmed=confirm) as s:
        await s.put(rec(1), seq=1)
        await s.flush()
        await s.put(rec(2), seq=2)
        await s.flush()
        assert await s.count() == 2
    assert calls == [[1], [2]]
    assert "on_confirmed raised" in caplog.text


# -- group commit --------------------------------------------------------------------------


async def test_put_returns_without_suspending_when_there_is_room(sqlite_store: EventStore) -> None:
    coro = sqlite_store.put(rec(1), seq=1)
    with pytest.raises(StopIteration):
        coro.send(None)  # ran to completion in one step: no await suspended it


async def test_many_puts_share_one_transaction(
    store: EventStore, confirmations: Confirmations
) -> None:
    for n in range(50):
        await store.put(rec(n), seq=n)
    await store.flush()
    assert store.stats.batches == 1
    assert confirmations.calls == [list(range(50))]


async def test_a_batch_holds_at_most_max_batch_events(
    db_url: str, confirmations: Confirmations
) -> None:
    async with EventStore(db_url, on_confirmed=confirmations, max_batch=10) as s:
        for n in range(25):
            await s.put(rec(n), seq=n)
        await s.flush()
        assert s.stats.batches == 3
        assert s.stats.largest_batch == 10
    assert confirmations.calls == [list(range(10)), list(range(10, 20)), list(range(20, 25))]


async def test_events_put_while_a_commit_is_in_flight_form_the_next_batch(
    store: EventStore, confirmations: Confirmations
) -> None:
    gate = Gate()
    store.before_commit = gate
    await store.put(rec(0), seq=0)
    await gate.entered.wait()  # batch [0] is inside its transaction
    store.before_commit = None
    for n in range(1, 6):
        await store.put(rec(n), seq=n)
    gate.release.set()
    await store.flush()
    assert confirmations.calls == [[0], [1, 2, 3, 4, 5]]
    assert store.stats.batches == 2


async def test_a_full_batch_cuts_the_linger_short(
    sqlite_url: str, confirmations: Confirmations
) -> None:
    async with EventStore(
        sqlite_url, on_confirmed=confirmations, commit_interval=3600, max_batch=4
    ) as s:
        await s.put(rec(0), seq=0)
        await asyncio.sleep(0)  # the writer wakes and lingers for more
        for n in range(1, 4):
            await s.put(rec(n), seq=n)
        await confirmations.wait_for(4)  # no flush: the full batch alone ends the linger
        assert confirmations.calls == [[0, 1, 2, 3]]


async def test_the_writer_lingers_only_while_more_events_come(
    sqlite_url: str, confirmations: Confirmations
) -> None:
    # nothing put in the turn after the first event: it is committed at once, not
    # after commit_interval (an hour here)
    async with EventStore(sqlite_url, on_confirmed=confirmations, commit_interval=3600) as s:
        await s.put(rec(0), seq=0)
        await confirmations.wait_for(1)
        assert confirmations.calls == [[0]]


async def test_flush_cuts_the_linger_short(sqlite_url: str, confirmations: Confirmations) -> None:
    async with EventStore(sqlite_url, on_confirmed=confirmations, commit_interval=3600) as s:
        await s.put(rec(0), seq=0)
        await asyncio.sleep(0)
        async with asyncio.timeout(SAFETY):
            await s.flush()
        assert confirmations.calls == [[0]]


# -- dedupe -------------------------------------------------------------------------------


async def test_a_redelivered_copy_is_confirmed_without_a_second_row(
    store: EventStore, confirmations: Confirmations
) -> None:
    await store.put(rec(1, payload={"copy": "first"}), seq=1)
    await store.flush()
    await store.put(rec(1, payload={"copy": "redelivered"}), seq=2)
    await store.flush()
    assert confirmations.calls == [[1], [2]]
    assert [e.payload for e in await store.list_events()] == [{"copy": "first"}]
    assert (store.stats.inserted, store.stats.duplicates) == (1, 1)


async def test_a_copy_in_the_same_batch_is_confirmed_and_stored_once(
    store: EventStore, confirmations: Confirmations
) -> None:
    await store.put(rec(1), seq=1)
    await store.put(rec(1), seq=2)
    await store.flush()
    assert confirmations.calls == [[1, 2]]
    assert await store.count() == 1


async def test_other_position_trigger_or_stream_of_one_message_is_not_a_duplicate(
    store: EventStore,
) -> None:
    await store.put(rec(1, position=0))
    await store.put(rec(1, position=1))
    await store.put(rec(1, position=0, trigger="another-watcher"))
    # The same id from another stream (cluster, queue, group) is another message.
    await store.put(rec(1, position=0, stream_key="('kafka', 'orders', 'other-cluster')"))
    await store.flush()
    assert await store.count() == 4


async def test_events_without_message_id_are_never_deduplicated(store: EventStore) -> None:
    await store.put(rec(1, message_id=None))
    await store.put(rec(1, message_id=None))
    await store.flush()
    assert await store.count() == 2


# -- commit, failure, retry ---------------------------------------------------------------


async def test_nothing_is_confirmed_before_the_commit(
    store: EventStore, confirmations: Confirmations
) -> None:
    seen_in_transaction: list[list[int]] = []

    async def look(conn: AsyncConnection) -> None:
        seen_in_transaction.append(confirmations.seqs)

    store.before_commit = look
    await store.put(rec(1), seq=1)
    await store.flush()
    assert seen_in_transaction == [[]]
    assert confirmations.seqs == [1]


async def test_a_crash_between_write_and_commit_leaves_no_confirmed_but_missing_event(
    store: EventStore, confirmations: Confirmations, caplog: pytest.LogCaptureFixture
) -> None:
    store.retry_initial_delay = store.retry_max_delay = 0.001
    crashed = asyncio.Event()
    rows_inside: list[int] = []

    async def crash(conn: AsyncConnection) -> None:
        count = select(func.count()).select_from(events_table)
        rows_inside.append((await conn.execute(count)).scalar_one())
        crashed.set()
        raise ConnectionError("connection lost before COMMIT")

    store.before_commit = crash
    with caplog.at_level(logging.WARNING, logger="acklane.core.events"):
        await store.put(rec(1), seq=1)
        async with asyncio.timeout(SAFETY):
            await crashed.wait()
            while store.stats.failed_attempts == 0:  # the writer rolls back, then logs
                await asyncio.sleep(0.001)
    assert rows_inside[0] == 1  # the INSERT did happen...
    assert await store.count() == 0  # ...no row is visible: the transaction rolled back...
    assert confirmations.seqs == []  # ...and nothing was confirmed
    assert "connection lost before COMMIT" in caplog.text
    assert "nothing confirmed" in caplog.text
    store.before_commit = None  # the database is back: the retry commits it, once
    await store.flush()
    assert confirmations.seqs == [1]
    assert await store.count() == 1


async def test_a_failed_batch_is_retried_until_it_commits(
    store: EventStore, confirmations: Confirmations
) -> None:
    store.retry_initial_delay = 0.0
    failures = 3

    async def flaky(conn: AsyncConnection) -> None:
        nonlocal failures
        if failures:
            failures -= 1
            raise OSError("database is locked")

    store.before_commit = flaky
    await store.put(rec(1), seq=1)
    await store.flush()
    assert store.stats.failed_attempts == 3
    assert store.stats.batches == 1
    assert confirmations.calls == [[1]]
    assert await store.count() == 1


def test_retry_pauses_double_up_to_the_cap() -> None:
    pauses = backoff(0.5, 4.0)
    assert [next(pauses) for _ in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


async def test_a_lost_postgresql_connection_is_replaced_and_the_batch_retried(
    pg_url: str, confirmations: Confirmations
) -> None:
    killed = False

    async def kill_own_connection(conn: AsyncConnection) -> None:
        nonlocal killed
        if not killed:
            killed = True
            await conn.exec_driver_sql("SELECT pg_terminate_backend(pg_backend_pid())")

    async with EventStore(pg_url, on_confirmed=confirmations) as s:
        s.retry_initial_delay = 0.0
        s.before_commit = kill_own_connection
        await s.put(rec(1), seq=1)
        await s.flush()
        assert s.stats.failed_attempts == 1
        assert await s.count() == 1
    assert confirmations.calls == [[1]]


async def test_postgresql_commits_are_synchronous_even_when_the_session_says_off(
    pg_url: str,
) -> None:
    seen: list[str] = []

    async def show(conn: AsyncConnection) -> None:
        result = await conn.exec_driver_sql("SHOW synchronous_commit")
        seen.append(result.scalar_one())

    async with EventStore(pg_url + "%20-csynchronous_commit%3Doff") as s:
        s.before_commit = show
        await s.put(rec(1))
        await s.flush()
    assert seen == ["on"]


# -- payload validation -------------------------------------------------------------------


class Color(Enum):
    RED = "red"


@pytest.mark.parametrize(
    ("payload", "offending"),
    [
        ({"at": datetime(2024, 1, 1)}, "datetime"),
        ({"amount": Decimal("1.5")}, "Decimal"),
        ({"tags": {"a", "b"}}, "set"),
        ({"raw": b"\x00"}, "bytes"),
        ({"color": Color.RED}, "Color"),
        ({"pair": (1, 2)}, "tuple"),
        ({1: "int key"}, "int"),
        ({"x": float("nan")}, "nan"),
        ({"x": [1, float("inf")]}, "inf"),
        (object(), "object"),
    ],
)
async def test_put_refuses_a_payload_that_is_not_json_and_stores_nothing(
    sqlite_store: EventStore, confirmations: Confirmations, payload: Any, offending: str
) -> None:
    with pytest.raises(TypeError) as info:
        await sqlite_store.put(rec(1, trigger="billing-watcher", payload=payload), seq=1)
    assert "billing-watcher" in str(info.value)
    assert offending in str(info.value)
    await sqlite_store.flush()
    assert await sqlite_store.count() == 0
    assert confirmations.seqs == []
    assert sqlite_store.pending == 0


async def test_put_refusal_says_where_in_the_payload_the_bad_value_is(
    sqlite_store: EventStore,
) -> None:
    with pytest.raises(TypeError, match=r"payload\['rows'\]\[1\]\['at'\] is a datetime"):
        await sqlite_store.put(rec(1, payload={"rows": [{"at": 1}, {"at": datetime.now()}]}))


async def test_put_refuses_a_circular_payload(sqlite_store: EventStore) -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(TypeError, match="orders-watcher"):
        await sqlite_store.put(rec(1, payload=loop))


@pytest.mark.parametrize(
    "payload",
    [None, 0, -(2**70), 1.5, "text", True, [], {}, {"a": [{"b": None}], "c": "\x00 \ud800"}],
)
async def test_every_json_value_reads_back_equal(sqlite_store: EventStore, payload: Any) -> None:
    await sqlite_store.put(EventRecord("w", "k", payload, None, 0))
    await sqlite_store.flush()
    (event,) = await sqlite_store.list_events()
    assert event.payload == payload


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("trigger_id", "", ValueError),
        ("trigger_id", 7, TypeError),
        ("message_id", 42, TypeError),
        ("stream_key", "\ud800", ValueError),
        ("position", -1, ValueError),
        ("position", True, ValueError),
    ],
)
async def test_put_refuses_fields_the_database_could_not_store(
    sqlite_store: EventStore, field: str, value: Any, error: type[Exception]
) -> None:
    fields = {
        "trigger_id": "w",
        "stream_key": "k",
        "payload": {},
        "message_id": "m",
        "position": 0,
        field: value,
    }
    with pytest.raises(error, match=field):
        await sqlite_store.put(EventRecord(**fields))
    assert sqlite_store.pending == 0


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("trigger_id", "", ValueError),
        ("trigger_id", 7, TypeError),
        ("message_id", 42, TypeError),
        ("stream_key", "\ud800", ValueError),
        ("stream_key", 3, TypeError),
        ("position", -1, ValueError),
        ("position", True, ValueError),
        ("payload", (1, 2), TypeError),
    ],
)
@pytest.mark.parametrize("shared", [False, True])
async def test_put_event_nowait_refuses_what_put_refuses(
    sqlite_store: EventStore, field: str, value: Any, error: type[Exception], shared: bool
) -> None:
    # the inline path's put, with its checks written out: the same refusals
    fields: dict[str, Any] = {
        "trigger_id": "w",
        "stream_key": "k",
        "payload": {},
        "message_id": "m",
        "position": 0,
    }
    sqlite_store.put_event_nowait(*fields.values(), None, shared)  # the pair checked once
    fields[field] = value
    with pytest.raises(error, match=field):
        sqlite_store.put_event_nowait(*fields.values(), None, shared)
    await sqlite_store.flush()
    assert sqlite_store.pending == 0
    assert await sqlite_store.count() == 1


async def test_put_event_nowait_reuses_a_shared_payloads_text_only_for_that_object(
    sqlite_store: EventStore,
) -> None:
    body = {"n": 1}
    sqlite_store.put_event_nowait("a", "k", body, "m", 0, None, True)
    sqlite_store.put_event_nowait("b", "k", body, "m", 0, None, True)  # the same object
    sqlite_store.put_event_nowait("c", "k", {"n": 2}, "m", 0, None, True)
    body["n"] = 3  # changed: a put that does not say it is shared encodes it again
    sqlite_store.put_event_nowait("d", "k", body, "m", 0, None)
    sqlite_store.put_event_nowait("e", "k", {"n": 4}, "\ud800", 0, None, True)
    await sqlite_store.flush()
    stored = {e.trigger_id: e for e in await sqlite_store.list_events()}
    assert {t: e.payload for t, e in stored.items()} == {
        "a": {"n": 1},
        "b": {"n": 1},
        "c": {"n": 2},
        "d": {"n": 3},
        "e": {"n": 4},
    }
    assert (stored["e"].message_id or "").startswith("sha256:")


@pytest.mark.parametrize(
    "odd_id",
    ["x" * 5000, "é" * 600, "a\x00b", "\ud800 lone surrogate"],
    ids=["long", "wide", "nul", "surrogate"],
)
async def test_a_message_id_the_database_cannot_index_is_stored_as_its_digest_and_still_dedupes(
    store: EventStore, confirmations: Confirmations, odd_id: str
) -> None:
    await store.put(rec(1, message_id=odd_id), seq=1)
    await store.put(rec(1, message_id=odd_id), seq=2)
    await store.put(rec(1, message_id=odd_id + "!"), seq=3)
    await store.flush()
    assert confirmations.seqs == [1, 2, 3]
    stored = await store.list_events()
    assert len(stored) == 2
    assert all((e.message_id or "").startswith("sha256:") for e in stored)


# -- back-pressure ------------------------------------------------------------------------


async def test_put_waits_for_room_while_max_pending_events_are_queued(db_url: str) -> None:
    gate = Gate()
    async with EventStore(db_url, max_batch=2, max_pending=3, commit_interval=0) as s:
        s.before_commit = gate
        await s.put(rec(0))
        await gate.entered.wait()  # the writer holds [0] in its transaction
        s.before_commit = None
        for n in range(1, 4):
            await s.put(rec(n))  # three queued: the queue is full
        blocked = asyncio.create_task(s.put(rec(4)))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not blocked.done()
        gate.release.set()  # [0] commits, the writer takes [1, 2]: room
        async with asyncio.timeout(SAFETY):
            await blocked
        await s.flush()
        assert await s.count() == 5


# -- lifecycle ----------------------------------------------------------------------------


async def test_flush_with_nothing_put_returns_at_once(store: EventStore) -> None:
    await store.flush()
    assert store.stats.batches == 0


async def test_close_commits_and_confirms_what_was_put(
    db_url: str, confirmations: Confirmations
) -> None:
    s = EventStore(db_url, on_confirmed=confirmations)
    await s.open()
    for n in range(10):
        await s.put(rec(n), seq=n)
    await s.close()
    assert confirmations.seqs == list(range(10))
    async with EventStore(db_url) as again:
        assert await again.count() == 10


async def test_close_is_idempotent_and_refuses_later_puts(db_url: str) -> None:
    s = EventStore(db_url)
    await s.open()
    await s.close()
    await s.close()
    with pytest.raises(RuntimeError, match="closed"):
        await s.put(rec(1))


async def test_put_before_open_is_refused(sqlite_url: str) -> None:
    with pytest.raises(RuntimeError, match="open it first"):
        await EventStore(sqlite_url).put(rec(1))


async def test_a_cancelled_close_abandons_uncommitted_events_without_confirming_them(
    sqlite_url: str, confirmations: Confirmations, caplog: pytest.LogCaptureFixture
) -> None:
    s = EventStore(sqlite_url, on_confirmed=confirmations)
    await s.open()
    s.retry_initial_delay = 3600

    async def fail(conn: AsyncConnection) -> None:
        raise OSError("disk full")

    s.before_commit = fail
    await s.put(rec(1), seq=1)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await s.close()
    assert confirmations.seqs == []
    assert "1 event(s) not committed" in caplog.text
    with pytest.raises(RuntimeError):
        await s.put(rec(2))
    with pytest.raises(RuntimeError, match="never committed"):
        await s.flush()


async def test_an_unsupported_database_is_refused_at_open() -> None:
    with pytest.raises(ValueError, match="sqlite:// and postgresql://"):
        await EventStore("mysql://root@127.0.0.1/test").open()


async def test_an_in_memory_sqlite_store_works(confirmations: Confirmations) -> None:
    async with EventStore("sqlite://", on_confirmed=confirmations) as s:
        for n in range(20):
            await s.put(rec(n), seq=n)
            if n % 5 == 0:
                assert await s.count() <= n
        await s.flush()
        assert await s.count() == 20
    assert confirmations.seqs == list(range(20))


async def test_several_stores_open_one_new_database_at_once(db_url: str) -> None:
    stores = [EventStore(db_url) for _ in range(4)]
    await asyncio.gather(*(s.open() for s in stores))
    for n, s in enumerate(stores):
        await s.put(rec(n))
    for s in stores:
        await s.close()
    async with EventStore(db_url) as s:
        assert await s.count() == 4


# -- reading ------------------------------------------------------------------------------


async def test_list_events_filters_by_trigger_stream_key_and_id(store: EventStore) -> None:
    await store.put(rec(1, trigger="a", stream_key="k1"))
    await store.put(rec(2, trigger="b", stream_key="k1"))
    await store.put(rec(3, trigger="a", stream_key="k2"))
    await store.flush()
    all_events = await store.list_events()
    assert [e.payload["n"] for e in await store.list_events(trigger_id="a")] == [1, 3]
    assert [e.payload["n"] for e in await store.list_events(stream_key="k1")] == [1, 2]
    after_first = await store.list_events(after_id=all_events[0].id)
    assert [e.payload["n"] for e in after_first] == [2, 3]


async def test_list_events_orders_limits_and_can_start_from_the_newest(store: EventStore) -> None:
    for n in range(5):
        await store.put(rec(n))
    await store.flush()
    assert [e.payload["n"] for e in await store.list_events(limit=2)] == [0, 1]
    newest = await store.list_events(limit=2, newest_first=True)
    assert [e.payload["n"] for e in newest] == [4, 3]


async def test_count_counts_all_or_one_trigger(store: EventStore) -> None:
    await store.put(rec(1, trigger="a"))
    await store.put(rec(2, trigger="a"))
    await store.put(rec(3, trigger="b"))
    await store.flush()
    assert await store.count() == 3
    assert await store.count(trigger_id="a") == 2
    assert await store.count(trigger_id="nobody") == 0


async def test_tail_yields_events_as_they_are_committed(store: EventStore) -> None:
    await store.put(rec(0))
    await store.flush()
    (first,) = await store.list_events()
    tail = store.tail(after_id=first.id, poll_interval=0.01)
    try:
        async with asyncio.timeout(SAFETY):
            waiting = asyncio.ensure_future(anext(tail))
            await store.put(rec(1, trigger="other"))
            await store.put(rec(2))
            await store.flush()
            got = [await waiting, await anext(tail)]
    finally:
        await tail.aclose()
    assert [e.payload["n"] for e in got] == [1, 2]


async def test_tail_follows_one_trigger(store: EventStore) -> None:
    tail = store.tail(trigger_id="a", after_id=0, poll_interval=0.01)
    try:
        await store.put(rec(1, trigger="b"))
        await store.put(rec(2, trigger="a"))
        await store.flush()
        async with asyncio.timeout(SAFETY):
            event = await anext(tail)
    finally:
        await tail.aclose()
    assert (event.trigger_id, event.payload) == ("a", {"n": 2})


# -- several processes, and a process killed mid-run -----------------------------------------

CHILD = r"""
import asyncio, sys
from acklane.core.events import EventRecord, EventStore

async def main(url, name, count):
    def confirmed(seqs):
        sys.stdout.write("".join(f"{s}\n" for s in seqs))
        sys.stdout.flush()
    async with EventStore(url, on_confirmed=confirmed, max_batch=50, max_pending=100) as store:
        n = 0
        while count < 0 or n < count:
            await store.put(EventRecord(name, "k", {"n": n}, f"{name}/{n}", 0), seq=n)
            n += 1
    print("done", flush=True)

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""


def _spawn(url: str, name: str, count: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, url, name, str(count)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _stored_message_ids(url: str, trigger: str) -> set[str]:
    engine = sync_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                select(events_table.c.message_id).where(events_table.c.trigger_id == trigger)
            )
            return {row.message_id for row in rows}
    finally:
        engine.dispose()


def test_a_killed_process_loses_no_confirmed_event(db_url: str) -> None:
    confirmed: list[int] = []
    with _spawn(db_url, "killed", -1) as child:  # puts forever
        assert child.stdout is not None
        try:
            while len(confirmed) < 500:
                line = child.stdout.readline()
                if not line:
                    pytest.fail("the writer process ended early")
                confirmed.append(int(line))
            child.send_signal(signal.SIGKILL)
            rest = child.stdout.read()
        finally:
            child.kill()
    # A line cut by the kill has no newline yet: it was not a complete confirmation.
    confirmed += [int(line) for line in rest.splitlines(keepends=True) if line.endswith("\n")]
    stored = _stored_message_ids(db_url, "killed")
    missing = [n for n in confirmed if f"killed/{n}" not in stored]
    assert missing == []
    assert len(stored) >= len(confirmed)


def test_several_processes_write_one_database_without_losing_an_event(db_url: str) -> None:
    # The table exists before the writers start, as when a runner has opened it once.
    async def create() -> None:
        async with EventStore(db_url):
            pass

    asyncio.run(create())
    children = {name: _spawn(db_url, name, 2000) for name in ("p1", "p2")}
    for name, child in children.items():
        out, err = child.communicate(timeout=SAFETY * 3)
        assert child.returncode == 0, err
        lines = out.splitlines()
        assert lines[-1] == "done"
        assert sorted(int(n) for n in lines[:-1]) == list(range(2000)), name
    for name in children:
        assert _stored_message_ids(db_url, name) == {f"{name}/{n}" for n in range(2000)}


# -- CLI ----------------------------------------------------------------------------------

runner = CliRunner()


def _fill(url: str, records: Sequence[EventRecord]) -> None:
    async def fill() -> None:
        async with EventStore(url) as s:
            for r in records:
                await s.put(r)

    asyncio.run(fill())


def test_cli_list_shows_the_latest_events_in_a_table(sqlite_url: str) -> None:
    _fill(sqlite_url, [rec(n, trigger="orders") for n in range(5)])
    result = runner.invoke(events_cli, ["list", "--url", sqlite_url, "--limit", "2"])
    assert result.exit_code == 0, result.output
    assert "orders/0/3" in result.output and "orders/0/4" in result.output
    assert "orders/0/2" not in result.output


def test_cli_list_json_prints_one_object_per_line(sqlite_url: str) -> None:
    _fill(sqlite_url, [rec(1, trigger="a"), rec(2, trigger="b"), rec(3, trigger="a")])
    result = runner.invoke(events_cli, ["list", "--url", sqlite_url, "--trigger", "a", "--json"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(e["trigger_id"], e["payload"]) for e in lines] == [("a", {"n": 1}), ("a", {"n": 3})]
    assert set(lines[0]) == {
        "id",
        "created_at",
        "trigger_id",
        "stream",  # the stream's name; the stored key without a configuration (--url)
        "stream_key",
        "message_id",
        "position",
        "payload",
    }
    assert datetime.fromisoformat(lines[0]["created_at"]).tzinfo is not None


def test_cli_list_pages_forward_after_an_id(sqlite_url: str) -> None:
    _fill(sqlite_url, [rec(n) for n in range(5)])
    result = runner.invoke(
        events_cli, ["list", "--url", sqlite_url, "--after", "2", "--limit", "2", "--json"]
    )
    assert [json.loads(line)["id"] for line in result.stdout.splitlines()] == [3, 4]


def test_cli_list_prints_payload_brackets_literally(sqlite_url: str) -> None:
    _fill(sqlite_url, [EventRecord("t", "k", "[b]x[/b]", None, 0)])
    result = runner.invoke(events_cli, ["list", "--url", sqlite_url])
    assert '"[b]x[/b]"' in result.output


def test_cli_reads_the_store_url_from_the_config(sqlite_url: str, tmp_path: Path) -> None:
    _fill(sqlite_url, [rec(1)])
    config = tmp_path / "acklane.yaml"
    config.write_text(f'store: {{url: "{sqlite_url}"}}\n')
    result = runner.invoke(events_cli, ["list", str(config), "--json"])
    assert result.exit_code == 0, result.output
    assert len(result.stdout.splitlines()) == 1


def test_cli_refuses_url_and_config_together(sqlite_url: str, tmp_path: Path) -> None:
    result = runner.invoke(events_cli, ["list", str(tmp_path / "a.yaml"), "--url", sqlite_url])
    assert result.exit_code == 1
    assert "not both" in result.output


def test_cli_names_a_missing_sqlite_database_and_creates_none(tmp_path: Path) -> None:
    path = tmp_path / "nope.db"
    result = runner.invoke(events_cli, ["list", "--url", f"sqlite:///{path}"])
    assert result.exit_code == 1
    assert f"no SQLite database at {path}" in result.output
    assert not path.exists()


def test_cli_says_when_a_database_holds_no_event_store(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    engine = sync_engine(f"sqlite:///{path}")
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE unrelated (x INTEGER)"))
    engine.dispose()
    result = runner.invoke(events_cli, ["list", "--url", f"sqlite:///{path}"])
    assert result.exit_code == 1
    assert "holds no event store" in result.output


def test_cli_tail_follows_new_events_and_exits_cleanly_on_ctrl_c(sqlite_url: str) -> None:
    _fill(sqlite_url, [rec(n) for n in range(3)])
    code = "from acklane.core.cli.events import app; app()"
    args = ["tail", "--url", sqlite_url, "--lines", "2", "--interval", "0.02", "--json"]
    with subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        try:
            shown = [json.loads(proc.stdout.readline())["payload"]["n"] for _ in range(2)]
            assert shown == [1, 2]  # the last two first
            _fill(sqlite_url, [rec(3)])
            assert json.loads(proc.stdout.readline())["payload"] == {"n": 3}
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=SAFETY)
        finally:
            proc.kill()
        stderr = proc.stderr.read()
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr


def test_the_displayed_store_url_hides_the_password_and_secret_query_parameters() -> None:
    from acklane.core.events import display_url

    shown = display_url("postgresql://u:pw-123456@h/db?sslpassword=topsecret1&application_name=x")
    assert "pw-123456" not in shown
    assert "topsecret1" not in shown
    assert "application_name=x" in shown


@pytest.mark.parametrize(
    "row",
    [
        ("w", "k", '{"n":1}', "m", 0),
        ("w", "k", '{"n":1}', None, 0),
        ("w\t1", "k", "p", "m", 1),
        ("w", "k\n", "p", "m", 1),
        ("w", "k", '{"s":"a\\"b"}', "m", 2),
        ("w", "k", "p", "m\r", 3),
        ("w", "k", "p", "\\N", 4),
    ],
)
def test_copy_text_escapes_exactly_what_postgresql_copy_reads_specially(
    row: tuple[str, str, str, str | None, int],
) -> None:
    # the COPY encoder alone: a round trip through PostgreSQL cannot show each escape
    from acklane.core.events._insert import _copy_text

    def escaped(value: str) -> str:
        for raw, esc in (("\\", "\\\\"), ("\t", "\\t"), ("\n", "\\n"), ("\r", "\\r")):
            value = value.replace(raw, esc)
        return value

    *text, message_id, position = row
    expected = "\t".join(
        [*(escaped(v) for v in text), "\\N" if message_id is None else escaped(message_id)]
    )
    plain = ("w", "k", "{}", "m", 9)
    assert _copy_text([plain, row, plain]) == (
        f"w\tk\t{{}}\tm\t9\n{expected}\t{position}\nw\tk\t{{}}\tm\t9\n"
    )
