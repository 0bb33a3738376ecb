"""The event table, its creation, and the statements that read it."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Index,
    Integer,
    MetaData,
    Select,
    Table,
    Text,
    func,
    select,
)
from sqlalchemy.engine import Row
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from ._model import StoredEvent

__all__ = [
    "INSERT_COLUMNS",
    "TABLE_NAME",
    "count_statement",
    "create_tables",
    "events_table",
    "max_id_statement",
    "metadata",
    "row_to_event",
    "select_statement",
]

log = logging.getLogger("acklane.core.events")

TABLE_NAME = "acklane_trigger_events"

metadata = MetaData()

events_table = Table(
    TABLE_NAME,
    metadata,
    # INTEGER PRIMARY KEY AUTOINCREMENT on SQLite, so ids never go back (``tail``).
    Column("id", BigInteger().with_variant(Integer(), "sqlite"), primary_key=True),
    Column("trigger_id", Text(), nullable=False),
    Column("stream_key", Text(), nullable=False),
    Column("payload", Text(), nullable=False),  # JSON text
    Column("message_id", Text(), nullable=True),
    Column("position", Integer(), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    sqlite_autoincrement=True,
)

_message_id = events_table.c.message_id
# One copy per (trigger, upstream message, position among that message's yields).
# Rows without a message identity are never deduplicated.
Index(
    f"{TABLE_NAME}_dedupe",
    events_table.c.trigger_id,
    events_table.c.message_id,
    events_table.c.position,
    unique=True,
    sqlite_where=_message_id.is_not(None),
    postgresql_where=_message_id.is_not(None),
)
Index(f"{TABLE_NAME}_trigger", events_table.c.trigger_id, events_table.c.id)

#: The columns an INSERT fills, in the order of an encoded row plus ``created_at``.
INSERT_COLUMNS = ("trigger_id", "stream_key", "payload", "message_id", "position", "created_at")


async def create_tables(engine: AsyncEngine, *, attempts: int = 5) -> None:
    """Create the table and its indexes if missing.

    Several processes may start on one database at once: between one's existence
    check and its CREATE another may have created the table, so a failed CREATE is
    retried, and the check then finds it.
    """
    for attempt in range(1, attempts + 1):
        try:
            async with engine.begin() as conn:
                await conn.run_sync(metadata.create_all, checkfirst=True)
            return
        except DBAPIError as exc:
            if attempt == attempts:
                raise
            log.info("creating %s raced with another process (%s); checking again", TABLE_NAME, exc)


def select_statement(
    *,
    trigger_id: str | None = None,
    stream_key: str | None = None,
    after_id: int | None = None,
    before_id: int | None = None,
    limit: int = 100,
    newest_first: bool = False,
) -> Select[Any]:
    """The SELECT behind ``list_events``: filters, an id window, order and limit."""
    if limit < 0:
        raise ValueError(f"limit must be >= 0, not {limit}")
    t = events_table.c
    stmt = select(events_table)
    if trigger_id is not None:
        stmt = stmt.where(t.trigger_id == trigger_id)
    if stream_key is not None:
        stmt = stmt.where(t.stream_key == stream_key)
    if after_id is not None:
        stmt = stmt.where(t.id > after_id)
    if before_id is not None:
        stmt = stmt.where(t.id < before_id)
    return stmt.order_by(t.id.desc() if newest_first else t.id.asc()).limit(limit)


def count_statement(*, trigger_id: str | None = None) -> Select[Any]:
    stmt = select(func.count()).select_from(events_table)
    if trigger_id is not None:
        stmt = stmt.where(events_table.c.trigger_id == trigger_id)
    return stmt


def max_id_statement(*, trigger_id: str | None = None) -> Select[Any]:
    stmt = select(func.max(events_table.c.id))
    if trigger_id is not None:
        stmt = stmt.where(events_table.c.trigger_id == trigger_id)
    return stmt


def row_to_event(row: Row[Any]) -> StoredEvent:
    created_at: datetime = row.created_at
    # SQLite keeps the naive UTC time it was given; PostgreSQL answers in the session zone.
    created_at = (
        created_at.replace(tzinfo=UTC) if created_at.tzinfo is None else created_at.astimezone(UTC)
    )
    return StoredEvent(
        id=row.id,
        trigger_id=row.trigger_id,
        stream_key=row.stream_key,
        payload=json.loads(row.payload),
        message_id=row.message_id,
        position=row.position,
        created_at=created_at,
    )
