"""SQL tables of the metastore backend (prefix ``acklane_``)."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Connection,
    Double,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.schema import CreateIndex, CreateTable

from ._scope import MAX_ASSET_LENGTH, MAX_ID_LENGTH
from ._values import MAX_KEY_LENGTH

__all__ = ["asset_state", "asset_status", "create_schema", "metadata", "task_state"]

metadata = MetaData()

# SQLite only auto-increments an INTEGER PRIMARY KEY.
_Id = BigInteger().with_variant(Integer(), "sqlite")

task_state = Table(
    "acklane_task_state",
    metadata,
    Column("id", _Id, primary_key=True, autoincrement=True),
    Column("dag_id", String(MAX_ID_LENGTH), nullable=False),
    Column("run_id", String(MAX_ID_LENGTH), nullable=False),
    Column("task_id", String(MAX_ID_LENGTH), nullable=False),
    Column("map_index", Integer, nullable=False),
    Column("key", String(MAX_KEY_LENGTH), nullable=False),
    Column("value", Text, nullable=True, comment="JSON text; NULL when offloaded"),
    Column("value_ref", Text, nullable=True, comment="reference of an offloaded value"),
    Column("updated_at", Double, nullable=False, comment="epoch seconds"),
    Column("expires_at", Double, nullable=True, comment="epoch seconds; NULL = never"),
    UniqueConstraint(
        "dag_id", "run_id", "task_id", "map_index", "key", name="uq_acklane_task_state_key"
    ),
    Index("ix_acklane_task_state_expires_at", "expires_at"),
)

asset_state = Table(
    "acklane_asset_state",
    metadata,
    Column("id", _Id, primary_key=True, autoincrement=True),
    Column("asset", String(MAX_ASSET_LENGTH), nullable=False),
    Column("key", String(MAX_KEY_LENGTH), nullable=False),
    Column("value", Text, nullable=True, comment="JSON text; NULL when offloaded"),
    Column("value_ref", Text, nullable=True, comment="reference of an offloaded value"),
    Column("writer", String(16), nullable=False, comment="task, watcher or api"),
    Column("updated_at", Double, nullable=False, comment="epoch seconds"),
    UniqueConstraint("asset", "key", name="uq_acklane_asset_state_key"),
)

# One row per asset that was ever deactivated; no row means active.
asset_status = Table(
    "acklane_asset_status",
    metadata,
    Column("asset", String(MAX_ASSET_LENGTH), primary_key=True),
    Column("active", Boolean(create_constraint=False), nullable=False),
    Column("changed_at", Double, nullable=False, comment="epoch seconds"),
)

# Any constant will do: it only serialises acklane's own DDL across processes.
_DDL_LOCK_KEY = 0x61636B6C616E65


def create_schema(conn: Connection) -> None:
    """Create the tables if missing, on an autocommit connection.

    Safe when several processes start at once: SQLite checks and creates under
    its write lock; PostgreSQL's ``IF NOT EXISTS`` can still collide on the
    catalog, so the processes take turns on an advisory lock.
    """
    locked = conn.dialect.name == "postgresql"
    if locked:
        conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _DDL_LOCK_KEY})
    try:
        for table in metadata.sorted_tables:
            conn.execute(CreateTable(table, if_not_exists=True))
            for index in sorted(table.indexes, key=lambda i: str(i.name)):
                conn.execute(CreateIndex(index, if_not_exists=True))
    finally:
        if locked:
            conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _DDL_LOCK_KEY})
