"""The poison policy on Pub/Sub (acklane's emulator): a message whose filter raises is
dead-lettered after ``max_attempts`` with its last error, and the others are processed.

The subscription has no dead-letter policy, so Pub/Sub counts no delivery attempts
(``delivery_attempt`` is None): the count is acklane's, kept in the store.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from acklane.core.config import AcklaneConfig
from acklane.core.connectors.deadletter import REJECT_REASON
from acklane.core.pipeline.runner import Runner
from acklane.integration.emulator import Emulator
from acklane.integration.pubsub import PubSubKit
from acklane.integration.testing import ORDERS, fired_ids, poison_pipeline, run_until


@pytest.fixture
def settings(pubsub_emulator: Emulator) -> dict[str, Any]:
    return pubsub_emulator.client_settings()


@pytest.fixture
async def kit(settings: dict[str, Any]) -> AsyncIterator[PubSubKit]:
    async with PubSubKit(settings) as k:
        yield k


def pipeline(tmp_path: Path, settings: dict[str, Any], sub: str, dlq: str) -> AcklaneConfig:
    stream = f"""\
        subscription: "{sub}"
        dead_letter: "{dlq}"
        emulator_host: "{settings["emulator_host"]}"
        project: "{settings["project"]}"
        advance_linger: 0.01
        max_attempts: 2
        """
    return poison_pipeline(tmp_path, "pubsub", stream, package="pubsubpoison")


async def test_a_poison_message_is_dead_lettered_after_max_attempts_and_the_rest_processed(
    tmp_path: Path, settings: dict[str, Any], kit: PubSubKit
) -> None:
    topic, dlq = await kit.create_topic("orders"), await kit.create_topic("orders-dlq")
    sub = await kit.create_subscription(topic, ack_deadline=30)
    dlq_sub = await kit.create_subscription(dlq)
    ids = await kit.publish(topic, [json.dumps(b) for b in ORDERS])
    runner = Runner(pipeline(tmp_path, settings, sub, dlq), handle_signals=False)
    copies: list[Any] = []

    async def done() -> bool:
        if not copies:
            copies.extend(await kit.pull(dlq_sub))
        return bool(copies) and await fired_ids(tmp_path / "events.db") == [1, 3]

    await run_until(runner, done)

    [copy] = copies
    assert json.loads(copy.message.data) == {"id": 2}
    assert copy.message.attributes[REJECT_REASON] == (
        "poison: failed 2 times; last error: watcher big-orders: KeyError: 'amount'"
    )
    assert ids[1] in copy.message.attributes.values()  # the origin message id
    (book,) = runner.poison.streams().values()
    assert (book.failures, book.poisoned) == (2, 1)
    assert await kit.pull(dlq_sub) == []  # dead-lettered once
