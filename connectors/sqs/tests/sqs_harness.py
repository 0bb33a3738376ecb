"""A producer's stream driven by a test as the engine would: pull, then advance.

Used by the SQS producer tests (``from sqs_harness import ...``); their fixtures,
``settings`` and ``queues``, are in ``conftest.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from acklane.connectors.sqs import SqsConfig, SqsDelivery, SqsMessage, SqsStreamProducer
from acklane.core.producer import AdvanceItem, AdvanceOutcome

Pulled = tuple[SqsMessage, SqsDelivery]


class Stream:
    """A producer with its open stream; pulls with a deadline so a bug can't hang a test."""

    def __init__(self, producer: SqsStreamProducer) -> None:
        self.producer = producer
        self.iterator = producer.open_stream()

    async def pull(self, n: int = 1, timeout: float = 15.0) -> list[Pulled]:
        async with asyncio.timeout(timeout):
            return [await anext(self.iterator) for _ in range(n)]

    async def advance(self, *items: tuple[Pulled, AdvanceOutcome]) -> None:
        await self.producer.advance([AdvanceItem(p[1], outcome) for p, outcome in items])

    async def settle(self) -> None:
        """Wait until every buffered delete / visibility change reached SQS."""
        await self.producer.flush()

    async def close(self) -> None:
        """What the engine does when a group stops: close the stream, then the producer."""
        await self.iterator.aclose()
        await self.producer.aclose()


@contextlib.asynccontextmanager
async def open_stream(
    settings: dict[str, Any], *, session: Any = None, **fields: Any
) -> AsyncIterator[Stream]:
    """A :class:`Stream` of a producer of ``settings`` and ``fields`` (1 s long polls),
    closed on the way out."""
    config = SqsConfig(**{**settings, "wait_time_seconds": 1, **fields})
    stream = Stream(SqsStreamProducer(config, session=session))
    try:
        yield stream
    finally:
        await stream.close()
