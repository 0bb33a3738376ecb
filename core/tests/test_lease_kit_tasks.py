"""A producer's owned tasks: spawn, the failure latch, the ordered close (no broker)."""

from __future__ import annotations

import asyncio

import pytest

from acklane.core.connectors import ProducerTasks
from acklane.core.errors import BrokerAuthError


async def test_a_task_that_raises_latches_the_failure_and_it_is_raised_after() -> None:
    tasks = ProducerTasks("stream s")

    async def broken() -> None:
        raise ValueError("boom")

    await asyncio.wait([tasks.spawn(broken(), "broken")])
    assert isinstance(tasks.failure, ValueError)
    with pytest.raises(ValueError, match="boom"):
        tasks.raise_failure()


async def test_only_the_first_failure_is_kept_and_told_to_the_callbacks_once() -> None:
    tasks = ProducerTasks("stream s")
    told: list[BaseException] = []
    tasks.on_failure(told.append)
    first, second = RuntimeError("first"), RuntimeError("second")
    tasks.fail(first)
    tasks.fail(second)
    assert tasks.failure is first and told == [first]


async def test_a_refused_credential_is_latched_without_an_error_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tasks = ProducerTasks("stream s")
    tasks.fail(BrokerAuthError("no"))
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


async def test_a_cancelled_task_latches_nothing() -> None:
    tasks = ProducerTasks("stream s")
    task = tasks.spawn(asyncio.sleep(60), "sleeper")
    await tasks.stop(task)
    assert task.cancelled() and tasks.failure is None


async def test_close_cancels_the_last_spawned_first_and_awaits_each() -> None:
    tasks = ProducerTasks("stream s")
    ended: list[str] = []

    async def runs(name: str) -> None:
        try:
            await asyncio.sleep(60)
        finally:
            ended.append(name)

    tasks.spawn(runs("flusher"), "flusher")
    tasks.spawn(runs("keeper"), "keeper")
    await asyncio.sleep(0)
    await tasks.aclose()
    assert ended == ["keeper", "flusher"]


async def test_nothing_is_spawned_once_closed() -> None:
    tasks = ProducerTasks("stream s")
    await tasks.aclose()
    with pytest.raises(RuntimeError, match="closed"):
        tasks.spawn(asyncio.sleep(0), "late")
