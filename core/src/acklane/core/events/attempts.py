"""Failed attempts per message, kept in acklane's database so a restart does not reset them.

The poison policy (:mod:`acklane.core.pipeline.poison`) counts a failure against the message it
belongs to. The count and the last error live in one small table of the event store's
database (``store.url``: SQLite or PostgreSQL), one row per message that failed and is
not resolved yet::

    acklane_message_attempts(pipeline, stream_key, message_id, attempts, last_error,
                             watcher, updated_at)

Each pipeline (``pipeline:`` of the configuration) counts its own: two pipelines
reading one queue each judge a message by their own watchers' failures.

A row is added (or its count raised by one, atomically, so several engines sharing
one PostgreSQL database add up) when a watcher fails on the message, and removed once
the message is acked or dead-lettered. Rows not touched for :data:`STALE_AFTER` are
removed when their stream starts (the message is gone: deleted upstream, expired).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from sqlalchemy import (
    Column,
    Connection,
    DateTime,
    Index,
    Integer,
    MetaData,
    Table,
    Text,
    delete,
    select,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from ..names import DEFAULT_PIPELINE
from ..sql import async_engine, create_schema
from ._model import storable_stream_key
from ._schema import column_names, key_by_pipeline

__all__ = ["STALE_AFTER", "TABLE_NAME", "AttemptRecord", "AttemptStore", "attempts_table"]

log = logging.getLogger("acklane.core.pipeline.poison")

TABLE_NAME: Final = "acklane_message_attempts"
#: Rows not updated for this long are removed when their stream starts.
STALE_AFTER: Final = timedelta(days=7)
#: Longer message ids are counted in memory only (no built-in connector makes one).
MAX_MESSAGE_ID_BYTES: Final = 1024
#: The most bytes of error text a row keeps.
MAX_ERROR_BYTES: Final = 1024

metadata = MetaData()

attempts_table = Table(
    TABLE_NAME,
    metadata,
    Column("pipeline", Text(), primary_key=True),
    Column("stream_key", Text(), primary_key=True),
    Column("message_id", Text(), primary_key=True),
    Column("attempts", Integer(), nullable=False),
    Column("last_error", Text(), nullable=False),
    Column("watcher", Text(), nullable=True),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)
Index(f"{TABLE_NAME}_updated", attempts_table.c.stream_key, attempts_table.c.updated_at)

#: Serializes the table's creation among processes opening one PostgreSQL database.
_PG_SCHEMA_LOCK: Final = 0x61636B6C616E66


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    """One message's failed attempts: how many, the last error, and whose."""

    attempts: int
    last_error: str
    watcher: str | None = None


def storable_message_id(message_id: str) -> bool:
    """Whether a message id fits the table (longer ones are counted in memory only)."""
    return len(message_id.encode("utf-8", "surrogatepass")) <= MAX_MESSAGE_ID_BYTES


class AttemptStore:
    """The table of failed attempts on one database (the event store's ``store.url``)."""

    def __init__(self, url: str, *, pipeline: str = DEFAULT_PIPELINE) -> None:
        self.url = url
        self.pipeline = pipeline
        self._engine: AsyncEngine | None = None

    async def open(self, *, tries: int = 5) -> None:
        """Connect and create the table if missing."""
        if self._engine is not None:
            return
        if make_url(self.url).get_backend_name() not in ("sqlite", "postgresql"):
            raise ValueError("the attempt store supports sqlite:// and postgresql:// URLs")
        engine = async_engine(self.url)
        try:
            await create_schema(
                engine, _create, lock_key=_PG_SCHEMA_LOCK, table=TABLE_NAME, log=log, tries=tries
            )
        except BaseException:
            await engine.dispose()
            raise
        self._engine = engine

    async def close(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            await engine.dispose()

    def _opened(self) -> AsyncEngine:
        if self._engine is None:
            raise RuntimeError("the attempt store is not open")
        return self._engine

    async def load(self, stream_key: str) -> dict[str, AttemptRecord]:
        """The messages of ``stream_key`` with failed attempts; stale rows are removed."""
        key = storable_stream_key(stream_key)
        t = attempts_table.c
        async with self._opened().begin() as conn:
            stale = datetime.now(UTC) - STALE_AFTER
            await conn.execute(
                delete(attempts_table).where(
                    t.pipeline == self.pipeline, t.stream_key == key, t.updated_at < stale
                )
            )
            rows = await conn.execute(
                select(t.message_id, t.attempts, t.last_error, t.watcher).where(
                    t.pipeline == self.pipeline, t.stream_key == key
                )
            )
            return {
                row.message_id: AttemptRecord(row.attempts, row.last_error, row.watcher)
                for row in rows
            }

    async def add_failure(
        self, stream_key: str, message_id: str, watcher: str, error: str, times: int = 1
    ) -> AttemptRecord:
        """Count ``times`` more failed attempts of a message; returns its record now."""
        key = storable_stream_key(stream_key)
        t = attempts_table.c
        values: dict[str, Any] = {
            "pipeline": self.pipeline,
            "stream_key": key,
            "message_id": message_id,
            "attempts": times,
            "last_error": error,
            "watcher": watcher,
            "updated_at": datetime.now(UTC),
        }
        async with self._opened().begin() as conn:
            insert = pg_insert if conn.dialect.name == "postgresql" else sqlite_insert
            stmt = insert(attempts_table).values(values)
            stmt = stmt.on_conflict_do_update(
                index_elements=[t.pipeline, t.stream_key, t.message_id],
                set_={
                    "attempts": t.attempts + stmt.excluded.attempts,
                    "last_error": stmt.excluded.last_error,
                    "watcher": stmt.excluded.watcher,
                    "updated_at": stmt.excluded.updated_at,
                },
            )
            await conn.execute(stmt)
            row = (
                await conn.execute(
                    select(t.attempts, t.last_error, t.watcher).where(
                        t.pipeline == self.pipeline, t.stream_key == key, t.message_id == message_id
                    )
                )
            ).one()
            return AttemptRecord(row.attempts, row.last_error, row.watcher)

    async def forget(self, stream_key: str, message_ids: Sequence[str]) -> None:
        """Remove the rows of resolved messages."""
        if not message_ids:
            return
        key = storable_stream_key(stream_key)
        t = attempts_table.c
        async with self._opened().begin() as conn:
            for start in range(0, len(message_ids), 500):
                chunk = list(message_ids[start : start + 500])
                await conn.execute(
                    delete(attempts_table).where(
                        t.pipeline == self.pipeline,
                        t.stream_key == key,
                        t.message_id.in_(chunk),
                    )
                )


def _create(conn: Connection) -> None:
    metadata.create_all(conn, checkfirst=True)
    if "pipeline" not in column_names(conn, TABLE_NAME):
        # counts of a store written before pipelines: the default pipeline's
        key_by_pipeline(conn, attempts_table)
