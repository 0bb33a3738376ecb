"""Several processes writing at once: no lost update, no duplicate row (SQLite, PostgreSQL)."""

from __future__ import annotations

import multiprocessing

from stores_helpers import concurrent_writer, duplicate_keys, row_counts

from acklane.core.stores import AssetStore, MetastoreBackend, TaskScope, TaskStore

WORKERS = 4
KEYS = 20
ROUNDS = 4


def test_concurrent_writers_in_several_processes_lose_nothing_and_duplicate_nothing(
    db_url: str,
) -> None:
    # fork: the children start with the modules already imported (spawn would spend
    # seconds importing in each); they open their own engines after the fork.
    context = multiprocessing.get_context("fork")
    start = context.Event()
    processes = [
        context.Process(target=concurrent_writer, args=(db_url, w, KEYS, ROUNDS, start))
        for w in range(WORKERS)
    ]
    for process in processes:
        process.start()
    start.set()
    for process in processes:
        process.join(timeout=90)
    assert [p.exitcode for p in processes] == [0] * WORKERS

    assert duplicate_keys(db_url) == []
    assert row_counts(db_url) == {"task": WORKERS * KEYS + 1, "asset": WORKERS * KEYS + 1}
    with MetastoreBackend(db_url) as backend:
        task = TaskStore(TaskScope("d", "r", "t"), backend=backend)
        asset = AssetStore("shared-asset", backend=backend)
        last = ROUNDS - 1
        for store in (task, asset):
            for w in range(WORKERS):
                for i in range(KEYS):
                    assert store.get(f"w{w}-k{i}") == {"worker": w, "round": last, "i": i}
            shared = store.get("shared")
            assert isinstance(shared, dict)
            assert shared["round"] == last and shared["worker"] in range(WORKERS)
