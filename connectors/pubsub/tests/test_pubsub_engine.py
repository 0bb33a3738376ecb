"""Pub/Sub through the engine, against acklane's emulator.

The tests play the event store (every trigger event is confirmed at once). Two
``acklane run`` processes on one subscription, one SIGKILLed, is a rule of every
connector: ``tests/test_conformance.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
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
