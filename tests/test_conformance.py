"""The connector rules, one suite for every connector: the same tests, the same names.

Each test runs once per connector (``[memory]``, ``[kafka]``, ``[sqs]``, ``[pubsub]``,
``[servicebus]``), against the broker's emulator the session starts, through the
connector's own producer (driven as the engine drives it) or a whole runner; what
the broker did is read from outside, with the broker's own client, by the
connector's kit (:mod:`acklane.integration.kits`). A new connector implements a kit
and passes this suite (``docs/connectors/README.md``).

The rules:

- a clean message is advanced (committed past, deleted, acked, completed), and the
  identity its filters see is the one the event store drops duplicates by;
- a rejected message is dead-lettered, with the reason its watcher gave;
- a failed message, and one no watcher received, are redelivered, not advanced;
- a poison message is dead-lettered after ``max_attempts``, the others are processed;
- a lane (a partition, a FIFO group, an ordering key, a session) is held behind a
  failure: nothing after it is advanced, and it comes again first;
- an advance the broker fails fails the group, and the restart redelivers;
- two ``acklane run`` processes on one stream, one of them SIGKILLed: nothing is lost
  and nothing is stored twice (marked ``chaos``: it takes a while per broker);
- identities are never reused, not even by a source made again under its name.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from acklane.core.connectors import load_connector
from acklane.core.errors import AdvanceError
from acklane.core.pipeline.runner import Runner
from acklane.integration.kits import BrokerKit, DeadLetter, Source
from acklane.integration.testing import (
    CLEAN,
    FAILED,
    ORDERS,
    UNCLAIMED,
    StreamDriver,
    eventually,
    fired_ids,
    poison_pipeline,
    rejected,
    run_until,
)

pytestmark = pytest.mark.filterwarnings("ignore:The return_immediately flag:DeprecationWarning")

POISON_REASON = "poison: failed 2 times; last error: watcher big-orders: KeyError: 'amount'"


def can(kit: BrokerKit, rule: str) -> None:
    """Skip the test, saying why, when the kit's broker cannot be put through ``rule``."""
    why = kit.cannot.get(rule)
    if why is not None:
        pytest.skip(why)


def drive(kit: BrokerKit, source: Source, **more: Any) -> StreamDriver:
    """A new producer of the stream that reads ``source``, its stream open."""
    connector = load_connector(kit.connector)
    return StreamDriver(connector.create_producer(kit.fields(source, **more)))


async def left(kit: BrokerKit, source: Source, count: int, what: str) -> None:
    """Wait until the broker holds ``count`` messages of the source not advanced."""

    async def check() -> bool:
        return await kit.remaining(source) == count

    await eventually(check, f"{what} ({count} not advanced)")


def bodies(pairs: list[tuple[Any, Any]]) -> list[bytes]:
    return [raw.body for raw, _ in pairs]


# -- one message at a time ---------------------------------------------------------------


async def test_a_clean_message_is_advanced(kit: BrokerKit) -> None:
    source = await kit.create()
    await kit.publish(source, ["a", "b", "c"])
    async with drive(kit, source) as stream:
        pulled = await stream.take(3)
        assert sorted(bodies(pulled)) == [b"a", b"b", b"c"]
        await left(kit, source, 3, "received, not advanced yet")
        await stream.advance(*((pair, CLEAN) for pair in pulled))
        await left(kit, source, 0, "every clean message advanced")


async def test_a_message_carries_its_identity_as_message_id(kit: BrokerKit) -> None:
    source = await kit.create()
    await kit.publish(source, ["a"])
    async with drive(kit, source) as stream:
        [(raw, payload)] = await stream.take(1)
        # what a filter reads is what the event store drops duplicates by
        assert raw.message_id and raw.message_id == stream.producer.message_id(payload)
        await stream.advance(((raw, payload), CLEAN))


async def test_a_rejected_message_is_dead_lettered_with_its_reason(kit: BrokerKit) -> None:
    source = await kit.create()
    await kit.publish(source, ["not json"])
    async with drive(kit, source) as stream:
        [pulled] = await stream.take(1)
        await stream.advance((pulled, rejected("not an order")))
        assert await kit.dead_letters(source) == [DeadLetter(b"not json", "not an order")]
        await left(kit, source, 0, "the rejected message acted past")


async def test_a_failed_message_is_redelivered(kit: BrokerKit) -> None:
    source = await kit.create()
    await kit.publish(source, ["flaky"])
    async with drive(kit, source) as stream:
        [first] = await stream.take(1)
        await stream.advance((first, FAILED))
        [again] = await stream.take(1)
        assert again[0].message_id == first[0].message_id  # the same message, once more
        assert again[0].body == b"flaky"
        assert await kit.remaining(source) == 1
        await stream.advance((again, CLEAN))
        await left(kit, source, 0, "advanced once accepted")


async def test_a_message_no_watcher_received_is_not_advanced(kit: BrokerKit) -> None:
    source = await kit.create()
    await kit.publish(source, ["unseen"])
    async with drive(kit, source) as stream:
        [first] = await stream.take(1)
        await stream.advance((first, UNCLAIMED))
        [again] = await stream.take(1)
        assert again[0].message_id == first[0].message_id
        assert await kit.remaining(source) == 1
        await stream.advance((again, CLEAN))
        await left(kit, source, 0, "advanced once accepted")


async def test_a_lane_is_held_behind_a_failure(kit: BrokerKit) -> None:
    source = await kit.create(ordered=True)
    await kit.publish(source, ["first", "second"], lane="customer-7")
    async with drive(kit, source) as stream:
        [head] = await stream.take(1)
        assert head[0].body == b"first"
        try:  # most brokers hand out what follows in the lane before its head is done
            behind = await stream.take(1, within=3)
        except TimeoutError:  # an ordered Pub/Sub subscription holds the lane itself
            behind = []
        assert bodies(behind) in ([], [b"second"])
        await stream.advance((head, FAILED), *((pair, CLEAN) for pair in behind))
        [pair] = await stream.take(1, within=30)
        assert pair[0].body == b"first"  # the failed head comes again, first
        assert await kit.remaining(source) == 2  # nothing behind it was advanced
        # Accept what comes until the lane is done. The head may come once more (a
        # producer may redeliver where it cannot tell the order), never after what
        # follows it.
        order = [pair[0].body]
        while True:
            await stream.advance((pair, CLEAN))
            if pair[0].body == b"second":
                break
            [pair] = await stream.take(1, within=30)
            order.append(pair[0].body)
            assert len(order) <= 5, order
        assert order == sorted(order), order  # first... then second
        await left(kit, source, 0, "the lane advanced once its head was accepted")


# -- a group's failures ------------------------------------------------------------------


async def test_a_poison_message_is_dead_lettered_after_max_attempts(
    tmp_path: Path, kit: BrokerKit
) -> None:
    source = await kit.create()
    await kit.publish(source, [json.dumps(order) for order in ORDERS])
    stream = kit.stream_yaml(source, max_attempts=2)
    package = f"conformance_poison_{kit.connector}"
    runner = Runner(poison_pipeline(tmp_path, kit.connector, stream, package=package))

    async def done() -> bool:
        return await kit.remaining(source) == 0

    await run_until(runner, done, interval=0.2)
    [copy] = await kit.dead_letters(source)
    assert json.loads(copy.body) == {"id": 2}
    assert copy.reason == POISON_REASON
    assert await fired_ids(tmp_path / "events.db") == [1, 3]  # the others were processed
    (book,) = runner.poison.streams().values()
    assert (book.failures, book.poisoned) == (2, 1)


async def test_an_advance_error_fails_the_group_and_the_restart_redelivers(
    kit: BrokerKit,
) -> None:
    source = await kit.create()
    failure = await kit.advance_failure(source)
    await kit.publish(source, [failure.body])
    first = drive(kit, source, **failure.fields)
    try:
        [pulled] = await first.take(1)
        with pytest.raises(AdvanceError):  # the kind every connector raises for it
            await first.advance((pulled, failure.outcome))
            await first.take(1, within=10)  # a settlement in the background fails the stream
    finally:
        await first.close()
    assert await kit.remaining(source) == 1  # not advanced past
    async with drive(kit, source, **failure.fields) as restarted:
        [again] = await restarted.take(1, within=30)
        assert again[0].message_id == pulled[0].message_id


async def test_identities_are_never_reused(kit: BrokerKit) -> None:
    source = await kit.create()
    seen: list[str] = []
    for round_ in range(2):
        if round_:
            await kit.recreate(source)  # its life starts again: offsets, sequence numbers
        await kit.publish(source, ["same body", "same body"])
        async with drive(kit, source) as stream:
            pulled = await stream.take(2)
            seen += [raw.message_id for raw, _ in pulled]
            await stream.advance(*((pair, CLEAN) for pair in pulled))
            await left(kit, source, 0, "advanced")
    assert all(seen) and len(set(seen)) == 4, seen


# -- two processes -----------------------------------------------------------------------


def _runner_config(directory: Path, kit: BrokerKit, source: Source) -> Path:
    stream = textwrap.indent(kit.stream_yaml(source), "    ")
    store = json.dumps(f"sqlite:///{directory / 'events.db'}")
    config = directory / "pipeline.yaml"
    config.write_text(
        "engine: {ack_timeout: 30, restart_backoff_initial: 0.2, restart_backoff_max: 1, "
        "shutdown_timeout: 10}\n"
        f"store: {{url: {store}}}\n"
        f"streams:\n  jobs:\n    connector: {kit.connector}\n{stream}"
        "watchers:\n  - {name: every-job, stream: jobs, filter: {emit: {job: body.job}}}\n"
    )
    return config


def _stored_jobs(db: Path) -> list[int]:
    if not db.exists():
        return []
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10) as conn:
        try:
            rows = list(conn.execute("SELECT payload FROM acklane_trigger_events"))
        except sqlite3.OperationalError:
            return []  # not made yet
    return [json.loads(payload)["job"] for (payload,) in rows]


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    """``acklane run`` processes a test starts; any left running are killed after it."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)


@pytest.mark.chaos
@pytest.mark.timeout(240)
async def test_two_processes_and_a_sigkill_lose_nothing_and_store_nothing_twice(
    tmp_path: Path, kit: BrokerKit, processes: list[subprocess.Popen[bytes]]
) -> None:
    can(kit, "two_processes")
    source = await kit.create()
    config = _runner_config(tmp_path, kit, source)
    db, log = tmp_path / "events.db", tmp_path / "runners.log"
    with log.open("ab") as out:
        for _ in range(2):
            processes.append(
                subprocess.Popen(  # noqa: ASYNC220 - a runner process, watched, not awaited
                    [sys.executable, "-m", "acklane.core.cli", "run", str(config)],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=dict(os.environ),
                )
            )
    await kit.publish(source, [json.dumps({"job": i}) for i in range(40)])
    await eventually(lambda: len(_stored_jobs(db)) >= 10, "some events stored", within=60)
    processes[0].send_signal(signal.SIGKILL)
    processes[0].wait(timeout=10)
    await kit.publish(source, [json.dumps({"job": i}) for i in range(40, 60)])

    async def finished() -> bool:
        return set(_stored_jobs(db)) == set(range(60)) and await kit.remaining(source) == 0

    try:
        await eventually(finished, "every job stored and the source advanced", within=120)
    except AssertionError:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise AssertionError(f"not finished; the runners' log:\n{tail}") from None
    jobs = _stored_jobs(db)
    assert sorted(jobs) == list(range(60))  # none lost, none stored twice
    processes[1].send_signal(signal.SIGTERM)
    assert processes[1].wait(timeout=30) == 0
