"""The task store: one task instance's keys, shared by its retries (SQLite and PostgreSQL)."""

from __future__ import annotations

import pytest
from stores_helpers import BackendFactory, duplicate_keys, row_counts

from acklane.core.stores import JsonValue, StateWrite, TaskScope, TaskStore, encode_value

SCOPE = TaskScope("export", "2026-11-29", "submit")


def test_set_then_get_returns_the_same_json_value(make_backend: BackendFactory) -> None:
    value: JsonValue = {"job": "j-1", "n": 10**20, "ok": True, "tags": ["é", None], "m": {}}
    store = TaskStore(SCOPE, backend=make_backend())
    store.set("job", value)
    assert store.get("job") == value


def test_get_of_a_missing_key_returns_the_default(make_backend: BackendFactory) -> None:
    store = TaskStore(SCOPE, backend=make_backend())
    assert store.get("missing") is None
    assert store.get("missing", 0) == 0


def test_set_replaces_the_value_in_one_row(make_backend: BackendFactory, db_url: str) -> None:
    store = TaskStore(SCOPE, backend=make_backend())
    store.set("cursor", 1)
    store.set("cursor", {"page": 2})
    assert store.get("cursor") == {"page": 2}
    assert row_counts(db_url)["task"] == 1
    assert duplicate_keys(db_url) == []


def test_a_retry_in_another_process_sees_the_keys_of_earlier_attempts(
    make_backend: BackendFactory,
) -> None:
    TaskStore(SCOPE, backend=make_backend()).set("job_id", "j-42")
    retry = TaskStore(TaskScope("export", "2026-11-29", "submit"), backend=make_backend())
    assert retry.get("job_id") == "j-42"


@pytest.mark.parametrize(
    "other",
    [
        TaskScope("other-dag", "2026-11-29", "submit"),
        TaskScope("export", "other-run", "submit"),
        TaskScope("export", "2026-11-29", "other-task"),
        TaskScope("export", "2026-11-29", "submit", map_index=0),
    ],
    ids=["dag", "run", "task", "map_index"],
)
def test_each_part_of_the_scope_separates_keys(
    make_backend: BackendFactory, other: TaskScope
) -> None:
    backend = make_backend()
    TaskStore(SCOPE, backend=backend).set("k", "mine")
    neighbour = TaskStore(other, backend=backend)
    assert neighbour.get("k") is None
    neighbour.set("k", "theirs")
    assert TaskStore(SCOPE, backend=backend).get("k") == "mine"


def test_clear_removes_only_this_map_index(make_backend: BackendFactory) -> None:
    backend = make_backend()
    mapped = [TaskStore(TaskScope("d", "r", "t", map_index=i), backend=backend) for i in range(3)]
    for i, store in enumerate(mapped):
        store.set("a", i)
        store.set("b", i)
    mapped[1].clear()
    assert [store.keys() for store in mapped] == [["a", "b"], [], ["a", "b"]]


def test_delete_removes_a_key_and_a_missing_key_is_a_no_op(make_backend: BackendFactory) -> None:
    store = TaskStore(SCOPE, backend=make_backend())
    store.set("a", 1)
    store.set("b", 2)
    store.delete("a")
    store.delete("never-written")
    assert store.keys() == ["b"]


def test_keys_lists_the_live_keys_sorted(make_backend: BackendFactory) -> None:
    store = TaskStore(SCOPE, backend=make_backend())
    for key in ("b", "a", "c"):
        store.set(key, key)
    assert store.keys() == ["a", "b", "c"]


def test_entry_tells_when_a_key_was_written_and_when_it_expires(
    make_backend: BackendFactory,
) -> None:
    backend = make_backend(default_retention_days=1)
    store = TaskStore(SCOPE, backend=backend)
    store.set("k", [1])
    entry = store.entry("k")
    assert entry is not None
    assert (entry.value, entry.updated_at, entry.expires_at) == (
        [1],
        backend.now(),
        backend.now() + 86400,
    )


async def test_async_twins_do_what_the_sync_methods_do(amake_backend: BackendFactory) -> None:
    store = TaskStore(SCOPE, backend=amake_backend())
    await store.aset("a", {"x": 1})
    await store.aset("b", [2])
    assert await store.aget("a") == {"x": 1}
    assert await store.aget("missing", "dflt") == "dflt"
    assert await store.akeys() == ["a", "b"]
    assert [e.key for e in await store.aentries()] == ["a", "b"]
    await store.adelete("a")
    assert await store.akeys() == ["b"]
    await store.aclear()
    assert await store.akeys() == []


async def test_sync_and_async_writers_share_one_store(amake_backend: BackendFactory) -> None:
    store = TaskStore(SCOPE, backend=amake_backend())
    store.set("sync", 1)
    await store.aset("async", 2)
    assert await store.aget("sync") == 1
    assert store.get("async") == 2


def test_default_thread_twins_of_the_backend_interface_work(make_backend: BackendFactory) -> None:
    # StateBackend's own a* methods run the sync ones in threads (what a custom backend inherits).
    import asyncio

    from acklane.core.stores import StateBackend

    backend = make_backend()
    write = StateWrite("k", encode_value("k", 1, max_bytes=None))

    async def go() -> list[str]:
        await StateBackend.aset(backend, SCOPE, write)
        return await StateBackend.akeys(backend, SCOPE)

    assert asyncio.run(go()) == ["k"]


@pytest.mark.parametrize(
    ("text", "scope"),
    [
        ("d/r/t", TaskScope("d", "r", "t")),
        ("d/r/t/3", TaskScope("d", "r", "t", 3)),
    ],
)
def test_task_scope_parses_from_dag_run_task_and_map(text: str, scope: TaskScope) -> None:
    assert TaskScope.parse(text) == scope
    assert str(scope) == text


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("", "r", "t"), "dag_id must not be empty"),
        (("d", "r", "t", -2), "map_index must be -1"),
        (("d", "r" * 251, "t"), "at most 250"),
    ],
)
def test_task_scope_refuses_bad_ids(args: tuple[object, ...], fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        TaskScope(*args)  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["d/r", "d/r/t/x", "a/b/c/d/e"])
def test_task_scope_parse_refuses_other_shapes(text: str) -> None:
    with pytest.raises(ValueError, match="task scope"):
        TaskScope.parse(text)


async def test_a_backend_can_share_the_engines_of_the_event_store(db_url: str) -> None:
    from acklane.core.sql import async_engine, sync_engine
    from acklane.core.stores import MetastoreBackend

    engine, aengine = sync_engine(db_url), async_engine(db_url)
    try:
        backend = MetastoreBackend(db_url, engine=engine, aengine=aengine)
        store = TaskStore(SCOPE, backend=backend)
        store.set("sync", 1)
        await store.aset("async", 2)
        assert await store.akeys() == ["async", "sync"]
        assert store.get("async") == 2
        await backend.aclose()
        with engine.connect() as conn:  # still open: the backend did not own it
            assert conn.exec_driver_sql("SELECT 1").scalar_one() == 1
        async with aengine.connect() as aconn:
            assert (await aconn.exec_driver_sql("SELECT 1")).scalar_one() == 1
    finally:
        engine.dispose()
        await aengine.dispose()


def test_an_in_memory_sqlite_database_is_refused() -> None:
    from acklane.core.stores import MetastoreBackend

    with pytest.raises(ValueError, match="in-memory SQLite database dies with the process"):
        MetastoreBackend("sqlite://")


def test_accessors_without_a_backend_use_the_process_default(
    make_backend: BackendFactory,
) -> None:
    from acklane.core.sql import DEFAULT_URL
    from acklane.core.stores import MetastoreBackend, default_backend, set_default_backend

    set_default_backend(None)
    try:
        fallback = default_backend()
        assert isinstance(fallback, MetastoreBackend) and fallback.url == DEFAULT_URL
        chosen = make_backend()
        set_default_backend(chosen)
        TaskStore(SCOPE).set("k", 1)
        assert TaskStore(SCOPE, backend=chosen).get("k") == 1
    finally:
        set_default_backend(None)
