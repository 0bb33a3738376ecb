"""Offloading: large values as files, a reference in the row; custom backends."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from stores_helpers import BackendFactory, FakeClock, asset_state, task_state

from acklane.core.sql import sync_engine
from acklane.core.stores import (
    AssetStore,
    FileOffloadBackend,
    JsonValue,
    MetastoreBackend,
    OffloadedValueMissingError,
    Scope,
    StateBackend,
    StateEntry,
    StateStoreSettings,
    StateWrite,
    TaskScope,
    TaskStore,
    open_backend,
)

SCOPE = TaskScope("d", "r", "t")
BIG = {"rows": ["x" * 100] * 20}  # about 2 kB of JSON


def _offloading(make_backend: BackendFactory, **settings: Any) -> FileOffloadBackend:
    settings.setdefault("offload_threshold_bytes", 1000)
    backend = make_backend(offload=True, **settings)
    assert isinstance(backend, FileOffloadBackend)
    return backend


def _files(backend: FileOffloadBackend) -> list[str]:
    return sorted(
        p.relative_to(backend.directory).as_posix() for p in backend.directory.rglob("*.json")
    )


def _rows(url: str) -> list[tuple[Any, ...]]:
    engine = sync_engine(url)
    try:
        with engine.connect() as conn:
            task = conn.execute(
                select(task_state.c.key, task_state.c.value, task_state.c.value_ref)
            )
            asset = conn.execute(
                select(asset_state.c.key, asset_state.c.value, asset_state.c.value_ref)
            )
            return [tuple(r) for r in task] + [tuple(r) for r in asset]
    finally:
        engine.dispose()


def test_a_large_value_goes_to_a_file_and_the_row_keeps_only_its_reference(
    make_backend: BackendFactory, db_url: str
) -> None:
    backend = _offloading(make_backend)
    store = TaskStore(SCOPE, backend=backend)
    store.set("big", BIG)
    store.set("small", [1])
    ref = backend.ref_for("big", SCOPE)
    assert sorted(_rows(db_url)) == [("big", None, ref), ("small", "[1]", None)]
    assert _files(backend) == [ref]
    assert store.get("big") == BIG
    entry = store.entry("big")
    assert entry is not None and entry.ref == ref


def test_offloading_lifts_max_value_bytes(make_backend: BackendFactory) -> None:
    backend = _offloading(make_backend, max_value_bytes=1000)
    store = AssetStore("orders", backend=backend)
    huge = "y" * 200_000
    store.set("huge", huge)
    assert store.get("huge") == huge


def test_references_are_deterministic_so_a_retry_overwrites_the_same_file(
    make_backend: BackendFactory,
) -> None:
    backend = _offloading(make_backend)
    first = TaskStore(SCOPE, backend=backend)
    first.set("big", BIG)
    retry = TaskStore(TaskScope("d", "r", "t"), backend=_offloading(make_backend))
    retry.set("big", {**BIG, "attempt": 2})
    assert _files(backend) == [backend.ref_for("big", SCOPE)]
    assert first.get("big") == {**BIG, "attempt": 2}
    assert backend.ref_for("big", SCOPE) != backend.ref_for("big", TaskScope("d", "r", "t", 0))


class _OrderCheckingBackend(FileOffloadBackend):
    """Records, at each purge, whether a row still references the value."""

    purges: list[tuple[str, bool]]

    def purge_ref(self, ref: str) -> None:
        referencing = select(task_state.c.id).where(task_state.c.value_ref == ref)
        referencing = referencing.union_all(
            select(asset_state.c.id).where(asset_state.c.value_ref == ref)
        )
        still = self._one(referencing, {})
        self.purges.append((ref, bool(still)))
        super().purge_ref(ref)


@pytest.fixture
def ordered(db_url: str, tmp_path: Path) -> Iterator[_OrderCheckingBackend]:
    clock = FakeClock()
    backend = _OrderCheckingBackend(
        db_url,
        StateStoreSettings(offload_threshold_bytes=1000),
        directory=tmp_path / "offload",
        clock=clock,
    )
    backend.purges = []
    yield backend
    backend.close()


def test_delete_removes_the_row_before_the_file(ordered: _OrderCheckingBackend) -> None:
    store = TaskStore(SCOPE, backend=ordered)
    store.set("big", BIG)
    store.delete("big")
    assert ordered.purges == [(ordered.ref_for("big", SCOPE), False)]
    assert _files(ordered) == []


def test_clear_removes_the_rows_before_the_files(ordered: _OrderCheckingBackend) -> None:
    store = AssetStore("orders", backend=ordered)
    store.set("a", BIG)
    store.set("b", BIG)
    store.set("small", 1)
    store.clear()
    assert sorted(ordered.purges) == sorted(
        [(ordered.ref_for(k, store.scope), False) for k in ("a", "b")]
    )
    assert _files(ordered) == []


def test_gc_removes_the_rows_before_the_files(ordered: _OrderCheckingBackend) -> None:
    clock = ordered._clock
    assert isinstance(clock, FakeClock)
    TaskStore(SCOPE, backend=ordered).set("big", BIG, retention=timedelta(seconds=1))
    clock.advance(1)
    report = ordered.gc()
    assert (report.task_keys, report.offloaded_values) == (1, 1)
    assert ordered.purges == [(ordered.ref_for("big", SCOPE), False)]
    assert _files(ordered) == []


async def test_async_delete_and_clear_remove_rows_before_files(
    ordered: _OrderCheckingBackend,
) -> None:
    store = TaskStore(SCOPE, backend=ordered)
    await store.aset("a", BIG)
    await store.aset("b", BIG)
    await store.adelete("a")
    await store.aclear()
    assert [still for _, still in ordered.purges] == [False, False]
    assert await store.aget("a") is None
    assert _files(ordered) == []
    await ordered.aclose()


def test_a_missing_offloaded_file_is_reported_with_key_and_ref(
    make_backend: BackendFactory,
) -> None:
    backend = _offloading(make_backend)
    store = TaskStore(SCOPE, backend=backend)
    store.set("big", BIG)
    (backend.directory / backend.ref_for("big", SCOPE)).unlink()
    with pytest.raises(OffloadedValueMissingError, match="state key 'big': offloaded value"):
        store.get("big")


def test_a_refused_write_to_a_deactivated_asset_leaves_no_file(
    make_backend: BackendFactory,
) -> None:
    backend = _offloading(make_backend)
    backend.deactivate_asset("orders")
    with pytest.raises(Exception, match="deactivated"):
        AssetStore("orders", backend=backend).set("big", BIG)
    assert _files(backend) == []


def test_gc_sweeps_orphan_files_older_than_the_grace_period(
    make_backend: BackendFactory,
) -> None:
    clock = FakeClock(now=2_000_000_000.0)
    backend = _offloading(make_backend, clock=clock, orphan_grace_seconds=3600)
    store = TaskStore(SCOPE, backend=backend)
    store.set("kept", BIG)
    orphan_old = backend.directory / "task" / "x" / ("0" * 40 + ".json")
    orphan_new = backend.directory / "task" / "x" / ("1" * 40 + ".json")
    orphan_old.parent.mkdir(parents=True)
    for path, age in ((orphan_old, 7200), (orphan_new, 60)):
        path.write_text("{}")
        os.utime(path, (clock.now - age, clock.now - age))
    kept = backend.directory / backend.ref_for("kept", SCOPE)
    os.utime(kept, (clock.now - 7200, clock.now - 7200))

    assert backend.gc(dry_run=True).orphan_files == 1
    assert orphan_old.exists()
    assert backend.gc().orphan_files == 1
    assert (orphan_old.exists(), orphan_new.exists(), kept.exists()) == (False, True, True)
    assert store.get("kept") == BIG


def test_a_reference_outside_the_directory_is_refused(make_backend: BackendFactory) -> None:
    backend = _offloading(make_backend)
    with pytest.raises(ValueError, match="outside"):
        backend.deserialize_from_ref("../../etc/passwd.json")


def test_open_backend_picks_the_file_offload_backend_when_offload_dir_is_set(
    db_url: str, tmp_path: Path
) -> None:
    with open_backend(db_url, StateStoreSettings(offload_dir=str(tmp_path))) as backend:
        assert isinstance(backend, FileOffloadBackend)
    with open_backend(db_url) as backend:
        assert type(backend) is MetastoreBackend


class DictBackend(StateBackend):
    """A custom backend in a few lines: process memory, sync methods only."""

    def __init__(self, url: str = "", settings: StateStoreSettings | None = None) -> None:
        super().__init__(settings)
        self.rows: dict[tuple[Scope, str], StateEntry] = {}
        self.lock = threading.Lock()

    def get(self, scope: Scope, key: str) -> StateEntry | None:
        entry = self.rows.get((scope, key))
        if entry is None or (entry.expires_at is not None and entry.expires_at <= self.now()):
            return None
        return entry

    def set(self, scope: Scope, write: StateWrite) -> None:
        value: JsonValue = write.encoded.value
        with self.lock:
            self.rows[(scope, write.key)] = StateEntry(
                write.key, value, self.now(), write.expires_at, write.writer
            )

    def delete(self, scope: Scope, key: str) -> bool:
        return self.rows.pop((scope, key), None) is not None

    def clear(self, scope: Scope) -> int:
        doomed = [k for k in self.rows if k[0] == scope]
        for k in doomed:
            del self.rows[k]
        return len(doomed)

    def keys(self, scope: Scope) -> list[str]:
        return sorted(k for (s, k) in self.rows if s == scope and self.get(s, k) is not None)

    def entries(self, scope: Scope) -> list[StateEntry]:
        return [e for k in self.keys(scope) if (e := self.get(scope, k)) is not None]

    def gc(self, *, dry_run: bool = False) -> Any:
        raise NotImplementedError

    def deactivate_asset(self, asset: str) -> None:
        raise NotImplementedError

    def activate_asset(self, asset: str) -> None:
        raise NotImplementedError


def test_a_custom_backend_named_in_the_settings_is_used(tmp_path: Path) -> None:
    settings = StateStoreSettings(backend=f"{__name__}:DictBackend")
    backend = open_backend("sqlite://", settings)
    assert isinstance(backend, DictBackend)
    store = TaskStore(SCOPE, backend=backend)
    store.set("k", {"v": 1})
    assert store.get("k") == {"v": 1}


async def test_a_custom_backend_gets_async_twins_for_free() -> None:
    store = AssetStore("orders", backend=DictBackend())
    await store.aset("k", 1)
    assert await store.aget("k") == 1
    assert await store.akeys() == ["k"]


@pytest.mark.parametrize(
    ("path", "fragment"),
    [
        ("no_colon", "expected an import path 'module:Class'"),
        ("acklane.nope:Thing", "cannot be imported"),
        ("acklane.core.stores:TaskStore", "is not a StateBackend subclass"),
    ],
)
def test_a_bad_custom_backend_path_is_refused(path: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        open_backend("sqlite://", StateStoreSettings(backend=path))
