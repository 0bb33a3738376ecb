"""Shared pieces of the state-store tests: a settable clock, backend factories, row counts.

The fixtures built on these (``make_backend``, ``amake_backend``) are core/tests'
conftest's; the database URL is the workspace conftest's ``db_url`` (SQLite and
PostgreSQL). The state tables are read by the names docs/state-stores.md gives them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import column, func, select, table

from acklane.core.sql import sync_engine
from acklane.core.stores import (
    FileOffloadBackend,
    MetastoreBackend,
    StateStoreSettings,
)

START = 1_800_000_000.0

#: The state tables by their documented names (docs/state-stores.md), with the columns
#: these tests read: a test sees the schema a database administrator sees.
task_state = table(
    "acklane_task_state",
    *(column(c) for c in ("id", "dag_id", "run_id", "task_id", "map_index", "key")),
    *(column(c) for c in ("value", "value_ref")),
)
asset_state = table(
    "acklane_asset_state", *(column(c) for c in ("id", "asset", "key", "value", "value_ref"))
)


class FakeClock:
    """Time that moves only when a test says so."""

    def __init__(self, now: float = START) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


BackendFactory = Callable[..., MetastoreBackend]


def backend_factory(url: str, made: list[MetastoreBackend], tmp_path: Any) -> BackendFactory:
    """Build backends on ``url``, each kept in ``made`` (conftest's ``make_backend``)."""

    def make(
        settings: StateStoreSettings | None = None,
        *,
        clock: FakeClock | None = None,
        offload: bool = False,
        **overrides: Any,
    ) -> MetastoreBackend:
        if overrides:
            settings = (settings or StateStoreSettings()).model_copy(update=overrides)
        backend: MetastoreBackend
        if offload:
            backend = FileOffloadBackend(
                url, settings, directory=tmp_path / "offload", clock=clock or FakeClock()
            )
        else:
            backend = MetastoreBackend(url, settings, clock=clock or FakeClock())
        made.append(backend)
        return backend

    return make


def row_counts(url: str) -> dict[str, int]:
    """Rows in the state tables, expired and invisible ones included."""
    engine = sync_engine(url)
    try:
        with engine.connect() as conn:
            return {
                "task": conn.execute(select(func.count()).select_from(task_state)).scalar_one(),
                "asset": conn.execute(select(func.count()).select_from(asset_state)).scalar_one(),
            }
    finally:
        engine.dispose()


def duplicate_keys(url: str) -> list[tuple[Any, ...]]:
    """Natural keys that appear in more than one row (must always be empty)."""
    engine = sync_engine(url)
    t, a = task_state.c, asset_state.c
    try:
        with engine.connect() as conn:
            task_dups = conn.execute(
                select(t.dag_id, t.run_id, t.task_id, t.map_index, t.key)
                .group_by(t.dag_id, t.run_id, t.task_id, t.map_index, t.key)
                .having(func.count() > 1)
            ).all()
            asset_dups = conn.execute(
                select(a.asset, a.key).group_by(a.asset, a.key).having(func.count() > 1)
            ).all()
            return [tuple(r) for r in task_dups] + [tuple(r) for r in asset_dups]
    finally:
        engine.dispose()


def concurrent_writer(url: str, worker: int, keys: int, rounds: int, start: Any) -> None:
    """Body of one writer process: its own keys in both stores, and one key all share.

    Runs in a child process; the database (tables included) is first touched
    only after ``start`` is set, so the processes also race to create the schema.
    """
    from acklane.core.stores import AssetStore, TaskScope, TaskStore

    backend = MetastoreBackend(url)
    task = TaskStore(TaskScope("d", "r", "t"), backend=backend)
    asset = AssetStore("shared-asset", backend=backend, writer="watcher")
    start.wait()
    try:
        for round_ in range(rounds):
            for i in range(keys):
                value = {"worker": worker, "round": round_, "i": i}
                task.set(f"w{worker}-k{i}", value)
                asset.set(f"w{worker}-k{i}", value)
            task.set("shared", {"worker": worker, "round": round_})
            asset.set("shared", {"worker": worker, "round": round_})
    finally:
        backend.close()
