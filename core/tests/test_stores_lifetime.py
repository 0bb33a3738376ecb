"""Lifetime: expiry, clear on success, garbage collection in batches and on an interval."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

import pytest
from pydantic import ValidationError
from stores_helpers import BackendFactory, FakeClock, row_counts

from acklane.core.stores import (
    NEVER_EXPIRE,
    AssetStore,
    GcReport,
    StateStoreSettings,
    TaskScope,
    TaskStore,
)

SCOPE = TaskScope("d", "r", "t")
DAY = 86400.0


def test_an_expired_key_is_invisible_without_gc(make_backend: BackendFactory, db_url: str) -> None:
    clock = FakeClock()
    store = TaskStore(SCOPE, backend=make_backend(clock=clock))
    store.set("short", 1, retention=timedelta(seconds=10))
    store.set("long", 2, retention=timedelta(hours=1))
    clock.advance(9.5)
    assert store.get("short") == 1
    clock.advance(0.5)
    assert store.get("short") is None
    assert store.get("short", "gone") == "gone"
    assert store.keys() == ["long"]
    assert store.entry("short") is None
    assert row_counts(db_url)["task"] == 2  # still there, only invisible


def test_keys_expire_after_default_retention_days(make_backend: BackendFactory) -> None:
    clock = FakeClock()
    store = TaskStore(SCOPE, backend=make_backend(clock=clock))
    store.set("k", 1)
    clock.advance(30 * DAY - 1)
    assert store.get("k") == 1
    clock.advance(1)
    assert store.get("k") is None


def test_default_retention_of_zero_days_never_expires(make_backend: BackendFactory) -> None:
    clock = FakeClock()
    store = TaskStore(SCOPE, backend=make_backend(clock=clock, default_retention_days=0))
    store.set("k", 1)
    clock.advance(100 * 365 * DAY)
    assert store.get("k") == 1
    assert store.backend.gc().task_keys == 0


def test_never_expire_keeps_a_key_whatever_the_default(make_backend: BackendFactory) -> None:
    clock = FakeClock()
    store = TaskStore(SCOPE, backend=make_backend(clock=clock, default_retention_days=1))
    store.set("k", 1, retention=NEVER_EXPIRE)
    clock.advance(100 * 365 * DAY)
    assert store.get("k") == 1
    entry = store.entry("k")
    assert entry is not None and entry.expires_at is None


def test_set_replaces_the_expiry(make_backend: BackendFactory) -> None:
    clock = FakeClock()
    store = TaskStore(SCOPE, backend=make_backend(clock=clock))
    store.set("k", 1, retention=NEVER_EXPIRE)
    store.set("k", 2, retention=timedelta(seconds=5))
    clock.advance(5)
    assert store.get("k") is None


def test_setting_an_expired_key_again_revives_it(make_backend: BackendFactory) -> None:
    clock = FakeClock()
    store = TaskStore(SCOPE, backend=make_backend(clock=clock))
    store.set("k", 1, retention=timedelta(seconds=5))
    clock.advance(10)
    store.set("k", 2)
    assert store.get("k") == 2


@pytest.mark.parametrize("retention", [timedelta(0), timedelta(seconds=-1)])
def test_a_retention_that_is_not_positive_is_refused(
    make_backend: BackendFactory, retention: timedelta
) -> None:
    store = TaskStore(SCOPE, backend=make_backend())
    with pytest.raises(ValueError, match=r"'k': retention .* is not positive"):
        store.set("k", 1, retention=retention)
    assert store.keys() == []


def test_a_retention_of_another_type_is_refused(make_backend: BackendFactory) -> None:
    store = TaskStore(SCOPE, backend=make_backend())
    with pytest.raises(TypeError, match="retention must be a timedelta, NEVER_EXPIRE or None"):
        store.set("k", 1, retention=60)  # type: ignore[arg-type]
    assert store.keys() == []


def test_mark_success_clears_the_task_instance_when_clear_on_success(
    make_backend: BackendFactory,
) -> None:
    backend = make_backend(clear_on_success=True)
    done, sibling = (
        TaskStore(SCOPE, backend=backend),
        TaskStore(TaskScope("d", "r", "t", map_index=0), backend=backend),
    )
    done.set("job_id", "j")
    sibling.set("job_id", "j")
    assert done.mark_success() is True
    assert (done.keys(), sibling.keys()) == ([], ["job_id"])


def test_mark_success_keeps_the_keys_by_default(make_backend: BackendFactory) -> None:
    store = TaskStore(SCOPE, backend=make_backend())
    store.set("job_id", "j")
    assert store.mark_success() is False
    assert store.keys() == ["job_id"]


async def test_amark_success_clears_when_clear_on_success(amake_backend: BackendFactory) -> None:
    store = TaskStore(SCOPE, backend=amake_backend(clear_on_success=True))
    await store.aset("job_id", "j")
    assert await store.amark_success() is True
    assert await store.akeys() == []


def _expire_many(make_backend: BackendFactory, clock: FakeClock, expired: int, live: int) -> None:
    backend = make_backend(clock=clock)
    for i in range(expired):
        TaskStore(TaskScope("d", f"run-{i % 3}", "t"), backend=backend).set(
            f"k{i}", i, retention=timedelta(seconds=1)
        )
    for i in range(live):
        TaskStore(SCOPE, backend=backend).set(f"live{i}", i, retention=NEVER_EXPIRE)
    clock.advance(2)


def test_gc_removes_expired_keys_in_batches_of_cleanup_batch_size(
    make_backend: BackendFactory, db_url: str
) -> None:
    clock = FakeClock()
    _expire_many(make_backend, clock, expired=25, live=3)
    backend = make_backend(clock=clock, cleanup_batch_size=10)
    report = backend.gc()
    assert (report.task_keys, report.batches) == (25, 3)
    assert row_counts(db_url)["task"] == 3
    assert TaskStore(SCOPE, backend=backend).keys() == ["live0", "live1", "live2"]


def test_gc_dry_run_counts_and_removes_nothing(make_backend: BackendFactory, db_url: str) -> None:
    clock = FakeClock()
    _expire_many(make_backend, clock, expired=12, live=1)
    backend = make_backend(clock=clock, cleanup_batch_size=5)
    backend.deactivate_asset("gone")
    assert backend.gc(dry_run=True) == GcReport(True, task_keys=12, batches=3)
    assert row_counts(db_url)["task"] == 13


def test_gc_removes_keys_of_deactivated_assets_in_batches(
    make_backend: BackendFactory, db_url: str
) -> None:
    backend = make_backend(cleanup_batch_size=4)
    gone = AssetStore("gone", backend=backend)
    for i in range(9):
        gone.set(f"k{i}", i)
    AssetStore("kept", backend=backend).set("k", 1)
    backend.deactivate_asset("gone")
    assert backend.gc() == GcReport(False, asset_keys=9, batches=3)
    assert row_counts(db_url)["asset"] == 1


async def test_async_gc_matches_sync_gc(amake_backend: BackendFactory, db_url: str) -> None:
    clock = FakeClock()
    backend = amake_backend(clock=clock, cleanup_batch_size=2)
    store = TaskStore(SCOPE, backend=backend)
    for i in range(5):
        await store.aset(f"k{i}", i, retention=timedelta(seconds=1))
    clock.advance(1)
    assert await backend.agc(dry_run=True) == GcReport(True, task_keys=5, batches=3)
    assert await backend.agc() == GcReport(False, task_keys=5, batches=3)
    assert row_counts(db_url)["task"] == 0


async def test_gc_runs_on_an_interval_in_a_long_running_engine(
    amake_backend: BackendFactory,
) -> None:
    clock = FakeClock()
    backend = amake_backend(clock=clock)
    store = TaskStore(SCOPE, backend=backend)
    reports: list[GcReport] = []
    collected = asyncio.Event()

    def on_report(report: GcReport) -> None:
        reports.append(report)
        if report.task_keys:
            collected.set()

    async with asyncio.TaskGroup() as group:
        gc_task = group.create_task(backend.run_gc_forever(interval=0.01, on_report=on_report))
        await store.aset("k", 1, retention=timedelta(seconds=1))
        clock.advance(1)
        async with asyncio.timeout(30):
            await collected.wait()
        gc_task.cancel()
    assert gc_task.cancelled()
    assert sum(r.task_keys for r in reports) == 1


async def test_a_failed_gc_round_is_logged_and_the_loop_goes_on(
    amake_backend: BackendFactory, caplog: pytest.LogCaptureFixture
) -> None:
    backend = amake_backend()
    calls = 0
    original = backend.agc

    async def flaky_gc(*, dry_run: bool = False) -> GcReport:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("database went away")
        return await original(dry_run=dry_run)

    backend.agc = flaky_gc  # type: ignore[method-assign]
    second_round = asyncio.Event()
    with caplog.at_level(logging.ERROR, logger="acklane.core.stores"):
        async with asyncio.TaskGroup() as group:
            task = group.create_task(
                backend.run_gc_forever(interval=0.001, on_report=lambda _: second_round.set())
            )
            async with asyncio.timeout(30):
                await second_round.wait()
            task.cancel()
    assert "state store garbage collection failed" in caplog.text
    assert "database went away" in caplog.text


def test_settings_have_the_documented_defaults() -> None:
    settings = StateStoreSettings()
    assert (
        settings.max_value_bytes,
        settings.default_retention_days,
        settings.clear_on_success,
        settings.cleanup_batch_size,
        settings.gc_interval,
        settings.offload_dir,
    ) == (65535, 30, False, 1000, 3600.0, None)


def test_settings_refuse_unknown_fields() -> None:
    with pytest.raises(ValidationError, match="max_value_byte"):
        StateStoreSettings.model_validate({"max_value_byte": 10})


def test_settings_refuse_an_offload_threshold_over_the_value_limit() -> None:
    with pytest.raises(ValidationError, match="offload_threshold_bytes"):
        StateStoreSettings(offload_dir="/x", max_value_bytes=10, offload_threshold_bytes=20)
