"""pytest fixtures that give a test a live broker, whatever starts it.

Installed with ``acklane-integration`` (entry point ``pytest11``), so users get
the same fixtures in their own pipelines' tests. One emulator per broker per
test session; tests isolate themselves with their own topics/queues.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from .emulator import BACKEND_ENV, Emulator, emulator_for
from .kafka import KafkaKit


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
def kafka_kit(kafka_emulator: Emulator) -> Iterator[KafkaKit]:
    """Topics, records and committed offsets on the session's Kafka emulator."""
    kit = KafkaKit.of(kafka_emulator)
    yield kit
    kit.close()


@pytest.fixture(scope="session")
def sqs_emulator() -> Iterator[Emulator]:
    """An SQS endpoint: moto's server locally, LocalStack under Docker."""
    yield from _session_emulator("sqs")


@pytest.fixture(scope="session")
def pubsub_emulator() -> Iterator[Emulator]:
    """A Pub/Sub endpoint: acklane's emulator in relaxed mode (ack deadlines from 1 s).

    Google's image only when ``ACKLANE_EMULATOR_BACKEND=docker`` says so: it has no
    relaxed mode, and the fast tests' short deadlines need one.
    """
    backend = "docker" if os.environ.get(BACKEND_ENV, "").strip().lower() == "docker" else "local"
    emulator = emulator_for("pubsub", backend, relaxed=True)
    emulator.start()
    try:
        yield emulator
    finally:
        emulator.stop()


@pytest.fixture(scope="session")
def servicebus_emulator() -> Iterator[Emulator]:
    """An Azure Service Bus namespace: acklane's emulator locally, Microsoft's under Docker."""
    yield from _session_emulator("servicebus")


@pytest.fixture(scope="session")
def schema_registry_emulator() -> Iterator[Emulator]:
    """A Confluent Schema Registry API: acklane's emulator locally, Confluent's image
    (with a Kafka broker of its own) under Docker. ``client_settings()`` is a Kafka
    stream's ``schema_registry:`` block, ``client_conf()`` a ``SchemaRegistryClient``'s."""
    yield from _session_emulator("schema-registry")
