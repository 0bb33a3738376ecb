"""Retention: store.retention prunes old trigger events while running, and
``acklane events prune`` does it by hand; on SQLite and on PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import textwrap
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from runner_harness import all_committed, run_until
from sqlalchemy import text, update
from typer.testing import CliRunner

from acklane.connectors.memory import MemoryBroker
from acklane.core.cli.events import app as events_cli
from acklane.core.config import ConfigError, StoreSettings, parse_config
from acklane.core.durations import format_duration, parse_duration
from acklane.core.events import (
    DEFAULT_RETENTION,
    TABLE_NAME,
    EventRecord,
    EventStore,
    cutoff_for,
    events_table,
)
from acklane.core.pipeline.runner import Runner
from acklane.core.sql import is_sqlite, sync_engine

CREATED_AT_INDEX = f"{TABLE_NAME}_created_at"
cli = CliRunner()


def rec(n: int, *, trigger: str = "t", message_id: str | None = "auto") -> EventRecord:
    mid = f"orders/0/{n}" if message_id == "auto" else message_id
    return EventRecord(trigger, '["memory","k"]', {"n": n}, mid, 0)


async def _afill(url: str, records: Sequence[EventRecord]) -> None:
    async with EventStore(url) as store:
        for r in records:
            await store.put(r)


def _fill(url: str, records: Sequence[EventRecord]) -> None:
    asyncio.run(_afill(url, records))


def _age(url: str, ns: Sequence[int], age: timedelta) -> None:
    """Make the events of payload ``n`` in ``ns`` look ``age`` old."""
    when = datetime.now(UTC) - age
    if is_sqlite(url):
        when = when.replace(tzinfo=None)  # the naive UTC text the writer stores
    engine = sync_engine(url)
    try:
        with engine.begin() as conn:
            for n in ns:
                conn.execute(
                    update(events_table)
                    .where(events_table.c.message_id == f"orders/0/{n}")
                    .values(created_at=when)
                )
    finally:
        engine.dispose()


def _stored_ns(url: str) -> list[int]:
    engine = sync_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text(f"SELECT payload FROM {TABLE_NAME} ORDER BY id")).all()
    finally:
        engine.dispose()
    return [json.loads(payload)["n"] for (payload,) in rows]


def _index_names(url: str) -> set[str]:
    engine = sync_engine(url)
    try:
        with engine.connect() as conn:
            if is_sqlite(url):
                rows = conn.exec_driver_sql(
                    "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ?",
                    (TABLE_NAME,),
                )
            else:
                rows = conn.exec_driver_sql(
                    "SELECT indexname FROM pg_indexes "
                    "WHERE schemaname = current_schema() AND tablename = %(t)s",
                    {"t": TABLE_NAME},
                )
            return {str(name) for (name,) in rows}
    finally:
        engine.dispose()


# -- durations and the configuration ---------------------------------------------------


@pytest.mark.parametrize(
    ("given", "seconds"),
    [(90, 90.0), (1.5, 1.5), ("90", 90.0), ("90s", 90.0), ("15m", 900.0), ("12h", 43200.0),
     ("7d", 604800.0), ("1.5d", 129600.0), ("2w", 1209600.0), (" 3 H ", 10800.0)],
)  # fmt: skip
def test_a_duration_is_seconds_or_a_number_with_a_unit(given: object, seconds: float) -> None:
    assert parse_duration(given) == seconds


@pytest.mark.parametrize("given", ["7x", "d", "", "-1d", -5, True, float("nan"), [1], "1e3"])
def test_what_is_not_a_duration_is_refused_saying_what_is_expected(given: object) -> None:
    with pytest.raises(ValueError, match="expected a duration"):
        parse_duration(given)


def test_format_duration_picks_the_largest_round_unit() -> None:
    assert [format_duration(s) for s in (1209600, 604800, 43200, 5400, 90, 45)] == [
        "2w",
        "1w",
        "12h",
        "1.5h",
        "1.5m",
        "45s",
    ]


def test_store_retention_accepts_durations_null_and_defaults_to_fourteen_days() -> None:
    assert StoreSettings().retention == DEFAULT_RETENTION == 14 * 86400
    assert StoreSettings(retention="7d").retention == 7 * 86400
    assert StoreSettings(retention=3600).retention == 3600
    assert StoreSettings(retention=None).retention is None
    assert StoreSettings(prune_interval="30m").prune_interval == 1800


def test_a_bad_retention_is_reported_with_file_line_and_field() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(
            "store:\n  url: sqlite:///x.db\n  retention: 7x\n  prune_interval: 0\n"
            "streams: {s: {connector: memory, topics: [t]}}\n"
            "watchers: [{name: w, stream: s}]\n",
            source="p.yaml",
        )
    problems = {p.path: (p.line, p.message) for p in info.value.problems}
    assert problems["store.retention"][0] == 3
    assert "'12h' or '7d'" in problems["store.retention"][1]
    assert problems["store.prune_interval"][0] == 4


# -- pruning in the store --------------------------------------------------------------


async def test_prune_deletes_only_what_is_older_than_the_cutoff_in_batches(db_url: str) -> None:
    await _afill(db_url, [rec(n) for n in range(12)])
    _age(db_url, range(7), timedelta(days=3))
    batches: list[int] = []
    async with EventStore(db_url) as store:
        cutoff = cutoff_for(2 * 86400)
        assert await store.count_older_than(cutoff) == 7
        assert await store.prune(cutoff, batch_size=3, on_batch=batches.append) == 7
        assert store.stats.pruned == 7
        assert await store.count_older_than(cutoff) == 0
        assert await store.prune(cutoff) == 0
    assert batches == [3, 3, 1]
    assert _stored_ns(db_url) == list(range(7, 12))


async def test_a_pruned_message_that_comes_again_is_stored_again(db_url: str) -> None:
    """The documented price of a retention shorter than redelivery: a duplicate."""
    await _afill(db_url, [rec(1)])
    _age(db_url, [1], timedelta(days=30))
    async with EventStore(db_url) as store:
        assert await store.prune(cutoff_for(DEFAULT_RETENTION)) == 1
        await store.put(rec(1))  # the broker redelivers message 1
        await store.flush()
        assert store.stats.inserted == 1
    assert _stored_ns(db_url) == [1]


async def test_opening_a_store_adds_the_created_at_index_when_missing(db_url: str) -> None:
    await _afill(db_url, [rec(1)])
    assert CREATED_AT_INDEX in _index_names(db_url)
    engine = sync_engine(db_url)
    try:
        with engine.begin() as conn:
            conn.execute(text(f"DROP INDEX {CREATED_AT_INDEX}"))
    finally:
        engine.dispose()
    assert CREATED_AT_INDEX not in _index_names(db_url)
    async with EventStore(db_url) as store:
        assert await store.count() == 1
    assert CREATED_AT_INDEX in _index_names(db_url)


# -- the runner prunes while it runs ---------------------------------------------------


def _runner_config(url: str, broker: str, retention: str) -> str:
    return textwrap.dedent(
        f"""\
        engine: {{shutdown_timeout: 5, progress_interval: 0}}
        store: {{url: "{url}", retention: {retention}, prune_interval: 0.05}}
        streams:
          orders: {{connector: memory, broker: {broker}, topics: [orders], group_id: g,
                    partitions: 1, poll_interval: 0.02}}
        watchers:
          - {{name: w, stream: orders, filter: {{emit: {{n: body.n}}}}}}
        """
    )


async def test_the_runner_prunes_events_older_than_store_retention(
    db_url: str, broker: MemoryBroker
) -> None:
    await _afill(db_url, [rec(n, trigger="w") for n in range(100, 105)])
    _age(db_url, range(100, 103), timedelta(hours=3))
    for n in range(3):
        broker.publish("orders", json.dumps({"n": n}).encode())
    cfg = parse_config(_runner_config(db_url, broker.name, "2h"), source="r.yaml")
    runner = Runner(cfg, handle_signals=False)

    def done() -> bool:
        store = runner._store
        return all_committed(broker) and store is not None and store.stats.pruned >= 3

    await run_until(runner, done)
    assert sorted(_stored_ns(db_url)) == [0, 1, 2, 103, 104]


async def test_a_null_retention_keeps_every_event(sqlite_url: str, broker: MemoryBroker) -> None:
    await _afill(sqlite_url, [rec(n, trigger="w") for n in range(100, 103)])
    _age(sqlite_url, range(100, 103), timedelta(days=400))
    broker.publish("orders", b'{"n": 0}')
    cfg = parse_config(_runner_config(sqlite_url, broker.name, "null"), source="r.yaml")
    runner = Runner(cfg, handle_signals=False)
    await run_until(runner, lambda: all_committed(broker))
    assert not any(t.get_name() == "acklane-retention" for t in asyncio.all_tasks())
    assert sorted(_stored_ns(sqlite_url)) == [0, 100, 101, 102]


# -- acklane events prune --------------------------------------------------------------


def test_cli_prune_dry_run_counts_and_deletes_nothing(db_url: str) -> None:
    _fill(db_url, [rec(n) for n in range(6)])
    _age(db_url, range(4), timedelta(days=10))
    result = cli.invoke(events_cli, ["prune", "--url", db_url, "--older-than", "7d", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "would delete 4 event(s)" in result.stdout
    assert "older than 1w" in result.stdout
    assert _stored_ns(db_url) == list(range(6))


def test_cli_prune_deletes_what_is_older_and_says_how_many(db_url: str) -> None:
    _fill(db_url, [rec(n) for n in range(6)])
    _age(db_url, range(4), timedelta(days=10))
    _age(db_url, [4], timedelta(days=5))
    result = cli.invoke(
        events_cli, ["prune", "--url", db_url, "--older-than", "7d", "--batch-size", "2"]
    )
    assert result.exit_code == 0, result.output
    assert "deleted 4 event(s)" in result.stdout
    assert _stored_ns(db_url) == [4, 5]
    again = cli.invoke(events_cli, ["prune", "--url", db_url, "--older-than", "1d"])
    assert "deleted 1 event(s)" in again.stdout
    assert _stored_ns(db_url) == [5]


def test_cli_prune_takes_store_retention_from_the_config_and_no_broker_secret(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fill(sqlite_url, [rec(n) for n in range(3)])
    _age(sqlite_url, [0], timedelta(hours=30))
    _age(sqlite_url, [1], timedelta(hours=20))
    config = tmp_path / "p.yaml"
    config.write_text(
        f'store: {{url: "{sqlite_url}", retention: 1d}}\n'
        "streams:\n  s:\n    connector: sqs\n    queue_url: x\n"
        "    aws_secret_access_key: ${AWS_SECRET}\n"
        "watchers: [{name: w, stream: s}]\n"
    )
    monkeypatch.delenv("AWS_SECRET", raising=False)
    result = cli.invoke(events_cli, ["prune", str(config)])
    assert result.exit_code == 0, result.output
    assert "deleted 1 event(s)" in result.stdout and "older than 1d" in result.stdout
    assert _stored_ns(sqlite_url) == [1, 2]


def test_cli_prune_refuses_a_null_retention_without_older_than(
    sqlite_url: str, tmp_path: Path
) -> None:
    _fill(sqlite_url, [rec(0)])
    _age(sqlite_url, [0], timedelta(days=999))
    config = tmp_path / "p.yaml"
    config.write_text(f'store: {{url: "{sqlite_url}", retention: null}}\n')
    result = cli.invoke(events_cli, ["prune", str(config)])
    assert result.exit_code == 1
    assert "store.retention is null" in result.output
    assert _stored_ns(sqlite_url) == [0]


@pytest.mark.parametrize("bad", ["soon", "0", "0d"])
def test_cli_prune_refuses_a_bad_or_zero_window(sqlite_url: str, bad: str) -> None:
    _fill(sqlite_url, [rec(0)])
    result = cli.invoke(events_cli, ["prune", "--url", sqlite_url, "--older-than", bad])
    assert result.exit_code == 1
    assert "--older-than" in result.output
    assert _stored_ns(sqlite_url) == [0]


def test_cli_prune_never_creates_a_database(tmp_path: Path) -> None:
    path = tmp_path / "nope.db"
    result = cli.invoke(events_cli, ["prune", "--url", f"sqlite:///{path}", "--older-than", "1d"])
    assert result.exit_code == 1
    assert "no SQLite database" in result.output
    assert not path.exists()


def test_cli_prune_shows_a_progress_bar_on_a_terminal_for_a_large_prune(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import io

    from rich.console import Console

    from acklane.core.cli import events as cli_events

    _fill(sqlite_url, [rec(n) for n in range(9)])
    _age(sqlite_url, range(9), timedelta(days=30))
    screen = io.StringIO()
    monkeypatch.setattr(cli_events, "_err", Console(file=screen, force_terminal=True, width=80))
    result = cli.invoke(
        events_cli, ["prune", "--url", sqlite_url, "--older-than", "7d", "--batch-size", "2"]
    )
    assert result.exit_code == 0, result.output
    assert "deleted 9 event(s)" in result.stdout
    assert "pruning" in screen.getvalue()
    assert _stored_ns(sqlite_url) == []
