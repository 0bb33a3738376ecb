"""The poison policy on Service Bus (acklane's emulator): a message whose filter raises is
dead-lettered after ``max_attempts`` with its last error as the dead-letter reason, and
the others are processed.

The queue's own max delivery count is higher than ``max_attempts + 1``: the message
must be dead-lettered by acklane, with acklane's reason, not by the broker's count.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from acklane.core.config import AcklaneConfig
from acklane.core.pipeline.runner import Runner
from acklane.integration.emulator import Emulator
from acklane.integration.servicebus import ServiceBusEmulator, ServiceBusKit
from acklane.integration.testing import ORDERS, fired_ids, poison_pipeline, run_until

REASON = "poison: failed 2 times; last error: watcher big-orders: KeyError: 'amount'"


@pytest.fixture
def bus(servicebus_emulator: Emulator) -> ServiceBusEmulator:
    assert isinstance(servicebus_emulator, ServiceBusEmulator)
    return servicebus_emulator


def pipeline(
    tmp_path: Path, bus: ServiceBusEmulator, queue: str, monkeypatch: Any
) -> AcklaneConfig:
    monkeypatch.setenv("TEST_SB_CONNECTION", bus.connection_string)
    stream = f"""\
        connection_string: "${{TEST_SB_CONNECTION}}"
        queue: "{queue}"
        max_wait_time: 1
        max_attempts: 2
        """
    return poison_pipeline(tmp_path, "servicebus", stream, package="sbpoison")


async def test_a_poison_message_is_dead_lettered_after_max_attempts_and_the_rest_processed(
    tmp_path: Path, bus: ServiceBusEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A restart's abandoned messages may land in the closing receiver's prefetch and
    # stay locked until the lock lapses: a short lock keeps the test quick.
    queue = bus.create_queue(lock_duration=2, max_delivery_count=10)
    kit = ServiceBusKit(bus.connection_string)
    await asyncio.to_thread(kit.send, queue, [json.dumps(b) for b in ORDERS])
    runner = Runner(pipeline(tmp_path, bus, queue, monkeypatch), handle_signals=False)

    async def done() -> bool:
        counts = await asyncio.to_thread(bus.counts, queue)
        return counts["messages"] == 0 and counts["dead_letter"] == 1

    await run_until(runner, done, interval=0.2)

    [copy] = await asyncio.to_thread(kit.peek_dead_letters, queue)
    assert json.loads(str(copy)) == {"id": 2}
    assert copy.dead_letter_reason == REASON
    # dead-lettered by acklane, before the queue's own max delivery count; the broker's
    # count is higher than the failed attempts (a lapsed lock counts too)
    assert 2 <= copy.delivery_count < 10
    assert await fired_ids(tmp_path / "events.db") == [1, 3]
    (book,) = runner.poison.streams().values()
    assert (book.failures, book.poisoned) == (2, 1)
