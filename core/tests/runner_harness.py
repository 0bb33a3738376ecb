"""Helpers of the runner's end-to-end tests on the memory broker (not a test module)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from acklane.connectors.memory import MemoryBroker
from acklane.core.pipeline.runner import Runner

#: Runs a runner test on both filter paths (conftest's ``filter_path``).
both_filter_paths = pytest.mark.usefixtures("filter_path")


def all_committed(broker: MemoryBroker, group: str = "g", topic: str = "orders") -> bool:
    """Every partition of ``topic`` committed to its end by ``group``."""
    ends = broker.end_offsets(topic)
    return all(broker.committed(group, topic, p) >= end for p, end in ends.items())


async def run_until(runner: Runner, cond: Callable[[], bool], timeout: float = 15.0) -> None:
    """Run ``runner`` until ``cond()`` holds, then stop it and wait for it to finish."""
    task = asyncio.create_task(runner.run())
    try:
        async with asyncio.timeout(timeout):
            while not cond():
                assert not task.done(), task.exception()
                await asyncio.sleep(0.02)
    finally:
        runner.request_stop()
        await task
