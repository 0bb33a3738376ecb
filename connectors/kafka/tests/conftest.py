"""Fixtures of the Kafka connector's tests: connector configs, open streams, and a
stream whose SASL login the broker refuses.

The session's broker and its kit come from acklane's pytest plugin (``kafka_emulator``,
``kafka_kit``);
every test makes its own topics and consumer groups, so tests never share state.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from acklane.connectors.kafka import KafkaConfig, KafkaDelivery, KafkaMessage, KafkaStreamProducer
from acklane.integration.kafka import KafkaKit


@pytest.fixture
def refused_sasl_stream(kafka_kit: KafkaKit) -> str:
    """The YAML of a stream (``orders``, group ``g``) on the emulator with a SASL_PLAINTEXT
    login, user ``alice``, password ``Secr3tSasl`` (never to be printed): tansu speaks no
    SASL mechanism a client can complete, so the broker refuses it, a real
    authentication failure."""
    return f"""\
        bootstrap_servers: {kafka_kit.bootstrap_servers}
        topics: [orders]
        group_id: g
        security_protocol: SASL_PLAINTEXT
        sasl_mechanism: PLAIN
        sasl_username: alice
        sasl_password: "Secr3tSasl"
        """


@pytest.fixture
def make_kafka_config(kafka_kit: KafkaKit) -> Callable[..., KafkaConfig]:
    """A KafkaConfig for a fresh consumer group, tuned for quick group joins."""

    def make(topics: str | list[str], **fields: Any) -> KafkaConfig:
        client = {**KafkaKit.FAST_GROUP, **fields.pop("client", {})}
        settings: dict[str, Any] = {
            "bootstrap_servers": kafka_kit.bootstrap_servers,
            "topics": topics,
            "group_id": KafkaKit.unique("group"),
            "poll_timeout": 0.05,
            "client": client,
        }
        settings.update(fields)
        return KafkaConfig(**settings)

    return make


class StreamDriver:
    """One producer and its open stream, pulled by the test like the engine would."""

    def __init__(self, producer: KafkaStreamProducer) -> None:
        self.producer = producer
        self.stream = producer.open_stream()
        self._next: asyncio.Task[tuple[KafkaMessage, KafkaDelivery]] | None = None

    async def take(self, n: int, timeout: float = 20.0) -> list[tuple[KafkaMessage, KafkaDelivery]]:
        """The next ``n`` (raw, delivery) pairs of the stream."""
        items = []
        async with asyncio.timeout(timeout):
            while len(items) < n:
                items.append(await self._pull())
        return items

    async def _pull(self) -> tuple[KafkaMessage, KafkaDelivery]:
        if self._next is None:
            self._next = asyncio.ensure_future(anext(self.stream))
        try:
            return await asyncio.shield(self._next)
        finally:
            if self._next.done():
                self._next = None

    def pull_in_background(self) -> None:
        """Keep one pull pending (the consumer keeps polling, e.g. through a rebalance)."""
        if self._next is None:
            self._next = asyncio.ensure_future(anext(self.stream))

    async def offsets(self, n: int, timeout: float = 20.0) -> list[int]:
        return [raw.offset for raw, _ in await self.take(n, timeout)]

    async def close(self) -> None:
        if self._next is not None:
            self._next.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration, Exception):
                await self._next
        await self.stream.aclose()
        await self.producer.aclose()


@pytest.fixture
async def open_kafka_stream() -> AsyncIterator[Callable[[KafkaConfig], StreamDriver]]:
    """Open a producer's stream; every one opened is closed after the test."""
    drivers: list[StreamDriver] = []

    def open_(config: KafkaConfig) -> StreamDriver:
        driver = StreamDriver(KafkaStreamProducer(config))
        drivers.append(driver)
        return driver

    yield open_
    for driver in drivers:
        await driver.close()
