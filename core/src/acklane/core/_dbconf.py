"""What the configuration knows of the event store's database, without SQLAlchemy.

``acklane validate`` checks a store URL and never opens it: importing SQLAlchemy for
that (about a third of a second with bytecode, more without) would be most of the
command's time. A URL of the plain shapes acklane documents (``sqlite:///path``,
``postgresql://user:password@host:port/db?query``, with or without a driver) is read
here with the standard library; any other string (percent-escapes, IPv6 hosts, odd
ports, what does not parse) goes to SQLAlchemy's own ``make_url``, which decides, so
that what is accepted here is exactly what ``acklane run`` accepts.
:mod:`acklane.core.sql` re-exports these for code that has SQLAlchemy loaded anyway.
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import parse_qs

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

__all__ = [
    "DEFAULT_RETENTION",
    "DEFAULT_URL",
    "SUPPORTED_SCHEMES",
    "UrlParts",
    "is_sqlite",
    "is_sqlite_memory",
    "offline_url_problem",
    "sqlite_path_problem",
    "sqlite_url_from",
    "unsupported_url",
    "url_parts",
]

DEFAULT_URL = "sqlite:///acklane.db"
#: ``store.retention``'s default, in seconds: 14 days, as long as SQS keeps a message
#: at most, and longer than Kafka's and Pub/Sub's default retention (7 days).
DEFAULT_RETENTION = 14 * 86400.0

#: The URL schemes acklane opens: the backend, and the drivers it may name.
SUPPORTED_SCHEMES = {
    "sqlite": ("aiosqlite", "pysqlite"),
    "postgresql": ("psycopg",),
}

#: scheme://rest?query of the plain shapes (no percent-escape anywhere: see the module).
_PLAIN = re.compile(
    r"(?P<scheme>[A-Za-z][\w]*(?:\+\w+)?)://(?P<rest>[^?%]*)(?:\?(?P<query>[^%]*))?"
)
#: user[:password]@ of an authority, then host[:port] (no IPv6 brackets).
_AUTHORITY = re.compile(r"(?:[^:/@]*(?::[^@/]*)?@)?(?P<host>[^/:@\[\]]*)(?::(?P<port>\d+))?")


class UrlParts(NamedTuple):
    """The parts of a store URL acklane reads: as SQLAlchemy's ``URL`` has them."""

    drivername: str
    database: str | None
    query: dict[str, Any]


def _plain_parts(url: str) -> UrlParts | None:
    """The parts of a URL of the plain shapes, or None for anything else."""
    matched = _PLAIN.fullmatch(url)
    if matched is None:
        return None
    rest = matched["rest"]
    authority, slash, database = rest.partition("/")
    if not _AUTHORITY.fullmatch(authority):
        return None
    query: dict[str, Any] = {}
    for key, values in parse_qs(matched["query"] or "", keep_blank_values=True).items():
        query[key] = values[0] if len(values) == 1 else tuple(values)
    return UrlParts(matched["scheme"], database if slash else None, query)


def url_parts(url: str | URL) -> UrlParts:
    """``url``'s scheme, database and query; ``ValueError`` with SQLAlchemy's words
    when SQLAlchemy cannot parse it."""
    if not isinstance(url, str):
        return UrlParts(url.drivername, url.database, dict(url.query))
    plain = _plain_parts(url)
    if plain is not None:
        return plain
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise ValueError(str(exc)) from exc
    return url_parts(parsed)


def unsupported_url(url: str | URL) -> str | None:
    """Why acklane cannot open a database at ``url`` whatever is installed, or None.

    SQLite (the embedded default) and PostgreSQL, through the drivers acklane ships
    with (aiosqlite and pysqlite, psycopg 3); a plain ``sqlite://`` or
    ``postgresql://`` picks them.
    """
    scheme = url_parts(url).drivername
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


def sqlite_url_from(url: str, folder: Path) -> str:
    """``url`` with a relative SQLite file path made absolute from ``folder`` (the
    configuration file's directory, as ``schema:`` paths are); any other URL as it is.

    So that every command reading one configuration opens the same database wherever
    it is run from (docs/configuration.md, ``store.url``).
    """
    try:
        parts = url_parts(url)
    except ValueError:
        return url  # the model reports it
    database = parts.database
    if (
        parts.drivername.partition("+")[0] != "sqlite"
        or not database
        or database == ":memory:"
        or database.startswith("file:")
        or Path(database).expanduser().is_absolute()
        or is_sqlite_memory(url)
    ):
        return url
    absolute = str(folder / Path(database).expanduser())
    if _plain_parts(url) is not None:
        head, mark, query = url.partition("?")
        return head[: len(head) - len(database)] + absolute + mark + query
    from sqlalchemy.engine import make_url

    return make_url(url).set(database=absolute).render_as_string(hide_password=False)


def is_sqlite(url: str | URL) -> bool:
    return url_parts(url).drivername.partition("+")[0] == "sqlite"


def is_sqlite_memory(url: str | URL) -> bool:
    """An in-memory SQLite database (``sqlite://``, ``:memory:``, ``mode=memory``)."""
    return _in_memory(url_parts(url))


def _in_memory(parts: UrlParts) -> bool:
    if parts.drivername.partition("+")[0] != "sqlite":
        return False
    return parts.database in (None, "", ":memory:") or parts.query.get("mode") == "memory"


def offline_url_problem(url: str | URL) -> str | None:
    """What can be found wrong with a store URL without connecting, or None.

    The scheme (:func:`unsupported_url`); for SQLite, the file's directory exists and
    is writable (relative paths are taken from the working directory); for
    PostgreSQL, the driver is installed.
    """
    unsupported = unsupported_url(url)
    if unsupported is not None:
        return unsupported
    parts = url_parts(url)
    backend = parts.drivername.partition("+")[0]
    if backend == "sqlite":
        database = parts.database
        if _in_memory(parts) or not database:
            return None
        if database.startswith("file:"):
            return None  # a SQLite URI: its path is read by SQLite itself
        problem = sqlite_path_problem(database)
        return None if problem is None else f"SQLite database {database}: {problem}"
    if importlib.util.find_spec("psycopg") is None:
        return (
            "PostgreSQL needs the psycopg driver, which is not installed: "
            'pip install "acklane[postgres]"'
        )
    return None
