"""``acklane run`` with an event store it cannot open: one line, exit 1, no traceback.

The line names the URL (password masked) and the setting (``store.url``) and says
why (the missing directory, the refused connection); the traceback is written only
at DEBUG. Before: "raced with another process" four times, then a traceback that
named neither the path nor the setting. A store URL acklane cannot use at all is a
configuration problem (exit 2, file:line: store.url).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

PIPELINE = """\
store:
  url: "{url}"
engine: {{shutdown_timeout: 5}}
streams:
  orders: {{connector: memory, topics: [orders]}}
watchers:
  - {{name: all, stream: orders}}
"""


def _run(tmp_path: Path, url: str, *options: str) -> tuple[int, str]:
    cfg = tmp_path / "pipeline.yaml"
    cfg.write_text(PIPELINE.format(url=url))
    proc = subprocess.run(
        [sys.executable, "-m", "acklane.core.cli", *options, "run", str(cfg)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "ACKLANE_LOG_FORMAT": "text", "COLUMNS": "200"},
    )
    return proc.returncode, proc.stdout + proc.stderr


def _errors(out: str) -> list[str]:
    return [line for line in out.splitlines() if " ERROR " in line]


def test_a_sqlite_file_in_a_missing_directory_is_one_line_and_exit_1(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "dir"
    code, out = _run(tmp_path, f"sqlite:///{missing}/events.db")
    assert code == 1, out
    (line,) = _errors(out)
    assert f"cannot open the event store sqlite:///{missing}/events.db (store.url)" in line
    assert f"the directory {missing} does not exist" in line
    assert "Traceback" not in out
    assert "raced with another process" not in out
    assert len(out.splitlines()) <= 3, out  # starting, the error (and nothing else)
    assert not missing.exists()


def test_the_traceback_is_there_at_debug(tmp_path: Path) -> None:
    code, out = _run(tmp_path, f"sqlite:///{tmp_path}/nope/events.db", "--log-level", "DEBUG")
    assert code == 1
    assert "Traceback" in out
    assert len(_errors(out)) == 1


def test_an_unreachable_postgresql_is_one_line_with_the_password_masked(tmp_path: Path) -> None:
    code, out = _run(tmp_path, "postgresql://postgres:PgSecret99@127.0.0.1:1/test")
    assert code == 1, out
    (line,) = _errors(out)
    assert "cannot open the event store postgresql://postgres:***@127.0.0.1:1/test" in line
    assert "(store.url)" in line
    assert "Connection refused" in line
    assert "PgSecret99" not in out
    assert "Traceback" not in out


def test_a_postgresql_login_refused_names_the_role(tmp_path: Path, pg_url: str) -> None:
    code, out = _run(tmp_path, "postgresql://no_such_role_xyz@127.0.0.1:5432/test")
    if "Connection refused" in out:
        pytest.skip("PostgreSQL is not on 127.0.0.1:5432")
    assert code == 1, out
    (line,) = _errors(out)
    assert 'role "no_such_role_xyz" does not exist' in line
    assert "Traceback" not in out


def test_an_unsupported_scheme_is_a_configuration_problem(tmp_path: Path) -> None:
    code, out = _run(tmp_path, "mysql://root:Sekr1t@localhost/db")
    assert code == 2, out
    assert "pipeline.yaml:2: store.url: mysql:// is not a database acklane supports" in out
    assert "Traceback" not in out
    assert "Sekr1t" not in out


async def test_a_store_that_fails_while_running_is_told_once_per_outage(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from sqlalchemy.exc import OperationalError

    from acklane.core.events import EventRecord, EventStore

    failures = 4

    async def flaky(_conn: object) -> None:
        nonlocal failures
        if failures:
            failures -= 1
            raise OperationalError("INSERT", {}, Exception("database is locked"))

    caplog.set_level("DEBUG", logger="acklane.core.events")
    async with EventStore(f"sqlite:///{tmp_path}/e.db", commit_interval=0) as store:
        store.retry_initial_delay = store.retry_max_delay = 0.01
        store.before_commit = flaky
        await store.put(EventRecord("w", "k", {"n": 1}, "m1", 0))
        await store.flush()
    ours = [r for r in caplog.records if r.name == "acklane.core.events"]
    warnings = [r for r in ours if r.levelname == "WARNING"]
    assert len(warnings) == 1, [r.getMessage() for r in ours]
    assert "database is locked" in warnings[0].getMessage()
    assert [r.getMessage() for r in ours if "writable again" in r.getMessage()] == [
        f"event store sqlite:///{tmp_path}/e.db: writable again; the batch was committed at "
        "attempt 5"
    ]
