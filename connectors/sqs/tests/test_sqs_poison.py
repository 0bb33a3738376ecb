"""The poison policy on SQS (the session's emulator): a message whose filter raises is
dead-lettered after ``max_attempts`` with its last error, and the others are processed.

The filter is the docs' own example (``function: mypipeline.filters:big_orders``),
written beside the pipeline file as a user would: ``{"id": 2}`` has no ``amount``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from acklane.core.config import AcklaneConfig
from acklane.core.connectors.deadletter import ORIGIN_MESSAGE_ID, ORIGIN_QUEUE, REJECT_REASON
from acklane.core.pipeline.runner import Runner
from acklane.integration.sqs import SqsQueues
from acklane.integration.testing import ORDERS, fired_ids, poison_pipeline, run_until


def pipeline(
    tmp_path: Path, settings: dict[str, Any], queue: str, dlq: str, monkeypatch: Any
) -> AcklaneConfig:
    monkeypatch.setenv("TEST_SQS_KEY_ID", settings["aws_access_key_id"])
    monkeypatch.setenv("TEST_SQS_SECRET", settings["aws_secret_access_key"])
    stream = f"""\
        queue_url: "{queue}"
        dead_letter: "{dlq}"
        endpoint_url: "{settings["endpoint_url"]}"
        region: "{settings["region"]}"
        aws_access_key_id: "${{TEST_SQS_KEY_ID}}"
        aws_secret_access_key: "${{TEST_SQS_SECRET}}"
        wait_time_seconds: 1
        max_attempts: 2
        """
    return poison_pipeline(tmp_path, "sqs", stream, package="sqspoison")


async def test_a_poison_message_is_dead_lettered_after_max_attempts_and_the_rest_processed(
    tmp_path: Path, settings: dict[str, Any], queues: SqsQueues, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue, dlq = await queues.create("orders"), await queues.create("orders-dlq")
    ids = await queues.send(queue, [json.dumps(b) for b in ORDERS])
    runner = Runner(pipeline(tmp_path, settings, queue, dlq, monkeypatch), handle_signals=False)

    async def done() -> bool:
        return await queues.counts(queue) == (0, 0) and await queues.counts(dlq) != (0, 0)

    await run_until(runner, done, interval=0.2)

    [copy] = await queues.receive(dlq)
    assert json.loads(copy["Body"]) == {"id": 2}
    attributes = {k: v["StringValue"] for k, v in copy["MessageAttributes"].items()}
    assert attributes[REJECT_REASON] == (
        "poison: failed 2 times; last error: watcher big-orders: KeyError: 'amount'"
    )
    assert attributes[ORIGIN_MESSAGE_ID] == ids[1] and attributes[ORIGIN_QUEUE] == queue
    fired = await fired_ids(tmp_path / "events.db")
    assert fired == [1, 3]  # the others were processed; the poison one never fired
    (book,) = runner.poison.streams().values()
    assert (book.failures, book.poisoned) == (2, 1)
