"""Fixtures of the SQS connector's tests: the emulator's settings and throw-away queues.

The session's emulator comes from acklane's pytest plugin (``sqs_emulator``); every
test makes its own queues, so tests never share state. The helpers that drive a
producer's stream are in :mod:`sqs_harness`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from acklane.integration.emulator import Emulator
from acklane.integration.sqs import SqsQueues


@pytest.fixture
def settings(sqs_emulator: Emulator) -> dict[str, Any]:
    """The ``connector: sqs`` fields that reach the emulator (endpoint, region, keys)."""
    return sqs_emulator.client_settings()


@pytest.fixture
async def queues(settings: dict[str, Any]) -> AsyncIterator[SqsQueues]:
    """Queues made for this test, deleted after it."""
    async with SqsQueues(settings) as q:
        yield q
