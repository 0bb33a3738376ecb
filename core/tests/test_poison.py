"""The poison policy on the memory broker and the in-process runner.

A message whose filter raises (or times out) is a failed attempt of that message; once
it has failed ``max_attempts`` times, its next delivery is dead-lettered with the last
error and the partition moves on. Counts live in the store, so a restart keeps them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import poison_filters
import pytest
from runner_harness import all_committed, both_filter_paths, run_until

from acklane.connectors.memory import MemoryBroker
from acklane.core.config import AcklaneConfig, parse_config
from acklane.core.connectors.deadletter import ORIGIN_OFFSET, ORIGIN_TOPIC, REJECT_REASON
from acklane.core.events import EventStore
from acklane.core.events.attempts import AttemptStore
from acklane.core.pipeline.runner import RestartsExhausted, Runner, stream_key_text

TESTS = Path(__file__).parent


def _config(
    db: Path,
    broker: str,
    watchers: str,
    *,
    max_attempts: int | None = 3,
    ack_timeout: float = 10,
    max_restarts: int | None = 50,
    backoff: tuple[float, float] = (0.02, 0.1),
) -> AcklaneConfig:
    attempts = "" if max_attempts is None else f"    max_attempts: {max_attempts}\n"
    text = (
        textwrap.dedent(
            f"""\
            engine:
              ack_timeout: {ack_timeout}
              restart_backoff_initial: {backoff[0]}
              restart_backoff_max: {backoff[1]}
              shutdown_timeout: 5
              max_restarts: {"null" if max_restarts is None else max_restarts}
            store:
              url: sqlite:///{db}
            streams:
              orders:
                connector: memory
                broker: {broker}
                topics: [orders]
                group_id: g
                partitions: 1
                dead_letter: orders.dlq
                poll_interval: 0.02
            """
        )
        + attempts
        + "watchers:\n"
        + textwrap.indent(textwrap.dedent(watchers), "  ")
    )
    return parse_config(text, source="poison.yaml")


def _publish(broker: MemoryBroker, bodies: list[dict[str, Any]]) -> None:
    for body in bodies:
        broker.publish("orders", json.dumps(body).encode(), partition=0)


async def _stored(db: Path) -> dict[str, list[Any]]:
    async with EventStore(f"sqlite:///{db}") as store:
        events = await store.list_events(limit=10_000)
    out: dict[str, list[Any]] = {}
    for e in events:
        out.setdefault(e.trigger_id, []).append(e.payload["id"])
    return {k: sorted(v) for k, v in out.items()}


async def _table(db: Path, runner: Runner) -> dict[str, Any]:
    (key,) = {w.shared_stream_key() for w in runner.watchers}
    store = AttemptStore(f"sqlite:///{db}")
    await store.open()
    try:
        return await store.load(stream_key_text(key))
    finally:
        await store.close()


def _book(runner: Runner) -> Any:
    (book,) = runner.poison.streams().values()
    return book


BIG_ORDERS = """\
- name: big-orders
  stream: orders
  filter: {function: "poison_filters:big_orders"}
- name: all
  stream: orders
  filter: {emit: {id: body.id}}
"""


@both_filter_paths
async def test_a_message_whose_filter_raises_is_dead_lettered_after_max_attempts(
    tmp_path: Path, broker: MemoryBroker, caplog: pytest.LogCaptureFixture
) -> None:
    # the docs' own filter: {"id": 2} has no amount (KeyError); before the policy the
    # runner restarted forever and the partition never moved past it
    db = tmp_path / "e.db"
    caplog.set_level(logging.INFO)
    _publish(broker, [{"id": 1, "amount": 150}, {"id": 2}, {"id": 3, "amount": 300}])
    runner = Runner(_config(db, broker.name, BIG_ORDERS), handle_signals=False)
    await run_until(runner, lambda: all_committed(broker))

    (copy,) = broker.records("orders.dlq")
    assert json.loads(copy.value) == {"id": 2}
    assert copy.headers[ORIGIN_TOPIC] == "orders" and copy.headers[ORIGIN_OFFSET] == "1"
    assert copy.headers[REJECT_REASON] == (
        "poison: failed 3 times; last error: watcher big-orders: KeyError: 'amount'"
    )
    # the messages behind it were processed, by every watcher
    stored = await _stored(db)
    assert stored["big-orders"] == [1, 3]
    assert {1, 3} <= set(stored["all"])
    book = _book(runner)
    assert (book.failures, book.poisoned, book.restarts) == (3, 1, 3)
    assert await _table(db, runner) == {}  # resolved: its row is gone
    restarts = [r for r in caplog.records if r.getMessage().startswith("Restarting watchers")]
    assert len(restarts) == 3 and all(r.levelno == logging.WARNING for r in restarts)
    mid = copy.headers["acklane.origin.offset"]
    assert all(
        "watcher big-orders failed on message memory:" in r.getMessage()
        and f"/orders/0/{mid}" in r.getMessage()
        and "KeyError: 'amount'" in r.getMessage()
        for r in restarts
    ), [r.getMessage() for r in restarts]
    assert [r.getMessage().split("(attempt ")[1][:1] for r in restarts] == ["1", "2", "3"]


@both_filter_paths
async def test_an_ack_timeout_on_a_message_is_a_failed_attempt_of_it(
    tmp_path: Path, broker: MemoryBroker
) -> None:
    db = tmp_path / "e.db"
    watchers = """\
    - name: slow
      stream: orders
      filter: {function: "poison_filters:stalls"}
    """
    _publish(broker, [{"id": 1}, {"id": 2, "stall": True}, {"id": 3}])
    runner = Runner(
        _config(db, broker.name, watchers, max_attempts=2, ack_timeout=0.3), handle_signals=False
    )
    await run_until(runner, lambda: all_committed(broker))
    (copy,) = broker.records("orders.dlq")
    assert json.loads(copy.value) == {"id": 2, "stall": True}
    reason = copy.headers[REJECT_REASON]
    assert reason.startswith("poison: failed 2 times; last error: watcher slow: AckTimeout: ")
    assert "ack_timeout=0.3s" in reason
    assert await _stored(db) == {"slow": [1, 3]}


@both_filter_paths
async def test_a_message_that_fails_once_then_succeeds_is_not_dead_lettered(
    tmp_path: Path, broker: MemoryBroker
) -> None:
    poison_filters.FLAKY.clear()
    db = tmp_path / "e.db"
    watchers = """\
    - name: flaky
      stream: orders
      filter: {function: "poison_filters:flaky"}
    """
    _publish(broker, [{"id": 1}, {"id": 2, "flaky": True}, {"id": 3}])
    runner = Runner(_config(db, broker.name, watchers, max_attempts=2), handle_signals=False)
    await run_until(runner, lambda: all_committed(broker))
    # one failed attempt of two allowed: the second delivery reached the filter, which
    # got past it; its row is removed
    assert broker.records("orders.dlq") == []
    assert await _stored(db) == {"flaky": [1, 2, 3]}
    assert (_book(runner).failures, _book(runner).poisoned) == (1, 0)
    assert await _table(db, runner) == {}


@both_filter_paths
async def test_the_count_survives_a_restart_of_the_runner(
    tmp_path: Path, broker: MemoryBroker
) -> None:
    db = tmp_path / "e.db"
    _publish(broker, [{"id": 1, "amount": 150}, {"id": 2}, {"id": 3, "amount": 300}])
    # a long first backoff: the first runner is stopped while it waits to restart
    cfg = _config(db, broker.name, BIG_ORDERS, max_attempts=3, backoff=(2.0, 2.0))

    first = Runner(cfg, handle_signals=False)
    await run_until(first, lambda: any(b.failures for b in first.poison.streams().values()))
    assert broker.records("orders.dlq") == []
    (record,) = (await _table(db, first)).values()
    assert record.attempts == 1 and record.watcher == "big-orders"
    assert record.last_error == "KeyError: 'amount'"

    # a new process: the memory broker stays, the count comes from the table
    cfg = _config(db, broker.name, BIG_ORDERS, max_attempts=3)
    second = Runner(cfg, handle_signals=False)
    await run_until(second, lambda: all_committed(broker))
    (copy,) = broker.records("orders.dlq")
    assert copy.headers[REJECT_REASON] == (
        "poison: failed 3 times; last error: watcher big-orders: KeyError: 'amount'"
    )
    assert _book(first).failures + _book(second).failures == 3
    assert await _table(db, second) == {}


@both_filter_paths
async def test_a_failure_of_no_single_message_is_no_attempt_and_max_restarts_gives_up(
    tmp_path: Path, broker: MemoryBroker, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "e.db"
    watchers = """\
    - name: broken
      stream: orders
      filter: {function: "poison_filters:never_starts"}
    """
    _publish(broker, [{"id": 1}])
    cfg = _config(db, broker.name, watchers, max_restarts=2, backoff=(0.02, 5.0))
    runner = Runner(cfg, handle_signals=False)
    async with asyncio.timeout(15):
        await runner.run()  # returns by itself: it gave up
    assert isinstance(runner.failure, RestartsExhausted)
    assert "failed 3 times in a row without progress (engine.max_restarts=2)" in str(runner.failure)
    assert "RuntimeError: cannot start" in str(runner.failure)
    book = _book(runner)
    assert (book.restarts, book.failures, book.poisoned) == (2, 0, 0)
    assert await _table(db, runner) == {}
    assert broker.committed("g", "orders", 0) == 0  # nothing was skipped
    assert sum("Giving up:" in r.getMessage() for r in caplog.records) == 1


@both_filter_paths
async def test_poison_messages_do_not_count_towards_max_restarts(
    tmp_path: Path, broker: MemoryBroker
) -> None:
    # max_restarts=1 with max_attempts=4: the four restarts of the poison message are
    # bounded by the poison policy, not by max_restarts
    db = tmp_path / "e.db"
    _publish(broker, [{"id": 2}, {"id": 3, "amount": 300}])
    cfg = _config(db, broker.name, BIG_ORDERS, max_attempts=4, max_restarts=1)
    runner = Runner(cfg, handle_signals=False)
    await run_until(runner, lambda: all_committed(broker))
    assert runner.failure is None
    assert len(broker.records("orders.dlq")) == 1
    assert _book(runner).restarts == 4


def test_acklane_run_exits_1_with_one_error_line_when_it_gives_up(tmp_path: Path) -> None:
    config = tmp_path / "pipeline.yaml"
    config.write_text(
        textwrap.dedent(
            f"""\
            engine:
              restart_backoff_initial: 0.02
              restart_backoff_max: 5
              max_restarts: 1
            store:
              url: sqlite:///{tmp_path / "e.db"}
            streams:
              orders: {{connector: memory, topics: [orders], poll_interval: 0.05}}
            watchers:
              - name: broken
                stream: orders
                filter: {{function: "poison_filters:never_starts"}}
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    done = subprocess.run(
        [sys.executable, "-m", "acklane.core.cli", "run", str(config)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    errors = [line for line in done.stderr.splitlines() if "ERROR" in line]
    giving_up = [line for line in errors if "Giving up" in line]
    assert len(giving_up) == 1, done.stderr
    assert "engine.max_restarts=1" in giving_up[0]


async def test_the_attempt_table_counts_atomically_and_forgets(db_url: str) -> None:
    store = AttemptStore(db_url)
    await store.open()
    try:
        first = await store.add_failure('["k"]', "m-1", "w", "KeyError: 'a'")
        again = await store.add_failure('["k"]', "m-1", "v", "ValueError: b", times=2)
        other = await store.add_failure('["other"]', "m-1", "w", "E")
        assert (first.attempts, again.attempts, other.attempts) == (1, 3, 1)
        loaded = await store.load('["k"]')
        assert list(loaded) == ["m-1"]
        assert (loaded["m-1"].attempts, loaded["m-1"].last_error) == (3, "ValueError: b")
        assert loaded["m-1"].watcher == "v"
        await store.forget('["k"]', ["m-1"])
        assert await store.load('["k"]') == {}
        assert list(await store.load('["other"]')) == ["m-1"]
        # a second opener (another engine) finds the table and shares the counts
        twin = AttemptStore(db_url)
        await twin.open()
        try:
            assert (await twin.add_failure('["other"]', "m-1", "w", "E")).attempts == 2
        finally:
            await twin.close()
    finally:
        await store.close()


def test_max_attempts_is_a_validated_stream_setting(tmp_path: Path) -> None:
    from acklane.core.config import ConfigError

    name = f"p-{uuid.uuid4().hex[:8]}"
    default = _config(tmp_path / "e.db", name, BIG_ORDERS, max_attempts=None)
    assert default.streams["orders"].config.max_attempts == 5  # type: ignore[attr-defined]
    with pytest.raises(ConfigError) as caught:
        _config(tmp_path / "e.db", name, BIG_ORDERS, max_attempts=0)
    assert "streams.orders.max_attempts" in str(caught.value)
    MemoryBroker.remove(name)
