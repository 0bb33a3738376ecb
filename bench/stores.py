"""Task-store throughput: set and get on SQLite and PostgreSQL, 1 and 4 processes.

    uv run python bench/stores.py [--ops 400] [--pg-url postgresql://...] [--no-pg]

For each database it measures, in the same run, ``TaskStore.set``/``get``
(sync) and ``aset``/``aget`` (async, one process) against a baseline: the same
single-statement upsert and select sent with the bare driver (sqlite3,
psycopg) into the same table, in autocommit. The ratio is acklane's rate over
the baseline's. Writes are durable in both (SQLite WAL with synchronous=FULL,
PostgreSQL's default synchronous_commit), so set rates are bound by fsync.
Several processes write different task instances at once, each with its own
connection; PostgreSQL runs in a schema of its own, dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from acklane.core.stores import JsonValue, MetastoreBackend, TaskScope, TaskStore

DEFAULT_PG = os.environ.get("ACKLANE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
VALUE: JsonValue = {"job_id": "j-0123456789", "state": "running", "polls": 3, "rows": [1, 2, 3]}

_UPSERT = (
    "INSERT INTO acklane_task_state "
    "(dag_id, run_id, task_id, map_index, key, value, value_ref, updated_at, expires_at) "
    "VALUES ({p}, {p}, {p}, {p}, {p}, {p}, NULL, {p}, {p}) "
    "ON CONFLICT (dag_id, run_id, task_id, map_index, key) DO UPDATE SET "
    "value = excluded.value, value_ref = excluded.value_ref, "
    "updated_at = excluded.updated_at, expires_at = excluded.expires_at"
)
_SELECT = (
    "SELECT key, value, value_ref, updated_at, expires_at FROM acklane_task_state "
    "WHERE dag_id = {p} AND run_id = {p} AND task_id = {p} AND map_index = {p} AND key = {p} "
    "AND (expires_at IS NULL OR expires_at > {p})"
)


@dataclass(frozen=True)
class Target:
    name: str
    url: str  # SQLAlchemy URL for acklane
    raw: str  # what the bare driver connects to (a path, or a libpq URL)
    schema: str | None = None


# -- one process's share of the work ------------------------------------------------------


def _raw_sqlite(path: str) -> tuple[Callable[..., Any], str]:
    conn = sqlite3.connect(path, isolation_level=None, timeout=30)
    for pragma in ("journal_mode=WAL", "synchronous=FULL", "busy_timeout=30000"):
        conn.execute(f"PRAGMA {pragma}")
    return conn.execute, "?"


def _raw_pg(url: str, schema: str | None) -> tuple[Callable[..., Any], str]:
    import psycopg

    conn = psycopg.connect(url, autocommit=True)
    if schema:
        conn.execute(f'SET search_path TO "{schema}"')
    return conn.execute, "%s"


def _run_raw(target: Target, op: str, run_id: str, ops: int, barrier: Any) -> tuple[float, float]:
    if target.name == "sqlite":
        execute, p = _raw_sqlite(target.raw)
    else:
        execute, p = _raw_pg(target.raw, target.schema)
    upsert, query = _UPSERT.format(p=p), _SELECT.format(p=p)
    text = '{"job_id":"j-0123456789","state":"running","polls":3,"rows":[1,2,3]}'

    def write(i: int) -> None:
        now = time.time()
        execute(upsert, ("bench", run_id, "raw", -1, f"k{i}", text, now, now + 86400))

    def read(i: int) -> None:
        execute(query, ("bench", run_id, "raw", -1, f"k{i}", time.time())).fetchall()

    if op == "get":
        for i in range(ops):
            write(i)
    barrier.wait()
    start = time.perf_counter()
    for i in range(ops):
        (write if op == "set" else read)(i)
    return start, time.perf_counter()


def _run_acklane(
    target: Target, op: str, run_id: str, ops: int, barrier: Any
) -> tuple[float, float]:
    with MetastoreBackend(target.url) as backend:
        store = TaskStore(TaskScope("bench", run_id, "acklane"), backend=backend)
        store.set("warm", 1)
        if op == "get":
            for i in range(ops):
                store.set(f"k{i}", VALUE)
        barrier.wait()
        start = time.perf_counter()
        if op == "set":
            for i in range(ops):
                store.set(f"k{i}", VALUE)
        else:
            for i in range(ops):
                store.get(f"k{i}")
        return start, time.perf_counter()


def _run_acklane_async(
    target: Target, op: str, run_id: str, ops: int, barrier: Any
) -> tuple[float, float]:
    async def go() -> tuple[float, float]:
        backend = MetastoreBackend(target.url)
        try:
            store = TaskStore(TaskScope("bench", run_id, "async"), backend=backend)
            await store.aset("warm", 1)
            if op == "get":
                for i in range(ops):
                    await store.aset(f"k{i}", VALUE)
            barrier.wait()
            start = time.perf_counter()
            if op == "set":
                for i in range(ops):
                    await store.aset(f"k{i}", VALUE)
            else:
                for i in range(ops):
                    await store.aget(f"k{i}")
            return start, time.perf_counter()
        finally:
            await backend.aclose()

    return asyncio.run(go())


RUNNERS = {"acklane": _run_acklane, "acklane-async": _run_acklane_async, "baseline": _run_raw}


def _child(
    kind: str, target: Target, op: str, run_id: str, ops: int, barrier: Any, out: Any
) -> None:
    out.put(RUNNERS[kind](target, op, run_id, ops, barrier))


def measure(kind: str, target: Target, op: str, processes: int, ops: int) -> float:
    """Operations per second over all processes, from the common start to the last finish."""
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(processes)
    out = context.Queue()
    tag = uuid.uuid4().hex[:8]
    children = [
        context.Process(
            target=_child, args=(kind, target, op, f"{kind}-{tag}-{n}", ops, barrier, out)
        )
        for n in range(processes)
    ]
    for child in children:
        child.start()
    spans: list[tuple[float, float]] = [out.get(timeout=600) for _ in children]
    for child in children:
        child.join()
        if child.exitcode != 0:
            raise RuntimeError(f"{kind} {op} worker failed with status {child.exitcode}")
    wall = max(end for _, end in spans) - min(start for start, _ in spans)
    return processes * ops / wall


# -- targets ------------------------------------------------------------------------------


def _pg_target(base: str) -> tuple[Target, Callable[[], None]] | str:
    try:
        import psycopg

        with psycopg.connect(base, autocommit=True, connect_timeout=5) as conn:
            schema = f"bench_{uuid.uuid4().hex[:12]}"
            conn.execute(f'CREATE SCHEMA "{schema}"')
    except Exception as exc:
        return f"PostgreSQL at {base} is unreachable: {exc}"
    sep = "&" if "?" in base else "?"
    url = f"{base}{sep}options={quote(f'-csearch_path={schema}', safe='')}"

    def drop() -> None:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

    return Target("postgresql", url, base, schema), drop


def bench(target: Target, ops: int, repeat: int, rows: list[tuple[str, ...]]) -> None:
    with MetastoreBackend(target.url) as backend:  # creates the tables
        backend.keys(TaskScope("bench", "setup", "setup"))
    for op in ("set", "get"):
        for api, processes in (("sync", 1), ("sync", 4), ("async", 1)):
            kind = "acklane" if api == "sync" else "acklane-async"
            # Alternate the two so that a burst of disk or CPU contention from
            # elsewhere hits both; keep each one's best round.
            base = ours = 0.0
            for _ in range(repeat):
                base = max(base, measure("baseline", target, op, processes, ops))
                ours = max(ours, measure(kind, target, op, processes, ops))
            name = op if api == "sync" else f"a{op}"
            rows.append(
                (
                    target.name,
                    name,
                    str(processes),
                    f"{ours:,.0f}",
                    f"{base:,.0f}",
                    f"{ours / base:.2f}",
                )
            )
            print(
                f"  {target.name} {name} x{processes}: acklane {ours:,.0f}/s, "
                f"baseline {base:,.0f}/s",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=300, help="operations per process")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; the best is kept")
    parser.add_argument("--pg-url", default=DEFAULT_PG)
    parser.add_argument("--no-pg", action="store_true")
    args = parser.parse_args()

    rows: list[tuple[str, ...]] = []
    print(
        f"task store throughput: {args.ops} operations per process, best of {args.repeat}, "
        f"{os.cpu_count()} CPUs"
    )
    with tempfile.TemporaryDirectory(prefix="acklane-bench-") as tmp:
        path = Path(tmp) / "state.db"
        bench(Target("sqlite", f"sqlite:///{path}", str(path)), args.ops, args.repeat, rows)
    if not args.no_pg:
        pg = _pg_target(args.pg_url)
        if isinstance(pg, str):
            print(f"skipping PostgreSQL: {pg}")
        else:
            target, drop = pg
            try:
                bench(target, args.ops, args.repeat, rows)
            finally:
                drop()

    header = ("database", "op", "procs", "acklane ops/s", "baseline ops/s", "ratio")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    print()
    for row in [header, *rows]:
        print("  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)))
    print("\nbaseline = the same statement through the bare driver (sqlite3 / psycopg), autocommit")


if __name__ == "__main__":
    main()
