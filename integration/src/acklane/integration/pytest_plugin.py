"""pytest fixtures that give a test a live broker, whatever starts it.

Installed with ``acklane-integration`` (entry point ``pytest11``), so users get
the same fixtures in their own pipelines' tests. One emulator per broker per
test session; tests isolate themselves with their own topics/queues.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .emulator import Emulator, emulator_for


def _session_emulator(broker: str) -> Iterator[Emulator]:
    emulator = emulator_for(broker)
    emulator.start()
    try:
        yield emulator
    finally:
        emulator.stop()


@pytest.fixture(scope="session")
def kafka_emulator() -> Iterator[Emulator]:
    """A Kafka-protocol broker: tansu locally, ``apache/kafka`` under Docker."""
    yield from _session_emulator("kafka")


@pytest.fixture(scope="session")
def sqs_emulator() -> Iterator[Emulator]:
    """An SQS endpoint: moto's server locally, LocalStack under Docker."""
    yield from _session_emulator("sqs")
