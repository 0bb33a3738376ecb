"""Event store throughput and confirmation latency, against bare-driver baselines.

    uv run python bench/event_store.py [--events 200000] [--batch 2000] [--pg-url URL]

For each backend (SQLite in a temporary directory; PostgreSQL in a throw-away
schema when the server answers) it measures, in the same run:

- store: a producer coroutine awaits ``put()`` for every record (pre-built
  ``EventRecord``s with a small dict payload, each with a distinct message id),
  then ``flush()``; the writer group-commits as it goes. Figure: records
  persisted and confirmed per second, from the first put to the end of flush.
- baseline: the same rows written by the bare driver (sqlite3 / psycopg), one
  ``executemany`` of the same one-row INSERT ... ON CONFLICT DO NOTHING plus a
  COMMIT per batch of the same size, into the same table with the same
  durability settings (SQLite WAL + synchronous=FULL). Two figures: with the
  payloads already serialized (database work only), and with ``json.dumps`` of
  each payload (the least work any store has to do per record).
- latency: one put then flush, repeated: the time from a trigger event to its
  confirmation when nothing else is queued (includes the commit_interval linger
  being cut short by flush).

Targets: >= 50,000 events/s through SQLite, >= 20,000 events/s through PostgreSQL.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from acklane.core.events import EventRecord, EventStore, metadata
from acklane.core.sql import sync_engine

TARGETS = {"sqlite": 50_000, "postgresql": 20_000}
COLUMNS = "trigger_id, stream_key, payload, message_id, position, created_at"


def make_records(count: int) -> list[EventRecord]:
    return [
        EventRecord(
            trigger_id=f"watcher-{i % 4}",
            stream_key="('kafka', 'broker:9092', 'orders')",
            payload={
                "topic": "orders",
                "partition": i % 8,
                "offset": i,
                "value": {"order_id": i, "amount": 12.5, "currency": "EUR", "ok": True},
            },
            message_id=f"orders/{i % 8}/{i}",
            position=0,
        )
        for i in range(count)
    ]


async def run_store(url: str, records: Sequence[EventRecord], batch: int) -> dict[str, Any]:
    confirmed = 0

    def on_confirmed(seqs: Sequence[int]) -> None:
        nonlocal confirmed
        confirmed += len(seqs)

    async with EventStore(url, on_confirmed=on_confirmed, max_batch=batch) as store:
        start = time.perf_counter()
        for seq, record in enumerate(records):
            await store.put(record, seq)
        await store.flush()
        elapsed = time.perf_counter() - start
        stats = dataclasses.replace(store.stats)  # before the latency runs add theirs
        assert confirmed == len(records), (confirmed, len(records))
        assert await store.count() == len(records)
        # Latency of one event alone, after the bulk run.
        latencies = []
        for i in range(200):
            record = EventRecord("latency", "k", {"i": i}, f"latency/{i}", 0)
            t0 = time.perf_counter()
            await store.put(record, i)
            await store.flush()
            latencies.append(time.perf_counter() - t0)
    return {
        "rate": len(records) / elapsed,
        "seconds": elapsed,
        "batches": stats.batches,
        "mean_batch": stats.events / max(stats.batches, 1),
        "latency_p50_ms": statistics.median(latencies) * 1000,
        "latency_p99_ms": sorted(latencies)[int(len(latencies) * 0.99) - 1] * 1000,
    }


def _rows(records: Sequence[EventRecord], serialized: bool) -> list[tuple[Any, ...]]:
    return [
        (
            r.trigger_id,
            r.stream_key,
            r.payload if not serialized else json.dumps(r.payload, separators=(",", ":")),
            r.message_id,
            r.position,
        )
        for r in records
    ]


def create_table(url: str) -> None:
    engine = sync_engine(url)
    metadata.create_all(engine)
    engine.dispose()


def sqlite_baseline(path: Path, records: Sequence[EventRecord], batch: int, dumps: bool) -> float:
    url = f"sqlite:///{path}"
    create_table(url)
    rows = _rows(records, serialized=not dumps)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    sql = f"INSERT INTO acklane_trigger_events ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?) "
    sql += "ON CONFLICT DO NOTHING"
    start = time.perf_counter()
    for first in range(0, len(rows), batch):
        stamp = time.strftime("%Y-%m-%d %H:%M:%S.000000", time.gmtime())
        chunk = rows[first : first + batch]
        if dumps:
            chunk = [(a, b, json.dumps(p, separators=(",", ":")), m, q) for a, b, p, m, q in chunk]
        conn.execute("BEGIN")
        conn.executemany(sql, [(*row, stamp) for row in chunk])
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - start
    conn.close()
    return len(rows) / elapsed


def pg_baseline(url: str, records: Sequence[EventRecord], batch: int, dumps: bool) -> float:
    import datetime

    import psycopg

    create_table(url)
    rows = _rows(records, serialized=not dumps)
    sql = f"INSERT INTO acklane_trigger_events ({COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s) "
    sql += "ON CONFLICT DO NOTHING"
    conninfo = url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(conninfo) as conn:
        start = time.perf_counter()
        for first in range(0, len(rows), batch):
            stamp = datetime.datetime.now(datetime.UTC)
            chunk = rows[first : first + batch]
            if dumps:
                chunk = [
                    (a, b, json.dumps(p, separators=(",", ":")), m, q) for a, b, p, m, q in chunk
                ]
            with conn.cursor() as cur:
                cur.executemany(sql, [(*row, stamp) for row in chunk])
            conn.commit()
        elapsed = time.perf_counter() - start
    return len(rows) / elapsed


def pg_schema_url(base: str) -> tuple[str, str] | None:
    """A URL on a fresh schema of ``base``, or None when the server does not answer."""
    try:
        import psycopg

        schema = f"bench_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(base, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')
    except Exception as exc:
        print(f"postgresql: skipped ({exc})")
        return None
    sep = "&" if "?" in base else "?"
    return f"{base}{sep}options=-csearch_path%3D{schema}", schema


def pg_drop(base: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def report(backend: str, store: dict[str, Any], bare: float, bare_dumps: float) -> bool:
    target = TARGETS[backend]
    ok = bool(store["rate"] >= target)
    print(f"{backend}:")
    print(
        f"  store          {store['rate']:>10,.0f} events/s  ({store['seconds']:.2f} s, "
        f"{store['batches']} commits, mean batch {store['mean_batch']:.0f})  "
        f"target {target:,}/s: {'met' if ok else 'MISSED'}"
    )
    print(
        f"  bare driver    {bare:>10,.0f} rows/s    (pre-serialized)   "
        f"store/bare = {store['rate'] / bare:.2f}"
    )
    print(
        f"  bare + dumps   {bare_dumps:>10,.0f} rows/s    (json.dumps each) "
        f"store/bare = {store['rate'] / bare_dumps:.2f}"
    )
    print(
        f"  confirm latency, one event alone: p50 {store['latency_p50_ms']:.2f} ms, "
        f"p99 {store['latency_p99_ms']:.2f} ms"
    )
    return ok


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=2000, help="max_batch and baseline batch")
    parser.add_argument("--pg-url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--no-pg", action="store_true", help="SQLite only")
    args = parser.parse_args(argv)

    records = make_records(args.events)
    print(
        f"{args.events:,} events, batches of {args.batch}, "
        f"python {sys.version.split()[0]}, sqlite {sqlite3.sqlite_version}"
    )
    all_ok = True
    with tempfile.TemporaryDirectory(prefix="acklane-bench-") as tmp:
        store = asyncio.run(run_store(f"sqlite:///{tmp}/store.db", records, args.batch))
        bare = sqlite_baseline(Path(tmp, "bare.db"), records, args.batch, dumps=False)
        bare_dumps = sqlite_baseline(Path(tmp, "bare-dumps.db"), records, args.batch, dumps=True)
        all_ok &= report("sqlite", store, bare, bare_dumps)

    if not args.no_pg:
        for_pg = [pg_schema_url(args.pg_url) for _ in range(3)]
        if all(for_pg):
            try:
                (store_url, _), (bare_url, _), (dumps_url, _) = for_pg  # type: ignore[misc]
                store = asyncio.run(run_store(store_url, records, args.batch))
                bare = pg_baseline(bare_url, records, args.batch, dumps=False)
                bare_dumps = pg_baseline(dumps_url, records, args.batch, dumps=True)
                all_ok &= report("postgresql", store, bare, bare_dumps)
            finally:
                for item in for_pg:
                    if item:
                        pg_drop(args.pg_url, item[1])
    return 0 if all_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
