"""Reading persisted events: shared by :class:`EventStore` and the CLI."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from contextlib import AbstractAsyncContextManager, nullcontext
from typing import Any

from sqlalchemy import Select, inspect
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ..names import DEFAULT_PIPELINE
from ._model import StoredEvent
from ._schema import (
    TABLE_NAME,
    count_statement,
    max_id_statement,
    row_to_event,
    select_statement,
)

__all__ = ["EventReader"]


class EventReader:
    """Queries over one pipeline's rows of the event table of one engine (which the
    caller owns).

    ``serialize`` is a lock shared with the writer when both must take turns on
    a single connection (an in-memory SQLite database).
    """

    def __init__(
        self,
        engine: AsyncEngine,
        serialize: asyncio.Lock | None = None,
        *,
        pipeline: str = DEFAULT_PIPELINE,
    ) -> None:
        self._engine = engine
        self.pipeline = pipeline
        self._serialize = serialize

    def _turn(self) -> AbstractAsyncContextManager[object]:
        return self._serialize if self._serialize is not None else nullcontext()

    async def table_exists(self) -> bool:
        def check(conn: object) -> bool:
            return bool(inspect(conn).has_table(TABLE_NAME))

        async with self._turn(), self._engine.connect() as conn:
            return await conn.run_sync(check)

    async def list_events(
        self,
        *,
        trigger_id: str | None = None,
        stream_key: str | None = None,
        after_id: int | None = None,
        limit: int = 100,
        newest_first: bool = False,
    ) -> list[StoredEvent]:
        stmt = select_statement(
            pipeline=self.pipeline,
            trigger_id=trigger_id,
            stream_key=stream_key,
            after_id=after_id,
            limit=limit,
            newest_first=newest_first,
        )
        async with self._turn(), self._engine.connect() as conn:
            result = await conn.execute(stmt)
            return [row_to_event(row) for row in result]

    async def count(self, *, trigger_id: str | None = None) -> int:
        async with self._turn(), self._engine.connect() as conn:
            stmt = count_statement(pipeline=self.pipeline, trigger_id=trigger_id)
            return await _scalar_int(conn, stmt)

    async def last_id(self, *, trigger_id: str | None = None) -> int:
        """The largest id stored (0 when there is none)."""
        async with self._turn(), self._engine.connect() as conn:
            stmt = max_id_statement(pipeline=self.pipeline, trigger_id=trigger_id)
            return await _scalar_int(conn, stmt)

    async def tail(
        self,
        *,
        trigger_id: str | None = None,
        stream_key: str | None = None,
        after_id: int | None = None,
        poll_interval: float = 0.5,
    ) -> AsyncGenerator[StoredEvent, None]:
        """Yield events with an id above ``after_id`` (default: the current last one)
        in id order, forever, polling every ``poll_interval`` seconds when idle.

        On PostgreSQL with several concurrent writers an id is taken at INSERT but
        seen at COMMIT, so a row committed late with a smaller id than one already
        yielded is skipped: ``tail`` is for watching, ``list_events`` for auditing.
        """
        async for events in self.tail_batches(
            trigger_id=trigger_id,
            stream_key=stream_key,
            after_id=after_id,
            poll_interval=poll_interval,
        ):
            for event in events:
                yield event

    async def tail_batches(
        self,
        *,
        trigger_id: str | None = None,
        stream_key: str | None = None,
        after_id: int | None = None,
        poll_interval: float = 0.5,
        batch: int = 500,
    ) -> AsyncGenerator[list[StoredEvent], None]:
        """Like :meth:`tail`, one non-empty list per query that found new events."""
        cursor = await self.last_id(trigger_id=trigger_id) if after_id is None else after_id
        while True:
            events = await self.list_events(
                trigger_id=trigger_id, stream_key=stream_key, after_id=cursor, limit=batch
            )
            if events:
                cursor = events[-1].id
                yield events
            if len(events) < batch:
                await asyncio.sleep(poll_interval)


async def _scalar_int(conn: AsyncConnection, stmt: Select[Any]) -> int:
    value = (await conn.execute(stmt)).scalar()
    return int(value or 0)
