"""``acklane dlq list / redrive / purge`` on every broker's emulator.

The morning after, per broker: a filter bug dead-letters orders (a real runner, the
real filters and dead-letter step); ``dlq list`` shows them with their watcher and
reason and consumes nothing; ``redrive`` sends the chosen ones back (``--dry-run``
first) with a redrive count; ``acklane run`` with the fixed filter turns them into
trigger events; a letter rejected again after ``--max-redrives`` redrives stays;
``purge`` asks first, then empties. The SIGKILL test (``chaos``) kills a redrive
of many letters and checks that none is lost.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from acklane.core.cli import app as cli
from acklane.core.config import load_config
from acklane.core.connectors import load_connector
from acklane.core.connectors.deadletter import REDRIVE_COUNT
from acklane.core.pipeline.runner import Runner
from acklane.core.testing import CLEAN, eventually, rejected
from acklane.integration.emulator import Emulator
from acklane.integration.kits import BrokerKit, PubSubBrokerKit, Source
from acklane.integration.testing import AcklaneRun, StreamDriver, fired_ids, run_until

BROKERS = ["kafka", "sqs", "pubsub", "servicebus"]

pytestmark = [
    pytest.mark.filterwarnings("ignore:The return_immediately flag:DeprecationWarning"),
    pytest.mark.kit_brokers(*BROKERS),
]

ORDERS = [
    {"id": 1, "amount": 500},
    {"id": 2, "amount": 700},
    {"id": 3, "amount": 5, "kind": "test"},
    {"id": 4, "amount": 10},
]

#: The bug: big-orders rejects every order above 100 instead of firing for it.
BUGGY = {"match": {"body.amount": {"gt": 100}}, "reject": {"body.amount": {"gt": 100}}}
FIXED = {"match": {"body.amount": {"gt": 100}}}
EMIT = {"id": "body.id", "redrives": f"attributes.{REDRIVE_COUNT}"}
#: audit rejects test orders and fires for none of the others.
AUDIT = {"match": {"body.kind": "audit"}, "reject": {"body.kind": "test"}}


def pipeline(directory: Path, kit: BrokerKit, source: Source, name: str, big: Any) -> Path:
    stream = textwrap.indent(kit.stream_yaml(source), "    ")
    store = json.dumps(f"sqlite:///{directory / (name + '.db')}")
    watchers = [
        {"name": "big-orders", "stream": "orders", "filter": {**big, "emit": EMIT}},
        {"name": "audit", "stream": "orders", "filter": AUDIT},
    ]
    config = directory / f"{name}.yaml"
    config.write_text(
        "engine: {ack_timeout: 30, restart_backoff_initial: 0.2, shutdown_timeout: 10}\n"
        f"store: {{url: {store}}}\n"
        f"streams:\n  orders:\n    connector: {kit.connector}\n{stream}"
        f"watchers: {json.dumps(watchers)}\n"
    )
    return config


async def dlq(*args: str, input: str | None = None) -> Any:
    """``acklane dlq ARGS`` in this process (on a thread: it runs its own event loop)."""

    def invoke() -> Any:
        return CliRunner().invoke(cli.app, ["dlq", *args], input=input, env={"COLUMNS": "200"})

    return await asyncio.to_thread(invoke)


async def letters(config: Path, *options: str) -> list[dict[str, Any]]:
    result = await dlq("list", str(config), "orders", "--format", "json", *options)
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["count"] == len(document["letters"])
    found: list[dict[str, Any]] = document["letters"]
    return found


async def redrive(config: Path, *options: str) -> dict[str, Any]:
    result = await dlq("redrive", str(config), "orders", "--format", "json", *options)
    assert result.exit_code == 0, result.output
    report: dict[str, Any] = json.loads(result.stdout)
    return report


def ids(found: list[dict[str, Any]]) -> list[int]:
    return sorted(json.loads(letter["body"])["id"] for letter in found)


async def test_list_redrive_fix_and_purge(kit: BrokerKit, tmp_path: Path) -> None:
    source = await kit.create()
    await kit.publish(source, [json.dumps(order) for order in ORDERS])
    buggy = pipeline(tmp_path, kit, source, "buggy", BUGGY)

    # the night: three orders dead-lettered by the real runner and its filters
    async def advanced() -> bool:
        return await kit.remaining(source) == 0

    await run_until(Runner(load_config(buggy)), advanced, limit=60)

    # the morning: what is there, with watcher and reason; reading consumes nothing
    found = await letters(buggy)
    assert ids(found) == [1, 2, 3]
    by_id = {json.loads(letter["body"])["id"]: letter for letter in found}
    assert by_id[1]["watchers"] == ["big-orders"] and by_id[3]["watchers"] == ["audit"]
    assert "watcher big-orders: reject rule matched" in by_id[1]["reason"]
    assert all(
        letter["origin_id"] and letter["time"] and letter["redrives"] == 0 for letter in found
    )
    assert ids(await letters(buggy)) == [1, 2, 3]
    assert ids(await letters(buggy, "--reason", "BODY.KIND", "--id", by_id[3]["id"])) == [3]
    text = await dlq("list", str(buggy), "orders", "--watcher", "big-orders", "--limit", "1")
    assert text.exit_code == 0 and "1 dead letter(s)" in text.stdout, text.output

    dry = await redrive(buggy, "--watcher", "big-orders", "--dry-run")
    assert dry["redriven"] == 2 and dry["dry_run"] is True
    assert ids(await letters(buggy)) == [1, 2, 3]
    done = await redrive(buggy, "--watcher", "big-orders")
    assert (done["redriven"], done["kept"]) == (2, 1)
    assert ids(await letters(buggy)) == [3]

    # the fix: the redriven orders become trigger events through `acklane run`
    fixed = pipeline(tmp_path, kit, source, "fixed", FIXED)
    with AcklaneRun(fixed) as run:
        await eventually(
            lambda: _fired(tmp_path / "fixed.db", 2), "the redriven orders fired", within=60
        )
        assert run.stop() == 0, run.output
    assert await fired_ids(tmp_path / "fixed.db") == [1, 2]
    assert {str(r) for r in _payloads(tmp_path / "fixed.db", "redrives")} == {"1"}

    # a letter that comes back rejected again after --max-redrives redrives stays
    assert (await redrive(buggy, "--max-redrives", "1"))["redriven"] == 1
    async with StreamDriver(load_connector(kit.connector).create_producer(kit.fields(source))) as s:
        [pair] = await s.take(1)
        assert pair[0].attributes.get(REDRIVE_COUNT) == "1"
        await s.advance((pair, rejected("watcher audit: still a test order")))
    [again] = await eventually_letters(buggy, 1)
    assert again["redrives"] == 1 and again["reason"] == "watcher audit: still a test order"
    skipped = await redrive(buggy, "--max-redrives", "1")
    assert (skipped["redriven"], skipped["skipped"]) == (0, 1)

    # purge asks first (no terminal: --yes is required), then empties
    refused = await dlq("purge", str(buggy), "orders")
    assert refused.exit_code == 2 and "--yes" in refused.output
    purged = await dlq("purge", str(buggy), "orders", "--yes")
    assert purged.exit_code == 0 and "purged 1 dead letter(s)" in purged.stdout, purged.output
    assert await letters(buggy) == []


async def eventually_letters(config: Path, count: int) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []

    async def enough() -> bool:
        nonlocal got
        got = await letters(config)
        return len(got) >= count

    await eventually(enough, f"{count} dead letter(s)", within=30)
    return got


def _rows(db: Path) -> list[dict[str, Any]]:
    import sqlite3

    if not db.exists():
        return []
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10) as conn:
        try:
            rows = list(conn.execute("SELECT payload FROM acklane_trigger_events"))
        except sqlite3.OperationalError:
            return []
    return [json.loads(payload) for (payload,) in rows]


def _fired(db: Path, count: int) -> bool:
    return len(_rows(db)) >= count


def _payloads(db: Path, name: str) -> list[Any]:
    return [row.get(name) for row in _rows(db)]


async def test_a_connector_without_a_reader_and_a_bad_stream_are_refused(tmp_path: Path) -> None:
    config = tmp_path / "memory.yaml"
    config.write_text(
        f"store: {{url: 'sqlite:///{tmp_path / 'e.db'}'}}\n"
        "streams:\n  orders: {connector: memory, topics: [orders], dead_letter: dlq}\n"
        "watchers: [{name: w, stream: orders}]\n"
    )
    result = await dlq("list", str(config), "orders")
    assert result.exit_code == 2 and "cannot read its dead letters" in result.output
    missing = await dlq("list", str(config), "nope")
    assert missing.exit_code == 2 and "no stream named 'nope'" in missing.output


async def test_an_sqs_stream_without_a_dead_letter_queue_is_refused(
    sqs_emulator: Emulator, tmp_path: Path
) -> None:
    from acklane.integration.sqs import SqsQueues

    settings = sqs_emulator.client_settings()
    async with SqsQueues(settings) as queues:
        url = await queues.create("no-dlq")
        config = tmp_path / "sqs.yaml"
        block = json.dumps({"connector": "sqs", **settings, "queue_url": url})
        config.write_text(
            f"store: {{url: 'sqlite:///{tmp_path / 'e.db'}'}}\n"
            f"streams:\n  orders: {block}\nwatchers: [{{name: w, stream: orders}}]\n"
        )
        result = await dlq("redrive", str(config), "orders")
    assert result.exit_code == 2 and "no dead-letter queue" in result.output, result.output


@pytest.mark.chaos
@pytest.mark.timeout(420)
async def test_a_redrive_killed_by_sigkill_loses_nothing(kit: BrokerKit, tmp_path: Path) -> None:
    source = await kit.create()
    count = 150
    await kit.publish(source, [json.dumps({"id": i, "amount": 500}) for i in range(count)])
    buggy = pipeline(tmp_path, kit, source, "buggy", BUGGY)

    async def advanced() -> bool:
        return await kit.remaining(source) == 0

    await run_until(Runner(load_config(buggy)), advanced, limit=120)
    assert len(await letters(buggy)) == count

    command = [sys.executable, "-m", "acklane.core.cli", "dlq", "redrive", str(buggy), "orders"]
    log = tmp_path / "redrive.log"
    process = subprocess.Popen(  # noqa: ASYNC220 - killed below, not awaited
        [*command, "--hold", str(HOLD)],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env=dict(os.environ),
    )
    try:
        if kit.connector == "kafka":
            # the kit cannot count a topic's records (the emulator's high-water marks are
            # wrong): killed at a random moment of its work (start-up takes about 2 s)
            await asyncio.sleep(random.uniform(2.0, 3.5))
        else:
            # killed as soon as the first copies are in the source, before all are

            async def copies_came() -> bool:
                return await kit.remaining(source) > 0

            try:
                await eventually(copies_came, "the first copies in the source", within=120)
            except AssertionError:
                said = log.read_text()
                raise AssertionError(f"no copy came; the redrive said:\n{said}") from None
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    # what the killed redrive held comes back (locks, visibility, deadlines lapse): the
    # second one sends every letter it finds; together, every order is in the source
    await asyncio.sleep(_lapse(kit))

    async def all_sent_back() -> bool:
        # a letter still held by the killed one (a lock, a deadline) is found by a later run
        await redrive(buggy)
        return await letters(buggy) == []

    await eventually(all_sent_back, "every letter sent back", within=150)
    seen: set[int] = set()
    connector = load_connector(kit.connector)
    async with StreamDriver(connector.create_producer(kit.fields(source))) as stream:
        taken: list[Any] = []
        while len(seen) < count:
            taken += await stream.take(1, within=30)
            seen.update(json.loads(raw.body)["id"] for raw, _ in taken[-1:])
            if len(taken) >= 50 or len(seen) == count:
                await stream.advance(*((pair, CLEAN) for pair in taken))
                taken = []
    assert seen == set(range(count))  # none lost (some may have come twice)


#: Seconds the killed redrive holds SQS and Pub/Sub letters.
HOLD = 10


def _lapse(kit: BrokerKit) -> float:
    """Seconds until what a killed reader held is given back by the broker.

    A Pub/Sub pull gives its letters the reader subscription's deadline until the reader
    moves them to ``--hold``: one killed in between holds them for the former (while held,
    ``dlq list`` does not see them, and the test would stop looking too early).
    """
    lock = 5.0  # the Service Bus kit's lock duration is 2 s
    pubsub = max(HOLD, PubSubBrokerKit.READER_ACK_DEADLINE) + 1.0
    return {"sqs": HOLD + 1.0, "pubsub": pubsub, "servicebus": lock, "kafka": 0.0}[kit.connector]
