"""The Service Bus producer 5 ms away (acklane's latency proxy before the emulator):
completions go in ranges, none lost or settled twice; a cut connection is recovered.

No speed is asserted: how many dispositions carried the completions is.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from acklane.connectors.servicebus import ServiceBusConfig, ServiceBusStreamProducer
from acklane.core.producer import AdvanceItem
from acklane.integration.emulator import Emulator
from acklane.integration.netproxy import LatencyProxy
from acklane.integration.servicebus import ServiceBusEmulator, ServiceBusKit
from acklane.integration.servicebus._launcher import connection_string
from acklane.integration.testing import CLEAN, rejected


@pytest.fixture
def bus(servicebus_emulator: Emulator) -> ServiceBusEmulator:
    assert isinstance(servicebus_emulator, ServiceBusEmulator)
    return servicebus_emulator


@pytest.fixture
async def proxy(bus: ServiceBusEmulator) -> AsyncIterator[LatencyProxy]:
    assert bus.port is not None
    async with LatencyProxy(bus.host, bus.port, delay=0.0025) as proxy:  # 5 ms round trip
        yield proxy


def through(
    bus: ServiceBusEmulator, proxy: LatencyProxy, queue: str, **extra: Any
) -> ServiceBusConfig:
    return ServiceBusConfig(
        connection_string=connection_string(proxy.host, proxy.port, bus.key),
        queue=queue,
        max_wait_time=1,
        **extra,
    )


async def drain(
    producer: ServiceBusStreamProducer,
    stream: AsyncIterator[Any],
    total: int,
    outcome: Any = lambda body: CLEAN,
    *,
    during: Any = None,
) -> list[Any]:
    """Take ``total`` messages, advancing each batch the way the engine does (in
    chunks, as they come); ``during(i)`` runs after the i-th message."""
    got: list[Any] = []
    batch: list[AdvanceItem[Any]] = []
    while len(got) < total:
        record, delivery = await asyncio.wait_for(anext(stream), 30)
        got.append(record)
        batch.append(AdvanceItem(delivery, outcome(record.body)))
        if len(batch) >= 25:
            await producer.advance(batch)
            batch = []
        if during is not None:
            await during(len(got))
    if batch:
        await producer.advance(batch)
    await producer.flush()
    return got


async def test_completions_go_in_ranges_none_lost_or_settled_twice_at_5ms(
    bus: ServiceBusEmulator, proxy: LatencyProxy
) -> None:
    queue = bus.create_queue(lock_duration=60)
    kit = ServiceBusKit(bus.connection_string)
    bodies = [f"m{i}".encode() for i in range(300)]
    bodies[40] = bodies[41] = bodies[200] = b"bad"  # rejects cut the ranges
    kit.send(queue, bodies)
    producer = ServiceBusStreamProducer(through(bus, proxy, queue, prefetch=60, receivers=2))
    stream = producer.open_stream()
    try:

        def outcome(body: bytes) -> Any:
            return rejected("bad body") if body == b"bad" else CLEAN

        got = await drain(producer, stream, 300, outcome)
    finally:
        await stream.aclose()
        await producer.aclose()
    assert proxy.accepted >= 2  # both receivers went through the proxy
    numbers = [r.sequence_number for r in got]
    assert len(set(numbers)) == 300  # each message handed on once
    assert all(r.delivery_count == 0 for r in got)  # none came again
    assert bus.counts(queue)["messages"] == 0
    assert bus.counts(queue)["dead_letter"] == 3
    counters = producer.counters()
    assert counters["completed"] == 297
    assert counters["dead_lettered"] == 3
    assert counters["lease_lost"] == 0 and counters["redelivered"] == 0
    assert producer.ranged >= 1
    assert producer.dispositions < 150  # far fewer calls than messages


async def test_a_cut_connection_is_recovered_without_loss(
    bus: ServiceBusEmulator, proxy: LatencyProxy
) -> None:
    queue = bus.create_queue(lock_duration=3)
    kit = ServiceBusKit(bus.connection_string)
    kit.send(queue, [f"m{i}".encode() for i in range(120)])
    producer = ServiceBusStreamProducer(
        through(
            bus,
            proxy,
            queue,
            prefetch=20,
            client_options={"retry_backoff_factor": 0.1, "retry_backoff_max": 0.5},
        )
    )
    stream = producer.open_stream()
    seen: set[int] = set()

    async def cut_once(i: int) -> None:
        if i == 30:
            proxy.cut()
            await asyncio.sleep(0.3)
            proxy.restore()

    try:
        got: list[Any] = []
        batch: list[AdvanceItem[Any]] = []
        async with asyncio.timeout(60):
            while len(seen) < 120:  # until every message was handed on (some twice)
                record, delivery = await anext(stream)
                got.append(record)
                seen.add(record.sequence_number)
                batch.append(AdvanceItem(delivery, CLEAN))
                if len(batch) >= 10:
                    await producer.advance(batch)
                    batch = []
                await cut_once(len(got))
            if batch:
                await producer.advance(batch)
            await producer.flush()
            # the redeliveries of the lost link's, advanced as they come (as the engine
            # does: a flush after each would hold each one up behind the next receive,
            # and the prefetched ones' locks would lapse meanwhile, sending them again);
            # flushed once the queue holds no more than the advanced ones
            unflushed = 0
            while True:
                if bus.counts(queue)["messages"] <= unflushed:
                    await producer.flush()
                    unflushed = 0
                    if bus.counts(queue)["messages"] == 0:
                        break
                record, delivery = await asyncio.wait_for(anext(stream), 30)
                await producer.advance([AdvanceItem(delivery, CLEAN)])
                unflushed += 1
    finally:
        await stream.aclose()
        await producer.aclose()
    assert proxy.accepted >= 2  # it connected again after the cut
    assert len(seen) == 120  # every message handed on (those of the cut link again)
    assert bus.counts(queue) == {
        "messages": 0,
        "locked": 0,
        "deferred": 0,
        "scheduled": 0,
        "dead_letter": 0,
    }


async def test_a_range_not_all_accepted_goes_one_by_one_by_lock_token(
    bus: ServiceBusEmulator, proxy: LatencyProxy
) -> None:
    """The service refuses one completion of a range (and applies the rest): each
    message is then completed by its lock token, the refused one included; the
    ones the range completed read as lost locks, none is completed twice or lost."""
    queue = bus.create_queue(lock_duration=60)
    ServiceBusKit(bus.connection_string).send(queue, [f"m{i}".encode() for i in range(40)])
    producer = ServiceBusStreamProducer(through(bus, proxy, queue, prefetch=40, receivers=1))
    stream = producer.open_stream()
    try:
        pending = [await asyncio.wait_for(anext(stream), 30) for _ in range(40)]
        bus.refuse_settlements(queue, 1)
        await producer.advance([AdvanceItem(delivery, CLEAN) for _, delivery in pending])
        await asyncio.wait_for(producer.flush(), 30)  # no outcome waited for in vain
    finally:
        await stream.aclose()
        await producer.aclose()
    assert bus.counts(queue)["messages"] == 0
    counters = producer.counters()
    assert counters["completed"] + counters["lease_lost"] == 40
    assert counters["completed"] >= 1  # the refused one, by its lock token
    assert producer.dispositions > producer.ranged + 1  # one by one after the range
