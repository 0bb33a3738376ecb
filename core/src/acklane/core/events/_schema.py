"""The event table, its creation, and the statements that read it."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    DateTime,
    Index,
    Integer,
    MetaData,
    Select,
    Table,
    Text,
    func,
    select,
    update,
)
from sqlalchemy.engine import Dialect, Row
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.schema import CreateIndex

from ..names import DEFAULT_PIPELINE, check_pipeline_name
from ..sql import create_schema
from ._model import MAX_STREAM_KEY_BYTES, StoredEvent, storable_stream_key

__all__ = [
    "CREATED_AT_INDEX",
    "DEDUPE_INDEX",
    "INSERT_COLUMNS",
    "SINK_DELIVERIES_TABLE",
    "SINK_STATE_TABLE",
    "TABLE_NAME",
    "column_names",
    "count_statement",
    "create_tables",
    "dedupe_conflict_clause",
    "events_table",
    "key_by_pipeline",
    "max_id_statement",
    "metadata",
    "row_to_event",
    "select_statement",
    "sink_deliveries_table",
    "sink_state_table",
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
    #: The pipeline that stored the row (``pipeline:`` of its configuration): every
    #: reader, sink and pruning round sees only its own pipeline's rows. The default
    #: is what rows written before the column existed get.
    Column("pipeline", Text(), nullable=False, server_default=DEFAULT_PIPELINE),
    sqlite_autoincrement=True,
)

_message_id = events_table.c.message_id
#: One copy per (trigger, upstream message, position among that message's yields,
#: stream, pipeline): a message identity is only trusted within the stream it came
#: from, so the same id from another stream (another cluster, queue or group) is a
#: new message, never a redelivery; and a pipeline never takes another pipeline's row
#: for its own. Rows without a message identity are never deduplicated. stream_key
#: and pipeline come last: they are compared only when the rest ties.
DEDUPE_INDEX = Index(
    f"{TABLE_NAME}_pipeline_dedupe",
    events_table.c.trigger_id,
    events_table.c.message_id,
    events_table.c.position,
    events_table.c.stream_key,
    events_table.c.pipeline,
    unique=True,
    sqlite_where=_message_id.is_not(None),
    postgresql_where=_message_id.is_not(None),
)
Index(f"{TABLE_NAME}_trigger", events_table.c.trigger_id, events_table.c.id)
#: For retention: pruning finds the rows older than a cutoff through it.
CREATED_AT_INDEX = Index(f"{TABLE_NAME}_created_at", events_table.c.created_at)

# -- the outbox: where each sink stands (acklane.core.sinks delivers from the table above) --

SINK_STATE_TABLE = "acklane_sink_state"
SINK_DELIVERIES_TABLE = "acklane_sink_deliveries"

#: One row per sink of each pipeline. Every event of the sink's watchers with ``id <= cursor`` is
#: settled for it: delivered, or held by a row of ``sink_deliveries`` (retrying or
#: parked). The owner holds the sink's lease until ``lease_until``; only the owner
#: delivers and moves the cursor. ``claimed_to`` is the highest id the owner may have
#: sent beyond the cursor: after a crash, the events between the two are the ones an
#: exactly-once sink looks up before sending them again.
sink_state_table = Table(
    SINK_STATE_TABLE,
    metadata,
    Column("pipeline", Text(), primary_key=True),
    Column("sink", Text(), primary_key=True),
    #: JSON list of the watchers whose events the sink takes (what retention reads).
    Column("watchers", Text(), nullable=False),
    Column("cursor", BigInteger(), nullable=False),
    Column("claimed_to", BigInteger(), nullable=False),
    Column("delivered", BigInteger(), nullable=False),
    Column("owner", Text(), nullable=True),
    Column("lease_until", DateTime(timezone=True), nullable=True),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)

#: The exceptions to a sink's cursor: events retrying (``state = 'retry'``) or parked
#: (``'parked'``) for that sink, with their attempts and last error. A delivered
#: event has no row.
sink_deliveries_table = Table(
    SINK_DELIVERIES_TABLE,
    metadata,
    Column("pipeline", Text(), primary_key=True),
    Column("sink", Text(), primary_key=True),
    Column("event_id", BigInteger(), primary_key=True),
    Column("state", Text(), nullable=False),
    Column("attempts", Integer(), nullable=False),
    Column("next_attempt_at", DateTime(timezone=True), nullable=True),
    Column("last_error", Text(), nullable=True),
    #: 1 when an attempt may have got through (a timeout, a crash): an exactly-once
    #: sink looks the event up before sending it again.
    Column("unsure", Integer(), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)
Index(
    f"{SINK_DELIVERIES_TABLE}_due",
    sink_deliveries_table.c.pipeline,
    sink_deliveries_table.c.sink,
    sink_deliveries_table.c.state,
    sink_deliveries_table.c.next_attempt_at,
)

#: Dedupe indexes of earlier versions, dropped when a store opens the table. The
#: first one, on (trigger_id, message_id, position), took a message from another
#: stream with a reused id for a redelivery: confirmed, never stored; the second,
#: without the pipeline, took another pipeline's row for one.
_RETIRED_INDEXES = (f"{TABLE_NAME}_dedupe", f"{TABLE_NAME}_stream_dedupe")

#: Serializes schema creation and migration among the processes opening one
#: PostgreSQL database (a transaction-level advisory lock; the value is arbitrary).
_PG_SCHEMA_LOCK = 0x61636B6C616E65  # "acklane"

#: The columns an INSERT fills, in the order of an encoded row plus ``created_at`` and
#: ``pipeline`` (one value per store, bound once per statement, not per row).
INSERT_COLUMNS = (
    "trigger_id",
    "stream_key",
    "payload",
    "message_id",
    "position",
    "created_at",
    "pipeline",
)


def dedupe_conflict_clause(dialect: Dialect) -> str:
    """``ON CONFLICT (<the dedupe index>) WHERE message_id IS NOT NULL DO NOTHING``.

    The target is explicit, so the INSERT skips exactly the rows the dedupe index
    calls duplicates, and fails loudly rather than guess if that index is missing.
    """
    prep = dialect.identifier_preparer
    columns = ", ".join(prep.quote(str(column.name)) for column in DEDUPE_INDEX.columns)
    message_id = prep.quote("message_id")
    return f" ON CONFLICT ({columns}) WHERE {message_id} IS NOT NULL DO NOTHING"


async def create_tables(engine: AsyncEngine, *, attempts: int = 5) -> None:
    """Create the table and its indexes if missing; migrate an older dedupe index.

    Several processes may start on one database at once. On PostgreSQL they take
    turns (an advisory lock held until the transaction ends); processes of an
    older version take no such lock, and on SQLite two openers may both see the
    table missing or the old index present: a statement that lost such a race
    fails, the transaction is retried, and the checks then find the work done.
    """
    await create_schema(
        engine,
        _create_or_migrate,
        lock_key=_PG_SCHEMA_LOCK,
        table=TABLE_NAME,
        log=log,
        tries=attempts,
    )


def _create_or_migrate(conn: Connection) -> None:
    metadata.create_all(conn, checkfirst=True)
    # Stores written before pipelines existed: every row they hold is the default
    # pipeline's (docs/event-store.md, "Pipelines"). First, while no row has changed:
    # SQLite's rebuild of a table takes the write lock with its own BEGIN.
    earlier = [
        table
        for table in (sink_state_table, sink_deliveries_table)
        if "pipeline" not in column_names(conn, table.name)
    ]
    if earlier:
        key_by_pipeline(conn, *earlier)
    if "pipeline" not in column_names(conn, TABLE_NAME):
        # One statement, atomic on both backends; existing rows take the default.
        _add_column(conn, TABLE_NAME, events_table.c.pipeline, DEFAULT_PIPELINE)
        log.info("event store: column pipeline added; earlier rows are %r's", DEFAULT_PIPELINE)
    present = _index_names(conn)
    if CREATED_AT_INDEX.name not in present:
        # Tables made before retention existed: pruning would scan the whole table.
        conn.execute(CreateIndex(CREATED_AT_INDEX, if_not_exists=True))
        log.info("event store: index %s created (for retention)", CREATED_AT_INDEX.name)
    retired = [name for name in _RETIRED_INDEXES if name in present]
    if DEDUPE_INDEX.name in present and not retired:
        return
    # Rows written before the index held the stream key may keep a key too long
    # for it (PostgreSQL bounds an index entry): store those as a put does now.
    digested = _digest_long_stream_keys(conn)
    # New index first, then the old one goes: at no moment is there no dedupe
    # index (SQLite runs DDL outside a transaction unless rows changed first).
    conn.execute(CreateIndex(DEDUPE_INDEX, if_not_exists=True))
    prep = conn.dialect.identifier_preparer
    for name in retired:
        conn.exec_driver_sql(f"DROP INDEX IF EXISTS {prep.quote(name)}")
    log.info(
        "event store: dedupe index %s created (trigger, message id, position, stream key)%s%s",
        DEDUPE_INDEX.name,
        f", replacing {', '.join(retired)}" if retired else "",
        f"; {digested} long stream key(s) stored as their digest" if digested else "",
    )


def column_names(conn: Connection, table: str) -> set[str]:
    """The names of ``table``'s columns, read in one query (see :func:`_index_names`)."""
    if conn.dialect.name == "sqlite":
        rows = conn.exec_driver_sql(f"SELECT name FROM pragma_table_info('{table}')")
    else:
        rows = conn.exec_driver_sql(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name = %(table)s",
            {"table": table},
        )
    return {str(name) for (name,) in rows}


def key_by_pipeline(conn: Connection, *tables: Table) -> None:
    """Give tables of an earlier version (the sinks', the poison policy's) their
    ``pipeline`` column, first in their primary key, every existing row in the default
    pipeline; in one transaction.

    PostgreSQL changes each table in place (under the schema lock). SQLite cannot
    change a primary key: each table is renamed, made again and its rows copied, under
    one ``BEGIN IMMEDIATE`` (taken before any row changes, so that pysqlite opens no
    transaction of its own), so a second opener waits, then finds the work done.
    """
    if conn.dialect.name == "sqlite":
        conn.exec_driver_sql("BEGIN IMMEDIATE")
    for table in tables:
        if "pipeline" in column_names(conn, table.name):
            continue  # another process did it while this one waited for the lock
        if conn.dialect.name == "postgresql":
            _key_in_place(conn, table)
        else:
            _key_by_copy(conn, table)
        log.info(
            "event store: %s keyed by pipeline; earlier rows are %r's",
            table.name,
            DEFAULT_PIPELINE,
        )


def _key_in_place(conn: Connection, table: Table) -> None:
    prep = conn.dialect.identifier_preparer
    name = prep.quote(table.name)
    key = ", ".join(prep.quote(c.name) for c in table.primary_key.columns)
    _add_column(conn, table.name, table.c.pipeline, DEFAULT_PIPELINE)
    conn.exec_driver_sql(f"ALTER TABLE {name} ALTER COLUMN pipeline DROP DEFAULT")
    old_key = prep.quote(f"{table.name}_pkey")  # PostgreSQL's name for it
    conn.exec_driver_sql(f"ALTER TABLE {name} DROP CONSTRAINT {old_key}")
    conn.exec_driver_sql(f"ALTER TABLE {name} ADD PRIMARY KEY ({key})")
    for index in table.indexes:
        conn.exec_driver_sql(f"DROP INDEX IF EXISTS {prep.quote(str(index.name))}")
        conn.execute(CreateIndex(index))


def _key_by_copy(conn: Connection, table: Table) -> None:
    prep = conn.dialect.identifier_preparer
    name = prep.quote(table.name)
    before = prep.quote(f"{table.name}_before_pipeline")
    for index in table.indexes:  # their names go with the new table
        conn.exec_driver_sql(f"DROP INDEX IF EXISTS {prep.quote(str(index.name))}")
    conn.exec_driver_sql(f"ALTER TABLE {name} RENAME TO {before}")
    table.create(conn)
    columns = ", ".join(prep.quote(c.name) for c in table.columns if c.name != "pipeline")
    conn.exec_driver_sql(
        f"INSERT INTO {name} (pipeline, {columns}) SELECT ?, {columns} FROM {before}",
        (DEFAULT_PIPELINE,),
    )
    conn.exec_driver_sql(f"DROP TABLE {before}")


def _add_column(conn: Connection, table: str, column: Column[Any], default: str) -> None:
    """``ALTER TABLE ... ADD COLUMN`` of ``column``'s type, NOT NULL, existing rows
    ``default`` (a pipeline name: the name rule admits no quote)."""
    prep = conn.dialect.identifier_preparer
    kind = column.type.compile(dialect=conn.dialect)
    conn.exec_driver_sql(
        f"ALTER TABLE {prep.quote(table)} ADD COLUMN {prep.quote(column.name)} "
        f"{kind} NOT NULL DEFAULT '{check_pipeline_name(default)}'"
    )


def _index_names(conn: Connection) -> set[str]:
    """The names of the table's indexes, read in one query.

    Not SQLAlchemy's inspector: on SQLite it lists the indexes, then reads each one's
    SQL in a second query, and fails (a TypeError, not a database error) when another
    process drops an index in between, as a concurrent migration does.
    """
    if conn.dialect.name == "sqlite":
        rows = conn.exec_driver_sql(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ?",
            (TABLE_NAME,),
        )
    else:
        rows = conn.exec_driver_sql(
            "SELECT indexname FROM pg_indexes "
            "WHERE schemaname = current_schema() AND tablename = %(table)s",
            {"table": TABLE_NAME},
        )
    return {str(name) for (name,) in rows}


def _digest_long_stream_keys(conn: Connection) -> int:
    """Replace every stream key longer than MAX_STREAM_KEY_BYTES by its digest; the
    number of rows changed. Such keys are few and distinct keys fewer still."""
    key = events_table.c.stream_key
    # length() counts characters; a key of more than N bytes has more than N/4.
    candidates = select(key).where(func.length(key) > MAX_STREAM_KEY_BYTES // 4).distinct()
    changed = 0
    for (old,) in conn.execute(candidates).all():
        new = storable_stream_key(old)
        if new != old:
            result = conn.execute(update(events_table).where(key == old).values(stream_key=new))
            changed += result.rowcount
    return changed


def select_statement(
    *,
    pipeline: str = DEFAULT_PIPELINE,
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
    stmt = select(events_table).where(t.pipeline == pipeline)
    if trigger_id is not None:
        stmt = stmt.where(t.trigger_id == trigger_id)
    if stream_key is not None:
        # Stored as a put stores it: a long key as its digest.
        stmt = stmt.where(t.stream_key == storable_stream_key(stream_key))
    if after_id is not None:
        stmt = stmt.where(t.id > after_id)
    if before_id is not None:
        stmt = stmt.where(t.id < before_id)
    return stmt.order_by(t.id.desc() if newest_first else t.id.asc()).limit(limit)


def count_statement(
    *, pipeline: str = DEFAULT_PIPELINE, trigger_id: str | None = None
) -> Select[Any]:
    stmt = select(func.count()).where(events_table.c.pipeline == pipeline)
    if trigger_id is not None:
        stmt = stmt.where(events_table.c.trigger_id == trigger_id)
    return stmt


def max_id_statement(
    *, pipeline: str = DEFAULT_PIPELINE, trigger_id: str | None = None
) -> Select[Any]:
    stmt = select(func.max(events_table.c.id)).where(events_table.c.pipeline == pipeline)
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
