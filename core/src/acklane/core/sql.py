"""SQL engines shared by the event store and the state stores.

One URL names the database. SQLite is the embedded default (WAL journal, so
readers never block the writer and several processes on one machine can share
it); PostgreSQL serves several engine instances. Plain ``sqlite://`` and
``postgresql://`` URLs are mapped to the drivers acklane ships with.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

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


#: The URL schemes acklane opens: the backend, and the drivers it may name.
SUPPORTED_SCHEMES = {
    "sqlite": ("aiosqlite", "pysqlite"),
    "postgresql": ("psycopg",),
}


def unsupported_url(url: str | URL) -> str | None:
    """Why acklane cannot open a database at ``url`` whatever is installed, or None.

    SQLite (the embedded default) and PostgreSQL, through the drivers acklane ships
    with (aiosqlite and pysqlite, psycopg 3); a plain ``sqlite://`` or
    ``postgresql://`` picks them.
    """
    scheme = make_url(url).drivername
    # (not URL.get_driver_name(): it loads the dialect, and fails for an unknown one)
    backend, _, driver = scheme.partition("+")
    if backend == "postgres":
        return f"{scheme}:// is not a scheme SQLAlchemy knows: write postgresql://"
    if backend not in SUPPORTED_SCHEMES:
        return (
            f"{scheme}:// is not a database acklane supports: use sqlite:///path/to/file.db "
            "(the default, embedded) or postgresql://user@host:5432/db"
        )
    drivers = SUPPORTED_SCHEMES[backend]
    if driver and driver not in drivers:
        plain = f"{backend}://"
        also = ", ".join(f"{backend}+{d}://" for d in drivers)
        return f"{scheme}:// names a driver acklane does not use: write {plain} (or {also})"
    return None


def sqlite_path_problem(database: str) -> str | None:
    """What keeps a SQLite database file from being opened for writing, or None."""
    path = Path(database).expanduser()
    directory = path.parent
    if path.is_dir():
        return f"{path} is a directory"
    if not directory.exists():
        return f"the directory {directory} does not exist"
    if not directory.is_dir():
        return f"{directory} is not a directory"
    if not os.access(directory, os.W_OK | os.X_OK):
        return f"the directory {directory} is not writable (SQLite writes its -wal file there)"
    if path.exists() and not os.access(path, os.R_OK | os.W_OK):
        return f"the file {path} is not readable and writable"
    return None


def is_sqlite_memory(url: str | URL) -> bool:
    """An in-memory SQLite database (``sqlite://``, ``:memory:``, ``mode=memory``)."""
    u = make_url(url)
    if u.drivername.partition("+")[0] != "sqlite":
        return False
    return u.database in (None, "", ":memory:") or u.query.get("mode") == "memory"


def offline_url_problem(url: str | URL) -> str | None:
    """What can be found wrong with a store URL without connecting, or None.

    The scheme (:func:`unsupported_url`); for SQLite, the file's directory exists and
    is writable (relative paths are taken from the working directory); for
    PostgreSQL, the driver is installed.
    """
    unsupported = unsupported_url(url)
    if unsupported is not None:
        return unsupported
    u = make_url(url)
    backend = u.drivername.partition("+")[0]
    if backend == "sqlite":
        if is_sqlite_memory(u) or not u.database:
            return None
        if u.database.startswith("file:"):
            return None  # a SQLite URI: its path is read by SQLite itself
        problem = sqlite_path_problem(u.database)
        return None if problem is None else f"SQLite database {u.database}: {problem}"
    if importlib.util.find_spec("psycopg") is None:
        return (
            "PostgreSQL needs the psycopg driver, which is not installed: "
            'pip install "acklane[postgres]"'
        )
    return None


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
