"""The metastore backend: the state stores as SQL tables, SQLite or PostgreSQL.

Every write is one ``INSERT ... ON CONFLICT DO UPDATE`` statement on the unique
key of its table, so concurrent writers in several processes never lose an
update to a read-modify-write race and never create a duplicate row. The sync
API uses :func:`acklane.core.sql.sync_engine`, the async twins
:func:`acklane.core.sql.async_engine`, both over the same URL.

Statements are built once per backend with bound parameters, and every
operation that is a single statement runs in autocommit mode: one round trip,
atomic by itself, durable when it returns.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    Double,
    Engine,
    Integer,
    Row,
    Select,
    String,
    Text,
    bindparam,
    delete,
    exists,
    func,
    or_,
    select,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.sql.dml import ReturningDelete, ReturningInsert

from ..sql import DEFAULT_URL, async_engine, sync_engine
from ._errors import AssetInactiveError, OffloadedValueMissingError
from ._scope import AssetScope, Scope, TaskScope
from ._tables import asset_state, asset_status, create_schema, task_state
from ._values import JsonValue, decode_value
from .backend import Clock, GcReport, StateBackend, StateEntry, StateWrite
from .settings import StateStoreSettings

__all__ = ["MetastoreBackend"]

log = logging.getLogger("acklane.core.stores")

if TYPE_CHECKING:
    _AnyRow = Row[*tuple[Any, ...]]
    _AnySelect = Select[*tuple[Any, ...]]
    _RefDelete = ReturningDelete[str | None]

_t = task_state
_a = asset_state
_s = asset_status

Params = dict[str, Any]


class _Statements:
    """Every statement the backend runs, built once with bound parameters.

    Parameters: task scope ``dag_id, run_id, task_id, map_index``; asset scope
    ``asset``; plus ``key`` and ``now``. Upserts take their columns by name.
    """

    def __init__(self, dialect: str, batch_size: int) -> None:
        insert: Callable[[Any], Any] = sqlite.insert if dialect == "sqlite" else postgresql.insert
        in_task = (
            _t.c.dag_id == bindparam("dag_id", type_=String()),
            _t.c.run_id == bindparam("run_id", type_=String()),
            _t.c.task_id == bindparam("task_id", type_=String()),
            _t.c.map_index == bindparam("map_index", type_=Integer()),
        )
        live_task = or_(
            _t.c.expires_at.is_(None), _t.c.expires_at > bindparam("now", type_=Double())
        )
        task_key = _t.c.key == bindparam("key", type_=String())
        task_columns = (_t.c.key, _t.c.value, _t.c.value_ref, _t.c.updated_at, _t.c.expires_at)

        asset = bindparam("asset", type_=String())
        inactive = exists().where(_s.c.asset == asset, _s.c.active.is_(False))
        in_asset = _a.c.asset == asset
        asset_key = _a.c.key == bindparam("key", type_=String())
        asset_columns = (_a.c.key, _a.c.value, _a.c.value_ref, _a.c.updated_at, _a.c.writer)

        self.task_get: _AnySelect = select(*task_columns).where(*in_task, task_key, live_task)
        self.task_entries: _AnySelect = (
            select(*task_columns).where(*in_task, live_task).order_by(_t.c.key)
        )
        self.task_keys: Select[str] = select(_t.c.key).where(*in_task, live_task).order_by(_t.c.key)
        self.task_delete: _RefDelete = (
            delete(_t).where(*in_task, task_key).returning(_t.c.value_ref)
        )
        self.task_clear: _RefDelete = delete(_t).where(*in_task).returning(_t.c.value_ref)
        ins = insert(_t)
        self.task_upsert: Any = ins.on_conflict_do_update(
            index_elements=[_t.c.dag_id, _t.c.run_id, _t.c.task_id, _t.c.map_index, _t.c.key],
            set_={
                "value": ins.excluded.value,
                "value_ref": ins.excluded.value_ref,
                "updated_at": ins.excluded.updated_at,
                "expires_at": ins.excluded.expires_at,
            },
        )

        self.asset_get: _AnySelect = select(*asset_columns).where(in_asset, asset_key, ~inactive)
        self.asset_entries: _AnySelect = (
            select(*asset_columns).where(in_asset, ~inactive).order_by(_a.c.key)
        )
        self.asset_keys: Select[str] = (
            select(_a.c.key).where(in_asset, ~inactive).order_by(_a.c.key)
        )
        self.asset_delete: _RefDelete = (
            delete(_a).where(in_asset, asset_key).returning(_a.c.value_ref)
        )
        self.asset_clear: _RefDelete = delete(_a).where(in_asset).returning(_a.c.value_ref)
        # Guarded by the asset's status in the same statement: a deactivated asset
        # selects no row, so nothing is written and RETURNING comes back empty.
        source: _AnySelect = select(
            asset,
            bindparam("new_key", type_=String()),
            bindparam("new_value", type_=Text()),
            bindparam("new_value_ref", type_=Text()),
            bindparam("new_writer", type_=String()),
            bindparam("new_updated_at", type_=Double()),
        ).where(~inactive)
        ins = insert(_a).from_select(
            ["asset", "key", "value", "value_ref", "writer", "updated_at"], source
        )
        self.asset_upsert: ReturningInsert[int] = ins.on_conflict_do_update(
            index_elements=[_a.c.asset, _a.c.key],
            set_={
                "value": ins.excluded.value,
                "value_ref": ins.excluded.value_ref,
                "writer": ins.excluded.writer,
                "updated_at": ins.excluded.updated_at,
            },
        ).returning(_a.c.id)

        expired = _t.c.expires_at <= bindparam("now", type_=Double())
        self.gc_task: _RefDelete = (
            delete(_t)
            .where(_t.c.id.in_(select(_t.c.id).where(expired).order_by(_t.c.id).limit(batch_size)))
            .where(expired)
            .returning(_t.c.value_ref)
        )
        inactive_assets = select(_s.c.asset).where(_s.c.active.is_(False))
        doomed = _a.c.asset.in_(inactive_assets)
        self.gc_assets: _RefDelete = (
            delete(_a)
            .where(_a.c.id.in_(select(_a.c.id).where(doomed).order_by(_a.c.id).limit(batch_size)))
            .returning(_a.c.value_ref)
        )
        self.gc_one_asset: _RefDelete = (
            delete(_a)
            .where(_a.c.id.in_(select(_a.c.id).where(in_asset).order_by(_a.c.id).limit(batch_size)))
            .returning(_a.c.value_ref)
        )
        self.count_expired: Select[int] = select(func.count()).select_from(_t).where(expired)
        self.count_inactive: Select[int] = select(func.count()).select_from(_a).where(doomed)
        self.is_inactive: Select[bool] = select(inactive)
        ins = insert(_s)
        self.set_status: Any = ins.on_conflict_do_update(
            index_elements=[_s.c.asset],
            set_={"active": ins.excluded.active, "changed_at": ins.excluded.changed_at},
        )


def _scope_params(scope: Scope, **extra: Any) -> Params:
    if isinstance(scope, TaskScope):
        return {
            "dag_id": scope.dag_id,
            "run_id": scope.run_id,
            "task_id": scope.task_id,
            "map_index": scope.map_index,
            **extra,
        }
    return {"asset": scope.asset, **extra}


class MetastoreBackend(StateBackend):
    """State in SQL tables; embedded SQLite by default, PostgreSQL by URL.

    One backend is shared by every accessor of a process; its engines are made
    on first use (sync ones for the sync API; for the async twins, async ones on
    PostgreSQL and worker threads on SQLite). Pass ``engine``/``aengine`` to
    share the event store's engines instead; :meth:`close`/:meth:`aclose` then
    leave them open. The async side belongs to one event loop.
    """

    def __init__(
        self,
        url: str | URL = DEFAULT_URL,
        settings: StateStoreSettings | None = None,
        *,
        clock: Clock = time.time,
        engine: Engine | None = None,
        aengine: AsyncEngine | None = None,
    ) -> None:
        super().__init__(settings, clock=clock)
        self._url = make_url(url)
        dialect = self._url.get_backend_name()
        if dialect not in ("sqlite", "postgresql"):
            raise ValueError(
                f"state store URL {self.url!r}: unsupported database {dialect!r} "
                "(use sqlite:///PATH or postgresql://...)"
            )
        if dialect == "sqlite" and (
            self._url.database in (None, "", ":memory:") or self._url.query.get("mode") == "memory"
        ):
            raise ValueError(
                f"state store URL {self.url!r}: an in-memory SQLite database dies with the "
                "process, and state must outlive it; name a file (sqlite:///PATH)"
            )
        self._sql = _Statements(dialect, self.settings.cleanup_batch_size)
        # Given engines are shared (left open by close()); single statements then
        # run on an autocommit view of their pool.
        self._given_engine = engine
        self._given_aengine = aengine
        # SQLite's async driver runs each call in a thread of its own anyway; running
        # the sync statements in a worker thread does the same with far less overhead.
        self._threaded_async = dialect == "sqlite" and aengine is None
        self._auto: Engine | None = None
        self._tx: Engine | None = None
        self._aauto: AsyncEngine | None = None
        self._atx: AsyncEngine | None = None
        self._schema_ready = False
        self._lock = threading.Lock()
        self._alock: asyncio.Lock | None = None

    @property
    def url(self) -> str:
        """The database URL, password hidden."""
        return self._url.render_as_string(hide_password=True)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    # -- engines and schema --------------------------------------------------------------
    #
    # Two engines per API: an autocommit one for every single-statement operation
    # (one round trip, no BEGIN/COMMIT) and, created only when needed, a
    # transactional one for the one operation of two statements (reactivating an
    # asset). The schema is created on first use, on the autocommit engine.

    def _autocommit(self) -> Engine:
        engine = self._auto
        if engine is None or not self._schema_ready:
            with self._lock:
                if self._auto is None:
                    if self._given_engine is not None:
                        self._auto = self._given_engine.execution_options(
                            isolation_level="AUTOCOMMIT"
                        )
                    else:
                        self._auto = sync_engine(self._url, isolation_level="AUTOCOMMIT")
                engine = self._auto
                if not self._schema_ready:
                    with engine.connect() as conn:
                        create_schema(conn)
                    self._schema_ready = True
        return engine

    def _transactional(self) -> Engine:
        self._autocommit()
        with self._lock:
            if self._tx is None:
                self._tx = self._given_engine or sync_engine(self._url)
            return self._tx

    async def _aautocommit(self) -> AsyncEngine:
        engine = self._aauto
        if engine is None or not self._schema_ready:
            if self._alock is None:
                self._alock = asyncio.Lock()
            async with self._alock:
                if self._aauto is None:
                    if self._given_aengine is not None:
                        self._aauto = self._given_aengine.execution_options(
                            isolation_level="AUTOCOMMIT"
                        )
                    else:
                        self._aauto = async_engine(self._url, isolation_level="AUTOCOMMIT")
                engine = self._aauto
                if not self._schema_ready:
                    async with engine.connect() as conn:
                        await conn.run_sync(create_schema)
                    self._schema_ready = True
        return engine

    async def _atransactional(self) -> AsyncEngine:
        await self._aautocommit()
        if self._atx is None:
            self._atx = self._given_aengine or async_engine(self._url)
        return self._atx

    def close(self) -> None:
        # Only engines made here: a given engine (and its autocommit view) stays open.
        for engine in (self._auto, self._tx):
            if engine is not None and self._given_engine is None:
                engine.dispose()
        self._auto = self._tx = None

    async def aclose(self) -> None:
        for engine in (self._aauto, self._atx):
            if engine is not None and self._given_aengine is None:
                await engine.dispose()
        self._aauto = self._atx = None
        self.close()

    # -- one statement, sync and async ------------------------------------------------------

    def _one(self, stmt: Any, params: Mapping[str, Any]) -> Sequence[_AnyRow]:
        with self._autocommit().connect() as conn:
            result = conn.execute(stmt, dict(params))
            return result.all() if result.returns_rows else ()

    async def _aone(self, stmt: Any, params: Mapping[str, Any]) -> Sequence[_AnyRow]:
        if self._threaded_async:
            return await asyncio.to_thread(self._one, stmt, params)
        engine = await self._aautocommit()
        async with engine.connect() as conn:
            result = await conn.execute(stmt, dict(params))
            return result.all() if result.returns_rows else ()

    def _reactivate(self, asset: str) -> Sequence[_AnyRow]:
        status = {"asset": asset, "active": True, "changed_at": self.now()}
        with self._transactional().begin() as conn:
            rows = conn.execute(self._sql.asset_clear, {"asset": asset}).all()
            conn.execute(self._sql.set_status, status)
        return rows

    async def _areactivate(self, asset: str) -> Sequence[_AnyRow]:
        if self._threaded_async:
            return await asyncio.to_thread(self._reactivate, asset)
        status = {"asset": asset, "active": True, "changed_at": self.now()}
        engine = await self._atransactional()
        async with engine.begin() as conn:
            rows = (await conn.execute(self._sql.asset_clear, {"asset": asset})).all()
            await conn.execute(self._sql.set_status, status)
        return rows

    def _statement(self, scope: Scope, task: Any, asset: Any) -> Any:
        return task if isinstance(scope, TaskScope) else asset

    def _write_params(self, scope: Scope, write: StateWrite, ref: str | None) -> Params:
        value = None if ref is not None else write.encoded.text
        now = self.now()
        if isinstance(scope, TaskScope):
            return _scope_params(
                scope,
                key=write.key,
                value=value,
                value_ref=ref,
                updated_at=now,
                expires_at=write.expires_at,
            )
        return _scope_params(
            scope,
            new_key=write.key,
            new_value=value,
            new_value_ref=ref,
            new_writer=write.writer or "api",
            new_updated_at=now,
        )

    # -- rows to entries ---------------------------------------------------------------------

    @staticmethod
    def _entry(scope: Scope, row: _AnyRow, value: JsonValue) -> StateEntry:
        if isinstance(scope, TaskScope):
            return StateEntry(
                key=row[0], value=value, updated_at=row[3], expires_at=row[4], ref=row[2]
            )
        return StateEntry(key=row[0], value=value, updated_at=row[3], writer=row[4], ref=row[2])

    def _load(self, row: _AnyRow) -> JsonValue:
        if row[2] is None:
            return decode_value(row[1])
        try:
            return self.deserialize_from_ref(row[2])
        except Exception as exc:
            raise OffloadedValueMissingError(row[0], row[2], str(exc)) from exc

    async def _aload(self, row: _AnyRow) -> JsonValue:
        if row[2] is None:
            return decode_value(row[1])
        try:
            return await self.adeserialize_from_ref(row[2])
        except Exception as exc:
            raise OffloadedValueMissingError(row[0], row[2], str(exc)) from exc

    def _purge(self, refs: Iterable[str | None]) -> int:
        purged = 0
        for ref in refs:
            if ref is None:
                continue
            try:
                self.purge_ref(ref)
            except Exception as exc:
                log.warning(
                    "offloaded value %r outlived its row (%s); garbage collection removes it",
                    ref,
                    exc,
                )
            else:
                purged += 1
        return purged

    async def _apurge(self, refs: Iterable[str | None]) -> int:
        purged = 0
        for ref in refs:
            if ref is None:
                continue
            try:
                await self.apurge_ref(ref)
            except Exception as exc:
                log.warning(
                    "offloaded value %r outlived its row (%s); garbage collection removes it",
                    ref,
                    exc,
                )
            else:
                purged += 1
        return purged

    @staticmethod
    def _refs(rows: Sequence[_AnyRow]) -> list[str | None]:
        return [row[0] for row in rows]

    # -- sync API ------------------------------------------------------------------------------

    def get(self, scope: Scope, key: str) -> StateEntry | None:
        sql = self._sql
        stmt = self._statement(scope, sql.task_get, sql.asset_get)
        rows = self._one(stmt, _scope_params(scope, key=key, now=self.now()))
        return self._entry(scope, rows[0], self._load(rows[0])) if rows else None

    def entries(self, scope: Scope) -> list[StateEntry]:
        sql = self._sql
        stmt = self._statement(scope, sql.task_entries, sql.asset_entries)
        rows = self._one(stmt, _scope_params(scope, now=self.now()))
        return [self._entry(scope, row, self._load(row)) for row in rows]

    def keys(self, scope: Scope) -> list[str]:
        stmt = self._statement(scope, self._sql.task_keys, self._sql.asset_keys)
        return [row[0] for row in self._one(stmt, _scope_params(scope, now=self.now()))]

    def set(self, scope: Scope, write: StateWrite) -> None:
        ref = None
        if self.offloads(write.encoded.nbytes, write.key, scope):
            # The value first, then the row: a row never points at a missing value.
            ref = self.serialize_to_ref(write.encoded.value, write.key, scope)
        stmt = self._statement(scope, self._sql.task_upsert, self._sql.asset_upsert)
        params = self._write_params(scope, write, ref)
        if not self._one(stmt, params) and isinstance(scope, AssetScope):
            self._purge([ref])
            raise AssetInactiveError(scope.asset, write.key)

    def delete(self, scope: Scope, key: str) -> bool:
        stmt = self._statement(scope, self._sql.task_delete, self._sql.asset_delete)
        rows = self._one(stmt, _scope_params(scope, key=key))
        self._purge(self._refs(rows))
        return bool(rows)

    def clear(self, scope: Scope) -> int:
        stmt = self._statement(scope, self._sql.task_clear, self._sql.asset_clear)
        rows = self._one(stmt, _scope_params(scope))
        self._purge(self._refs(rows))
        return len(rows)

    def gc(self, *, dry_run: bool = False) -> GcReport:
        now = self.now()
        size = self.settings.cleanup_batch_size
        if dry_run:
            task_keys = self._one(self._sql.count_expired, {"now": now})[0][0]
            asset_keys = self._one(self._sql.count_inactive, {})[0][0]
            batches = -(-task_keys // size) + -(-asset_keys // size)
            return GcReport(True, task_keys=task_keys, asset_keys=asset_keys, batches=batches)
        task_keys, task_batches, task_offloaded = self._gc_phase(self._sql.gc_task, {"now": now})
        asset_keys, asset_batches, asset_offloaded = self._gc_phase(self._sql.gc_assets, {})
        return GcReport(
            False,
            task_keys=task_keys,
            asset_keys=asset_keys,
            offloaded_values=task_offloaded + asset_offloaded,
            batches=task_batches + asset_batches,
        )

    def _gc_phase(self, batch: _RefDelete, params: Params) -> tuple[int, int, int]:
        """Run ``batch`` until it removes fewer rows than a batch: (rows, batches, purged)."""
        removed = batches = purged = 0
        while True:
            rows = self._one(batch, params)
            if rows:
                batches += 1
                removed += len(rows)
                purged += self._purge(self._refs(rows))
            if len(rows) < self.settings.cleanup_batch_size:
                return removed, batches, purged

    def deactivate_asset(self, asset: str) -> None:
        AssetScope(asset)
        self._one(self._sql.set_status, {"asset": asset, "active": False, "changed_at": self.now()})

    def activate_asset(self, asset: str) -> None:
        AssetScope(asset)
        if not self._one(self._sql.is_inactive, {"asset": asset})[0][0]:
            return
        # Leftover keys are invisible while the asset is inactive and writes are
        # refused, so they can go in batches before the asset comes back empty.
        self._gc_phase(self._sql.gc_one_asset, {"asset": asset})
        self._purge(self._refs(self._reactivate(asset)))

    # -- async API -----------------------------------------------------------------------------

    async def aget(self, scope: Scope, key: str) -> StateEntry | None:
        sql = self._sql
        stmt = self._statement(scope, sql.task_get, sql.asset_get)
        rows = await self._aone(stmt, _scope_params(scope, key=key, now=self.now()))
        return self._entry(scope, rows[0], await self._aload(rows[0])) if rows else None

    async def aentries(self, scope: Scope) -> list[StateEntry]:
        sql = self._sql
        stmt = self._statement(scope, sql.task_entries, sql.asset_entries)
        rows = await self._aone(stmt, _scope_params(scope, now=self.now()))
        return [self._entry(scope, row, await self._aload(row)) for row in rows]

    async def akeys(self, scope: Scope) -> list[str]:
        stmt = self._statement(scope, self._sql.task_keys, self._sql.asset_keys)
        return [row[0] for row in await self._aone(stmt, _scope_params(scope, now=self.now()))]

    async def aset(self, scope: Scope, write: StateWrite) -> None:
        ref = None
        if self.offloads(write.encoded.nbytes, write.key, scope):
            ref = await self.aserialize_to_ref(write.encoded.value, write.key, scope)
        stmt = self._statement(scope, self._sql.task_upsert, self._sql.asset_upsert)
        params = self._write_params(scope, write, ref)
        if not await self._aone(stmt, params) and isinstance(scope, AssetScope):
            await self._apurge([ref])
            raise AssetInactiveError(scope.asset, write.key)

    async def adelete(self, scope: Scope, key: str) -> bool:
        stmt = self._statement(scope, self._sql.task_delete, self._sql.asset_delete)
        rows = await self._aone(stmt, _scope_params(scope, key=key))
        await self._apurge(self._refs(rows))
        return bool(rows)

    async def aclear(self, scope: Scope) -> int:
        stmt = self._statement(scope, self._sql.task_clear, self._sql.asset_clear)
        rows = await self._aone(stmt, _scope_params(scope))
        await self._apurge(self._refs(rows))
        return len(rows)

    async def agc(self, *, dry_run: bool = False) -> GcReport:
        now = self.now()
        size = self.settings.cleanup_batch_size
        if dry_run:
            task_keys = (await self._aone(self._sql.count_expired, {"now": now}))[0][0]
            asset_keys = (await self._aone(self._sql.count_inactive, {}))[0][0]
            batches = -(-task_keys // size) + -(-asset_keys // size)
            return GcReport(True, task_keys=task_keys, asset_keys=asset_keys, batches=batches)
        task_keys, task_batches, task_offloaded = await self._agc_phase(
            self._sql.gc_task, {"now": now}
        )
        asset_keys, asset_batches, asset_offloaded = await self._agc_phase(self._sql.gc_assets, {})
        return GcReport(
            False,
            task_keys=task_keys,
            asset_keys=asset_keys,
            offloaded_values=task_offloaded + asset_offloaded,
            batches=task_batches + asset_batches,
        )

    async def _agc_phase(self, batch: _RefDelete, params: Params) -> tuple[int, int, int]:
        removed = batches = purged = 0
        while True:
            rows = await self._aone(batch, params)
            if rows:
                batches += 1
                removed += len(rows)
                purged += await self._apurge(self._refs(rows))
            if len(rows) < self.settings.cleanup_batch_size:
                return removed, batches, purged

    async def adeactivate_asset(self, asset: str) -> None:
        AssetScope(asset)
        status = {"asset": asset, "active": False, "changed_at": self.now()}
        await self._aone(self._sql.set_status, status)

    async def aactivate_asset(self, asset: str) -> None:
        AssetScope(asset)
        if not (await self._aone(self._sql.is_inactive, {"asset": asset}))[0][0]:
            return
        await self._agc_phase(self._sql.gc_one_asset, {"asset": asset})
        await self._apurge(self._refs(await self._areactivate(asset)))
