"""SQL engines shared by the event store and the state stores.

One URL names the database. SQLite is the embedded default (WAL journal, so
readers never block the writer and several processes on one machine can share
it); PostgreSQL serves several engine instances. Plain ``sqlite://`` and
``postgresql://`` URLs are mapped to the drivers acklane ships with.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ._dbconf import (
    DEFAULT_URL,
    SUPPORTED_SCHEMES,
    is_sqlite,
    is_sqlite_memory,
    offline_url_problem,
    sqlite_path_problem,
    unsupported_url,
)

__all__ = [
    "DEFAULT_URL",
    "SUPPORTED_SCHEMES",
    "async_engine",
    "create_schema",
    "is_sqlite",
    "is_sqlite_memory",
    "normalize_url",
    "offline_url_problem",
    "sqlite_path_problem",
    "sync_engine",
    "unsupported_url",
]

_SQLITE_PRAGMAS = (
    # First: switching a new database to WAL needs an exclusive lock, and several
    # processes opening it at once must wait for each other, not fail "locked".
    "PRAGMA busy_timeout=30000",
    "PRAGMA journal_mode=WAL",
    "PRAGMA synchronous=FULL",
    "PRAGMA foreign_keys=ON",
)


def normalize_url(url: str | URL, *, asynchronous: bool) -> URL:
    """Pick the driver for a plain URL: aiosqlite/pysqlite, psycopg (v3) for PostgreSQL."""
    u = make_url(url)
    backend = u.get_backend_name()
    if backend == "sqlite":
        return u.set(drivername="sqlite+aiosqlite" if asynchronous else "sqlite+pysqlite")
    if backend == "postgresql":
        return u.set(drivername="postgresql+psycopg")
    return u


def _install_sqlite_pragmas(sync_engine: Engine) -> None:
    @event.listens_for(sync_engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Runs on each new DBAPI connection, before any transaction is open (pysqlite
        # begins one implicitly only before DML), so journal_mode can change.
        cursor = dbapi_conn.cursor()
        for pragma in _SQLITE_PRAGMAS:
            cursor.execute(pragma)
        cursor.close()


def sync_engine(url: str | URL = DEFAULT_URL, **kwargs: Any) -> Engine:
    """A blocking engine (CLI, sync store API)."""
    u = normalize_url(url, asynchronous=False)
    engine = create_engine(u, **kwargs)
    if u.get_backend_name() == "sqlite":
        _install_sqlite_pragmas(engine)
    return engine


def async_engine(url: str | URL = DEFAULT_URL, **kwargs: Any) -> AsyncEngine:
    """An asyncio engine (the runner's event store and state stores)."""
    u = normalize_url(url, asynchronous=True)
    engine = create_async_engine(u, **kwargs)
    if u.get_backend_name() == "sqlite":
        _install_sqlite_pragmas(engine.sync_engine)
    return engine


async def create_schema(
    engine: AsyncEngine,
    create: Callable[[Connection], None],
    *,
    lock_key: int,
    table: str,
    log: logging.Logger,
    tries: int = 5,
) -> None:
    """Run ``create`` (a table's creation or migration) once, safe against other processes.

    Several processes may open one database at once. On PostgreSQL they take turns:
    a transaction-level advisory lock on ``lock_key`` (one value per table) is held
    until the transaction ends. On SQLite, and against processes of an older version
    that take no lock, two openers may both find the table missing: the statement
    that lost the race fails, the transaction is tried again (``tries`` in all, the
    race told at INFO on ``log``), and ``create`` then finds the work done, so it
    must check before it creates.
    """
    for attempt in range(1, tries + 1):
        try:
            async with engine.begin() as conn:
                if conn.dialect.name == "postgresql":
                    await conn.exec_driver_sql(
                        "SELECT pg_advisory_xact_lock(%(key)s)", {"key": lock_key}
                    )
                await conn.run_sync(create)
            return
        except DBAPIError as exc:
            if attempt == tries:
                raise
            log.info("creating %s raced with another process (%s); checking again", table, exc)
