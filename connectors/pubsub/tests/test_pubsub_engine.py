"""Pub/Sub through the engine and through ``acklane run``, against acklane's emulator.

The in-process tests play the event store (every trigger event is confirmed at
once); the last one runs two real runner processes on one subscription and
SIGKILLs one.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest

from acklane.connectors.pubsub import PubSubMessage, PubSubMessageTrigger, PubSubStreamProducer
from acklane.core.producer import AdvanceItem
from acklane.core.trigger import AckTimeout, TriggerEvent, reject_shared_stream_event
from acklane.integration.emulator import Emulator
from acklane.integration.pubsub import PubSubKit
from acklane.integration.testing import eventually, run_engine


class Watcher(PubSubMessageTrigger):
    producers: ClassVar[list[PubSubStreamProducer]] = []

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> PubSubStreamProducer:
        producer = super().create_shared_stream_producer(kwargs)
        assert isinstance(producer, PubSubStreamProducer)
        Watcher.producers.append(producer)
        return producer


class SlowOn(Watcher):
    slow_body: str
    work_seconds: float

    async def filter_shared_stream(self, stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        async for message in stream:
            if message.text() == self.slow_body:
                await asyncio.sleep(self.work_seconds)
            yield TriggerEvent(self.event_payload(message))


class Rejecting(Watcher):
    def accepts(self, message: PubSubMessage) -> bool:
        if message.text() == "poison":
            reject_shared_stream_event("poison pill")
            return False
        return True


class BrokenOnce(PubSubStreamProducer):
    """A producer whose first advance raises, as a broker error would."""

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        if not getattr(type(self), "broken", False):
            type(self).broken = True  # type: ignore[attr-defined]
            raise RuntimeError("the broker said no")
        await super().advance(batch)


class WithBrokenProducer(Watcher):
    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> PubSubStreamProducer:
        producer = BrokenOnce(cls.connector_class.config(kwargs))
        Watcher.producers.append(producer)
        return producer


@pytest.fixture
def settings(pubsub_emulator: Emulator) -> dict[str, Any]:
    return {**pubsub_emulator.client_settings(), "advance_linger": 0.01}


@pytest.fixture
async def kit(settings: dict[str, Any]) -> AsyncIterator[PubSubKit]:
    async with PubSubKit(settings) as k:
        yield k


@pytest.fixture(autouse=True)
def _fresh() -> None:
    Watcher.producers.clear()


async def test_watchers_share_one_pull_and_clean_messages_are_acked(
    settings: dict[str, Any], kit: PubSubKit
) -> None:
    topic = await kit.create_topic()
    sub = await kit.create_subscription(topic)
    bodies = [f"m{i}" for i in range(30)]
    await kit.publish(topic, bodies)
    async with run_engine() as e:
        e.watch("a", Watcher(subscription=sub, **settings))
        e.watch("b", Watcher(subscription=sub, **settings))
        await eventually(lambda: len(e.seen["a"]) == len(e.seen["b"]) == 30, "both saw all")
        producer = Watcher.producers[0]
        await eventually(lambda: producer.acked == 30, "all acked")
    assert len(Watcher.producers) == 1
    assert sorted(e.bodies("a")) == sorted(e.bodies("b")) == sorted(bodies)
    assert producer.api_calls <= 12  # get, a few pulls, batched acks


async def test_a_slow_watcher_keeps_the_lease_until_its_ack_timeout_then_redelivery(
    settings: dict[str, Any], kit: PubSubKit
) -> None:
    topic = await kit.create_topic()
    sub = await kit.create_subscription(topic, ack_deadline=1)
    await kit.publish(topic, ["slow"])
    config = {**settings, "subscription": sub, "ack_deadline": 2}
    async with run_engine(ack_timeout=4.0) as e:
        e.watch("fast", Watcher(**config))
        e.watch("slow", SlowOn(slow_body="slow", work_seconds=6.0, **config))
        await eventually(lambda: len(e.seen["fast"]) == 1, "the fast watcher saw it")
        for _ in range(5):  # 2.5 s: past the subscription's 1 s deadline, the lease holds
            await asyncio.sleep(0.5)
            assert len(e.seen["fast"]) == 1
        await eventually(lambda: isinstance(e.errors.get("slow"), AckTimeout), "slow timed out")
        await eventually(lambda: len(e.seen["fast"]) == 2, "redelivered to the fast watcher")
        await eventually(lambda: Watcher.producers[0].acked == 1, "acked after redelivery")


async def test_a_rejected_message_reaches_the_dead_letter_topic_with_the_reason(
    settings: dict[str, Any], kit: PubSubKit
) -> None:
    topic, dlq = await kit.create_topic(), await kit.create_topic("dlq")
    sub, dlq_sub = await kit.create_subscription(topic), await kit.create_subscription(dlq)
    [poison_id] = await kit.publish(topic, ["poison"])
    await kit.publish(topic, ["fine"])
    async with run_engine() as e:
        e.watch("w", Rejecting(subscription=sub, dead_letter=dlq, **settings))
        await eventually(lambda: e.bodies("w") == ["fine"], "the fine one fired")
        await eventually(lambda: Watcher.producers[0].dead_lettered == 1, "dead-lettered")
    [copy] = await kit.drain(dlq_sub, expect=1)
    assert copy.message.attributes["acklane.reject.reason"] == "poison pill"
    assert copy.message.attributes["acklane.origin.message_id"] == poison_id


@pytest.mark.parametrize("hold", [30, 0])
async def test_an_advance_error_fails_the_group_and_a_restart_gets_the_message_again(
    settings: dict[str, Any], kit: PubSubKit, hold: int
) -> None:
    """With a hold the restarted group takes the lease over: no delivery attempt counted."""
    topic, dead = await kit.create_topic(), await kit.create_topic("dead")
    sub = await kit.create_subscription(
        topic, ack_deadline=30, dead_letter_topic=dead, max_delivery_attempts=5
    )
    await kit.publish(topic, ["once"])
    BrokenOnce.broken = False  # type: ignore[attr-defined]
    fields = {**settings, "restart_lease_hold": hold}
    async with run_engine() as e:
        e.watch("w", WithBrokenProducer(subscription=sub, **fields))
        await eventually(lambda: "w" in e.errors, "the group failed")
        assert "the broker said no" in repr(e.errors["w"])
        first = Watcher.producers[0]
        await eventually(lambda: first.parked + first.nacked == 1, "kept or released at close")
        assert (first.parked, first.nacked) == ((1, 0) if hold else (0, 1))
        e.watch("w", WithBrokenProducer(subscription=sub, **fields))  # the runner's restart
        await eventually(lambda: e.bodies("w") == ["once", "once"], "delivered again")
        await eventually(lambda: Watcher.producers[-1].acked == 1, "acked by the new group")
        attempts = [p["delivery_attempt"] for p in e.seen["w"]]
        assert attempts == ([1, 1] if hold else [1, 2])
        assert Watcher.producers[-1].taken_over == (1 if hold else 0)
    assert len(Watcher.producers) == 2


# ------------------------------------------------------------ acklane run, twice


def write_config(path: Path, settings: dict[str, Any], subscription: str) -> Path:
    config = path / "pipeline.yaml"
    config.write_text(
        textwrap.dedent(
            f"""\
            engine:
              ack_timeout: 30
              restart_backoff_initial: 0.2
              restart_backoff_max: 1
              shutdown_timeout: 10
            store:
              url: "sqlite:///{path / "events.db"}"
            streams:
              jobs:
                connector: pubsub
                subscription: "{subscription}"
                emulator_host: "{settings["emulator_host"]}"
                ack_deadline: 2
                batch_size: 5
                max_outstanding: 10
            watchers:
              - name: every-job
                stream: jobs
                asset: jobs
                filter:
                  emit: message
            """
        )
    )
    return config


def stored(db: Path) -> list[tuple[str, int]]:
    if not db.exists():
        return []
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10) as conn:
        try:
            return list(conn.execute("SELECT message_id, position FROM acklane_trigger_events"))
        except sqlite3.OperationalError:
            return []


async def test_two_runners_share_a_subscription_and_the_survivor_of_a_sigkill_finishes(
    tmp_path: Path, settings: dict[str, Any], kit: PubSubKit
) -> None:
    topic = await kit.create_topic()
    sub = await kit.create_subscription(topic, ack_deadline=2)
    config = write_config(tmp_path, settings, sub)
    db, log = tmp_path / "events.db", tmp_path / "runner.log"
    processes: list[subprocess.Popen[bytes]] = []
    try:
        with log.open("ab") as out:
            for _ in range(2):
                processes.append(
                    subprocess.Popen(  # noqa: ASYNC220 - a runner process, not awaited
                        [sys.executable, "-m", "acklane.core.cli", "run", str(config)],
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        env=dict(os.environ),
                    )
                )
        ids = await kit.publish(topic, [f'{{"job": {i}}}' for i in range(60)])
        await eventually(lambda: len(stored(db)) >= 15, "some events stored", within=40)
        processes[0].send_signal(signal.SIGKILL)
        processes[0].wait(timeout=10)
        ids += await kit.publish(topic, [f'{{"job": {i}}}' for i in range(60, 80)])
        expected = {i for i in ids}

        def all_stored() -> bool:
            return {m.rsplit("/", 1)[1].split("@")[0] for m, _ in stored(db)} == expected

        try:
            await eventually(all_stored, "every message stored once", within=60)
        except AssertionError:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
            raise AssertionError(f"not all stored; runner log:\n{tail}") from None
        assert len(stored(db)) == len(ids)  # redeliveries were deduplicated
        processes[1].send_signal(signal.SIGTERM)
        assert processes[1].wait(timeout=20) == 0
        # Whatever the stop left unacked comes back, and is a message already stored.
        left = await kit.drain(sub, expect=len(ids), within=3)
        assert {r.message.message_id for r in left} <= expected
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=5)
