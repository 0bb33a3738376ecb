"""The Service Bus producer against acklane's emulator: outcomes, renewal, lost locks, sessions."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest

from acklane.connectors.servicebus import (
    ServiceBusConfig,
    ServiceBusConnector,
    ServiceBusStreamProducer,
)
from acklane.core.connectors import load_connector
from acklane.core.producer import AdvanceItem
from acklane.integration.emulator import Emulator
from acklane.integration.servicebus import ServiceBusEmulator, ServiceBusKit
from acklane.integration.testing import CLEAN, FAILED, UNCLAIMED, eventually, rejected


@pytest.fixture
def bus(servicebus_emulator: Emulator) -> ServiceBusEmulator:
    assert isinstance(servicebus_emulator, ServiceBusEmulator)
    return servicebus_emulator


@pytest.fixture
def kit(bus: ServiceBusEmulator) -> ServiceBusKit:
    return ServiceBusKit(bus.connection_string)


def config(bus: ServiceBusEmulator, queue: str, **extra: Any) -> ServiceBusConfig:
    return ServiceBusConfig(
        connection_string=bus.connection_string, queue=queue, max_wait_time=1, **extra
    )


async def take(stream: AsyncIterator[Any], n: int, timeout: float = 20) -> list[Any]:
    return [await asyncio.wait_for(anext(stream), timeout) for _ in range(n)]


def test_the_connector_is_found_by_its_entry_point() -> None:
    assert load_connector("servicebus") is ServiceBusConnector


async def test_clean_completed_rejected_dead_lettered_with_reason(
    bus: ServiceBusEmulator, kit: ServiceBusKit
) -> None:
    queue = bus.create_queue(lock_duration=5)
    kit.send(queue, [b"ok1", b"ok2", b"bad"])
    producer = ServiceBusConnector.create_producer(config(bus, queue))
    stream = producer.open_stream()
    try:
        got = await take(stream, 3)
        outcomes = {b"ok1": CLEAN, b"ok2": CLEAN, b"bad": rejected("not JSON")}
        await producer.advance([AdvanceItem(d, outcomes[r.body]) for r, d in got])
    finally:
        await stream.aclose()
        await producer.aclose()
    assert bus.counts(queue)["messages"] == 0
    [copy] = kit.peek_dead_letters(queue)
    assert str(copy) == "bad"
    assert copy.dead_letter_reason == "not JSON"
    assert copy.dead_letter_error_description == "not JSON"
    assert producer.counters()["dead_lettered"] == 1
    assert producer.counters()["completed"] == 2


async def test_failed_abandoned_redelivered_with_count_plus_one_lock_renewed_meanwhile(
    bus: ServiceBusEmulator, kit: ServiceBusKit
) -> None:
    queue = bus.create_queue(lock_duration=2)
    kit.send(queue, [b"m"])
    producer = ServiceBusStreamProducer(config(bus, queue, heartbeat={"interval": 0.3}))
    stream = producer.open_stream()
    try:
        [(record, delivery)] = await take(stream, 1)
        assert record.delivery_count == 0
        # past the 2 s lock it came with (by a second), renewed twice: only the renewals
        # keep it
        first_lock = delivery.message.locked_until_utc
        assert first_lock is not None

        def kept_past_its_lock() -> bool:
            past = (datetime.now(UTC) - first_lock).total_seconds() > 1.0
            return past and producer.renewed >= 2

        await eventually(kept_past_its_lock, "renewed twice, past the first lock", within=30)
        assert producer.renewed >= 2
        assert producer.lock_lost == 0
        await producer.advance([AdvanceItem(delivery, FAILED)])
        [(again, delivery2)] = await take(stream, 1)
        assert again.delivery_count == 1
        assert producer.message_id(delivery2) == producer.message_id(delivery)
        await producer.advance([AdvanceItem(delivery2, CLEAN)])
    finally:
        await stream.aclose()
        await producer.aclose()
    assert bus.counts(queue)["messages"] == 0


async def test_unclaimed_message_abandoned_and_max_delivery_count_dead_letters(
    bus: ServiceBusEmulator, kit: ServiceBusKit
) -> None:
    queue = bus.create_queue(lock_duration=5, max_delivery_count=2)
    kit.send(queue, [b"m"])
    producer = ServiceBusStreamProducer(config(bus, queue))
    stream = producer.open_stream()
    try:
        for _ in range(2):
            [(_, delivery)] = await take(stream, 1)
            await producer.advance([AdvanceItem(delivery, UNCLAIMED)])
        await asyncio.sleep(0.5)
    finally:
        await stream.aclose()
        await producer.aclose()
    [copy] = kit.peek_dead_letters(queue)
    assert copy.dead_letter_reason == "MaxDeliveryCountExceeded"
    assert producer.abandoned == 2


async def test_a_lost_lock_is_counted_and_the_message_redelivered(
    bus: ServiceBusEmulator, kit: ServiceBusKit
) -> None:
    queue = bus.create_queue(lock_duration=1.5)
    kit.send(queue, [b"m"])
    # No renewal within the lock: it lapses while the "watcher" works.
    producer = ServiceBusStreamProducer(config(bus, queue, heartbeat={"interval": 30}))
    stream = producer.open_stream()
    try:
        [(_, delivery)] = await take(stream, 1)
        await asyncio.sleep(2.0)
        [(again, delivery2)] = await take(stream, 1)  # Service Bus gave it again
        assert again.delivery_count == 1
        await producer.advance([AdvanceItem(delivery2, CLEAN)])
        await producer.advance([AdvanceItem(delivery, CLEAN)])  # lock lost: counted
        await producer.flush()  # settlements are sent in the background
        assert producer.lock_lost == 1
    finally:
        await stream.aclose()
        await producer.aclose()
    assert bus.counts(queue)["messages"] == 0


async def test_crash_without_advancing_redelivers(
    bus: ServiceBusEmulator, kit: ServiceBusKit
) -> None:
    queue = bus.create_queue(lock_duration=0.5)
    kit.send(queue, [b"a", b"b"])
    first = ServiceBusStreamProducer(config(bus, queue))
    stream = first.open_stream()
    await take(stream, 2)
    await stream.aclose()
    await first.aclose()
    second = ServiceBusStreamProducer(config(bus, queue))
    stream = second.open_stream()
    try:
        got = await take(stream, 2)
        assert sorted(r.body for r, _ in got) == [b"a", b"b"]
        await second.advance([AdvanceItem(d, CLEAN) for _, d in got])
    finally:
        await stream.aclose()
        await second.aclose()


async def test_topic_subscription(bus: ServiceBusEmulator) -> None:
    topic = bus.create_topic(subscriptions=["s1"], lock_duration=5)
    from azure.servicebus import ServiceBusClient, ServiceBusMessage

    with (
        ServiceBusClient.from_connection_string(bus.connection_string) as client,
        client.get_topic_sender(topic) as sender,
    ):
        sender.send_messages(ServiceBusMessage(b"t"))
    cfg = ServiceBusConfig(
        connection_string=bus.connection_string, topic=topic, subscription="s1", max_wait_time=1
    )
    producer = ServiceBusStreamProducer(cfg)
    stream = producer.open_stream()
    try:
        [(record, delivery)] = await take(stream, 1)
        assert record.body == b"t"
        assert producer.message_id(delivery).startswith(
            f"servicebus:{cfg.namespace}/{topic}/subscriptions/s1/1@"
        )
        await producer.advance([AdvanceItem(delivery, CLEAN)])
    finally:
        await stream.aclose()
        await producer.aclose()


async def test_a_failed_message_holds_its_session(
    bus: ServiceBusEmulator, kit: ServiceBusKit
) -> None:
    queue = bus.create_queue(lock_duration=5, requires_session=True)
    kit.send(queue, [b"s1-a", b"s1-b"], session_id="s1")
    producer = ServiceBusStreamProducer(config(bus, queue, sessions=True, max_sessions=1))
    stream = producer.open_stream()
    try:
        (ra, da), (rb, db) = await take(stream, 2)
        assert (ra.body, rb.body) == (b"s1-a", b"s1-b")
        assert producer.get_advance_lane(da) == producer.get_advance_lane(db)
        # s1-b is outstanding behind the failed s1-a: the session is let go with both,
        # and comes back in order; what was outstanding is not settled any more.
        await producer.advance([AdvanceItem(da, FAILED)])
        (a2, d2), (b2, e2) = await take(stream, 2)
        assert (a2.body, b2.body) == (b"s1-a", b"s1-b")
        assert a2.delivery_count == b2.delivery_count == 1
        await producer.advance([AdvanceItem(db, CLEAN)])
        await producer.advance([AdvanceItem(d2, CLEAN), AdvanceItem(e2, CLEAN)])
    finally:
        await stream.aclose()
        await producer.aclose()
    assert bus.counts(queue)["messages"] == 0


async def test_settlements_are_sent_in_the_background_and_a_failure_fails_the_next_advance(
    bus: ServiceBusEmulator, kit: ServiceBusKit, monkeypatch: pytest.MonkeyPatch
) -> None:
    from azure.servicebus.aio import ServiceBusReceiver
    from azure.servicebus.exceptions import ServiceBusError

    from acklane.core.errors import AdvanceError

    queue = bus.create_queue(lock_duration=5)
    kit.send(queue, [b"a", b"b", b"c"])
    producer = ServiceBusStreamProducer(config(bus, queue))
    stream = producer.open_stream()
    try:
        got = await take(stream, 3)
        await producer.advance([AdvanceItem(got[0][1], CLEAN)])
        await producer.flush()  # returns once Service Bus answered
        assert producer.completed == 1

        async def refuse(self: ServiceBusReceiver, message: Any) -> None:
            raise ServiceBusError("the broker said no")

        monkeypatch.setattr(ServiceBusReceiver, "complete_message", refuse)
        await producer.advance([AdvanceItem(got[1][1], CLEAN)])
        with pytest.raises(AdvanceError) as refused:
            await producer.flush()
        assert isinstance(refused.value.__cause__, ServiceBusError)  # the SDK's, as the cause
        with pytest.raises(AdvanceError, match="the broker said no"):
            await producer.advance([AdvanceItem(got[2][1], CLEAN)])
        with pytest.raises(AdvanceError):
            await take(stream, 1)  # the stream fails too: the group fails
    finally:
        await stream.aclose()
        await producer.aclose()
    assert producer.completed == 1  # the refused one was never completed: it comes back
    assert bus.counts(queue)["messages"] == 2


async def test_a_closing_producer_gives_back_at_once_what_it_held_and_prefetched(
    bus: ServiceBusEmulator, kit: ServiceBusKit
) -> None:
    # A cohort restart: the group's producer closes with messages handed on and never
    # resolved, and more prefetched by the SDK. The next producer gets them all long
    # before the 60 s locks would lapse: the unresolved ones abandoned (counted once),
    # the prefetched ones released by the SDK (not counted).
    queue = bus.create_queue(lock_duration=60)
    bodies = [f"m{i}".encode() for i in range(30)]
    kit.send(queue, bodies)
    first = ServiceBusStreamProducer(config(bus, queue, prefetch=20))
    stream = first.open_stream()
    try:
        held = await take(stream, 3)
    finally:
        await stream.aclose()
        await first.aclose()
    assert first.abandoned >= 3  # those three, and any other it had handed on
    assert first.completed == 0
    second = ServiceBusStreamProducer(config(bus, queue, prefetch=20))
    stream = second.open_stream()
    try:
        again = await take(stream, 30)
        await second.advance([AdvanceItem(d, CLEAN) for _, d in again])
        await second.flush()
    finally:
        await stream.aclose()
        await second.aclose()
    assert sorted(r.body for r, _ in again) == sorted(bodies)
    counts = {r.body: r.delivery_count for r, _ in again}
    assert all(counts[r.body] == 1 for r, _ in held)
    assert sum(counts.values()) == first.abandoned
    assert bus.counts(queue)["messages"] == 0


async def test_one_user_of_a_receivers_connection_at_a_time_and_batches_in_a_backlog(
    bus: ServiceBusEmulator, kit: ServiceBusKit, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Receives and settlements on one receiver never overlap (concurrent users of one
    # connection stall each other in the SDK); a backlog is received in whole batches.
    from azure.servicebus.aio import ServiceBusReceiver

    in_use: dict[int, int] = {}
    overlaps: list[str] = []
    asked: list[int] = []

    def counted(name: str) -> Any:
        original = getattr(ServiceBusReceiver, name)

        async def call(self: ServiceBusReceiver, *args: Any, **kwargs: Any) -> Any:
            if in_use.get(id(self)):
                overlaps.append(name)
            in_use[id(self)] = in_use.get(id(self), 0) + 1
            try:
                return await original(self, *args, **kwargs)
            finally:
                in_use[id(self)] -= 1

        return call

    receive = counted("receive_messages")

    async def receive_messages(self: ServiceBusReceiver, **kwargs: Any) -> Any:
        asked.append(kwargs["max_message_count"])
        return await receive(self, **kwargs)

    monkeypatch.setattr(ServiceBusReceiver, "receive_messages", receive_messages)
    monkeypatch.setattr(ServiceBusReceiver, "complete_message", counted("complete_message"))
    queue = bus.create_queue(lock_duration=30)
    kit.send(queue, [f"m{i}".encode() for i in range(200)])
    producer = ServiceBusStreamProducer(config(bus, queue, prefetch=20, batch_size=20))
    stream = producer.open_stream()
    try:
        for _ in range(20):  # the engine resolves each batch while the next comes
            got = await take(stream, 10)
            await producer.advance([AdvanceItem(d, CLEAN) for _, d in got])
        await producer.flush()
    finally:
        await stream.aclose()
        await producer.aclose()
    assert producer.completed == 200
    assert overlaps == []
    assert 20 in asked  # the backlog showed: whole batches
    assert len(asked) < 200
    assert bus.counts(queue)["messages"] == 0
