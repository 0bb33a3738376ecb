"""Pipelines sharing one event store: two configurations with the same stream, watcher
and sink names on one SQLite file or one PostgreSQL database never see, deliver, prune
or count each other's events; a store written before pipelines existed migrates in
place, its rows the default pipeline's.

Every store test runs on SQLite and on PostgreSQL (``db_url``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from runner_harness import all_committed, run_until
from sink_functions import RECEIVED, RECEIVED_OTHER
from sqlalchemy import text
from typer.testing import CliRunner

from acklane.connectors.memory import MemoryBroker
from acklane.core.cli.app import app
from acklane.core.config import ConfigError, load_config, load_store_config, parse_config
from acklane.core.events import EventRecord, EventStore
from acklane.core.events.attempts import AttemptStore
from acklane.core.pipeline.runner import Runner
from acklane.core.sinks import sink_status

# a sink's outbox driven step by step (lease, take, settle): no sink runs it so exactly
from acklane.core.sinks._outbox import Failure, Outbox
from acklane.core.sql import async_engine, is_sqlite, sync_engine

pytestmark = pytest.mark.timeout(60)

# A safety net against hangs, never a measure of speed.
SAFETY = 30.0

KEY = '["acklane","memory","b",["orders"],"g"]'
LATER = datetime.now(UTC) + timedelta(days=1)  # a cutoff every stored row is older than


def rec(message_id: str | None, payload: object, *, position: int = 0) -> EventRecord:
    return EventRecord("big", KEY, payload, message_id, position)


# -- the store: events, sinks, retention, poison counts -----------------------------------


async def test_two_pipelines_store_and_read_only_their_own_events(db_url: str) -> None:
    async with (
        EventStore(db_url, pipeline="alpha") as alpha,
        EventStore(db_url, pipeline="beta") as beta,
    ):
        # the very same message (trigger, stream, id, position) in both pipelines
        await alpha.put(rec("orders/0/1", {"from": "alpha"}))
        await beta.put(rec("orders/0/1", {"from": "beta"}))
        await beta.put(rec("orders/0/2", {"from": "beta"}))
        await alpha.flush()
        await beta.flush()
        # neither took the other's row for a redelivery
        assert (alpha.stats.inserted, beta.stats.inserted) == (1, 2)
        assert [e.payload for e in await alpha.list_events()] == [{"from": "alpha"}]
        assert [e.payload["from"] for e in await beta.list_events()] == ["beta", "beta"]
        assert (await alpha.count(), await beta.count()) == (1, 2)
        # a redelivery within one pipeline is still a duplicate
        await alpha.put(rec("orders/0/1", {"from": "alpha"}))
        await alpha.flush()
        assert alpha.stats.duplicates == 1
    async with EventStore(db_url) as default:
        assert await default.count() == 0


async def test_each_pipelines_sink_takes_and_counts_only_its_own_events(db_url: str) -> None:
    async with (
        EventStore(db_url, pipeline="alpha") as alpha,
        EventStore(db_url, pipeline="beta") as beta,
    ):
        for i in range(3):
            await alpha.put(rec(f"m{i}", {"from": "alpha", "i": i}))
        await beta.put(rec("m0", {"from": "beta", "i": 0}))
        await alpha.flush()
        await beta.flush()
    engine = async_engine(db_url)
    try:
        names = {"big": "orders"}
        a = Outbox(engine, "hook", ["big"], "owner-a", pipeline="alpha", streams=names)
        b = Outbox(engine, "hook", ["big"], "owner-b", pipeline="beta")
        for outbox in (a, b):
            await outbox.register()
            # one lease each: the same sink name in two pipelines is two sinks
            assert await outbox.acquire(30)
        work_a, work_b = await a.fresh(100), await b.fresh(100)
        assert [w.delivery.payload["from"] for w in work_a] == ["alpha"] * 3
        assert [w.delivery.payload["from"] for w in work_b] == ["beta"]
        assert {w.delivery.stream_name for w in work_a} == {"orders"}
        assert {w.delivery.acklane_fields()["stream"] for w in work_a} == {"orders"}
        assert {w.delivery.acklane_fields()["stream"] for w in work_b} == {KEY}
        # alpha delivers two, parks one; beta has not started
        last = work_a[-1].delivery.store_id
        parked = Failure(last, "parked", 1, "refused", None, unsure=False)
        await a.settle(cursor=last, delivered=2, cleared=[], failures=[parked])
        (sa,) = await sink_status(engine, {"hook": ["big"]}, pipeline="alpha")
        (sb,) = await sink_status(engine, {"hook": ["big"]}, pipeline="beta")
        assert (sa.delivered, sa.lag, sa.parked) == (2, 0, 1)
        assert (sb.delivered, sb.lag, sb.parked) == (0, 1, 0)
        assert await b.retrying() == (0, None)
    finally:
        await engine.dispose()


async def test_pruning_counts_and_deletes_only_the_pipelines_own_events(db_url: str) -> None:
    async with (
        EventStore(db_url, pipeline="alpha") as alpha,
        EventStore(db_url, pipeline="beta") as beta,
    ):
        for i in range(3):
            await alpha.put(rec(f"m{i}", {"i": i}))
            await beta.put(rec(f"m{i}", {"i": i}))
        await alpha.flush()
        await beta.flush()
        engine = async_engine(db_url)
        try:
            # alpha's sink has delivered nothing: it holds alpha's events, not beta's
            await Outbox(engine, "hook", ["big"], "o", pipeline="alpha").register()
        finally:
            await engine.dispose()
        assert await alpha.count_older_than(LATER) == 0
        assert await beta.count_older_than(LATER) == 3
        assert await beta.prune(LATER) == 3
        assert await alpha.prune(LATER) == 0
        assert (await alpha.count(), await beta.count()) == (3, 0)


async def test_poison_attempts_are_counted_per_pipeline(db_url: str) -> None:
    alpha, beta = AttemptStore(db_url, pipeline="alpha"), AttemptStore(db_url, pipeline="beta")
    await alpha.open()
    await beta.open()
    try:
        assert (await alpha.add_failure(KEY, "m1", "big", "boom")).attempts == 1
        assert (await alpha.add_failure(KEY, "m1", "big", "boom")).attempts == 2
        assert (await beta.add_failure(KEY, "m1", "big", "other")).attempts == 1
        assert set(await beta.load(KEY)) == {"m1"}
        await beta.forget(KEY, ["m1"])
        assert await beta.load(KEY) == {}
        assert (await alpha.load(KEY))["m1"].attempts == 2
    finally:
        await alpha.close()
        await beta.close()


# -- two pipelines running, one store ------------------------------------------------------


def _pipeline_yaml(name: str, db: str, broker: str, function: str) -> str:
    return textwrap.dedent(
        f"""\
        pipeline: {name}
        engine: {{shutdown_timeout: 5, restart_backoff_initial: 0.05}}
        store: {{url: "{db}"}}
        streams:
          orders: {{connector: memory, broker: {broker}, topics: [orders], group_id: g,
                    partitions: 1, poll_interval: 0.02}}
        sinks:
          - {{name: calls, kind: function, function: "sink_functions:{function}"}}
        watchers:
          - {{name: big, stream: orders, sinks: [calls]}}
        """
    )


@pytest.fixture
def brokers() -> Iterator[tuple[MemoryBroker, MemoryBroker]]:
    names = [f"b-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    pair = (MemoryBroker.get(names[0]), MemoryBroker.get(names[1]))
    for b in pair:
        b.create_topic("orders", 1)
    RECEIVED.clear()
    RECEIVED_OTHER.clear()
    yield pair
    for name in names:
        MemoryBroker.remove(name)


async def test_two_running_pipelines_with_the_same_names_deliver_only_their_own(
    db_url: str, brokers: tuple[MemoryBroker, MemoryBroker]
) -> None:
    one, two = brokers
    for i in range(3):
        one.publish("orders", json.dumps({"pipeline": "alpha", "i": i}).encode())
    for i in range(2):
        two.publish("orders", json.dumps({"pipeline": "beta", "i": i}).encode())
    alpha = parse_config(_pipeline_yaml("alpha", db_url, one.name, "record"), source="<a>")
    beta = parse_config(_pipeline_yaml("beta", db_url, two.name, "record_other"), source="<b>")
    await run_until(Runner(alpha, handle_signals=False), lambda: len(RECEIVED) == 3)
    await run_until(
        Runner(beta, handle_signals=False),
        lambda: len(RECEIVED_OTHER) == 2 and all_committed(two),
    )
    await asyncio.sleep(0.3)  # room for a wrong delivery to show
    assert sorted(d.payload["i"] for d in RECEIVED) == [0, 1, 2]
    assert {d.payload["pipeline"] for d in RECEIVED} == {"alpha"}
    assert sorted(d.payload["i"] for d in RECEIVED_OTHER) == [0, 1]
    assert {d.payload["pipeline"] for d in RECEIVED_OTHER} == {"beta"}
    assert {d.acklane_fields()["stream"] for d in RECEIVED + RECEIVED_OTHER} == {"orders"}


@pytest.mark.parametrize("named", [False, True])
async def test_a_second_configuration_under_the_same_pipeline_name_is_warned_of(
    brokers: tuple[MemoryBroker, MemoryBroker],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    named: bool,
) -> None:
    one, two = brokers
    one.publish("orders", json.dumps({"i": 1}).encode())
    two.publish("orders", json.dumps({"i": 2}).encode())
    db = f"sqlite:///{tmp_path / 'e.db'}"
    first = _pipeline_yaml("alpha", db, one.name, "record")
    second = _pipeline_yaml("beta", db, two.name, "record_other")
    if not named:  # both without pipeline: (the default)
        first, second = (text.split("\n", 1)[1] for text in (first, second))
    await run_until(Runner(parse_config(first), handle_signals=False), lambda: len(RECEIVED) == 1)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="acklane.core.pipeline.runner"):
        await run_until(
            Runner(parse_config(second), handle_signals=False), lambda: len(RECEIVED_OTHER) >= 1
        )
    warned = [r.getMessage() for r in caplog.records if "shares this store" in r.getMessage()]
    if named:
        assert warned == []
    else:
        (message,) = warned
        assert "Pipeline 'default'" in message and "watcher big" in message


async def test_the_webhook_body_names_the_stream_as_the_configuration_does(
    brokers: tuple[MemoryBroker, MemoryBroker], tmp_path: Path
) -> None:
    bodies: list[dict[str, object]] = []

    async def receive(request: web.Request) -> web.Response:
        bodies.append(await request.json())
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/hook", receive)
    server = web.AppRunner(app, shutdown_timeout=1)
    await server.setup()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    await web.SockSite(server, sock).start()
    try:
        one, _ = brokers
        one.publish("orders", json.dumps({"i": 1}).encode())
        config = parse_config(
            textwrap.dedent(
                f"""\
                pipeline: alpha
                engine: {{shutdown_timeout: 5}}
                store: {{url: "sqlite:///{tmp_path / "e.db"}"}}
                streams:
                  orders: {{connector: memory, broker: {one.name}, topics: [orders],
                            group_id: g, partitions: 1, poll_interval: 0.02}}
                sinks:
                  - {{name: calls, kind: webhook, url: "http://127.0.0.1:{port}/hook"}}
                watchers:
                  - {{name: big, stream: orders, sinks: [calls]}}
                """
            )
        )
        await run_until(Runner(config, handle_signals=False), lambda: len(bodies) == 1)
    finally:
        await server.cleanup()
    (body,) = bodies
    assert (body["stream"], body["watcher"], body["payload"]) == ("orders", "big", {"i": 1})


# -- the configuration --------------------------------------------------------------------


def test_the_pipeline_name_defaults_to_default_and_follows_the_name_rule() -> None:
    base = _pipeline_yaml("x", "sqlite:///e.db", "b", "record").split("\n", 1)[1]
    assert parse_config(base).pipeline == "default"
    assert parse_config("pipeline: orders-eu.v2\n" + base).pipeline == "orders-eu.v2"
    for bad in ("'has space'", "''", "[a]", '"it\'s"', "-lead"):
        with pytest.raises(ConfigError) as caught:
            parse_config(f"pipeline: {bad}\n" + base, source="p.yaml")
        assert any("p.yaml:1: pipeline" in str(p) for p in caught.value.problems), bad


def test_a_relative_sqlite_path_is_read_from_the_configurations_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "conf"
    folder.mkdir()
    path = folder / "p.yaml"
    path.write_text(_pipeline_yaml("alpha", "sqlite:///data/events.db?timeout=5", "b", "record"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    expected = f"sqlite:///{folder.resolve() / 'data' / 'events.db'}?timeout=5"
    assert load_config(path).store.url == expected
    # validate's look at this machine checks that folder, not the working directory's
    (folder / "data").mkdir()
    assert load_config(path, offline_checks=True).store.url == expected
    assert load_store_config(path).store.url == expected
    assert load_store_config(path).pipeline == "alpha"
    # absolute paths, PostgreSQL and text without a file stay as written
    assert parse_config(path.read_text()).store.url == "sqlite:///data/events.db?timeout=5"


def test_sinks_status_from_another_folder_creates_no_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(_pipeline_yaml("alpha", "sqlite:///never.db", "b", "record"))
    monkeypatch.chdir(tmp_path.parent)
    result = CliRunner().invoke(app, ["sinks", "status", str(path)])
    assert result.exit_code == 1
    assert "no SQLite database at" in result.output and "never.db" in result.output
    assert not (tmp_path / "never.db").exists()
    assert not (tmp_path.parent / "never.db").exists()


async def test_the_events_and_sinks_commands_show_only_the_configurations_pipeline(
    tmp_path: Path,
) -> None:
    db = f"sqlite:///{tmp_path / 'shared.db'}"
    async with (
        EventStore(db, pipeline="alpha") as alpha,
        EventStore(db, pipeline="beta") as beta,
    ):
        await alpha.put(rec("m1", {"from": "alpha"}))
        await beta.put(rec("m1", {"from": "beta"}))
        await beta.put(rec("m2", {"from": "beta"}))
    path = tmp_path / "alpha.yaml"
    path.write_text(_pipeline_yaml("alpha", db, "b", "record"))

    def invoke(*args: str) -> list[dict[str, Any]]:
        result = CliRunner().invoke(app, list(args))
        assert result.exit_code == 0, result.output
        return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]

    listed = await asyncio.to_thread(invoke, "events", "list", str(path), "--json")
    assert [(e["payload"], e["stream"]) for e in listed] == [({"from": "alpha"}, "orders")]
    by_url = await asyncio.to_thread(
        invoke, "events", "list", "--url", db, "--pipeline", "beta", "--json"
    )
    assert [e["payload"]["from"] for e in by_url] == ["beta", "beta"]
    assert {e["stream"] for e in by_url} == {KEY}  # no configuration: the stored key
    (status,) = await asyncio.to_thread(invoke, "sinks", "status", str(path), "--format", "json")
    assert status["sink"] == "calls" and status["lag"] == 1


# -- a store written by the previous version ----------------------------------------------

#: The tables and indexes exactly as the version before pipelines created them.
_PREVIOUS_DDL = {
    "sqlite": """
CREATE TABLE acklane_sink_deliveries (
    sink TEXT NOT NULL, event_id BIGINT NOT NULL, state TEXT NOT NULL,
    attempts INTEGER NOT NULL, next_attempt_at DATETIME, last_error TEXT,
    unsure INTEGER NOT NULL, updated_at DATETIME NOT NULL, PRIMARY KEY (sink, event_id));
CREATE INDEX acklane_sink_deliveries_due ON acklane_sink_deliveries (sink, state, next_attempt_at);
CREATE TABLE acklane_sink_state (
    sink TEXT NOT NULL, watchers TEXT NOT NULL, cursor BIGINT NOT NULL,
    claimed_to BIGINT NOT NULL, delivered BIGINT NOT NULL, owner TEXT,
    lease_until DATETIME, updated_at DATETIME NOT NULL, PRIMARY KEY (sink));
CREATE TABLE acklane_trigger_events (
    id INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT, trigger_id TEXT NOT NULL,
    stream_key TEXT NOT NULL, payload TEXT NOT NULL, message_id TEXT,
    position INTEGER NOT NULL, created_at DATETIME NOT NULL);
CREATE INDEX acklane_trigger_events_trigger ON acklane_trigger_events (trigger_id, id);
CREATE UNIQUE INDEX acklane_trigger_events_stream_dedupe ON acklane_trigger_events
    (trigger_id, message_id, position, stream_key) WHERE message_id IS NOT NULL;
CREATE INDEX acklane_trigger_events_created_at ON acklane_trigger_events (created_at);
CREATE TABLE acklane_message_attempts (
    stream_key TEXT NOT NULL, message_id TEXT NOT NULL, attempts INTEGER NOT NULL,
    last_error TEXT NOT NULL, watcher TEXT, updated_at DATETIME NOT NULL,
    PRIMARY KEY (stream_key, message_id));
CREATE INDEX acklane_message_attempts_updated ON acklane_message_attempts (stream_key, updated_at);
""",
    "postgresql": """
CREATE TABLE acklane_sink_deliveries (
    sink TEXT NOT NULL, event_id BIGINT NOT NULL, state TEXT NOT NULL,
    attempts INTEGER NOT NULL, next_attempt_at TIMESTAMP WITH TIME ZONE, last_error TEXT,
    unsure INTEGER NOT NULL, updated_at TIMESTAMP WITH TIME ZONE NOT NULL,
    PRIMARY KEY (sink, event_id));
CREATE INDEX acklane_sink_deliveries_due ON acklane_sink_deliveries (sink, state, next_attempt_at);
CREATE TABLE acklane_sink_state (
    sink TEXT NOT NULL, watchers TEXT NOT NULL, cursor BIGINT NOT NULL,
    claimed_to BIGINT NOT NULL, delivered BIGINT NOT NULL, owner TEXT,
    lease_until TIMESTAMP WITH TIME ZONE, updated_at TIMESTAMP WITH TIME ZONE NOT NULL,
    PRIMARY KEY (sink));
CREATE TABLE acklane_trigger_events (
    id BIGSERIAL NOT NULL, trigger_id TEXT NOT NULL, stream_key TEXT NOT NULL,
    payload TEXT NOT NULL, message_id TEXT, position INTEGER NOT NULL,
    created_at TIMESTAMP WITH TIME ZONE NOT NULL, PRIMARY KEY (id));
CREATE INDEX acklane_trigger_events_trigger ON acklane_trigger_events (trigger_id, id);
CREATE UNIQUE INDEX acklane_trigger_events_stream_dedupe ON acklane_trigger_events
    (trigger_id, message_id, position, stream_key) WHERE message_id IS NOT NULL;
CREATE INDEX acklane_trigger_events_created_at ON acklane_trigger_events (created_at);
CREATE TABLE acklane_message_attempts (
    stream_key TEXT NOT NULL, message_id TEXT NOT NULL, attempts INTEGER NOT NULL,
    last_error TEXT NOT NULL, watcher TEXT, updated_at TIMESTAMP WITH TIME ZONE NOT NULL,
    PRIMARY KEY (stream_key, message_id));
CREATE INDEX acklane_message_attempts_updated ON acklane_message_attempts (stream_key, updated_at);
""",
}

_PREVIOUS_ROWS = [
    "INSERT INTO acklane_trigger_events (trigger_id, stream_key, payload, message_id, position, "
    f"created_at) VALUES ('big', '{KEY}', '{{\"i\": 1}}', 'm1', 0, CURRENT_TIMESTAMP)",
    "INSERT INTO acklane_trigger_events (trigger_id, stream_key, payload, message_id, position, "
    f"created_at) VALUES ('big', '{KEY}', '{{\"i\": 2}}', 'm2', 0, CURRENT_TIMESTAMP)",
    "INSERT INTO acklane_trigger_events (trigger_id, stream_key, payload, message_id, position, "
    f"created_at) VALUES ('big', '{KEY}', '{{\"i\": 3}}', 'm3', 0, CURRENT_TIMESTAMP)",
    # the sink delivered 1, keeps 2 retrying, has not reached 3
    "INSERT INTO acklane_sink_state (sink, watchers, cursor, claimed_to, delivered, owner, "
    "lease_until, updated_at) VALUES ('hook', '[\"big\"]', 2, 2, 1, NULL, NULL, "
    "CURRENT_TIMESTAMP)",
    "INSERT INTO acklane_sink_deliveries (sink, event_id, state, attempts, next_attempt_at, "
    "last_error, unsure, updated_at) VALUES ('hook', 2, 'retry', 3, CURRENT_TIMESTAMP, "
    "'HTTP 503', 0, CURRENT_TIMESTAMP)",
    f"INSERT INTO acklane_message_attempts (stream_key, message_id, attempts, last_error, "
    f"watcher, updated_at) VALUES ('{KEY}', 'm9', 2, 'boom', 'big', CURRENT_TIMESTAMP)",
]


def _create_previous_store(url: str) -> None:
    engine = sync_engine(url)
    try:
        with engine.begin() as conn:
            ddl = _PREVIOUS_DDL["sqlite" if is_sqlite(url) else "postgresql"]
            for statement in filter(str.strip, ddl.split(";")):
                conn.execute(text(statement))
            for statement in _PREVIOUS_ROWS:
                conn.execute(text(statement))
    finally:
        engine.dispose()


def _primary_keys(url: str) -> dict[str, list[str]]:
    from sqlalchemy import inspect

    engine = sync_engine(url)
    try:
        with engine.connect() as conn:
            seen = inspect(conn)
            return {
                table: seen.get_pk_constraint(table)["constrained_columns"]
                for table in ("acklane_sink_state", "acklane_sink_deliveries")
            }
    finally:
        engine.dispose()


async def test_a_store_of_the_previous_version_migrates_in_place_with_nothing_lost(
    db_url: str,
) -> None:
    _create_previous_store(db_url)
    async with EventStore(db_url) as store:
        assert [e.payload["i"] for e in await store.list_events()] == [1, 2, 3]
        await store.put(rec("m1", {"i": 1}))  # a redelivery of an old message: a duplicate
        await store.put(rec("m4", {"i": 4}))
        await store.flush()
        assert (store.stats.inserted, store.stats.duplicates) == (1, 1)
    assert _primary_keys(db_url) == {
        "acklane_sink_state": ["pipeline", "sink"],
        "acklane_sink_deliveries": ["pipeline", "sink", "event_id"],
    }
    engine = async_engine(db_url)
    try:
        # the default pipeline's sink goes on where it stood
        (status,) = await sink_status(engine, {"hook": ["big"]})
        assert (status.delivered, status.retrying, status.pending) == (1, 1, 2)
        hook = Outbox(engine, "hook", ["big"], "me")
        assert await hook.acquire(30)
        assert hook.cursor == 2
        assert [w.delivery.payload["i"] for w in await hook.due(10)] == [2]
        assert [w.delivery.payload["i"] for w in await hook.fresh(10)] == [3, 4]
        # another pipeline's sink of the same name starts empty, beside it
        other = Outbox(engine, "hook", ["big"], "them", pipeline="beta")
        await other.register()
        assert await other.acquire(30)
        assert await other.fresh(10) == [] and await other.due(10) == []
    finally:
        await engine.dispose()
    attempts = AttemptStore(db_url)
    await attempts.open()
    try:
        assert (await attempts.load(KEY))["m9"].attempts == 2
    finally:
        await attempts.close()


OPENER = r"""
import asyncio, sys
from acklane.core.events import EventRecord, EventStore
from acklane.core.events.attempts import AttemptStore

async def main(url, name):
    attempts = AttemptStore(url, pipeline=name)
    async with EventStore(url, pipeline=name) as store:
        await attempts.open()
        await store.put(EventRecord("big", "k", {}, "m1", 0))
    await attempts.close()
    print("done", flush=True)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def test_several_processes_migrate_one_previous_store_at_once(db_url: str) -> None:
    _create_previous_store(db_url)
    names = [f"p{n}" for n in range(4)]
    children = [
        subprocess.Popen(
            [sys.executable, "-c", OPENER, db_url, name],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in names
    ]
    for child in children:
        out, err = child.communicate(timeout=SAFETY * 3)
        assert child.returncode == 0, err
        assert out.splitlines()[-1] == "done"
    engine = sync_engine(db_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text("SELECT pipeline, count(*) FROM acklane_trigger_events GROUP BY pipeline")
            ).all()
            kept = conn.execute(text("SELECT pipeline, sink, cursor FROM acklane_sink_state")).all()
            retrying = conn.execute(
                text("SELECT pipeline, sink, event_id FROM acklane_sink_deliveries")
            ).all()
    finally:
        engine.dispose()
    assert dict(rows) == {"default": 3, **dict.fromkeys(names, 1)}
    assert [tuple(r) for r in kept] == [("default", "hook", 2)]
    assert [tuple(r) for r in retrying] == [("default", "hook", 2)]
