"""SQL engines shared by the event store and the state stores.

One URL names the database. SQLite is the embedded default (WAL journal, so
readers never block the writer and several processes on one machine can share
it); PostgreSQL serves several engine instances. Plain ``sqlite://`` and
``postgresql://`` URLs are mapped to the drivers acklane ships with.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

__all__ = ["DEFAULT_URL", "async_engine", "is_sqlite", "normalize_url", "sync_engine"]

DEFAULT_URL = "sqlite:///acklane.db"

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


def is_sqlite(url: str | URL) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


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
