"""``acklane store``: JSON in, JSON out, against a URL or the store named in the YAML."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from acklane.core.cli.store import app
from acklane.core.stores import AssetStore, MetastoreBackend, TaskScope, TaskStore

runner = CliRunner()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """An existing SQLite store: the CLI refuses a file that does not exist."""
    url = f"sqlite:///{tmp_path / 'acklane.db'}"
    with MetastoreBackend(url) as backend:
        AssetStore("-", backend=backend).keys()
    return url


def store(*args: str, input: str | None = None) -> Any:
    """Run ``acklane store ARGS``; return the result."""
    return runner.invoke(app, list(args), input=input)


def ok(*args: str, input: str | None = None) -> Any:
    result = store(*args, input=input)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_set_then_get_round_trips_json_for_a_task_scope(db_url: str) -> None:
    written = ok("set", "job", '{"id": "j-1", "n": [1, 2.5]}', "--task", "d/r/t", "--url", db_url)
    assert written["value"] == {"id": "j-1", "n": [1, 2.5]}
    assert ok("get", "job", "--task", "d/r/t", "--url", db_url) == {"id": "j-1", "n": [1, 2.5]}
    with MetastoreBackend(db_url) as backend:
        assert TaskStore(TaskScope("d", "r", "t"), backend=backend).get("job") == {
            "id": "j-1",
            "n": [1, 2.5],
        }


def test_asset_writes_from_the_cli_are_recorded_as_api(db_url: str) -> None:
    written = ok("set", "watermark", "42", "--asset", "orders", "--url", db_url)
    assert (written["value"], written["writer"]) == (42, "api")
    with MetastoreBackend(db_url) as backend:
        entry = AssetStore("orders", backend=backend).entry("watermark")
    assert entry is not None and entry.writer == "api"


def test_a_mapped_task_scope_is_named_with_its_map_index(sqlite_url: str) -> None:
    ok("set", "k", "1", "--task", "d/r/t/2", "--url", sqlite_url)
    assert ok("list", "--task", "d/r/t/2", "--url", sqlite_url) == ["k"]
    assert ok("list", "--task", "d/r/t", "--url", sqlite_url) == []


def test_value_can_come_from_stdin(sqlite_url: str) -> None:
    ok("set", "k", "-", "--asset", "a", "--url", sqlite_url, input='{"from": "stdin"}')
    assert ok("get", "k", "--asset", "a", "--url", sqlite_url) == {"from": "stdin"}


def test_get_of_a_missing_key_exits_1_unless_a_default_is_given(sqlite_url: str) -> None:
    result = store("get", "nope", "--asset", "a", "--url", sqlite_url)
    assert result.exit_code == 1
    assert "key 'nope' not found" in result.stderr
    assert ok("get", "nope", "--asset", "a", "--url", sqlite_url, "--default", "0") == 0


def test_list_long_shows_values_times_and_expiry(sqlite_url: str) -> None:
    ok("set", "b", '"x"', "--task", "d/r/t", "--url", sqlite_url, "--retention", "never")
    ok("set", "a", "1", "--task", "d/r/t", "--url", sqlite_url, "--retention", "2h")
    entries = ok("list", "--long", "--task", "d/r/t", "--url", sqlite_url)
    assert [(e["key"], e["value"]) for e in entries] == [("a", 1), ("b", "x")]
    assert entries[0]["expires_at"] is not None and entries[1]["expires_at"] is None


def test_delete_and_clear_report_what_they_removed(db_url: str) -> None:
    for key in ("a", "b", "c"):
        ok("set", key, "1", "--task", "d/r/t", "--url", db_url)
    assert ok("delete", "a", "--task", "d/r/t", "--url", db_url) == {"key": "a", "deleted": True}
    assert ok("delete", "a", "--task", "d/r/t", "--url", db_url) == {"key": "a", "deleted": False}
    assert ok("clear", "--task", "d/r/t", "--url", db_url) == {"cleared": 2}
    assert ok("list", "--task", "d/r/t", "--url", db_url) == []


def test_gc_dry_run_counts_and_gc_removes(db_url: str) -> None:
    ok("set", "k", "1", "--asset", "gone", "--url", db_url)
    assert ok("deactivate", "--asset", "gone", "--url", db_url) == {
        "asset": "gone",
        "active": False,
    }
    assert ok("gc", "--dry-run", "--url", db_url)["asset_keys"] == 1
    assert ok("gc", "--url", db_url)["asset_keys"] == 1
    assert ok("gc", "--dry-run", "--url", db_url)["asset_keys"] == 0
    assert ok("activate", "--asset", "gone", "--url", db_url) == {"asset": "gone", "active": True}


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["set", "k", "[1, NaN]", "--task", "d/r/t"], "VALUE is not JSON text: NaN is not JSON"),
        (["set", "k", "{oops", "--task", "d/r/t"], "VALUE is not JSON text"),
        (["set", "k", "null", "--task", "d/r/t"], "None cannot be stored"),
        (["set", "", "1", "--task", "d/r/t"], "must not be empty"),
        (["set", "k", "1", "--asset", "a", "--retention", "1h"], "task store only"),
        (["set", "k", "1", "--task", "d/r/t", "--retention", "soon"], "--retention 'soon'"),
        (["get", "k"], "name one scope"),
        (["get", "k", "--task", "d/r/t", "--asset", "a"], "name one scope"),
        (["get", "k", "--task", "d/r"], "expected DAG/RUN/TASK"),
    ],
)
def test_bad_input_is_refused_with_exit_2_and_nothing_written(
    sqlite_url: str, args: list[str], fragment: str
) -> None:
    result = store(*args, "--url", sqlite_url)
    assert result.exit_code == 2
    assert fragment in result.stderr
    assert ok("list", "--task", "d/r/t", "--url", sqlite_url) == []


def test_the_store_must_be_named() -> None:
    result = store("list", "--asset", "a")
    assert result.exit_code == 2
    assert "CONFIG" in result.stderr and "--url URL" in result.stderr


def _config(tmp_path: Path, url: str, state: str = "") -> Path:
    path = tmp_path / "acklane.yaml"
    path.write_text(
        f"store:\n  url: {json.dumps(url)}\n"
        f"{state}"
        "streams:\n  orders: {connector: memory, topics: [orders]}\n"
        "watchers:\n  - {name: w, stream: orders, asset: orders}\n",
        encoding="utf-8",
    )
    return path


def test_the_store_named_in_the_yaml_is_used(tmp_path: Path, sqlite_url: str) -> None:
    config = _config(tmp_path, sqlite_url, "state:\n  default_retention_days: 1\n")
    ok("set", str(config), "k", "1", "--task", "d/r/t")
    assert ok("get", "k", "--task", "d/r/t", "--url", sqlite_url) == 1
    entry = ok("list", str(config), "-l", "--task", "d/r/t")[0]
    assert entry["expires_at"] is not None


def test_the_yamls_offload_dir_is_used(tmp_path: Path, sqlite_url: str) -> None:
    offload = tmp_path / "offload"
    config = _config(
        tmp_path,
        sqlite_url,
        f"state:\n  offload_dir: {json.dumps(str(offload))}\n  offload_threshold_bytes: 10\n",
    )
    ok("set", str(config), "big", json.dumps("x" * 100), "--asset", "a")
    assert list(offload.rglob("*.json"))
    assert ok("get", str(config), "big", "--asset", "a") == "x" * 100


def test_a_bad_configuration_is_reported_with_its_file(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("state:\n  max_value_byte: 3\n", encoding="utf-8")
    result = store("list", str(config), "--asset", "a")
    assert result.exit_code == 2
    assert str(config) in result.stderr


def test_a_missing_sqlite_file_is_an_error_and_stays_missing(tmp_path: Path) -> None:
    typo = tmp_path / "typo.db"
    for args in (["list", "--asset", "a"], ["get", "k", "--task", "d/r/t"], ["gc"]):
        result = store(*args, "--url", f"sqlite:///{typo}")
        assert result.exit_code == 2, result.output
        assert f"no SQLite database at {typo}" in result.stderr
    assert not typo.exists()
    ok("set", "k", "1", "--asset", "a", "--url", f"sqlite:///{typo}", "--create")
    assert ok("get", "k", "--asset", "a", "--url", f"sqlite:///{typo}") == 1


def test_a_database_password_never_shows_in_an_error() -> None:
    url = "postgresql://acklane:Pa55w0rd-in-url@127.0.0.1:1/acklane"
    result = store("list", "--asset", "a", "--url", url)
    assert result.exit_code == 2
    assert "Pa55w0rd" not in result.output
    assert "acklane:***@127.0.0.1:1" in result.stderr


def test_config_reads_only_the_store_section(tmp_path: Path, sqlite_url: str) -> None:
    config = (
        _config(tmp_path, sqlite_url)
        .read_text()
        .replace("topics: [orders]", 'topics: [orders], broker: "${UNSET_BROKER_PASSWORD}"')
    )
    (tmp_path / "acklane.yaml").write_text(config)
    assert ok("list", str(tmp_path / "acklane.yaml"), "--asset", "a") == []
