"""The poison policy on Service Bus (acklane's emulator): a message whose filter raises is
dead-lettered after ``max_attempts`` with its last error as the dead-letter reason, and
the others are processed.

The queue's own max delivery count is higher than ``max_attempts + 1``: the message
must be dead-lettered by acklane, with acklane's reason, not by the broker's count.
"""

from __future__ import annotations

import asyncio
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from acklane.core.config import AcklaneConfig, load_config
from acklane.core.events import EventStore
from acklane.core.runner import Runner
from acklane.integration.emulator import Emulator
from acklane.integration.servicebus import ServiceBusEmulator, ServiceBusKit

FILTERS = """\
from acklane.core import RawMessage


def big_orders(message: RawMessage):
    order = message.json()
    return {"id": order["id"]} if order["amount"] > 100 else None
"""

REASON = "poison: failed 2 times; last error: watcher big-orders: KeyError: 'amount'"


@pytest.fixture
def bus(servicebus_emulator: Emulator) -> ServiceBusEmulator:
    assert isinstance(servicebus_emulator, ServiceBusEmulator)
    return servicebus_emulator


def pipeline(
    tmp_path: Path, bus: ServiceBusEmulator, queue: str, monkeypatch: Any
) -> AcklaneConfig:
    package = tmp_path / "sbpoison"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "filters.py").write_text(FILTERS)
    monkeypatch.setenv("TEST_SB_CONNECTION", bus.connection_string)
    path = tmp_path / "pipeline.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            engine:
              ack_timeout: 20
              restart_backoff_initial: 0.05
              restart_backoff_max: 0.2
              shutdown_timeout: 5
            store:
              url: sqlite:///{tmp_path / "events.db"}
            streams:
              orders:
                connector: servicebus
                connection_string: "${{TEST_SB_CONNECTION}}"
                queue: "{queue}"
                max_wait_time: 1
                max_attempts: 2
            watchers:
              - name: big-orders
                stream: orders
                filter: {{function: "sbpoison.filters:big_orders"}}
            """
        )
    )
    return load_config(path)


async def fired(db: Path) -> list[int]:
    async with EventStore(f"sqlite:///{db}") as store:
        return sorted(e.payload["id"] for e in await store.list_events(limit=100))


async def test_a_poison_message_is_dead_lettered_after_max_attempts_and_the_rest_processed(
    tmp_path: Path, bus: ServiceBusEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A restart's abandoned messages may land in the closing receiver's prefetch and
    # stay locked until the lock lapses: a short lock keeps the test quick.
    queue = bus.create_queue(lock_duration=2, max_delivery_count=10)
    kit = ServiceBusKit(bus.connection_string)
    bodies = [{"id": 1, "amount": 150}, {"id": 2}, {"id": 3, "amount": 300}, {"id": 4, "amount": 5}]
    await asyncio.to_thread(kit.send, queue, [json.dumps(b) for b in bodies])
    runner = Runner(pipeline(tmp_path, bus, queue, monkeypatch), handle_signals=False)
    task = asyncio.create_task(runner.run())
    try:
        async with asyncio.timeout(60):
            while True:
                counts = await asyncio.to_thread(bus.counts, queue)
                if counts["messages"] == 0 and counts["dead_letter"] == 1:
                    break
                assert not task.done(), task.exception()
                await asyncio.sleep(0.2)
    finally:
        runner.request_stop()
        await task

    [copy] = await asyncio.to_thread(kit.peek_dead_letters, queue)
    assert json.loads(str(copy)) == {"id": 2}
    assert copy.dead_letter_reason == REASON
    # dead-lettered by acklane, before the queue's own max delivery count; the broker's
    # count is higher than the failed attempts (a lapsed lock counts too)
    assert 2 <= copy.delivery_count < 10
    assert await fired(tmp_path / "events.db") == [1, 3]
    (book,) = runner.poison.streams().values()
    assert (book.failures, book.poisoned) == (2, 1)
