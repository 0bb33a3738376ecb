"""/readyz and a broker that does not answer.

A broker that does not answer fails no group (the connectors wait and retry), so the
stream's watchers stay "polling"; readiness must still say that nothing can be
received. The connectors keep that state in one :class:`Reachability`, their
producers' ``broker_problem()`` hands it to the runner on every heartbeat.

- unit: the readiness rule, the manager's ``broker_problems()``, ``Reachability``'s
  log lines and pauses, the runner's heartbeat (memory broker);
- real: a Kafka stream and an SQS stream whose broker is a closed local port, in an
  in-process Runner with its metrics port, probed with urllib.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import textwrap
import uuid
from collections.abc import AsyncIterator, Callable, Hashable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from endpoint_harness import Running, http_get, probe_until
from prometheus_client import CollectorRegistry

from acklane.connectors.memory import MemoryBroker
from acklane.core.config import parse_config
from acklane.core.connectors import Reachability
from acklane.core.events import EventStore
from acklane.core.observe.health import CohortStatus, Health
from acklane.core.observe.metrics import start_metrics_server
from acklane.core.pipeline.runner import Runner
from acklane.integration.emulator import free_port

# ------------------------------------------------------------------ the rule


class _OpenStore:
    problem: str | None = None


def _health(*statuses: CohortStatus) -> Health:
    health = Health()
    health.phase = "running"
    health.beat()
    health.store = cast(EventStore, _OpenStore())
    for status in statuses:
        health.cohorts[status.key_text] = status
    return health


def test_a_polling_stream_whose_broker_does_not_answer_is_not_ready() -> None:
    orders = CohortStatus("orders", "kafka|b:9092|orders", ("w",), state="polling")
    audit = CohortStatus("audit", "sqs|q", ("a",), state="polling")
    health = _health(orders, audit)
    assert health.readiness()[0] is True

    orders.broker_problem = "broker unreachable at b:9092 (Connection refused)"
    ready, body = health.readiness()
    assert not ready
    assert body["status"] == "not ready"
    assert body["problems"] == [
        "stream orders cannot reach its broker: broker unreachable at b:9092 (Connection refused)"
    ]
    assert body["streams"]["orders"] == {
        "key": "kafka|b:9092|orders",
        "state": "polling",
        "broker": "broker unreachable at b:9092 (Connection refused)",
    }
    assert "broker" not in body["streams"]["audit"]

    orders.broker_problem = None  # it answers again
    ready, body = health.readiness()
    assert ready and "problems" not in body and "broker" not in body["streams"]["orders"]


def test_a_restarting_stream_is_told_as_restarting_with_its_broker_beside() -> None:
    orders = CohortStatus("orders", "k", ("w",), state="restarting", reason="boom")
    orders.broker_problem = "broker unreachable at b:9092 (refused)"
    ready, body = _health(orders).readiness()
    assert not ready
    assert body["problems"] == ["stream orders is restarting: boom"]  # one line a stream
    assert body["streams"]["orders"]["broker"] == "broker unreachable at b:9092 (refused)"


# ------------------------------------------------------------------ the manager


async def test_the_manager_collects_broker_problems_skipping_silent_and_broken_ones() -> None:
    from engine_harness import AckTrigger, FakeProducer, Upstream

    from acklane.core import SharedStreamManager

    class Down(FakeProducer):
        def broker_problem(self) -> str | None:
            return "broker unreachable at x (refused)"

    class Broken(FakeProducer):
        def broker_problem(self) -> str | None:
            raise RuntimeError("bug")

    class Silent:  # Airflow's producers know nothing of it
        pass

    up = Upstream(f"up-{uuid.uuid4().hex[:8]}")
    manager = SharedStreamManager()
    trigger = AckTrigger(up.name)
    key = trigger.shared_stream_key()
    events = manager.events(trigger_id="t", trigger=trigger, key=key)
    pending = asyncio.ensure_future(anext(events))
    try:
        await asyncio.sleep(0.01)
        assert manager.broker_problems() == {}  # the default: None, left out
        group = manager._groups[key]
        real = group.producer
        group.producer = Down(up)
        assert manager.broker_problems() == {key: "broker unreachable at x (refused)"}
        group.producer = Broken(up)
        assert manager.broker_problems() == {}  # ignored, not raised
        group.producer = cast(Any, Silent())
        assert manager.broker_problems() == {}
        group.producer = real
    finally:
        pending.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pending


# ------------------------------------------------------------------ Reachability


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_reachability_tells_each_change_once(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("acklane.test.reachability")
    clock = _Clock()
    r = Reachability("sqs queue=q", "SQS endpoint", "http://h:1", logger=logger, clock=clock)
    caplog.set_level(logging.DEBUG, logger=logger.name)
    r.answered()  # answering while reachable: nothing to tell
    assert r.problem is None and not caplog.records

    assert r.failed(ConnectionError("Could not connect\n  to h:1")) is True
    assert r.failed("refused again") is False
    assert r.failed("and again") is False
    assert r.problem == "SQS endpoint unreachable at http://h:1 (Could not connect to h:1)"
    clock.now += 42
    r.answered()
    r.answered()
    assert r.problem is None

    told = [(rec.levelno, rec.getMessage()) for rec in caplog.records]
    assert told == [
        (
            logging.WARNING,
            "sqs queue=q: SQS endpoint unreachable at http://h:1 (Could not connect to h:1);"
            " retrying until it answers",
        ),
        (logging.DEBUG, "sqs queue=q: SQS endpoint still unreachable: refused again"),
        (logging.DEBUG, "sqs queue=q: SQS endpoint still unreachable: and again"),
        (logging.INFO, "sqs queue=q: reconnected to SQS endpoint at http://h:1 after 42s"),
    ]


async def test_reachability_wait_pauses_doubling_to_the_max_and_starts_over() -> None:
    default = Reachability("s", "broker", "h")
    assert (default.initial_pause, default.max_pause) == (1.0, 30.0)  # the connectors' pauses
    r = Reachability("s", "broker", "h", initial_pause=0.001, max_pause=0.004)
    slept: list[float] = []
    for _ in range(4):
        slept.append(r.pause)
        await r.wait(OSError("refused"))
    assert slept == [0.001, 0.002, 0.004, 0.004]
    r.answered()
    assert r.pause == 0.001
    await r.wait("down again")
    assert r.problem == "broker unreachable at h (down again)"


# ------------------------------------------------------------------ probes


@pytest.fixture
async def run_stream(tmp_path: Path) -> AsyncIterator[Callable[[str], Running]]:
    """``run_stream(block)``: a Runner of one stream ``orders`` (the YAML block of
    its settings) and one watcher, with its metrics port."""
    started: list[Running] = []

    def start(stream: str) -> Running:
        config = parse_config(
            textwrap.dedent(
                """\
                engine: {shutdown_timeout: 5, progress_interval: 0,
                         restart_backoff_initial: 0.05, restart_backoff_max: 0.2}
                store: {url: "sqlite:///%s", retention: null}
                streams:
                  orders:
                %s
                watchers:
                  - {name: w, stream: orders}
                """
            )
            % (tmp_path / "e.db", textwrap.indent(textwrap.dedent(stream), "    ")),
            source="h.yaml",
        )
        runner = Runner(config, handle_signals=False)
        server = start_metrics_server(0, runner, CollectorRegistry(), addr="127.0.0.1")
        started.append(Running(runner, server, asyncio.create_task(runner.run())))
        return started[-1]

    yield start
    for r in started:
        r.runner.request_stop()
        async with asyncio.timeout(60):
            await r.task
        r.server.close()


@pytest.fixture
def memory_broker() -> Iterator[MemoryBroker]:
    b = MemoryBroker.get(f"hb-{uuid.uuid4().hex[:8]}")
    b.create_topic("orders", 1)
    yield b
    MemoryBroker.remove(b.name)


async def test_the_heartbeat_sets_and_clears_each_streams_broker_problem(
    run_stream: Callable[[str], Running], memory_broker: MemoryBroker
) -> None:
    r = run_stream(
        f"connector: memory\nbroker: {memory_broker.name}\ntopics: [orders]\n"
        "group_id: g\npartitions: 1\npoll_interval: 0.02\n"
    )
    r.runner.health.heartbeat_interval = 0.02
    await probe_until(r.port, "/readyz", lambda s, _: s == 200)
    # the memory producer never has a problem: the manager reports one by hand
    problems: dict[Hashable, str] = dict.fromkeys(
        r.runner.manager._groups, "broker unreachable at mem (test)"
    )
    assert problems
    r.runner.manager.broker_problems = lambda: dict(problems)  # type: ignore[method-assign]
    _, body = await probe_until(r.port, "/readyz", lambda s, _: s == 503)
    answer = json.loads(body)
    assert answer["streams"]["orders"]["state"] == "polling"
    assert answer["streams"]["orders"]["broker"] == "broker unreachable at mem (test)"
    assert answer["problems"] == [
        "stream orders cannot reach its broker: broker unreachable at mem (test)"
    ]
    problems.clear()  # it answers again: ready on the next beat
    _, body = await probe_until(r.port, "/readyz", lambda s, _: s == 200)
    assert "broker" not in json.loads(body)["streams"]["orders"]


def _not_ready_for_the_broker(status: int, body: str) -> bool:
    return status == 503 and "cannot reach its broker" in body


async def test_readyz_names_a_kafka_stream_whose_brokers_do_not_answer(
    run_stream: Callable[[str], Running],
) -> None:
    port = free_port()  # nothing listens there
    r = run_stream(
        f"connector: kafka\nbootstrap_servers: 127.0.0.1:{port}\ntopics: [orders]\ngroup_id: g\n"
    )
    _, body = await probe_until(r.port, "/readyz", _not_ready_for_the_broker, timeout=90)
    answer = json.loads(body)
    assert answer["streams"]["orders"]["state"] == "polling"  # waiting, not failing
    broker = answer["streams"]["orders"]["broker"]
    assert broker.startswith(f"broker unreachable at 127.0.0.1:{port} (")
    assert f"stream orders cannot reach its broker: {broker}" in answer["problems"]
    status, _ = await asyncio.to_thread(http_get, r.port, "/healthz")
    assert status == 200  # not ready is not dead: the process waits for the cluster


async def test_readyz_names_an_sqs_stream_whose_endpoint_does_not_answer(
    run_stream: Callable[[str], Running],
) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    secret = "NotShownAnywhere123"
    r = run_stream(
        f"connector: sqs\nqueue_url: {endpoint}/123456789012/q\nendpoint_url: {endpoint}\n"
        f"region: us-east-1\naws_access_key_id: AKIATEST\naws_secret_access_key: {secret}\n"
        "wait_time_seconds: 1\n"
    )
    _, body = await probe_until(r.port, "/readyz", _not_ready_for_the_broker, timeout=90)
    answer = json.loads(body)
    assert answer["streams"]["orders"]["state"] == "polling"
    broker = answer["streams"]["orders"]["broker"]
    assert broker.startswith(f"SQS endpoint unreachable at {endpoint} (")
    assert f"stream orders cannot reach its broker: {broker}" in answer["problems"]
    assert secret not in body
