"""The delivery state of each sink, in the event store's database (SQLite or PostgreSQL).

Per sink of a pipeline, one row of ``acklane_sink_state`` (a cursor in store order, a lease, a
count of deliveries) and the exceptions to the cursor in
``acklane_sink_deliveries`` (events retrying or parked). See
:mod:`acklane.core.events._schema` for the tables and docs/sinks.md for why a
cursor plus exceptions is as safe as a row per delivery:

- every event of the sink's watchers with ``id <= cursor`` is settled (delivered,
  or held by a row); the cursor only moves in a transaction that also writes the
  rows of the events it passes that were not delivered;
- event ids become visible in id order (one writer transaction at a time on
  PostgreSQL, SQLite's single writer), so the cursor never passes an id that is
  still to be committed;
- only the lease holder moves the cursor: each of its writes checks the owner,
  so a process that lost its lease (paused, partitioned) cannot settle anything.

Every row is keyed by the pipeline too (the sink's configuration's ``pipeline:``), and
a sink takes only its own pipeline's events: two pipelines sharing a database with the
same sink and watcher names never see each other's.

This module is only SQL; :mod:`._dispatcher` decides what to write.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import and_, case, delete, func, literal, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ..events import events_table, sink_deliveries_table, sink_state_table
from ..names import DEFAULT_PIPELINE
from ._base import Delivery, SinkError, event_id_for

__all__ = [
    "Failure",
    "LeaseLost",
    "Outbox",
    "ParkedEvent",
    "SinkStatus",
    "StoredWork",
    "parked_events",
    "replay_events",
    "retry_parked",
    "sink_status",
]

_E = events_table.c
_S = sink_state_table.c
_D = sink_deliveries_table.c


class LeaseLost(SinkError):
    """Another process holds the sink's lease now: stop delivering (nothing settled)."""


@dataclass(frozen=True, slots=True)
class StoredWork:
    """An event to attempt: the delivery, and what its row says (if it has one)."""

    delivery: Delivery
    #: Attempts already made (0 for a new event or a replay).
    attempts: int
    #: True when a past attempt may have got through (the lookup decides).
    unsure: bool
    #: True when it comes from a row (retrying, replayed), False when past the cursor.
    from_row: bool


@dataclass(frozen=True, slots=True)
class Failure:
    """A row to write for an event that was not delivered."""

    store_id: int
    state: str  # "retry" | "parked"
    attempts: int
    reason: str
    next_attempt_at: datetime | None
    unsure: bool


@dataclass(frozen=True, slots=True)
class SinkStatus:
    """What ``acklane sinks status`` shows for one sink."""

    sink: str
    delivered: int
    #: Stored, not yet attempted (beyond the cursor and not in flight).
    pending: int
    #: Claimed by the lease holder and not yet settled.
    in_flight: int
    retrying: int
    parked: int
    #: When the oldest event not yet delivered nor parked was stored, or None.
    oldest_pending_at: datetime | None
    owner: str | None
    lease_until: datetime | None

    @property
    def lag(self) -> int:
        """Events stored and not yet delivered nor parked."""
        return self.pending + self.in_flight + self.retrying


@dataclass(frozen=True, slots=True)
class ParkedEvent:
    delivery: Delivery
    attempts: int
    reason: str | None
    parked_at: datetime


def _gone(owner: str) -> bool:
    """Whether ``owner`` (``host:pid:random``, see ``worker_owner``) names a process of
    this host that does not exist any more."""
    host, _, rest = owner.partition(":")
    pid_text = rest.partition(":")[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return False  # this very process: an owner of an earlier life with the same pid
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # exists, another user's
        return False
    return False


def _aware(value: datetime | None) -> datetime | None:
    # SQLite keeps the naive UTC time it was given; PostgreSQL answers in the session zone.
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _stamp(engine: AsyncEngine, value: datetime) -> datetime:
    value = value.astimezone(UTC)
    return value.replace(tzinfo=None) if engine.dialect.name == "sqlite" else value


def _delivery(row: Any, attempt: int, streams: Mapping[str, str] | None = None) -> Delivery:
    """A row of ``_EVENT_COLUMNS`` (first seven fields, by position: a Row's attribute
    lookup costs more than the rest of this) as a Delivery."""
    store_id, watcher, stream, payload, message_id, position, created = row[:7]
    created_at = created.replace(tzinfo=UTC) if created.tzinfo is None else created.astimezone(UTC)
    return Delivery(
        event_id=event_id_for(
            watcher=watcher,
            stream=stream,
            message_id=message_id,
            position=position,
            store_id=store_id,
            created_at=created_at,
        ),
        store_id=store_id,
        watcher=watcher,
        stream=stream,
        message_id=message_id,
        position=position,
        payload=_decode(payload),
        created_at=created_at,
        attempt=attempt,
        stream_name=None if streams is None else streams.get(watcher),
    )


_decode = json.JSONDecoder().decode


def _upsert(engine: AsyncEngine) -> Any:
    return postgresql.insert if engine.dialect.name == "postgresql" else sqlite.insert


_EVENT_COLUMNS = (
    _E.id,
    _E.trigger_id,
    _E.stream_key,
    _E.payload,
    _E.message_id,
    _E.position,
    _E.created_at,
)


class Outbox:
    """One sink's rows, seen by one process (``owner``): lease, cursor, work, settlement."""

    def __init__(
        self,
        engine: AsyncEngine,
        sink: str,
        watchers: Sequence[str],
        owner: str,
        *,
        start: str = "all",
        pipeline: str = DEFAULT_PIPELINE,
        streams: Mapping[str, str] | None = None,
    ) -> None:
        self.engine = engine
        self.pipeline = pipeline
        #: watcher -> its stream's name, what a delivery says its stream is
        self.streams = streams
        self.sink = sink
        self.watchers = tuple(watchers)
        self.owner = owner
        self._start = start
        #: The cursor and claimed_to as of the last lease taken or settlement (owner only).
        self.cursor = 0
        self.claimed_to = 0

    def _now(self) -> datetime:
        return datetime.now(UTC)

    def _mine(self) -> Any:
        """The sink's state row."""
        return and_(_S.pipeline == self.pipeline, _S.sink == self.sink)

    def _rows(self) -> Any:
        """The sink's delivery rows."""
        return and_(_D.pipeline == self.pipeline, _D.sink == self.sink)

    # -- registration and lease --------------------------------------------------------

    async def register(self) -> None:
        """Create the sink's row if missing (cursor at the start, or at the newest event
        for ``start: new``), and record its watchers (retention reads them)."""
        now = _stamp(self.engine, self._now())
        watchers = json.dumps(sorted(self.watchers))
        async with self.engine.begin() as conn:
            start = 0
            if self._start == "new":
                newest = select(func.max(_E.id)).where(_E.pipeline == self.pipeline)
                start = int((await conn.execute(newest)).scalar() or 0)
            stmt = _upsert(self.engine)(sink_state_table).values(
                pipeline=self.pipeline,
                sink=self.sink,
                watchers=watchers,
                cursor=start,
                claimed_to=start,
                delivered=0,
                owner=None,
                lease_until=None,
                updated_at=now,
            )
            await conn.execute(
                stmt.on_conflict_do_update(
                    index_elements=[_S.pipeline, _S.sink], set_={"watchers": watchers}
                )
            )

    async def acquire(self, ttl: float) -> bool:
        """Take (or keep) the sink's lease for ``ttl`` seconds; True when this process
        holds it. Taking it loads the cursor and what the last holder may have sent.

        A lease held by a process of this host that no longer exists (killed, crashed)
        is taken at once rather than when it lapses."""
        now = self._now()
        until = _stamp(self.engine, now + timedelta(seconds=ttl))
        stamp_now = _stamp(self.engine, now)
        async with self.engine.begin() as conn:
            held_by = (await conn.execute(select(_S.owner).where(self._mine()))).scalar()
            free = or_(_S.owner.is_(None), _S.owner == self.owner, _S.lease_until < stamp_now)
            if held_by is not None and held_by != self.owner and _gone(held_by):
                free = or_(free, _S.owner == held_by)
            result = await conn.execute(
                update(sink_state_table)
                .where(self._mine(), free)
                .values(owner=self.owner, lease_until=until, updated_at=stamp_now)
            )
            if result.rowcount != 1:
                return False
            row = (await conn.execute(select(_S.cursor, _S.claimed_to).where(self._mine()))).one()
        self.cursor, self.claimed_to = int(row.cursor), int(row.claimed_to)
        return True

    async def renew(self, ttl: float) -> None:
        """Extend the lease; :class:`LeaseLost` when another process took it."""
        now = self._now()
        async with self.engine.begin() as conn:
            result = await conn.execute(
                update(sink_state_table)
                .where(self._mine(), _S.owner == self.owner)
                .values(
                    lease_until=_stamp(self.engine, now + timedelta(seconds=ttl)),
                    updated_at=_stamp(self.engine, now),
                )
            )
        if result.rowcount != 1:
            raise LeaseLost(self.sink)

    async def release(self) -> None:
        """Give the lease up, so that another process takes over at once."""
        async with self.engine.begin() as conn:
            await conn.execute(
                update(sink_state_table)
                .where(self._mine(), _S.owner == self.owner)
                .values(owner=None, lease_until=None)
            )

    # -- work --------------------------------------------------------------------------

    async def retrying(self) -> tuple[int, datetime | None]:
        """How many events retry, and when the first is due."""
        async with self.engine.connect() as conn:
            row = (
                await conn.execute(
                    select(func.count(), func.min(_D.next_attempt_at)).where(
                        self._rows(), _D.state == "retry"
                    )
                )
            ).one()
        return int(row[0]), _aware(row[1])

    async def due(self, limit: int) -> list[StoredWork]:
        """Rows due for another attempt, in store order (their event read with them)."""
        now = _stamp(self.engine, self._now())
        stmt = (
            select(*_EVENT_COLUMNS, _D.attempts, _D.unsure)
            .select_from(sink_deliveries_table.join(events_table, _E.id == _D.event_id))
            .where(self._rows(), _D.state == "retry", _D.next_attempt_at <= now)
            .order_by(_D.event_id)
            .limit(limit)
        )
        async with self.engine.connect() as conn:
            rows = (await conn.execute(stmt)).all()
        return [
            StoredWork(_delivery(r, r.attempts + 1, self.streams), r.attempts, bool(r.unsure), True)
            for r in rows
        ]

    async def fresh(self, limit: int) -> list[StoredWork]:
        """Events beyond the cursor, in store order; those the last holder may have sent
        (up to its ``claimed_to``) are marked unsure."""
        stmt = (
            select(*_EVENT_COLUMNS)
            .where(
                _E.id > self.cursor,
                _E.trigger_id.in_(self.watchers),
                _E.pipeline == self.pipeline,
            )
            .order_by(_E.id)
            .limit(limit)
        )
        async with self.engine.connect() as conn:
            rows = (await conn.execute(stmt)).all()
        streams = self.streams
        return [
            StoredWork(_delivery(r, 1, streams), 0, r.id <= self.claimed_to, False) for r in rows
        ]

    async def claim(self, up_to: int) -> None:
        """Record that events up to ``up_to`` may be sent before the next settlement."""
        if up_to <= self.claimed_to:
            return
        async with self.engine.begin() as conn:
            result = await conn.execute(
                update(sink_state_table)
                .where(self._mine(), _S.owner == self.owner)
                .values(claimed_to=up_to)
            )
            if result.rowcount != 1:
                raise LeaseLost(self.sink)
        self.claimed_to = up_to

    async def settle(
        self,
        *,
        cursor: int,
        delivered: int,
        cleared: Iterable[int],
        failures: Sequence[Failure],
    ) -> None:
        """In one transaction: move the cursor to ``cursor`` (never back), count
        ``delivered``, delete the rows of the ``cleared`` events (delivered from a row),
        and write ``failures``. :class:`LeaseLost` (and nothing written) when another
        process holds the lease."""
        now = _stamp(self.engine, self._now())
        cleared = list(cleared)
        async with self.engine.begin() as conn:
            result = await conn.execute(
                update(sink_state_table)
                .where(self._mine(), _S.owner == self.owner)
                .values(
                    cursor=case((_S.cursor < cursor, literal(cursor)), else_=_S.cursor),
                    claimed_to=case((_S.claimed_to < cursor, literal(cursor)), else_=_S.claimed_to),
                    delivered=_S.delivered + delivered,
                    updated_at=now,
                )
            )
            if result.rowcount != 1:
                raise LeaseLost(self.sink)
            if cleared:
                await conn.execute(
                    delete(sink_deliveries_table).where(self._rows(), _D.event_id.in_(cleared))
                )
            if failures:
                await _write_failures(conn, self.engine, self.pipeline, self.sink, failures, now)
        self.cursor = max(self.cursor, cursor)
        self.claimed_to = max(self.claimed_to, self.cursor)


async def _write_failures(
    conn: AsyncConnection,
    engine: AsyncEngine,
    pipeline: str,
    sink: str,
    failures: Sequence[Failure],
    now: datetime,
) -> None:
    rows = [
        {
            "pipeline": pipeline,
            "sink": sink,
            "event_id": f.store_id,
            "state": f.state,
            "attempts": f.attempts,
            "next_attempt_at": None
            if f.next_attempt_at is None
            else _stamp(engine, f.next_attempt_at),
            "last_error": f.reason,
            "unsure": int(f.unsure),
            "updated_at": now,
        }
        for f in failures
    ]
    await _put_rows(conn, engine, rows)


#: The columns of a delivery row a new write replaces (all but the key).
_ROW_FIELDS = ("state", "attempts", "next_attempt_at", "last_error", "unsure", "updated_at")


async def _put_rows(
    conn: AsyncConnection,
    engine: AsyncEngine,
    rows: Sequence[dict[str, Any]],
    *,
    keep: tuple[str, ...] = (),
) -> None:
    """Insert delivery rows, or replace an existing row's fields but those in ``keep``."""
    stmt = _upsert(engine)(sink_deliveries_table)
    excluded = stmt.excluded
    replaced = {name: excluded[name] for name in _ROW_FIELDS if name not in keep}
    key = [_D.pipeline, _D.sink, _D.event_id]
    await conn.execute(stmt.on_conflict_do_update(index_elements=key, set_=replaced), rows)


# -- what the CLI reads and writes (any process, no lease needed) ---------------------------


async def sink_status(
    engine: AsyncEngine,
    sinks: Mapping[str, Sequence[str]],
    *,
    pipeline: str = DEFAULT_PIPELINE,
) -> list[SinkStatus]:
    """The status of each named sink of ``pipeline`` (with its watchers), in the order
    given; only that pipeline's rows are counted."""
    out: list[SinkStatus] = []
    async with engine.connect() as conn:
        for name, watchers in sinks.items():
            state = (
                await conn.execute(
                    select(sink_state_table).where(_S.pipeline == pipeline, _S.sink == name)
                )
            ).first()
            rows = and_(_D.pipeline == pipeline, _D.sink == name)
            cursor = int(state.cursor) if state is not None else 0
            claimed = int(state.claimed_to) if state is not None else 0
            mine = and_(_E.pipeline == pipeline, _E.trigger_id.in_(list(watchers)))
            beyond = (
                await conn.execute(
                    select(
                        func.count(),
                        func.sum(case((_E.id <= claimed, 1), else_=0)),
                        func.min(_E.created_at),
                    ).where(_E.id > cursor, mine)
                )
            ).one()
            counts: dict[str, int] = dict(
                (
                    await conn.execute(
                        select(_D.state, func.count()).where(rows).group_by(_D.state)
                    )
                ).all()
            )
            oldest_retry = (
                await conn.execute(
                    select(func.min(_E.created_at))
                    .select_from(sink_deliveries_table.join(events_table, _E.id == _D.event_id))
                    .where(rows, _D.state == "retry")
                )
            ).scalar()
            oldest = [t for t in (_aware(beyond[2]), _aware(oldest_retry)) if t is not None]
            in_flight = int(beyond[1] or 0)
            out.append(
                SinkStatus(
                    sink=name,
                    delivered=int(state.delivered) if state is not None else 0,
                    pending=int(beyond[0]) - in_flight,
                    in_flight=in_flight,
                    retrying=int(counts.get("retry", 0)),
                    parked=int(counts.get("parked", 0)),
                    oldest_pending_at=min(oldest) if oldest else None,
                    owner=state.owner if state is not None else None,
                    lease_until=_aware(state.lease_until) if state is not None else None,
                )
            )
    return out


async def parked_events(
    engine: AsyncEngine, sink: str, *, limit: int = 100, pipeline: str = DEFAULT_PIPELINE
) -> list[ParkedEvent]:
    """The events parked for ``pipeline``'s ``sink``, oldest first, with their reasons."""
    stmt = (
        select(*_EVENT_COLUMNS, _D.attempts, _D.last_error, _D.updated_at.label("parked_at"))
        .select_from(sink_deliveries_table.join(events_table, _E.id == _D.event_id))
        .where(_D.pipeline == pipeline, _D.sink == sink, _D.state == "parked")
        .order_by(_D.event_id)
        .limit(limit)
    )
    async with engine.connect() as conn:
        rows = (await conn.execute(stmt)).all()
    return [
        ParkedEvent(
            _delivery(r, r.attempts),
            r.attempts,
            r.last_error,
            _aware(r.parked_at) or datetime.now(UTC),
        )
        for r in rows
    ]


async def retry_parked(
    engine: AsyncEngine,
    sink: str,
    *,
    event_ids: Sequence[str] | None = None,
    pipeline: str = DEFAULT_PIPELINE,
) -> int:
    """Give parked events of ``pipeline``'s ``sink`` another round of attempts, now (all of them, or
    those whose event id is in ``event_ids``); how many."""
    now = _stamp(engine, datetime.now(UTC))
    parked = and_(_D.pipeline == pipeline, _D.sink == sink, _D.state == "parked")
    async with engine.begin() as conn:
        if event_ids is None:
            store_ids = None
        else:
            wanted = set(event_ids)
            rows = (
                await conn.execute(
                    select(*_EVENT_COLUMNS)
                    .select_from(sink_deliveries_table.join(events_table, _E.id == _D.event_id))
                    .where(parked)
                )
            ).all()
            store_ids = [r.id for r in rows if _delivery(r, 0).event_id in wanted]
            if not store_ids:
                return 0
        stmt = update(sink_deliveries_table).where(parked)
        if store_ids is not None:
            stmt = stmt.where(_D.event_id.in_(store_ids))
        result = await conn.execute(
            stmt.values(state="retry", attempts=0, next_attempt_at=now, updated_at=now)
        )
    return int(result.rowcount)


async def replay_events(
    engine: AsyncEngine,
    sink: str,
    watcher: str,
    *,
    since: datetime | None = None,
    pipeline: str = DEFAULT_PIPELINE,
) -> int:
    """Deliver again the stored events of ``watcher`` (stored at or after ``since``) that
    ``sink`` is past, with their original ids; how many were queued. Events the sink
    has not reached yet are delivered anyway and are not counted."""
    now = _stamp(engine, datetime.now(UTC))
    async with engine.begin() as conn:
        state = (
            await conn.execute(select(_S.cursor).where(_S.pipeline == pipeline, _S.sink == sink))
        ).scalar()
        if state is None:
            return 0
        where = [_E.pipeline == pipeline, _E.trigger_id == watcher, _E.id <= int(state)]
        if since is not None:
            where.append(_E.created_at >= _stamp(engine, since))
        ids = [r[0] for r in (await conn.execute(select(_E.id).where(and_(*where)))).all()]
        if not ids:
            return 0
        rows = [
            {
                "pipeline": pipeline,
                "sink": sink,
                "event_id": i,
                "state": "retry",
                "attempts": 0,
                "next_attempt_at": now,
                "last_error": "replayed",
                "unsure": 1,
                "updated_at": now,
            }
            for i in ids
        ]
        # a parked event replayed keeps its reason until the replay settles
        await _put_rows(conn, engine, rows, keep=("last_error",))
    return len(ids)
