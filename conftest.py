"""Fixtures shared by the unit tests: database URLs, each isolated per test.

- ``sqlite_url``: a SQLite file in the test's tmp_path.
- ``pg_url``: a fresh PostgreSQL schema per test on the local server (dropped
  after the test), reached through ``?options=-csearch_path=<schema>`` so the
  code under test needs no schema argument. Base URL: ``ACKLANE_TEST_PG_URL``
  (default ``postgresql://postgres@127.0.0.1:5432/test``). When the server is
  unreachable the test is skipped, except under CI (``CI`` set), where it fails.
- ``db_url``: parametrized over both, for tests that must hold on every backend.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

PG_BASE_URL = os.environ.get("ACKLANE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")


@pytest.fixture(scope="session")
def _pg_admin_available() -> str | None:
    """None when PostgreSQL answers, else why not."""
    try:
        import psycopg
    except ImportError as exc:  # pragma: no cover - psycopg is a dev dependency
        return f"psycopg is not installed: {exc}"
    try:
        with psycopg.connect(PG_BASE_URL, connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:
        return f"PostgreSQL at {PG_BASE_URL} is unreachable: {exc}"
    return None


@pytest.fixture
def pg_url(_pg_admin_available: str | None) -> Iterator[str]:
    """A PostgreSQL URL whose search_path is a schema made for this test alone."""
    if _pg_admin_available is not None:
        if os.environ.get("CI"):
            pytest.fail(_pg_admin_available)
        pytest.skip(_pg_admin_available)
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(PG_BASE_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in PG_BASE_URL else "?"
    try:
        yield f"{PG_BASE_URL}{sep}options={quote(f'-csearch_path={schema}', safe='')}"
    finally:
        with psycopg.connect(PG_BASE_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A SQLite database file of this test's own."""
    return f"sqlite:///{tmp_path / 'acklane.db'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest) -> str:
    """The same test on SQLite and on PostgreSQL."""
    name = "sqlite_url" if request.param == "sqlite" else "pg_url"
    url: str = request.getfixturevalue(name)
    return url
