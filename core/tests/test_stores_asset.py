"""The asset store: an asset's keys across runs, who wrote them, and the asset's end."""

from __future__ import annotations

import pytest
from stores_helpers import BackendFactory, FakeClock, row_counts

from acklane.core.stores import AssetInactiveError, AssetStore


def test_an_asset_is_addressed_by_name_or_by_uri_alike(make_backend: BackendFactory) -> None:
    backend = make_backend()
    AssetStore(uri="s3://landing/orders/", backend=backend).set("watermark", 10)
    assert AssetStore("s3://landing/orders/", backend=backend).get("watermark") == 10


def test_exactly_one_of_name_and_uri_is_required() -> None:
    with pytest.raises(TypeError, match="exactly one"):
        AssetStore()
    with pytest.raises(TypeError, match="exactly one"):
        AssetStore("a", uri="s3://a")


def test_assets_do_not_share_keys(make_backend: BackendFactory) -> None:
    backend = make_backend()
    AssetStore("orders", backend=backend).set("watermark", 1)
    assert AssetStore("customers", backend=backend).get("watermark") is None


def test_keys_outlive_any_retention_setting(make_backend: BackendFactory) -> None:
    clock = FakeClock()
    store = AssetStore("orders", backend=make_backend(clock=clock, default_retention_days=1))
    store.set("watermark", 5)
    clock.advance(10 * 365 * 86400)
    assert store.get("watermark") == 5
    assert store.backend.gc().asset_keys == 0


def test_set_takes_no_retention(make_backend: BackendFactory) -> None:
    store = AssetStore("orders", backend=make_backend())
    with pytest.raises(TypeError):
        store.set("k", 1, retention=None)  # type: ignore[call-arg]


@pytest.mark.parametrize("writer", ["task", "watcher", "api"])
def test_a_write_records_the_writer_kind_and_time(
    make_backend: BackendFactory, writer: str
) -> None:
    clock = FakeClock()
    backend = make_backend(clock=clock)
    AssetStore("orders", backend=backend, writer="task").set("k", 0)
    clock.advance(60)
    AssetStore("orders", backend=backend, writer=writer).set("k", 1)  # type: ignore[arg-type]
    entry = AssetStore("orders", backend=backend).entry("k")
    assert entry is not None
    assert (entry.value, entry.writer, entry.updated_at) == (1, writer, clock.now)


def test_an_unknown_writer_kind_is_refused(make_backend: BackendFactory) -> None:
    with pytest.raises(ValueError, match="writer must be one of task, watcher, api"):
        AssetStore("orders", backend=make_backend(), writer="cron")  # type: ignore[arg-type]


def test_clear_removes_the_assets_keys_only(make_backend: BackendFactory) -> None:
    backend = make_backend()
    orders, customers = AssetStore("orders", backend=backend), AssetStore("cust", backend=backend)
    orders.set("a", 1)
    customers.set("a", 1)
    orders.clear()
    assert (orders.keys(), customers.keys()) == ([], ["a"])


def test_keys_of_a_deactivated_asset_vanish_at_once(make_backend: BackendFactory) -> None:
    backend = make_backend()
    store = AssetStore("orders", backend=backend)
    store.set("watermark", 7)
    backend.deactivate_asset("orders")
    assert store.get("watermark") is None
    assert store.keys() == []


def test_a_deactivated_asset_refuses_writes(make_backend: BackendFactory, db_url: str) -> None:
    backend = make_backend()
    store = AssetStore("orders", backend=backend)
    store.set("watermark", 7)
    backend.deactivate_asset("orders")
    with pytest.raises(AssetInactiveError, match="asset 'orders' is deactivated"):
        store.set("watermark", 8)
    with pytest.raises(AssetInactiveError):
        store.set("new-key", 8)
    assert row_counts(db_url)["asset"] == 1


def test_gc_removes_the_keys_of_a_deactivated_asset(
    make_backend: BackendFactory, db_url: str
) -> None:
    backend = make_backend()
    AssetStore("orders", backend=backend).set("a", 1)
    AssetStore("orders", backend=backend).set("b", 1)
    AssetStore("kept", backend=backend).set("a", 1)
    backend.deactivate_asset("orders")
    report = backend.gc()
    assert (report.asset_keys, row_counts(db_url)["asset"]) == (2, 1)
    assert AssetStore("kept", backend=backend).get("a") == 1


def test_a_reactivated_asset_starts_empty(make_backend: BackendFactory) -> None:
    backend = make_backend()
    store = AssetStore("orders", backend=backend)
    store.set("watermark", 7)
    backend.deactivate_asset("orders")
    backend.activate_asset("orders")
    assert store.keys() == []
    store.set("watermark", 1)
    assert store.get("watermark") == 1


def test_activating_an_active_asset_keeps_its_keys(make_backend: BackendFactory) -> None:
    backend = make_backend()
    store = AssetStore("orders", backend=backend)
    store.set("watermark", 7)
    backend.activate_asset("orders")
    assert store.get("watermark") == 7


async def test_async_twins_do_what_the_sync_methods_do(amake_backend: BackendFactory) -> None:
    backend = amake_backend()
    store = AssetStore("orders", backend=backend, writer="watcher")
    await store.aset("seen", ["m-1"])
    await store.aset("watermark", 3)
    assert await store.aget("watermark") == 3
    assert await store.akeys() == ["seen", "watermark"]
    entry = await store.aentry("seen")
    assert entry is not None and entry.writer == "watcher"
    await store.adelete("seen")
    assert await store.akeys() == ["watermark"]
    await backend.adeactivate_asset("orders")
    assert await store.aget("watermark") is None
    with pytest.raises(AssetInactiveError):
        await store.aset("watermark", 4)
    await backend.aactivate_asset("orders")
    await store.aset("watermark", 4)
    assert await store.aentries() == [await store.aentry("watermark")]
    await store.aclear()
    assert await store.akeys() == []
