"""An offloading backend: large values as files under a directory, a reference in the row.

It is also the worked example of the custom-backend interface: it only adds
:meth:`offloads`, :meth:`serialize_to_ref`, :meth:`deserialize_from_ref` and
:meth:`purge_ref` to the metastore backend, plus an orphan sweep in :meth:`gc`.

References are deterministic: ``task/<scope digest>/<key digest>.json`` or
``asset/<asset digest>/<key digest>.json``, relative to the directory. A retry
writing the same key replaces the same file (atomically: a temporary file then
``os.replace``), so retries never pile files up. The file is written before its
row and removed after its row, so a row never points at a missing file because
of a crash; a crash in between leaves an orphan file that garbage collection
removes once it is older than ``orphan_grace_seconds``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import tempfile
import time
from pathlib import Path

from sqlalchemy import CompoundSelect, Engine, select, union
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from ..sql import DEFAULT_URL
from ._scope import Scope, TaskScope
from ._tables import asset_state, task_state
from ._values import JsonValue, decode_value
from .backend import Clock, GcReport
from .metastore import MetastoreBackend
from .settings import StateStoreSettings

__all__ = ["FileOffloadBackend"]

_SUFFIX = ".json"
_TMP_PREFIX = ".tmp-"


def _digest(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, ensure_ascii=False).encode("utf-8")).hexdigest()[:40]


class FileOffloadBackend(MetastoreBackend):
    """Metastore rows, with values over ``offload_threshold_bytes`` kept as files."""

    def __init__(
        self,
        url: str | URL = DEFAULT_URL,
        settings: StateStoreSettings | None = None,
        *,
        directory: str | os.PathLike[str] | None = None,
        clock: Clock = time.time,
        engine: Engine | None = None,
        aengine: AsyncEngine | None = None,
    ) -> None:
        super().__init__(url, settings, clock=clock, engine=engine, aengine=aengine)
        where = directory if directory is not None else self.settings.offload_dir
        if where is None:
            raise ValueError(
                "FileOffloadBackend needs a directory: pass directory= or set state.offload_dir"
            )
        if "://" in str(where):
            raise ValueError(
                f"offload directory {str(where)!r}: only local paths are supported, not URLs"
            )
        self.directory = Path(where).resolve()
        self.directory.mkdir(parents=True, exist_ok=True)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r}, directory={str(self.directory)!r})"

    # -- the custom-backend hooks ----------------------------------------------------------

    def offloads(self, nbytes: int, key: str, scope: Scope) -> bool:
        return nbytes > self.settings.offload_threshold_bytes

    def ref_for(self, key: str, scope: Scope) -> str:
        """The deterministic reference of ``key`` in ``scope``."""
        if isinstance(scope, TaskScope):
            folder = "task/" + _digest(scope.dag_id, scope.run_id, scope.task_id, scope.map_index)
        else:
            folder = "asset/" + _digest(scope.asset)
        return f"{folder}/{_digest(key)}{_SUFFIX}"

    def _path(self, ref: str) -> Path:
        path = (self.directory / ref).resolve()
        if not path.is_relative_to(self.directory) or not ref.endswith(_SUFFIX):
            raise ValueError(f"offloaded reference {ref!r} is outside {self.directory}")
        return path

    def serialize_to_ref(self, value: JsonValue, key: str, scope: Scope) -> str:
        ref = self.ref_for(key, scope)
        path = self._path(ref)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        fd, tmp = tempfile.mkstemp(prefix=_TMP_PREFIX, dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        _fsync_dir(path.parent)
        return ref

    def deserialize_from_ref(self, ref: str) -> JsonValue:
        return decode_value(self._path(ref).read_text(encoding="utf-8"))

    def purge_ref(self, ref: str) -> None:
        self._path(ref).unlink(missing_ok=True)

    # -- orphans -------------------------------------------------------------------------------

    def _orphans(self, referenced: set[str]) -> list[Path]:
        cutoff = self.now() - self.settings.orphan_grace_seconds
        found: list[Path] = []
        for path in self.directory.rglob("*"):
            if not path.is_file():
                continue
            ref = path.relative_to(self.directory).as_posix()
            if ref in referenced:
                continue
            if not (ref.endswith(_SUFFIX) or path.name.startswith(_TMP_PREFIX)):
                continue
            try:
                if path.stat().st_mtime > cutoff:
                    continue
            except FileNotFoundError:
                continue
            found.append(path)
        return found

    @staticmethod
    def _referenced_query() -> CompoundSelect[str]:
        return union(
            select(task_state.c.value_ref).where(task_state.c.value_ref.is_not(None)),
            select(asset_state.c.value_ref).where(asset_state.c.value_ref.is_not(None)),
        )

    def _sweep(self, referenced: set[str], dry_run: bool) -> int:
        orphans = self._orphans(referenced)
        if not dry_run:
            for path in orphans:
                path.unlink(missing_ok=True)
        return len(orphans)

    def gc(self, *, dry_run: bool = False) -> GcReport:
        report = super().gc(dry_run=dry_run)
        # References are read before the files are listed: a file written since is
        # younger than the grace period, so a writer between file and row is safe.
        referenced = {row[0] for row in self._one(self._referenced_query(), {})}
        swept = self._sweep(referenced, dry_run)
        return report + GcReport(dry_run, orphan_files=swept)

    async def agc(self, *, dry_run: bool = False) -> GcReport:
        report = await super().agc(dry_run=dry_run)
        referenced = {row[0] for row in await self._aone(self._referenced_query(), {})}
        swept = await asyncio.to_thread(self._sweep, referenced, dry_run)
        return report + GcReport(dry_run, orphan_files=swept)


def _fsync_dir(path: Path) -> None:
    # Makes the rename durable; some file systems refuse to open a directory.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
