"""The settle buffer: chunks, linger, single flight, back-pressure, failures (no broker)."""

from __future__ import annotations

import asyncio
from collections import deque

import pytest

from acklane.core.connectors import SettleBuffer


class Broker:
    """Records each call; fails the item named in ``fail``; may pause on a gate."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[int]]] = []
        self.fail: int | None = None
        self.gate: asyncio.Event | None = None

    async def send(self, key: str, chunk: deque[int]) -> None:
        self.calls.append((key, list(chunk)))
        if self.gate is not None:
            await self.gate.wait()
        while chunk:
            if chunk[0] == self.fail:
                raise RuntimeError(f"refused {chunk[0]}")
            chunk.popleft()


async def test_a_flush_sends_each_key_in_chunks_in_the_order_of_its_keys() -> None:
    broker = Broker()
    buffer: SettleBuffer[str, int] = SettleBuffer(
        broker.send, batch=2, limit=100, order=("delete", "release")
    )
    for n in (1, 2, 3):
        buffer.add("release", n)
    buffer.add("delete", 9)
    await buffer.flush()
    assert broker.calls == [("delete", [9]), ("release", [1, 2]), ("release", [3])]
    assert len(buffer) == 0


async def test_the_flusher_lingers_for_company_then_sends_one_chunk() -> None:
    broker = Broker()
    buffer: SettleBuffer[str, int] = SettleBuffer(broker.send, batch=10, limit=100, linger=0.05)
    flusher = asyncio.create_task(buffer.run())
    buffer.add("k", 1)
    await asyncio.sleep(0)
    buffer.add("k", 2)
    while len(buffer):
        await asyncio.sleep(0.01)
    flusher.cancel()
    assert broker.calls == [("k", [1, 2])]


async def test_a_full_chunk_is_sent_without_waiting_for_the_linger() -> None:
    broker = Broker()
    buffer: SettleBuffer[str, int] = SettleBuffer(broker.send, batch=2, limit=100, linger=60)
    flusher = asyncio.create_task(buffer.run())
    buffer.add("k", 1)
    buffer.add("k", 2)
    async with asyncio.timeout(5):
        while len(buffer):
            await asyncio.sleep(0.01)
    flusher.cancel()
    assert broker.calls == [("k", [1, 2])]


async def test_a_flush_returns_only_once_the_flush_in_flight_was_answered() -> None:
    broker = Broker()
    broker.gate = asyncio.Event()
    buffer: SettleBuffer[str, int] = SettleBuffer(broker.send, batch=10, limit=100)
    buffer.add("k", 1)
    first = asyncio.create_task(buffer.flush())
    await asyncio.sleep(0)
    second = asyncio.create_task(buffer.flush())
    await asyncio.sleep(0.01)
    assert not second.done()
    broker.gate.set()
    await asyncio.gather(first, second)
    assert broker.calls == [("k", [1])]


async def test_cancelling_a_flush_never_drops_its_chunk_half_sent() -> None:
    broker = Broker()
    broker.gate = asyncio.Event()
    buffer: SettleBuffer[str, int] = SettleBuffer(broker.send, batch=10, limit=100)
    buffer.add("k", 1)
    caller = asyncio.create_task(buffer.flush())
    await asyncio.sleep(0)
    caller.cancel()
    broker.gate.set()
    await buffer.flush()  # waits for the shielded flush: it went on
    assert broker.calls == [("k", [1])] and len(buffer) == 0


async def test_a_failed_item_is_dropped_and_what_follows_it_is_kept_for_the_next_flush() -> None:
    broker = Broker()
    broker.fail = 2
    buffer: SettleBuffer[str, int] = SettleBuffer(broker.send, batch=10, limit=100)
    for n in (1, 2, 3, 4):
        buffer.add("k", n)
    with pytest.raises(RuntimeError, match="refused 2"):
        await buffer.flush()
    assert len(buffer) == 2
    await buffer.flush()
    assert broker.calls[-1] == ("k", [3, 4])


async def test_past_the_limit_settle_soon_flushes_before_it_returns() -> None:
    broker = Broker()
    buffer: SettleBuffer[str, int] = SettleBuffer(broker.send, batch=10, limit=3, linger=60)
    buffer.add("k", 1)
    await buffer.settle_soon()
    assert broker.calls == []
    buffer.add("k", 2)
    buffer.add("k", 3)
    await buffer.settle_soon()
    assert broker.calls == [("k", [1, 2, 3])]


async def test_parallel_keys_are_sent_together_and_the_first_failure_is_raised() -> None:
    broker = Broker()
    broker.fail = 5
    buffer: SettleBuffer[str, int] = SettleBuffer(broker.send, batch=10, limit=100, parallel=True)
    buffer.add("a", 1)
    buffer.add("b", 5)
    with pytest.raises(RuntimeError, match="refused 5"):
        await buffer.flush()
    assert sorted(broker.calls) == [("a", [1]), ("b", [5])]


async def test_one_key_is_flushed_alone_and_holds_tells_what_it_still_has() -> None:
    broker = Broker()
    buffer: SettleBuffer[str, int] = SettleBuffer(broker.send, batch=10, limit=100)
    buffer.add("a", 1)
    buffer.add("b", 2)
    await buffer.flush("a")
    assert broker.calls == [("a", [1])]
    assert not buffer.holds("a") and buffer.holds("b")
    assert buffer.forget("b") == [2] and len(buffer) == 0
