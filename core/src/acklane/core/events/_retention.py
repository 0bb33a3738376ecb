"""Retention: trigger events older than a window are deleted, a batch per transaction.

Used by a running engine (``store.retention``, every ``store.prune_interval``) and by
``acklane events prune``. Rows are found through the index on ``created_at``; each
batch is one short DELETE transaction, so the writer (which shares SQLite's one
write lock) waits at most one batch.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, nullcontext
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Select, and_, delete, exists, func, not_, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from .._dbconf import DEFAULT_RETENTION
from ..names import DEFAULT_PIPELINE
from ._schema import events_table, sink_deliveries_table, sink_state_table

__all__ = [
    "DEFAULT_PRUNE_BATCH",
    "DEFAULT_RETENTION",
    "count_older_than",
    "cutoff_for",
    "prune_older_than",
]

#: Rows deleted per transaction.
DEFAULT_PRUNE_BATCH = 5000


def cutoff_for(retention: float, now: datetime | None = None) -> datetime:
    """The creation time before which events are pruned (UTC)."""
    if retention <= 0:
        raise ValueError(f"retention must be > 0 seconds, not {retention:g}")
    now = datetime.now(UTC) if now is None else now
    return now - timedelta(seconds=retention)


def _bound(engine: AsyncEngine, cutoff: datetime) -> datetime:
    # SQLite keeps naive UTC text (as the writer stamps it); PostgreSQL an aware time.
    cutoff = cutoff.astimezone(UTC)
    return cutoff.replace(tzinfo=None) if engine.dialect.name == "sqlite" else cutoff


def _older(engine: AsyncEngine, cutoff: datetime) -> Any:
    return events_table.c.created_at < _bound(engine, cutoff)


async def _prunable(
    conn: AsyncConnection, engine: AsyncEngine, cutoff: datetime, pipeline: str
) -> Any:
    """``pipeline``'s, older than ``cutoff`` and held by none of its sinks: an event a
    sink has not yet delivered (beyond its cursor), or still retries or keeps parked,
    is never pruned. Another pipeline's rows are neither counted nor pruned.

    The sinks' cursors are read in the same transaction; a cursor only moves forward,
    so one read a moment old holds back more, never less.
    """
    t = events_table.c
    condition: ColumnElement[bool] = and_(t.pipeline == pipeline, _older(engine, cutoff))
    s = sink_state_table.c
    sinks = (await conn.execute(select(s.watchers, s.cursor).where(s.pipeline == pipeline))).all()
    ahead = [
        and_(t.trigger_id.in_(json.loads(watchers)), t.id > cursor)
        for watchers, cursor in sinks
        if json.loads(watchers)
    ]
    if ahead:
        condition = and_(condition, not_(or_(*ahead)))
        d = sink_deliveries_table.c
        held = exists().where(d.pipeline == pipeline, d.event_id == t.id)
        condition = and_(condition, not_(held))
    return condition


async def count_older_than(
    engine: AsyncEngine,
    cutoff: datetime,
    *,
    pipeline: str = DEFAULT_PIPELINE,
    serialize: Callable[[], AbstractAsyncContextManager[object]] | None = None,
) -> int:
    """How many of ``pipeline``'s events created before ``cutoff`` may be pruned."""
    async with serialize() if serialize is not None else nullcontext(), engine.connect() as conn:
        stmt: Select[Any] = select(func.count()).select_from(events_table)
        stmt = stmt.where(await _prunable(conn, engine, cutoff, pipeline))
        return int((await conn.execute(stmt)).scalar() or 0)


async def prune_older_than(
    engine: AsyncEngine,
    cutoff: datetime,
    *,
    batch_size: int = DEFAULT_PRUNE_BATCH,
    pipeline: str = DEFAULT_PIPELINE,
    serialize: Callable[[], AbstractAsyncContextManager[object]] | None = None,
    on_batch: Callable[[int], None] | None = None,
) -> int:
    """Delete ``pipeline``'s events created before ``cutoff``, ``batch_size`` rows per transaction;
    the number deleted. ``on_batch(n)`` is called after each committed batch.

    Rows created after the call started are never touched (the cutoff is fixed), so
    it ends even while the engine writes.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, not {batch_size}")
    total = 0
    while True:
        async with (
            serialize() if serialize is not None else nullcontext(),
            engine.begin() as conn,
        ):
            where = await _prunable(conn, engine, cutoff, pipeline)
            ids = select(events_table.c.id).where(where).limit(batch_size)
            stmt = delete(events_table).where(events_table.c.id.in_(ids))
            deleted = (await conn.execute(stmt)).rowcount
        total += deleted
        if deleted and on_batch is not None:
            on_batch(deleted)
        if deleted < batch_size:
            return total
