"""Service Bus through acklane's engine and runner, the official SDK against acklane's emulator.

The in-process engine tests play the event store (every trigger event is confirmed
at once, unless a test holds some back); the runner tests run ``acklane run``'s
Runner in this process, or as real subprocesses with a YAML configuration and a
SQLite event store, one of them SIGKILLed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Hashable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from azure.servicebus.aio import ServiceBusReceiver
from azure.servicebus.exceptions import ServiceBusError

from acklane.connectors.servicebus import (
    ServiceBusMessage,
    ServiceBusMessageTrigger,
    ServiceBusStreamProducer,
)
from acklane.core.config import parse_config
from acklane.core.events import EventStore
from acklane.core.pipeline.runner import Runner, RunObserver
from acklane.core.trigger import AckTimeout, TriggerEvent, reject_shared_stream_event
from acklane.integration.emulator import Emulator
from acklane.integration.servicebus import ServiceBusEmulator, ServiceBusKit
from acklane.integration.testing import EngineDriver, eventually, run_engine

# ------------------------------------------------------------------------ watchers


class Watcher(ServiceBusMessageTrigger):
    """One trigger event per message; remembers the producers the engine made."""

    producers: ClassVar[list[ServiceBusStreamProducer]] = []

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> ServiceBusStreamProducer:
        producer = super().create_shared_stream_producer(kwargs)
        assert isinstance(producer, ServiceBusStreamProducer)
        Watcher.producers.append(producer)
        return producer

    async def filter_shared_stream(self, stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        async for record in stream:
            if self.accepts(record):
                yield TriggerEvent(payload(record))

    def accepts(self, record: ServiceBusMessage) -> bool:
        return True


def payload(record: ServiceBusMessage) -> dict[str, Any]:
    return {
        "body": record.text(),
        "session": record.session_id,
        "seq": record.sequence_number,
        "delivery_count": record.delivery_count,
    }


class Rejecting(Watcher):
    """Rejects the message whose body is ``poison``, with a reason."""

    def accepts(self, record: ServiceBusMessage) -> bool:
        if record.text() == "poison":
            reject_shared_stream_event("poison pill: not an order")
            return False
        return True


class Wedged(Watcher):
    """Sits on its first message past the ack timeout, then catches its failure and
    stays subscribed: its group lives on with nobody in its snapshot."""

    async def filter_shared_stream(self, stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        try:
            async for _record in stream:
                await asyncio.sleep(3600)
                yield TriggerEvent({})  # pragma: no cover - never reached
        except AckTimeout:
            await asyncio.Event().wait()


# ------------------------------------------------------------------------ fixtures


@pytest.fixture
def bus(servicebus_emulator: Emulator) -> ServiceBusEmulator:
    assert isinstance(servicebus_emulator, ServiceBusEmulator)
    return servicebus_emulator


@pytest.fixture
def kit(bus: ServiceBusEmulator) -> ServiceBusKit:
    return ServiceBusKit(bus.connection_string)


@pytest.fixture
def settings(bus: ServiceBusEmulator) -> dict[str, Any]:
    return {"connection_string": bus.connection_string, "max_wait_time": 1}


@pytest.fixture(autouse=True)
def _fresh_producer_log() -> None:
    Watcher.producers.clear()


def in_session(e: EngineDriver, trigger_id: str, session: str) -> list[str]:
    """The bodies ``trigger_id`` yielded for messages of ``session``, in order."""
    return [p["body"] for p in e.seen[trigger_id] if p["session"] == session]


# ------------------------------------------------------------------ the engine


async def test_watchers_sharing_one_receiver_see_every_message_and_a_clean_batch_is_completed(
    bus: ServiceBusEmulator, kit: ServiceBusKit, settings: dict[str, Any]
) -> None:
    queue = bus.create_queue(lock_duration=30)
    bodies = [f"m{i}" for i in range(30)]
    kit.send(queue, bodies)
    async with run_engine(cancel_watchers=True) as e:
        e.watch("a", Watcher(queue=queue, **settings))
        e.watch("b", Watcher(queue=queue, **settings))
        await eventually(lambda: len(e.seen["a"]) == len(e.seen["b"]) == 30, "both saw all")
        producer = Watcher.producers[0]
        await eventually(lambda: producer.completed == 30, "all completed")
    assert len(Watcher.producers) == 1  # one receiver for both watchers
    assert sorted(e.bodies("a")) == sorted(e.bodies("b")) == sorted(bodies)
    assert (producer.abandoned, producer.dead_lettered, producer.lock_lost) == (0, 0, 0)
    assert bus.counts(queue) == {
        "messages": 0,
        "locked": 0,
        "deferred": 0,
        "scheduled": 0,
        "dead_letter": 0,
    }


async def test_a_rejecting_watcher_dead_letters_with_acklanes_reason_readable_from_the_dlq(
    bus: ServiceBusEmulator, kit: ServiceBusKit, settings: dict[str, Any]
) -> None:
    queue = bus.create_queue(lock_duration=30)
    kit.send(queue, ["poison", "fine"])
    async with run_engine(cancel_watchers=True) as e:
        e.watch("all", Watcher(queue=queue, **settings))
        e.watch("picky", Rejecting(queue=queue, **settings))
        await eventually(lambda: e.bodies("picky") == ["fine"], "the fine one fired")
        producer = Watcher.producers[0]
        await eventually(lambda: producer.dead_lettered == 1, "dead-lettered")
        await eventually(lambda: producer.completed == 1, "the fine one completed")
    assert sorted(e.bodies("all")) == ["fine", "poison"]  # the other watcher still fired
    [copy] = kit.peek_dead_letters(queue)
    assert str(copy) == "poison"
    assert copy.dead_letter_reason == "poison pill: not an order"
    assert copy.dead_letter_error_description == "poison pill: not an order"
    assert copy.delivery_count == 0  # dead-lettered on its first delivery, not by retries
    assert bus.counts(queue)["messages"] == 0


async def test_messages_no_watcher_received_are_abandoned_never_completed(
    bus: ServiceBusEmulator, kit: ServiceBusKit, settings: dict[str, Any]
) -> None:
    # The only watcher sits on "first" past the ack timeout and is failed out of the
    # group; the group polls on with nobody subscribed. What it receives then is
    # unclaimed: abandoned, delivered again (count + 1), until the queue's max
    # delivery count dead-letters it. Never completed.
    queue = bus.create_queue(lock_duration=30, max_delivery_count=3)
    kit.send(queue, ["first"])
    async with run_engine(1.0, cancel_watchers=True) as e:
        key = e.watch("w", Wedged(queue=queue, **settings))
        await eventually(lambda: bool(Watcher.producers), "the group started")
        producer = Watcher.producers[0]
        await eventually(lambda: producer.abandoned >= 1, "first failed and abandoned")
        kit.send(queue, ["later"])
        await eventually(
            lambda: bus.counts(queue)["dead_letter"] == 2, "both out by max delivery count"
        )
        stats = e.manager.group_stats()[key]
        assert stats.unclaimed >= 5  # first: 2 of its 3 deliveries; later: all 3
    assert producer.completed == 0
    assert producer.abandoned >= 6
    copies = kit.peek_dead_letters(queue)
    assert sorted(str(c) for c in copies) == ["first", "later"]
    assert {c.dead_letter_reason for c in copies} == {"MaxDeliveryCountExceeded"}


async def test_a_failed_message_holds_its_session_behind_it_while_other_sessions_flow(
    bus: ServiceBusEmulator, kit: ServiceBusKit, settings: dict[str, Any]
) -> None:
    # "slow" stores h1's trigger event only after the ack timeout (it is held), h2 and
    # h3's at once: the engine resolves h1 failed and h2, h3 clean, in one lane (the
    # session). Completing h2 and h3 while h1 goes back would reorder the session: the
    # connector sends all three back, and they come again in order, h1 first.
    queue = bus.create_queue(lock_duration=5, requires_session=True)
    kit.send(queue, ["h1", "h2", "h3"], session_id="held")
    kit.send(queue, ["f0", "f1", "f2"], session_id="free")
    config = {**settings, "queue": queue, "sessions": True, "max_sessions": 2}
    async with run_engine(3.0, cancel_watchers=True) as e:
        e.hold = lambda trigger_id, p: trigger_id == "slow" and p["body"] == "h1"
        e.watch("fast", Watcher(**config))
        e.watch("slow", Watcher(**config))
        await eventually(lambda: in_session(e, "slow", "held") == ["h1", "h2", "h3"], "all fired")
        producer = Watcher.producers[0]
        # The other session is not held up by this one.
        await eventually(lambda: producer.completed == 3, "the free session completed")
        assert in_session(e, "fast", "free") == ["f0", "f1", "f2"]
        await eventually(lambda: isinstance(e.errors.get("slow"), AckTimeout), "slow timed out")
        await eventually(lambda: len(in_session(e, "fast", "held")) == 6, "the session came back")
        await eventually(lambda: producer.completed == 6, "all completed")
    assert in_session(e, "fast", "held") == ["h1", "h2", "h3", "h1", "h2", "h3"]
    again = [p for p in e.seen["fast"] if p["session"] == "held"][3:]
    assert [p["delivery_count"] for p in again] == [1, 1, 1]
    assert producer.abandoned == 3
    assert bus.counts(queue)["messages"] == 0


# ------------------------------------------------------------------ the runner


def pipeline_yaml(db: Path, queue: str) -> str:
    """One Service Bus stream, one watcher storing ``{"id": body.id}``; the
    connection string comes from the environment (``SB_CONNECTION``)."""
    return textwrap.dedent(
        f"""\
        engine:
          ack_timeout: 30
          restart_backoff_initial: 0.1
          restart_backoff_max: 0.5
          shutdown_timeout: 10
        store:
          url: "sqlite:///{db}"
        streams:
          jobs:
            connector: servicebus
            connection_string: "${{SB_CONNECTION}}"
            queue: "{queue}"
            max_wait_time: 1
            batch_size: 10
            prefetch: 10
        watchers:
          - name: every-job
            stream: jobs
            filter:
              emit: {{id: body.id}}
        """
    )


def exists(path: Path) -> bool:
    return path.exists()


async def stored_ids(db: Path) -> list[Any]:
    if not exists(db):
        return []
    async with EventStore(f"sqlite:///{db}") as store:
        return [e.payload["id"] for e in await store.list_events(limit=100_000)]


class Restarts(RunObserver):
    def __init__(self) -> None:
        self.errors: list[BaseException] = []

    def cohort_failed(self, key: Hashable, error: BaseException, delay: float) -> None:
        self.errors.append(error)


async def test_an_advance_error_fails_the_group_and_the_runner_restarts_it_losing_nothing(
    tmp_path: Path,
    bus: ServiceBusEmulator,
    kit: ServiceBusKit,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    queue = bus.create_queue(lock_duration=2)
    kit.send(queue, [json.dumps({"id": i}) for i in range(20)])
    complete = ServiceBusReceiver.complete_message
    failures: list[Any] = []

    async def complete_failing_once(self: ServiceBusReceiver, message: Any) -> None:
        if not failures:
            failures.append(message)
            raise ServiceBusError("the broker said no")
        await complete(self, message)

    monkeypatch.setattr(ServiceBusReceiver, "complete_message", complete_failing_once)
    db = tmp_path / "events.db"
    config = parse_config(
        pipeline_yaml(db, queue),
        source="pipeline.yaml",
        env={"SB_CONNECTION": bus.connection_string},
    )
    restarts = Restarts()
    runner = Runner(config, observer=restarts, handle_signals=False)
    task = asyncio.create_task(runner.run())
    try:

        async def done() -> bool:
            assert not task.done(), task
            counts = bus.counts(queue)
            return (counts["messages"], counts["locked"]) == (0, 0) and len(
                set(await stored_ids(db))
            ) == 20

        await eventually(done, "every message stored and completed", within=40)
    finally:
        runner.request_stop()
        await asyncio.wait_for(task, 30)
    assert len(failures) == 1
    assert [type(e) for e in restarts.errors] == [ServiceBusError]
    assert "the broker said no" in str(restarts.errors[0])
    ids = await stored_ids(db)
    assert sorted(ids) == list(range(20))  # each stored once: the redelivery was deduplicated
    assert bus.counts(queue)["dead_letter"] == 0


def stored_rows(db: Path) -> list[tuple[str, str]]:
    """``(message_id, payload)`` of every stored event, read without blocking a writer."""
    if not db.exists():
        return []
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)) as conn:
        try:
            return list(conn.execute("SELECT message_id, payload FROM acklane_trigger_events"))
        except sqlite3.OperationalError:  # not created yet
            return []


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)


async def test_two_runner_processes_share_a_queue_and_the_survivor_of_a_sigkill_finishes(
    tmp_path: Path,
    bus: ServiceBusEmulator,
    kit: ServiceBusKit,
    processes: list[subprocess.Popen[bytes]],
) -> None:
    queue = bus.create_queue(lock_duration=2)  # what the kill left locked comes back soon
    db, log = tmp_path / "events.db", tmp_path / "runners.log"
    config = tmp_path / "pipeline.yaml"
    config.write_text(pipeline_yaml(db, queue))
    env = {**os.environ, "SB_CONNECTION": bus.connection_string}
    with log.open("ab") as out:
        for _ in range(2):
            processes.append(
                subprocess.Popen(  # noqa: ASYNC220 - runner processes, not awaited
                    [sys.executable, "-m", "acklane.core.cli", "run", str(config)],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                )
            )
    kit.send(queue, [json.dumps({"id": i}) for i in range(60)])

    def ids() -> list[int]:
        return [json.loads(p)["id"] for _, p in stored_rows(db)]

    def tail() -> str:
        return "\n".join(log.read_text(errors="replace").splitlines()[-40:])

    try:
        await eventually(lambda: len(ids()) >= 15, "some events stored", within=40)
        processes[0].send_signal(signal.SIGKILL)  # mid-stream: messages locked, unsettled
        processes[0].wait(timeout=10)
        kit.send(queue, [json.dumps({"id": i}) for i in range(60, 80)])

        def finished() -> bool:
            counts = bus.counts(queue)
            return set(ids()) == set(range(80)) and (counts["messages"], counts["locked"]) == (
                0,
                0,
            )

        await eventually(finished, "the survivor stored and completed every message", 60)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nrunner log:\n{tail()}") from None
    assert sorted(ids()) == list(range(80))  # one event each: redeliveries deduplicated
    processes[1].send_signal(signal.SIGTERM)
    assert processes[1].wait(timeout=30) == 0, tail()
    assert bus.counts(queue)["dead_letter"] == 0
