"""The engine and the runner over real Kafka: watchers, commits, restarts and failover.

Each test runs acklane's runner (in this process, or as ``acklane run`` processes)
on a YAML configuration with a ``kafka`` stream, an SQLite event store in the
test's own directory, and its own topic and consumer group on the session's broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from acklane.core.config import AcklaneConfig, parse_config
from acklane.core.events import TABLE_NAME, EventStore, StoredEvent
from acklane.core.pipeline.runner import Runner
from acklane.integration.kafka import KafkaKit


def pipeline_yaml(
    kafka_kit: KafkaKit, db: Path, topic: str, group: str, watchers: str, *, dlq: str | None = None
) -> str:
    dlq_line = f"    dead_letter: {dlq}\n" if dlq else ""
    return (
        textwrap.dedent(
            f"""\
            engine:
              ack_timeout: 20
              restart_backoff_initial: 0.05
              restart_backoff_max: 0.2
              shutdown_timeout: 5
            store:
              url: sqlite:///{db}
            streams:
              orders:
                connector: kafka
                bootstrap_servers: {kafka_kit.bootstrap_servers}
                topics: [{topic}]
                group_id: {group}
                poll_timeout: 0.05
                client:
                  session.timeout.ms: {KafkaKit.FAST_GROUP["session.timeout.ms"]}
                  heartbeat.interval.ms: {KafkaKit.FAST_GROUP["heartbeat.interval.ms"]}
                  fetch.wait.max.ms: {KafkaKit.FAST_GROUP["fetch.wait.max.ms"]}
            """
        )
        + dlq_line
        + "watchers:\n"
        + textwrap.indent(textwrap.dedent(watchers), "  ")
    )


def pipeline(
    kafka_kit: KafkaKit, db: Path, topic: str, group: str, watchers: str, **kw: Any
) -> Any:
    config: AcklaneConfig = parse_config(
        pipeline_yaml(kafka_kit, db, topic, group, watchers, **kw), source="test.yaml"
    )
    return config


async def committed(
    kafka_kit: KafkaKit, group: str, topic: str, partitions: int
) -> dict[int, int | None]:
    return await asyncio.to_thread(kafka_kit.committed, group, topic, partitions)


async def run_until_committed(
    runner: Runner,
    kafka_kit: KafkaKit,
    group: str,
    topic: str,
    ends: dict[int, int],
    timeout: float = 30.0,
) -> None:
    """Run the runner until the group committed ``ends`` (partition -> offset), then stop it."""
    task = asyncio.create_task(runner.run())
    try:
        async with asyncio.timeout(timeout):
            while await committed(kafka_kit, group, topic, len(ends)) != ends:
                assert not task.done(), task.exception()
                await asyncio.sleep(0.1)
    finally:
        runner.request_stop()
        await task


async def stored(db: Path) -> list[StoredEvent]:
    async with EventStore(f"sqlite:///{db}") as store:
        return await store.list_events(limit=10_000)


def by_watcher(events: list[StoredEvent]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for e in events:
        out.setdefault(e.trigger_id, []).append(e.message_id or "?")
    return {k: sorted(v) for k, v in out.items()}


def ids(kafka_kit: KafkaKit, topic: str, ends: dict[int, int]) -> list[str]:
    """The message ids of the first ``ends[p]`` records of each partition ``p``."""
    return sorted(kafka_kit.message_id(topic, p, o) for p, end in ends.items() for o in range(end))


def produce_json(kafka_kit: KafkaKit, topic: str, partition: int, first: int, count: int) -> None:
    kafka_kit.produce(
        topic, [f'{{"id": {i}}}'.encode() for i in range(first, first + count)], partition=partition
    )


async def test_one_watcher_fires_every_record_once_and_commits_every_partition(
    kafka_kit: KafkaKit, tmp_path: Path
) -> None:
    topic, group, db = (
        kafka_kit.new_topic(partitions=2),
        kafka_kit.unique("group"),
        tmp_path / "e.db",
    )
    produce_json(kafka_kit, topic, 0, 0, 6)
    produce_json(kafka_kit, topic, 1, 6, 4)
    runner = Runner(
        pipeline(
            kafka_kit,
            db,
            topic,
            group,
            "- {name: all, stream: orders, filter: {emit: {id: body.id}}}",
        ),
        handle_signals=False,
    )

    await run_until_committed(runner, kafka_kit, group, topic, {0: 6, 1: 4})

    events = await stored(db)
    assert by_watcher(events) == {"all": ids(kafka_kit, topic, {0: 6, 1: 4})}
    assert sorted(e.payload["id"] for e in events) == list(range(10))


async def test_several_watchers_share_one_consumer_and_each_sees_every_record(
    kafka_kit: KafkaKit, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    topic, group, db = (
        kafka_kit.new_topic(partitions=2),
        kafka_kit.unique("group"),
        tmp_path / "e.db",
    )
    produce_json(kafka_kit, topic, 0, 0, 5)
    produce_json(kafka_kit, topic, 1, 5, 5)
    watchers = """\
        - {name: all, stream: orders, filter: {emit: {id: body.id}}}
        - {name: big, stream: orders, filter: {match: {body.id: {gte: 7}}, emit: {id: body.id}}}
        - {name: small, stream: orders, filter: {match: {body.id: {lt: 2}}, emit: {id: body.id}}}
        """
    runner = Runner(pipeline(kafka_kit, db, topic, group, watchers), handle_signals=False)

    with caplog.at_level(logging.INFO):
        await run_until_committed(runner, kafka_kit, group, topic, {0: 5, 1: 5})

    events = await stored(db)
    payloads = {
        w: sorted(e.payload["id"] for e in events if e.trigger_id == w)
        for w in ("all", "big", "small")
    }
    assert payloads == {"all": list(range(10)), "big": [7, 8, 9], "small": [0, 1]}
    subscribed = [r for r in caplog.records if "Kafka consumer subscribed" in r.getMessage()]
    started = [r for r in caplog.records if "Shared stream group started" in r.getMessage()]
    assert len(subscribed) == 1
    assert [r.getMessage().endswith("subscribers=3") for r in started] == [True]


async def test_record_a_filter_rejects_is_dead_lettered_and_committed_past(
    kafka_kit: KafkaKit, tmp_path: Path
) -> None:
    topic, dlq, group = kafka_kit.new_topic(), kafka_kit.new_topic("dlq"), kafka_kit.unique("group")
    db = tmp_path / "e.db"
    kafka_kit.produce(topic, [b'{"id": 0}', b"\xffnot json", b'{"id": 2}'])
    runner = Runner(
        pipeline(
            kafka_kit,
            db,
            topic,
            group,
            "- {name: all, stream: orders, filter: {emit: {id: body.id}}}",
            dlq=dlq,
        ),
        handle_signals=False,
    )

    await run_until_committed(runner, kafka_kit, group, topic, {0: 3})

    [copy] = kafka_kit.read(dlq, 1)
    headers = dict(copy.headers())
    assert copy.value() == b"\xffnot json"
    assert headers["acklane.origin.offset"] == b"1"
    assert b"not UTF-8" in headers["acklane.reject.reason"]
    assert sorted(e.payload["id"] for e in await stored(db)) == [0, 2]


# -- two engine processes in one consumer group ------------------------------------------


def _message_ids(db: Path) -> set[str]:
    """The message ids a running engine's SQLite store holds (read-only, never creating it)."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
            rows = conn.execute(f"SELECT message_id FROM {TABLE_NAME}").fetchall()
    except sqlite3.OperationalError:  # not created yet
        return set()
    return {row[0] for row in rows}


def _start_engine(config: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "COLUMNS": "400"}
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "acklane.core.cli", "run", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=out,
            env=env,
        )


async def _wait(cond: Callable[[], Any], timeout: float, what: str, procs: list[Any]) -> None:
    try:
        async with asyncio.timeout(timeout):
            while not await cond():
                for proc, log in procs:
                    assert proc.poll() is None or proc.returncode == -signal.SIGKILL, (
                        log.read_text()
                    )
                await asyncio.sleep(0.1)
    except TimeoutError:
        logs = "\n".join(f"--- {log}\n{log.read_text()[-3000:]}" for _, log in procs)
        raise AssertionError(f"timed out waiting for {what}\n{logs}") from None


async def test_two_engines_split_the_partitions_and_the_survivor_of_a_sigkill_loses_nothing(
    kafka_kit: KafkaKit, tmp_path: Path
) -> None:
    partitions = 4
    topic, group = kafka_kit.new_topic(partitions=partitions), kafka_kit.unique("group")
    dbs = [tmp_path / "a.db", tmp_path / "b.db"]
    procs = []
    for name, db in zip("ab", dbs, strict=True):
        config = tmp_path / f"{name}.yaml"
        config.write_text(
            pipeline_yaml(kafka_kit, db, topic, group, "- {name: all, stream: orders}")
        )
        log = tmp_path / f"{name}.log"
        procs.append((_start_engine(config, log), log))
    ends = dict.fromkeys(range(partitions), 0)

    def produce_round(count: int) -> None:
        for p in range(partitions):
            kafka_kit.produce(topic, [b"{}"] * count, partition=p)
            ends[p] += count

    async def both_working() -> bool:
        produce_round(1)
        return all(await asyncio.gather(*(asyncio.to_thread(_message_ids, db) for db in dbs)))

    async def survivor_done() -> bool:
        return await committed(kafka_kit, group, topic, partitions) == ends

    try:
        await _wait(both_working, 45, "both engines to store events", procs)
        procs[0][0].send_signal(signal.SIGKILL)
        procs[0][0].wait(timeout=10)
        produce_round(5)
        await _wait(survivor_done, 45, "the survivor to commit every partition", procs)
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, _ in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    a, b = await stored(dbs[0]), await stored(dbs[1])
    survivor_partitions = {e.message_id.split("/")[-2] for e in b if e.message_id}
    assert {e.message_id for e in a} | {e.message_id for e in b} == set(ids(kafka_kit, topic, ends))
    assert survivor_partitions == {str(p) for p in range(partitions)}
    assert procs[1][0].returncode == 0, procs[1][1].read_text()
