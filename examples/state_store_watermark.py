"""A watermark that advances per run: each run loads only what landed since the last one.

    uv run python examples/state_store_watermark.py [--url postgresql://...]

Files land in an object-storage prefix (faked here by a directory). Every run
of the incremental load reads the asset's watermark (the newest modification
time already loaded), loads the files newer than it, and moves the watermark
to the newest file it loaded. The watermark belongs to the asset, not to a run
or a task, so it lives in the asset store and every run (and every watcher of
that asset) sees the same one.

Files are stamped with explicit modification times so the demo does not depend
on the clock.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path

from acklane.core.stores import AssetStore, MetastoreBackend

ASSET_URI = "s3://landing/orders/"


def land(prefix: Path, name: str, mtime: float, rows: int) -> None:
    """A producer drops a file with ``rows`` lines, modified at ``mtime``."""
    path = prefix / name
    path.write_text("".join(f"order-{name}-{i}\n" for i in range(rows)), encoding="utf-8")
    os.utime(path, (mtime, mtime))


def incremental_load(store: AssetStore, prefix: Path, run: int) -> list[str]:
    """One run: load the files newer than the watermark, then advance it."""
    watermark = store.get("watermark", 0.0)
    assert isinstance(watermark, int | float)
    fresh = sorted(
        (path.stat().st_mtime, path.name)
        for path in prefix.iterdir()
        if path.stat().st_mtime > watermark
    )
    rows = sum(len((prefix / name).read_text(encoding="utf-8").splitlines()) for _, name in fresh)
    if fresh:
        # Advance only after the load succeeded: a failed run retries the same files.
        store.set("watermark", fresh[-1][0])
        total = store.get("rows_loaded", 0)
        assert isinstance(total, int)
        store.set("rows_loaded", total + rows)
    names = [name for _, name in fresh]
    print(
        f"run {run}: watermark {watermark:.0f} -> {store.get('watermark', 0.0):.0f}, "
        f"loaded {names or 'nothing new'} ({rows} rows)",
        flush=True,
    )
    return names


async def watcher_view(store: AssetStore) -> dict[str, object]:
    """What a watcher of the same asset reads from its filter (async twins)."""
    return {key: await store.aget(key) for key in await store.akeys()}


def demo(url: str | None, workdir: Path) -> list[list[str]]:
    """Three runs with files landing in between; return what each run loaded."""
    url = url or f"sqlite:///{workdir / 'acklane.db'}"
    prefix = workdir / "landing"
    prefix.mkdir()
    loaded: list[list[str]] = []
    with MetastoreBackend(url) as backend:
        store = AssetStore(uri=ASSET_URI, backend=backend)

        land(prefix, "a.csv", 1_000, rows=3)
        land(prefix, "b.csv", 2_000, rows=2)
        loaded.append(incremental_load(store, prefix, run=1))

        land(prefix, "c.csv", 3_000, rows=4)
        loaded.append(incremental_load(store, prefix, run=2))

        loaded.append(incremental_load(store, prefix, run=3))  # nothing landed

        async def look() -> dict[str, object]:
            watcher_store = AssetStore(uri=ASSET_URI, backend=backend, writer="watcher")
            try:
                return await watcher_view(watcher_store)
            finally:
                await backend.aclose()

        print(f"the asset's store as a watcher sees it: {asyncio.run(look())}", flush=True)
    return loaded


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=None, help="asset store database URL")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="acklane-watermark-") as tmp:
        loaded = demo(args.url, Path(tmp))
    return 0 if loaded == [["a.csv", "b.csv"], ["c.csv"], []] else 1


if __name__ == "__main__":
    sys.exit(main())
