"""The poison policy on Pub/Sub (acklane's emulator): a message whose filter raises is
dead-lettered after ``max_attempts`` with its last error, and the others are processed.

The subscription has no dead-letter policy, so Pub/Sub counts no delivery attempts
(``delivery_attempt`` is None): the count is acklane's, kept in the store.
"""

from __future__ import annotations

import asyncio
import json
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from acklane.core.config import AcklaneConfig, load_config
from acklane.core.deadletter import REJECT_REASON
from acklane.core.events import EventStore
from acklane.core.runner import Runner
from acklane.integration.emulator import Emulator
from acklane.integration.pubsub import PubSubKit

FILTERS = """\
from acklane.core import RawMessage


def big_orders(message: RawMessage):
    order = message.json()
    return {"id": order["id"]} if order["amount"] > 100 else None
"""


@pytest.fixture
def settings(pubsub_emulator: Emulator) -> dict[str, Any]:
    return pubsub_emulator.client_settings()


@pytest.fixture
async def kit(settings: dict[str, Any]) -> AsyncIterator[PubSubKit]:
    async with PubSubKit(settings) as k:
        yield k


def pipeline(tmp_path: Path, settings: dict[str, Any], sub: str, dlq: str) -> AcklaneConfig:
    package = tmp_path / "pubsubpoison"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "filters.py").write_text(FILTERS)
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
                connector: pubsub
                subscription: "{sub}"
                dead_letter_topic: "{dlq}"
                emulator_host: "{settings["emulator_host"]}"
                project: "{settings["project"]}"
                advance_linger: 0.01
                max_attempts: 2
            watchers:
              - name: big-orders
                stream: orders
                filter: {{function: "pubsubpoison.filters:big_orders"}}
            """
        )
    )
    return load_config(path)


async def fired(db: Path) -> list[int]:
    async with EventStore(f"sqlite:///{db}") as store:
        return sorted(e.payload["id"] for e in await store.list_events(limit=100))


async def test_a_poison_message_is_dead_lettered_after_max_attempts_and_the_rest_processed(
    tmp_path: Path, settings: dict[str, Any], kit: PubSubKit
) -> None:
    topic, dlq = await kit.create_topic("orders"), await kit.create_topic("orders-dlq")
    sub = await kit.create_subscription(topic, ack_deadline=30)
    dlq_sub = await kit.create_subscription(dlq)
    bodies = [{"id": 1, "amount": 150}, {"id": 2}, {"id": 3, "amount": 300}, {"id": 4, "amount": 5}]
    ids = await kit.publish(topic, [json.dumps(b) for b in bodies])
    runner = Runner(pipeline(tmp_path, settings, sub, dlq), handle_signals=False)
    copies: list[Any] = []
    task = asyncio.create_task(runner.run())
    try:
        async with asyncio.timeout(60):
            while not copies:
                assert not task.done(), task.exception()
                copies = await kit.pull(dlq_sub)
            while await fired(tmp_path / "events.db") != [1, 3]:
                await asyncio.sleep(0.1)
    finally:
        runner.request_stop()
        await task

    [copy] = copies
    assert json.loads(copy.message.data) == {"id": 2}
    assert copy.message.attributes[REJECT_REASON] == (
        "poison: failed 2 times; last error: watcher big-orders: KeyError: 'amount'"
    )
    assert ids[1] in copy.message.attributes.values()  # the origin message id
    (book,) = runner.poison.streams().values()
    assert (book.failures, book.poisoned) == (2, 1)
    assert await kit.pull(dlq_sub) == []  # dead-lettered once
