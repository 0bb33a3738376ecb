"""A Kafka message id names one record and nothing else: the cluster and the topic's life too.

The event store drops an event whose (watcher, message id, position) it already
holds. Offsets restart at 0 on another cluster and on a recreated topic, so an id
of topic, partition and offset alone would take the new records for redeliveries
of the old ones: confirmed without being stored, and committed past. Here a
pipeline moves to another cluster behind the same address (same topic, group,
watcher and event store), as after a migration or a failover to a rebuilt cluster.
"""

from __future__ import annotations

import asyncio
import logging
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from acklane.connectors.kafka import KafkaConfig, KafkaStreamProducer
from acklane.core.config import parse_config
from acklane.core.events import EventStore
from acklane.core.pipeline.runner import Runner
from acklane.integration.kafka import KafkaKit, TansuEmulator

TOPIC = "orders"
GROUP = "orders-pipeline"


def pipeline(servers: str, db: Path) -> Runner:
    """One watcher on ``orders``, whichever cluster is behind ``servers``."""
    text = textwrap.dedent(
        f"""\
        engine:
          ack_timeout: 20
          restart_backoff_initial: 0.05
          restart_backoff_max: 0.2
          shutdown_timeout: 5
        store:
          url: sqlite:///{db}
        streams:
          orders:
            connector: kafka
            bootstrap_servers: {servers}
            topics: [{TOPIC}]
            group_id: {GROUP}
            poll_timeout: 0.05
            client:
              session.timeout.ms: {KafkaKit.FAST_GROUP["session.timeout.ms"]}
              heartbeat.interval.ms: {KafkaKit.FAST_GROUP["heartbeat.interval.ms"]}
              fetch.wait.max.ms: {KafkaKit.FAST_GROUP["fetch.wait.max.ms"]}
        watchers:
          - {{name: every-order, stream: orders, filter: {{emit: {{name: body.name}}}}}}
        """
    )
    return Runner(parse_config(text, source="pipeline.yaml"), handle_signals=False)


async def run_until_committed(runner: Runner, kit: KafkaKit, offset: int) -> None:
    """Run the pipeline until its group committed ``offset`` on ``orders``, then stop it."""
    task = asyncio.create_task(runner.run())
    try:
        async with asyncio.timeout(30):
            while await asyncio.to_thread(kit.committed, GROUP, TOPIC) != {0: offset}:
                assert not task.done(), task.exception()
                await asyncio.sleep(0.1)
    finally:
        runner.request_stop()
        await task


async def stored_names(db: Path) -> list[str]:
    async with EventStore(f"sqlite:///{db}") as store:
        return sorted(e.payload["name"] for e in await store.list_events(limit=100))


def fill(kit: KafkaKit, names: list[str]) -> None:
    kit.create_topic(TOPIC)
    kit.produce(TOPIC, [f'{{"name": "{n}"}}'.encode() for n in names])


@pytest.fixture
def clusters() -> Iterator[list[TansuEmulator]]:
    started: list[TansuEmulator] = []
    yield started
    for emulator in started:
        emulator.stop()


def start_cluster(clusters: list[TansuEmulator], port: int | None = None) -> KafkaKit:
    emulator = TansuEmulator(port=port)
    clusters.append(emulator)
    for attempt in range(20):  # the previous cluster's port may take a moment to free
        try:
            emulator.start()
            break
        except Exception:
            if port is None or attempt == 19:
                raise
            emulator.stop()
            time.sleep(0.1)
    return KafkaKit.of(emulator)


async def test_a_pipeline_moved_to_another_cluster_with_the_same_topic_stores_every_record(
    clusters: list[TansuEmulator], tmp_path: Path
) -> None:
    db = tmp_path / "events.db"
    first = start_cluster(clusters)
    servers = first.bootstrap_servers
    fill(first, ["old-0", "old-1", "old-2"])
    await run_until_committed(pipeline(servers, db), first, 3)
    first_cluster = first.cluster_id()
    first.close()
    clusters[0].stop()  # the address now leads to another cluster: same topic, offsets from 0

    second = start_cluster(clusters, port=clusters[0].port)
    assert second.bootstrap_servers == servers
    assert second.cluster_id() != first_cluster
    fill(second, ["new-0", "new-1", "new-2", "new-3"])
    await run_until_committed(pipeline(servers, db), second, 4)
    second.close()

    assert await stored_names(db) == [
        "new-0",
        "new-1",
        "new-2",
        "new-3",
        "old-0",
        "old-1",
        "old-2",
    ]


async def test_message_ids_name_the_cluster_and_the_topic_id(
    clusters: list[TansuEmulator], tmp_path: Path
) -> None:
    db = tmp_path / "events.db"
    kit = start_cluster(clusters)
    fill(kit, ["a", "b"])
    await run_until_committed(pipeline(kit.bootstrap_servers, db), kit, 2)
    cluster, topic_id = kit.cluster_id(), kit.topic_id(TOPIC)
    kit.close()

    async with EventStore(f"sqlite:///{db}") as store:
        ids = sorted(e.message_id or "" for e in await store.list_events(limit=100))
    assert topic_id is not None  # tansu gives topic ids, as Kafka 2.8+ does
    assert ids == [f"kafka:{cluster}/{TOPIC}:{topic_id}/0/{o}" for o in (0, 1)]


class Described:
    def __init__(self, topic_id: Any) -> None:
        self.topic_id = topic_id


class Answer:
    def __init__(self, value: Any) -> None:
        self.value = value

    def result(self, timeout: float) -> Any:
        if isinstance(self.value, Exception):
            raise self.value
        return self.value


class StandInAdmin:
    """Topic ids as a broker answers them: an id, all zeros (no topic ids), or an error."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers

    def describe_topics(self, topics: Any, request_timeout: float) -> dict[str, Answer]:
        return {t: Answer(self.answers[t]) for t in topics.topic_names}


def test_a_topic_without_an_id_is_named_by_cluster_topic_partition_and_offset(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from confluent_kafka import KafkaException, TopicPartition, Uuid

    producer = KafkaStreamProducer(
        KafkaConfig(bootstrap_servers="127.0.0.1:9", topics=["a", "b", "c"], group_id="g")
    )
    producer._cluster_id = "c-1"
    producer._admin = StandInAdmin(
        {
            "a": Described(Uuid(1, 2)),
            "b": Described(Uuid(0, 0)),  # a broker before Kafka 2.8
            "c": KafkaException("not authorized"),
        }
    )

    with caplog.at_level(logging.INFO, logger="acklane.connectors.kafka"):
        producer._on_assign(None, [TopicPartition(t, 0) for t in "abc"])

    prefixes = {tp[0]: prefix for tp, (_, prefix) in producer._fetching.items()}
    assert prefixes == {
        "a": f"kafka:c-1/a:{Uuid(1, 2)}/0/",
        "b": "kafka:c-1/b/0/",
        "c": "kafka:c-1/c/0/",
    }
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "topic id of c unknown" in warning and "not authorized" in warning


def test_every_emulator_has_a_cluster_id_of_its_own_unless_told() -> None:
    from acklane.integration.kafka import KafkaDockerEmulator, new_cluster_id

    ids = {TansuEmulator().cluster_id for _ in range(200)} | {KafkaDockerEmulator().cluster_id}
    assert len(ids) == 201
    assert all(len(i) == 22 and not i.startswith("-") for i in ids)  # Kafka's own form
    assert TansuEmulator(cluster_id="mine").cluster_id == "mine"
    assert new_cluster_id() not in ids
