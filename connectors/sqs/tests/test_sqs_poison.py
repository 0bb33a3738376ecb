"""The poison policy on SQS (the session's emulator): a message whose filter raises is
dead-lettered after ``max_attempts`` with its last error, and the others are processed.

The filter is the docs' own example (``function: mypipeline.filters:big_orders``),
written beside the pipeline file as a user would: ``{"id": 2}`` has no ``amount``.
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
from acklane.core.deadletter import ORIGIN_MESSAGE_ID, ORIGIN_QUEUE, REJECT_REASON
from acklane.core.events import EventStore
from acklane.core.runner import Runner
from acklane.integration.emulator import Emulator
from acklane.integration.sqs import SqsQueues

FILTERS = """\
from acklane.core import RawMessage


def big_orders(message: RawMessage):
    order = message.json()
    return {"id": order["id"]} if order["amount"] > 100 else None
"""


@pytest.fixture
def settings(sqs_emulator: Emulator) -> dict[str, Any]:
    return sqs_emulator.client_settings()


@pytest.fixture
async def queues(settings: dict[str, Any]) -> AsyncIterator[SqsQueues]:
    async with SqsQueues(settings) as q:
        yield q


def pipeline(
    tmp_path: Path, settings: dict[str, Any], queue: str, dlq: str, monkeypatch: Any
) -> AcklaneConfig:
    package = tmp_path / "sqspoison"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "filters.py").write_text(FILTERS)
    monkeypatch.setenv("TEST_SQS_KEY_ID", settings["aws_access_key_id"])
    monkeypatch.setenv("TEST_SQS_SECRET", settings["aws_secret_access_key"])
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
                connector: sqs
                queue_url: "{queue}"
                dead_letter_queue_url: "{dlq}"
                endpoint_url: "{settings["endpoint_url"]}"
                region: "{settings["region"]}"
                aws_access_key_id: "${{TEST_SQS_KEY_ID}}"
                aws_secret_access_key: "${{TEST_SQS_SECRET}}"
                wait_time_seconds: 1
                max_attempts: 2
            watchers:
              - name: big-orders
                stream: orders
                filter: {{function: "sqspoison.filters:big_orders"}}
            """
        )
    )
    return load_config(path)


async def test_a_poison_message_is_dead_lettered_after_max_attempts_and_the_rest_processed(
    tmp_path: Path, settings: dict[str, Any], queues: SqsQueues, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue, dlq = await queues.create("orders"), await queues.create("orders-dlq")
    bodies = [{"id": 1, "amount": 150}, {"id": 2}, {"id": 3, "amount": 300}, {"id": 4, "amount": 5}]
    ids = await queues.send(queue, [json.dumps(b) for b in bodies])
    runner = Runner(pipeline(tmp_path, settings, queue, dlq, monkeypatch), handle_signals=False)
    task = asyncio.create_task(runner.run())
    try:
        async with asyncio.timeout(60):
            while await queues.counts(queue) != (0, 0) or await queues.counts(dlq) == (0, 0):
                assert not task.done(), task.exception()
                await asyncio.sleep(0.2)
    finally:
        runner.request_stop()
        await task

    [copy] = await queues.receive(dlq)
    assert json.loads(copy["Body"]) == {"id": 2}
    attributes = {k: v["StringValue"] for k, v in copy["MessageAttributes"].items()}
    assert attributes[REJECT_REASON] == (
        "poison: failed 2 times; last error: watcher big-orders: KeyError: 'amount'"
    )
    assert attributes[ORIGIN_MESSAGE_ID] == ids[1] and attributes[ORIGIN_QUEUE] == queue
    async with EventStore(f"sqlite:///{tmp_path / 'events.db'}") as store:
        fired = sorted(e.payload["id"] for e in await store.list_events(limit=100))
    assert fired == [1, 3]  # the others were processed; the poison one never fired
    (book,) = runner.poison.streams().values()
    assert (book.failures, book.poisoned) == (2, 1)
