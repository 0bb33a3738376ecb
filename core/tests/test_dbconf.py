"""Store URLs read without SQLAlchemy agree with SQLAlchemy's own ``make_url``."""

from __future__ import annotations

import pytest
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

# url_parts is the reader under test (what the public checks are built on); no public name
from acklane.core._dbconf import url_parts
from acklane.core.sql import is_sqlite_memory, offline_url_problem, unsupported_url

URLS = [
    "sqlite:///acklane.db",
    "sqlite://",
    "sqlite:///",
    "sqlite:///:memory:",
    "sqlite:////abs/path/x.db",
    "sqlite:///file:x?mode=memory&uri=true",
    "sqlite+aiosqlite:///x.db",
    "sqlite+pysqlite:///x.db?timeout=5",
    "sqlite:///a%20b.db",  # percent-escaped: SQLAlchemy decides
    "sqlite://relative.db",
    "postgresql://u:p@h:5432/db",
    "postgresql://u@h/db?sslmode=require",
    "postgresql://u@h/db?options=a&options=b",
    "postgresql+psycopg://h",
    "postgresql://[::1]:5432/db",
    "postgresql://u:p%40ss@h/db",
    "postgresql://u:p@ss@h/db",
    "postgres://x",
    "mysql://a@b/c",
    "postgresql://user:pa:ss@host/db",
]


@pytest.mark.parametrize("url", URLS)
def test_the_parts_are_sqlalchemys(url: str) -> None:
    parsed = make_url(url)
    parts = url_parts(url)
    assert parts.drivername == parsed.drivername
    assert parts.database == parsed.database
    assert parts.query == dict(parsed.query)


@pytest.mark.parametrize(
    "url", ["postgresql://h:abc/db", "postgresql://h:/db", "notaurl", "://x", "sqlite:/x.db"]
)
def test_what_sqlalchemy_refuses_is_refused(url: str) -> None:
    with pytest.raises((ValueError, ArgumentError)):
        make_url(url)
    with pytest.raises(ValueError):
        url_parts(url)


def test_the_checks_read_the_parts() -> None:
    assert is_sqlite_memory("sqlite://")
    assert is_sqlite_memory("sqlite:///file:x?mode=memory&uri=true")
    assert not is_sqlite_memory("sqlite:///x.db")
    assert not is_sqlite_memory("postgresql://h/db")
    assert unsupported_url("postgres://x") is not None
    assert unsupported_url("postgresql+asyncpg://h/db") is not None
    assert unsupported_url("sqlite+aiosqlite:///x.db") is None
    assert offline_url_problem("sqlite:////no/such/dir/x.db") is not None
    assert offline_url_problem("sqlite:///:memory:") is None
