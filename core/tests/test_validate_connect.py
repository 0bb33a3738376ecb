"""``acklane validate``: the store checks it makes offline, and ``--connect`` to the store.

Offline: the URL's scheme is one acklane opens, and a SQLite file's directory exists
(and is a directory, writable); reported like every other problem (file, line,
field, exit 2, in text and JSON). ``--connect``: the store is reached (SQLite and
PostgreSQL, good and bad), one line per check, exit 3 when a check fails, nothing
created. The brokers' checks are tested beside each connector.
"""

from __future__ import annotations

import json
import textwrap
import uuid
from pathlib import Path
from urllib.parse import quote

import pytest
from typer.testing import CliRunner

from acklane.core.cli.app import app
from acklane.core.config import ConfigError, load_config

runner = CliRunner()

PIPELINE = """\
store:
  url: "{url}"
streams:
  orders: {{connector: memory, topics: [orders]}}
watchers:
  - {{name: all, stream: orders}}
"""


def _config(tmp_path: Path, url: str) -> Path:
    path = tmp_path / "pipeline.yaml"
    path.write_text(PIPELINE.format(url=url))
    return path


def _json(tmp_path: Path, url: str, *options: str) -> tuple[int, dict[str, object]]:
    result = runner.invoke(
        app, ["validate", "--format", "json", *options, str(_config(tmp_path, url))]
    )
    return result.exit_code, json.loads(result.stdout)


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("mysql://root:pw@localhost/db", "mysql:// is not a database acklane supports"),
        ("postgres://u@localhost/db", "write postgresql://"),
        ("postgresql+asyncpg://u@localhost/db", "names a driver acklane does not use"),
    ],
)
def test_an_unsupported_store_url_is_a_problem_at_its_line(
    tmp_path: Path, url: str, words: str
) -> None:
    code, document = _json(tmp_path, url)
    assert code == 2
    (problem,) = document["problems"]  # type: ignore[misc]
    assert problem["line"] == 2
    assert problem["field"] == "store.url"
    assert words in problem["message"]
    assert "pw" not in json.dumps(document)


def test_a_sqlite_file_in_a_missing_directory_is_a_problem(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "dir"
    code, document = _json(tmp_path, f"sqlite:///{missing}/events.db")
    assert code == 2
    (problem,) = document["problems"]  # type: ignore[misc]
    assert (problem["line"], problem["field"]) == (2, "store.url")
    assert f"the directory {missing} does not exist" in problem["message"]
    # the text form names file, line and field too
    result = runner.invoke(app, ["validate", str(tmp_path / "pipeline.yaml")])
    assert result.exit_code == 2
    assert f"{tmp_path / 'pipeline.yaml'}:2: store.url:" in result.stderr
    assert not missing.exists()


def test_a_sqlite_directory_that_is_a_file_is_a_problem(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    code, document = _json(tmp_path, f"sqlite:///{tmp_path}/afile/events.db")
    assert code == 2
    assert "is not a directory" in document["problems"][0]["message"]  # type: ignore[index]


def test_offline_checks_are_reported_with_the_other_problems(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(
        textwrap.dedent(
            """\
            store:
              url: mysql://localhost/db
            engine: {ack_timeout: -1}
            streams:
              orders: {connector: memory, topics: [orders]}
            watchers:
              - {name: all, stream: orders}
            """
        )
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path, offline_checks=True)
    assert [p.path for p in caught.value.problems] == ["store.url", "engine.ack_timeout"]


def test_the_directory_check_is_validate_s_only(tmp_path: Path) -> None:
    # run, events and config show read the file without looking at this machine
    cfg = load_config(_config(tmp_path, f"sqlite:///{tmp_path}/missing/e.db"))
    assert cfg.store.url.endswith("missing/e.db")


# -- --connect: the store


def test_connect_to_a_sqlite_file_not_yet_created_creates_nothing(tmp_path: Path) -> None:
    db = tmp_path / "events.db"
    code, document = _json(tmp_path, f"sqlite:///{db}", "--connect")
    assert code == 0, document
    store, stream = document["checks"]  # type: ignore[misc]
    assert store["status"] == "ok" and store["setting"] == "store.url"
    assert "does not exist yet" in store["detail"]
    assert stream["status"] == "skipped"  # the in-process broker: nothing to reach
    assert document["connected"] is True
    assert not db.exists()


def test_connect_reads_an_existing_sqlite_store(tmp_path: Path) -> None:
    import sqlite3

    db = tmp_path / "events.db"
    sqlite3.connect(db).execute(
        "CREATE TABLE acklane_trigger_events (id INTEGER)"
    ).connection.close()
    result = runner.invoke(
        app, ["validate", "--connect", str(_config(tmp_path, f"sqlite:///{db}"))]
    )
    assert result.exit_code == 0, result.output
    assert "ok      store (store.url)" in result.stdout
    assert "table acklane_trigger_events read" in result.stdout


def test_connect_names_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    db = tmp_path / "events.db"
    db.write_text("this is not SQLite " * 100)
    result = runner.invoke(
        app, ["validate", "--connect", str(_config(tmp_path, f"sqlite:///{db}"))]
    )
    assert result.exit_code == 3, result.output
    assert "failed  store (store.url)" in result.stdout
    assert "file is not a database" in result.stdout


def test_connect_to_postgresql(tmp_path: Path, pg_url: str) -> None:
    code, document = _json(tmp_path, pg_url, "--connect")
    assert code == 0, document
    store = document["checks"][0]  # type: ignore[index]
    assert store["status"] == "ok"
    assert "does not exist yet, the user may create it" in store["detail"]


def test_connect_to_an_unreachable_postgresql_names_the_url_masked(tmp_path: Path) -> None:
    url = "postgresql://postgres:PgSecret99@127.0.0.1:1/test"
    result = runner.invoke(
        app, ["validate", "--connect", "--timeout", "3", str(_config(tmp_path, url))]
    )
    assert result.exit_code == 3, result.output
    line = next(x for x in result.stdout.splitlines() if x.startswith("failed"))
    assert "store (store.url): postgresql://postgres:***@127.0.0.1:1/test" in line
    assert "Connection refused" in line
    assert "PgSecret99" not in result.output


def test_connect_to_postgresql_as_a_user_who_may_not_create_the_table(
    tmp_path: Path, pg_url: str
) -> None:
    import psycopg

    from acklane.core.sql import normalize_url

    role = f"ro_{uuid.uuid4().hex[:8]}"
    admin = normalize_url(pg_url, asynchronous=False).set(drivername="postgresql")
    plain = admin.render_as_string(hide_password=False).split("?")[0]
    with psycopg.connect(plain, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{role}" LOGIN')
    try:
        schema = admin.query["options"].split("=", 1)[1]
        with psycopg.connect(plain, autocommit=True) as conn:
            conn.execute(f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"')
        url = admin.set(username=role).render_as_string(hide_password=False).split("?")[0]
        url += "?options=" + quote(f"-csearch_path={schema}", safe="")
        code, document = _json(tmp_path, url, "--connect")
        assert code == 3, document
        detail = document["checks"][0]["detail"]  # type: ignore[index]
        assert "may not create tables" in detail
    finally:
        with psycopg.connect(plain, autocommit=True) as conn:
            conn.execute(f'DROP OWNED BY "{role}"')
            conn.execute(f'DROP ROLE "{role}"')
