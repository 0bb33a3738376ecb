"""Dedupe scope: a message identity is only trusted within the stream it came from.

The store keeps one copy per (trigger, stream key, message id, position): a message
id reused by another stream (another cluster, queue or group) is a new message, never
a redelivery. Databases made by the previous code (unique index on trigger, message
id and position only) are migrated in place when a store opens them.

Every test runs on SQLite and on PostgreSQL (``db_url``).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import pytest
from sqlalchemy import inspect, text

from acklane.core.events import TABLE_NAME, EventRecord, EventStore
from acklane.core.sql import is_sqlite, sync_engine

#: docs/event-store.md: a stream key longer than this is stored as its digest.
MAX_STREAM_KEY_BYTES = 1024

# A safety net against hangs, never a measure of speed.
SAFETY = 30.0

OLD_INDEX = f"{TABLE_NAME}_dedupe"
NEW_INDEX = f"{TABLE_NAME}_pipeline_dedupe"
NEW_COLUMNS = ["trigger_id", "message_id", "position", "stream_key", "pipeline"]

KEY_A = '["acklane","kafka","old-cluster:9092",["orders"],"billing"]'
KEY_B = '["acklane","kafka","new-cluster:9092",["orders"],"billing"]'


def rec(
    stream_key: str,
    *,
    message_id: str | None = "orders/0/42",
    position: int = 0,
    trigger: str = "orders-watcher",
    payload: Any = None,
) -> EventRecord:
    return EventRecord(
        trigger_id=trigger,
        stream_key=stream_key,
        payload={"from": stream_key[:40]} if payload is None else payload,
        message_id=message_id,
        position=position,
    )


class Confirmed:
    def __init__(self) -> None:
        self.seqs: list[int] = []

    def __call__(self, seqs: Sequence[int]) -> None:
        self.seqs.extend(seqs)


def _rows(url: str) -> list[tuple[str, str | None, int, str]]:
    engine = sync_engine(url)
    try:
        with engine.connect() as conn:
            result = conn.execute(
                text(
                    f"SELECT trigger_id, message_id, position, stream_key FROM {TABLE_NAME} "
                    "ORDER BY id"
                )
            )
            return [(r[0], r[1], r[2], r[3]) for r in result]
    finally:
        engine.dispose()


def _unique_indexes(url: str) -> dict[str, list[str]]:
    engine = sync_engine(url)
    try:
        with engine.connect() as conn:
            indexes = inspect(conn).get_indexes(TABLE_NAME)
    finally:
        engine.dispose()
    return {str(i["name"]): [str(c) for c in i["column_names"]] for i in indexes if i["unique"]}


# -- the scope ------------------------------------------------------------------------------


async def test_one_message_id_from_two_streams_is_stored_twice(db_url: str) -> None:
    confirmed = Confirmed()
    async with EventStore(db_url, on_confirmed=confirmed) as store:
        await store.put(rec(KEY_A), seq=1)
        await store.flush()
        # The pipeline now reads another cluster, whose offsets restart: same id, new message.
        await store.put(rec(KEY_B), seq=2)
        await store.flush()
        assert confirmed.seqs == [1, 2]
        assert (store.stats.inserted, store.stats.duplicates) == (2, 0)
        stored = await store.list_events()
    assert [(e.stream_key, e.message_id, e.position) for e in stored] == [
        (KEY_A, "orders/0/42", 0),
        (KEY_B, "orders/0/42", 0),
    ]


async def test_two_streams_in_one_batch_are_both_stored(db_url: str) -> None:
    confirmed = Confirmed()
    async with EventStore(db_url, on_confirmed=confirmed) as store:
        await store.put(rec(KEY_A), seq=1)
        await store.put(rec(KEY_B), seq=2)
        await store.put(rec(KEY_A), seq=3)  # a redelivery of the first
        await store.flush()
        assert sorted(confirmed.seqs) == [1, 2, 3]
        assert store.stats.batches == 1
        assert (store.stats.inserted, store.stats.duplicates) == (2, 1)
        assert sorted(e.stream_key for e in await store.list_events()) == sorted([KEY_A, KEY_B])


async def test_a_redelivery_from_the_same_stream_is_confirmed_without_a_second_row(
    db_url: str,
) -> None:
    confirmed = Confirmed()
    async with EventStore(db_url, on_confirmed=confirmed) as store:
        await store.put(rec(KEY_A, payload={"copy": "first"}), seq=1)
        await store.flush()
        await store.put(rec(KEY_A, payload={"copy": "redelivered"}), seq=2)
        await store.flush()
        assert confirmed.seqs == [1, 2]
        assert (store.stats.inserted, store.stats.duplicates) == (1, 1)
        assert [e.payload for e in await store.list_events()] == [{"copy": "first"}]


async def test_a_long_stream_key_is_stored_as_its_digest_and_still_dedupes(db_url: str) -> None:
    # Many topics make a long key; incompressible text so PostgreSQL cannot squeeze
    # an index entry below its b-tree limit: the key must never make a batch fail.
    long_a = "".join(f"{os.urandom(8).hex()}" for _ in range(400))  # 6,400 bytes
    long_b = long_a[:-1] + ("0" if long_a[-1] != "0" else "1")
    assert len(long_a.encode()) > MAX_STREAM_KEY_BYTES
    confirmed = Confirmed()
    async with EventStore(db_url, on_confirmed=confirmed) as store:
        store.retry_initial_delay = store.retry_max_delay = 0.01
        await store.put(rec(long_a, trigger="t" * 512, message_id="m" * 1024), seq=1)
        await store.put(rec(long_a, trigger="t" * 512, message_id="m" * 1024), seq=2)
        await store.put(rec(long_b, trigger="t" * 512, message_id="m" * 1024), seq=3)
        async with asyncio.timeout(SAFETY):
            await store.flush()
        assert store.stats.failed_attempts == 0
        assert sorted(confirmed.seqs) == [1, 2, 3]
        stored = await store.list_events()
        assert len(stored) == 2
        assert all(e.stream_key.startswith("sha256:") for e in stored)
        # A filter on the key the producer knows finds the rows stored under its digest.
        (found,) = await store.list_events(stream_key=long_a)
        assert found.id == stored[0].id


# -- migrating a database made by the previous code ----------------------------------------

_OLD_DDL = {
    "sqlite": [
        f"""CREATE TABLE {TABLE_NAME} (
            id INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
            trigger_id TEXT NOT NULL,
            stream_key TEXT NOT NULL,
            payload TEXT NOT NULL,
            message_id TEXT,
            position INTEGER NOT NULL,
            created_at DATETIME NOT NULL
        )""",
    ],
    "postgresql": [
        f"""CREATE TABLE {TABLE_NAME} (
            id BIGSERIAL NOT NULL,
            trigger_id TEXT NOT NULL,
            stream_key TEXT NOT NULL,
            payload TEXT NOT NULL,
            message_id TEXT,
            position INTEGER NOT NULL,
            created_at TIMESTAMP WITH TIME ZONE NOT NULL,
            PRIMARY KEY (id)
        )""",
    ],
}
_OLD_INDEXES = [
    f"CREATE UNIQUE INDEX {OLD_INDEX} ON {TABLE_NAME} (trigger_id, message_id, position) "
    "WHERE message_id IS NOT NULL",
    f"CREATE INDEX {TABLE_NAME}_trigger ON {TABLE_NAME} (trigger_id, id)",
]


def _create_old_store(url: str, rows: Sequence[tuple[str, str, str | None, int]]) -> None:
    """The table and indexes exactly as the previous code created them, with ``rows``
    (trigger, stream key, message id, position)."""
    engine = sync_engine(url)
    try:
        with engine.begin() as conn:
            for ddl in _OLD_DDL["sqlite" if is_sqlite(url) else "postgresql"] + _OLD_INDEXES:
                conn.execute(text(ddl))
            for trigger, key, message_id, position in rows:
                conn.execute(
                    text(
                        f"INSERT INTO {TABLE_NAME} "
                        "(trigger_id, stream_key, payload, message_id, position, created_at) "
                        "VALUES (:t, :k, :payload, :m, :p, CURRENT_TIMESTAMP)"
                    ),
                    {
                        "t": trigger,
                        "k": key,
                        "payload": '{"old":true}',
                        "m": message_id,
                        "p": position,
                    },
                )
    finally:
        engine.dispose()


OLD_ROWS = [
    ("orders-watcher", KEY_A, "orders/0/42", 0),
    ("orders-watcher", KEY_A, "orders/0/42", 1),
    ("orders-watcher", KEY_A, None, 0),
    ("orders-watcher", KEY_A, None, 0),
    ("other-watcher", KEY_A, "orders/0/42", 0),
]


async def test_an_old_database_is_migrated_to_the_new_scope_on_open(db_url: str) -> None:
    _create_old_store(db_url, OLD_ROWS)
    assert _unique_indexes(db_url) == {OLD_INDEX: ["trigger_id", "message_id", "position"]}

    confirmed = Confirmed()
    async with EventStore(db_url, on_confirmed=confirmed) as store:
        assert _unique_indexes(db_url) == {NEW_INDEX: NEW_COLUMNS}
        assert _rows(db_url) == [(t, m, p, k) for t, k, m, p in OLD_ROWS]
        await store.put(rec(KEY_A), seq=1)  # a redelivery of an old message: same stream
        await store.put(rec(KEY_B), seq=2)  # the same id from another stream: new
        await store.put(rec(KEY_A, message_id=None), seq=3)  # never deduplicated
        await store.flush()
        assert sorted(confirmed.seqs) == [1, 2, 3]
        assert (store.stats.inserted, store.stats.duplicates) == (2, 1)
    assert _rows(db_url)[len(OLD_ROWS) :] == [
        ("orders-watcher", "orders/0/42", 0, KEY_B),
        ("orders-watcher", None, 0, KEY_A),
    ]

    # A second open finds nothing to migrate and changes nothing.
    async with EventStore(db_url) as store:
        assert await store.count() == len(OLD_ROWS) + 2
    assert _unique_indexes(db_url) == {NEW_INDEX: NEW_COLUMNS}


async def test_migration_digests_old_long_stream_keys_so_their_redeliveries_still_dedupe(
    db_url: str,
) -> None:
    # The previous code stored long keys verbatim; in the new index PostgreSQL could
    # not hold them next to a long trigger and message id, and a put now digests them.
    long_key = "".join(os.urandom(8).hex() for _ in range(400))
    trigger, message_id = "t" * 512, "m" * 1024
    _create_old_store(db_url, [(trigger, long_key, message_id, 0), ("w", KEY_A, "x", 0)])

    async with EventStore(db_url) as store:
        await store.put(rec(long_key, trigger=trigger, message_id=message_id))
        await store.put(rec(KEY_A, trigger="w", message_id="x"))
        await store.flush()
        assert (store.stats.inserted, store.stats.duplicates) == (0, 2)
        stored = await store.list_events()
        assert [e.stream_key.startswith("sha256:") for e in stored] == [True, False]
        assert [e.id for e in await store.list_events(stream_key=long_key)] == [stored[0].id]
    assert _unique_indexes(db_url) == {NEW_INDEX: NEW_COLUMNS}


async def test_several_stores_migrate_one_old_database_at_once(db_url: str) -> None:
    _create_old_store(db_url, OLD_ROWS)
    stores = [EventStore(db_url) for _ in range(4)]
    async with asyncio.timeout(SAFETY):
        await asyncio.gather(*(s.open() for s in stores))
    for s in stores:
        await s.put(rec(KEY_B))
    for s in stores:
        await s.close()
    assert _unique_indexes(db_url) == {NEW_INDEX: NEW_COLUMNS}
    assert len(_rows(db_url)) == len(OLD_ROWS) + 1


OPENER = r"""
import asyncio, sys
from acklane.core.events import EventRecord, EventStore

async def main(url, name):
    async with EventStore(url) as store:
        await store.put(EventRecord(name, "k", {}, "m", 0))
        await store.put(EventRecord("shared", name, {}, "m", 0))
    print("done", flush=True)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def test_several_processes_migrate_one_old_database_at_once(db_url: str) -> None:
    _create_old_store(db_url, OLD_ROWS)
    names = [f"p{n}" for n in range(4)]
    children = [
        subprocess.Popen(
            [sys.executable, "-c", OPENER, db_url, name],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in names
    ]
    for child in children:
        out, err = child.communicate(timeout=SAFETY * 3)
        assert child.returncode == 0, err
        assert out.splitlines()[-1] == "done"
    assert _unique_indexes(db_url) == {NEW_INDEX: NEW_COLUMNS}
    rows = _rows(db_url)
    assert len(rows) == len(OLD_ROWS) + 2 * len(names)
    # One message id, one trigger, four streams: four rows.
    assert sorted(k for t, _, _, k in rows if t == "shared") == names


@pytest.mark.parametrize("dropped", [True, False])
async def test_a_missing_new_index_is_created_on_open(db_url: str, dropped: bool) -> None:
    """A store opened on a database whose dedupe index is gone (dropped by hand, or a
    migration interrupted on SQLite, which runs DDL outside transactions) rebuilds it."""
    async with EventStore(db_url):
        pass
    engine = sync_engine(db_url)
    try:
        with engine.begin() as conn:
            conn.execute(text(f"DROP INDEX {NEW_INDEX}"))
            if not dropped:  # both indexes: stopped between creating the new and dropping the old
                conn.execute(text(_OLD_INDEXES[0]))
                conn.execute(
                    text(
                        f"CREATE UNIQUE INDEX {NEW_INDEX} ON {TABLE_NAME} "
                        "(trigger_id, message_id, position, stream_key, pipeline) "
                        "WHERE message_id IS NOT NULL"
                    )
                )
    finally:
        engine.dispose()
    async with EventStore(db_url) as store:
        assert _unique_indexes(db_url) == {NEW_INDEX: NEW_COLUMNS}
        await store.put(rec(KEY_A))
        await store.put(rec(KEY_A))
        await store.put(rec(KEY_B))
        await store.flush()
        assert await store.count() == 2
