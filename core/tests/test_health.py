"""/healthz and /readyz beside /metrics: a real Runner (memory broker, SQLite store)
and its HTTP server, probed with urllib."""

from __future__ import annotations

import asyncio
import json
import textwrap
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from endpoint_harness import Running, http_get, http_probe, probe_until
from prometheus_client import CollectorRegistry
from sqlalchemy.ext.asyncio import AsyncConnection

from acklane.connectors.memory import MemoryBroker
from acklane.core.config import parse_config
from acklane.core.events import EventStore
from acklane.core.observe.health import Health
from acklane.core.observe.metrics import start_metrics_server
from acklane.core.pipeline.runner import Runner
from acklane.core.sql import async_engine

BOOM_TEXT = "filter bug: always"


def boom(message: Any) -> Any:
    """A filter that always raises (``test_health:boom``)."""
    raise RuntimeError(BOOM_TEXT)


def _config(db: Path, broker: str, filter_: str, backoff: float = 0.05) -> Any:
    return parse_config(
        textwrap.dedent(
            f"""\
            engine:
              restart_backoff_initial: {backoff}
              restart_backoff_max: {max(backoff, 0.2)}
              shutdown_timeout: 5
              progress_interval: 0
            store: {{url: "sqlite:///{db}", retention: null}}
            streams:
              orders: {{connector: memory, broker: {broker}, topics: [orders], group_id: g,
                        partitions: 1, poll_interval: 0.02}}
            watchers:
              - {{name: w, stream: orders, filter: {filter_}}}
            """
        ),
        source="h.yaml",
    )


@pytest.fixture
async def running(tmp_path: Path, broker: MemoryBroker) -> AsyncIterator[Callable[..., Any]]:
    started: list[Running] = []

    def start(filter_: str = "{emit: {id: body.id}}", backoff: float = 0.05) -> Running:
        runner = Runner(
            _config(tmp_path / "e.db", broker.name, filter_, backoff), handle_signals=False
        )
        server = start_metrics_server(0, runner, CollectorRegistry(), addr="127.0.0.1")
        task = asyncio.create_task(runner.run())
        started.append(Running(runner, server, task))
        return started[-1]

    yield start
    for r in started:
        r.runner.request_stop()
        async with asyncio.timeout(30):
            await r.task
        r.server.close()


async def test_ready_when_every_stream_polls_and_metrics_on_the_same_port(
    running: Callable[..., Running], broker: MemoryBroker
) -> None:
    r = running()
    status, body = await probe_until(r.port, "/readyz", lambda s, _: s == 200)
    ready = json.loads(body)
    assert ready["status"] == "ready"
    assert ready["streams"]["orders"]["state"] == "polling"
    assert ready["store"] == {"ok": True}
    status, body = await http_probe(r.port, "/healthz")
    assert status == 200
    assert json.loads(body)["status"] == "alive"
    broker.publish("orders", b'{"id": 1}')
    status, _ = await probe_until(
        r.port, "/metrics", lambda s, b: "acklane_events_broadcast_total{" in b
    )
    assert status == 200


async def test_not_ready_while_a_stream_waits_out_a_restart_backoff(
    running: Callable[..., Running], broker: MemoryBroker
) -> None:
    broker.publish("orders", b'{"id": 1}')
    r = running('{function: "test_health:boom"}', backoff=30)
    _, body = await probe_until(r.port, "/readyz", lambda s, b: s == 503 and "restarting" in b)
    answer = json.loads(body)
    assert answer["status"] == "not ready"
    assert answer["streams"]["orders"]["state"] == "restarting"
    assert BOOM_TEXT in answer["streams"]["orders"]["reason"]
    assert any("stream orders is restarting" in p for p in answer["problems"])
    # not ready is not dead: the process is alive and will restart the stream
    status, _ = await http_probe(r.port, "/healthz")
    assert status == 200


async def test_not_ready_while_the_event_store_cannot_write_then_ready_again(
    running: Callable[..., Running], broker: MemoryBroker
) -> None:
    r = running()
    await probe_until(r.port, "/readyz", lambda s, _: s == 200)
    release = asyncio.Event()

    async def fail_until_released(conn: AsyncConnection) -> None:
        if not release.is_set():
            raise ConnectionError("database is down (test)")

    r.runner.store.before_commit = fail_until_released
    broker.publish("orders", b'{"id": 1}')
    _, body = await probe_until(r.port, "/readyz", lambda s, _: s == 503)
    answer = json.loads(body)
    assert answer["store"]["ok"] is False
    assert "database is down (test)" in answer["store"]["problem"]
    assert answer["streams"]["orders"]["state"] == "polling"
    release.set()  # the writer's retry commits: ready again
    await probe_until(r.port, "/readyz", lambda s, _: s == 200)
    assert await r.runner.store.count() == 1


async def test_not_ready_when_the_store_check_cannot_reach_the_database(
    running: Callable[..., Running],
) -> None:
    r = running()
    await probe_until(r.port, "/readyz", lambda s, _: s == 200)
    store = r.runner.store
    # The database goes away: the next check's connection attempt is refused.
    unreachable = async_engine("postgresql://nobody@127.0.0.1:1/none?connect_timeout=2")
    healthy, store._engine = store._engine, unreachable
    try:
        assert await store.ping(5) is False
        _, body = await probe_until(r.port, "/readyz", lambda s, _: s == 503)
        assert "the database is unreachable" in json.loads(body)["store"]["problem"]
    finally:
        store._engine = healthy
        await unreachable.dispose()
    assert await store.ping(5) is True
    await probe_until(r.port, "/readyz", lambda s, _: s == 200)


async def test_the_runner_checks_the_store_periodically(tmp_path: Path) -> None:
    health = Health()
    health.heartbeat_interval = 0.01
    health.store_check_interval = 0.01
    pings: list[float] = []

    class Store(EventStore):
        async def ping(self, max_wait: float = 5.0) -> bool:
            pings.append(max_wait)
            return True

    async with Store(f"sqlite:///{tmp_path / 'e.db'}") as store:
        health.store = store
        task = asyncio.create_task(health.run_forever())
        try:
            async with asyncio.timeout(30):
                while len(pings) < 2:
                    await asyncio.sleep(0.01)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    assert pings[0] == health.store_check_timeout
    assert health.heartbeat is not None


async def test_a_hung_event_loop_is_not_alive(running: Callable[..., Running]) -> None:
    r = running()
    r.runner.health.heartbeat_interval = 0.05
    r.runner.health.stale_after = 0.5
    await probe_until(r.port, "/healthz", lambda s, b: s == 200 and "heartbeat_age" in b)
    beat = r.runner.health.heartbeat
    assert beat is not None
    answers: list[tuple[int, str]] = []

    def probe_while_hung() -> None:
        while time.monotonic() - beat <= 1.0:  # the heartbeat is surely stale by then
            time.sleep(0.01)
        answers.append(http_get(r.port, "/healthz"))

    prober = threading.Thread(target=probe_while_hung)
    prober.start()
    while prober.is_alive():  # the event loop is blocked: no heartbeat
        time.sleep(0.01)  # blocking the event loop on purpose
    status, body = answers[0]
    assert status == 503
    assert json.loads(body)["status"] == "event loop unresponsive"
    await probe_until(r.port, "/healthz", lambda s, _: s == 200)  # it beats again


async def test_not_alive_once_the_runner_stopped(running: Callable[..., Running]) -> None:
    r = running()
    await probe_until(r.port, "/readyz", lambda s, _: s == 200)
    r.runner.request_stop()
    async with asyncio.timeout(30):
        await r.task
    status, body = await http_probe(r.port, "/healthz")
    assert (status, json.loads(body)["status"]) == (503, "stopped")
    status, body = await http_probe(r.port, "/readyz")
    assert status == 503
    assert "the runner is stopped" in json.loads(body)["problems"]


def test_alive_but_not_ready_before_the_runner_starts(tmp_path: Path) -> None:
    health = Health()
    assert health.liveness() == (True, {"status": "alive", "phase": "new"})
    ready, body = health.readiness()
    assert not ready
    assert "the runner is new" in body["problems"]
    assert body["store"] == {"ok": False, "problem": "the event store is not open"}
