"""Service Bus through acklane's engine, the official SDK against acklane's emulator.

The engine tests play the event store (every trigger event is confirmed at once,
unless a test holds some back). The rules every connector keeps (an advance error
fails the group and the restart redelivers; two ``acklane run`` processes and a
SIGKILL lose nothing) are tested on Service Bus with the others, in
``tests/test_conformance.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import pytest

from acklane.connectors.servicebus import (
    ServiceBusMessage,
    ServiceBusMessageTrigger,
    ServiceBusStreamProducer,
)
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
