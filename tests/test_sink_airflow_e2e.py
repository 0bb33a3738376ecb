"""Kafka and SQS messages become Airflow asset events, then DAG runs, through ``acklane run``
with an airflow sink: exactly one asset event per trigger event, however often the
runner is SIGKILLed while it delivers.

A real Apache Airflow 3.3.2 (the ``airflow_server`` fixture: API server and scheduler
on a SQLite metadata database), the Kafka and SQS emulators, ``acklane run`` as a
subprocess (the chaos driver's runner process), checked through Airflow's REST API.
Marked ``airflow`` (``uv run --group airflow pytest -m airflow``).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from acklane.integration import chaos
from acklane.integration.airflow import AirflowServer, AirflowServerError
from acklane.integration.emulator import Emulator

pytestmark = [pytest.mark.airflow, pytest.mark.timeout(420)]

PER_BROKER = 12
KILLS = 4


def _pipeline(
    workdir: Path, server: AirflowServer, kafka: chaos.BrokerAdapter, sqs: chaos.BrokerAdapter
) -> Path:
    user = server.admin
    auth = {"url": server.url, "username": user.username, "password": user.password}
    config: dict[str, Any] = {
        "engine": {"restart_backoff_initial": 0.2, "restart_backoff_max": 1.0},
        "store": {"url": f"sqlite:///{workdir / 'events.db'}"},
        "streams": {"orders-k": kafka.stream_block(), "orders-q": sqs.stream_block()},
        "sinks": [
            # ordered (one POST at a time): Airflow on SQLite takes one write at a time
            {"name": "airflow", "kind": "airflow", **auth, "backoff_initial": 0.2},
            {
                "name": "airflow-by-uri",
                "kind": "airflow",
                **auth,
                "asset_uri": "s3://acklane-tests/orders.csv",
                "backoff_initial": 0.2,
            },
        ],
        "watchers": [
            {"name": "kafka-orders", "stream": "orders-k", "asset": "orders", "sinks": ["airflow"]},
            {"name": "sqs-orders", "stream": "orders-q", "sinks": ["airflow-by-uri"]},
        ],
    }
    path = workdir / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


async def _airflow_ids(server: AirflowServer) -> list[str]:
    """The acklane event id of every asset event of both assets (repeats kept). Airflow
    on SQLite answers 500 now and then while it writes ("database is locked"): asked
    again."""
    for attempt in range(10):
        try:
            async with server.rest() as rest:
                events = await rest.asset_events(name="orders")
                events += await rest.asset_events(uri="s3://acklane-tests/orders.csv")
            break
        except AirflowServerError:
            if attempt == 9:
                raise
            await asyncio.sleep(0.5)
    return [
        str(((e.get("extra") or {}).get("acklane") or {}).get("event_id"))
        for e in events
        if (e.get("extra") or {}).get("acklane")
    ]


def test_messages_become_exactly_one_asset_event_each_through_sigkills(
    airflow_server: AirflowServer,
    kafka_emulator: Emulator,
    sqs_emulator: Emulator,
    tmp_path: Path,
) -> None:
    airflow_server.start_component("scheduler")
    before = asyncio.run(_airflow_ids(airflow_server))
    kafka, sqs = chaos.KafkaAdapter(kafka_emulator), chaos.SqsAdapter(sqs_emulator)
    rng = random.Random()
    try:
        kafka.prepare()
        sqs.prepare()
        runner = chaos.RunnerProcess(
            _pipeline(tmp_path, airflow_server, kafka, sqs), tmp_path / "runner.log"
        )
        store = chaos.StoreReader(tmp_path / "events.db")
        try:
            runner.start()
            kafka.produce([json.dumps({"id": f"k-{i}"}) for i in range(PER_BROKER)])
            sqs.produce([json.dumps({"id": f"q-{i}"}) for i in range(PER_BROKER)])
            for _ in range(KILLS):
                # while events are being posted: after some reach Airflow, or at random
                seen = len(asyncio.run(_airflow_ids(airflow_server)))
                chaos.wait_until(
                    lambda seen=seen: len(asyncio.run(_airflow_ids(airflow_server))) > seen,
                    20.0,
                    0.3,
                )
                time.sleep(rng.uniform(0.0, 0.3))
                runner.kill()
                runner.start()
            expected = 2 * PER_BROKER

            def all_there() -> bool:
                stored = store.event_ids()
                got = set(asyncio.run(_airflow_ids(airflow_server)))
                return len(stored) == expected and stored <= got

            assert chaos.wait_until(all_there, 150.0, 0.5), runner.tail()
            # the last start has its streams up (a SIGTERM before is not a graceful stop)
            assert chaos.wait_until(
                lambda: runner.tail().rpartition("===== start")[2].count("group started") == 2,
                60.0,
                0.2,
            ), runner.tail()
            assert runner.terminate(timeout=30.0) == 0, runner.tail()
            stored = store.event_ids()
        finally:
            runner.kill()
            store.close()
    finally:
        kafka.close()
        sqs.close()
    ids = [i for i in asyncio.run(_airflow_ids(airflow_server)) if i not in set(before)]
    assert len(stored) == 2 * PER_BROKER
    assert sorted(ids) == sorted(stored), "each trigger event is exactly one asset event"

    async def runs() -> tuple[list[Any], list[Any]]:
        async with airflow_server.rest() as rest:
            return (
                await rest.dag_runs("acklane_sink_orders"),
                await rest.dag_runs("acklane_sink_orders_by_uri"),
            )

    assert chaos.wait_until(lambda: all(asyncio.run(runs())), 60.0, 1.0), airflow_server.log_tail(
        "scheduler"
    )


def test_the_kafka_to_airflow_example_runs_as_its_header_says(
    airflow_server: AirflowServer, tmp_path: Path
) -> None:
    """examples/sinks/kafka-airflow.yaml's header, step by step, against a real Airflow:
    the two big orders of orders.jsonl become two asset events of big_orders."""
    import os
    import subprocess
    import sys

    from test_examples import ROOT, address_environment, emulator_backend, header_steps, stop

    from acklane.integration.emulator import free_port

    steps = header_steps(ROOT / "examples" / "sinks" / "kafka-airflow.yaml")
    assert [s[:2] for s in steps] == [
        ["acklane", "emulator"],
        ["acklane", "publish"],
        ["acklane", "run"],
        ["acklane", "sinks"],
    ], steps
    acklane = [sys.executable, "-m", "acklane.core.cli"]
    env = {
        **os.environ,
        "ACKLANE_STORE_URL": f"sqlite:///{tmp_path / 'events.db'}",
        "AIRFLOW_URL": airflow_server.url,
        "AIRFLOW_USERNAME": airflow_server.admin.username,
        "AIRFLOW_PASSWORD": airflow_server.admin.password,
        **address_environment("kafka", free_port()),
    }
    before = asyncio.run(_big_orders(airflow_server))
    emulator = subprocess.Popen(
        [*acklane, *steps[0][1:], "--backend", emulator_backend()],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert emulator.stderr is not None
        for line in emulator.stderr:  # ready once it says how to stop it
            if "Ctrl-C to stop" in line:
                break
        published = subprocess.run(
            [*acklane, *steps[1][1:]],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert published.returncode == 0, published.stderr
        log = (tmp_path / "run.log").open("w")
        runner = subprocess.Popen(
            [*acklane, *steps[2][1:]], cwd=ROOT, env=env, stdout=log, stderr=log, text=True
        )
        try:
            assert chaos.wait_until(
                lambda: len(asyncio.run(_big_orders(airflow_server))) >= len(before) + 2, 120, 0.5
            ), (tmp_path / "run.log").read_text()
        finally:
            assert stop(runner) == 0, (tmp_path / "run.log").read_text()
        status = subprocess.run(
            [*acklane, *steps[3][1:], "--format", "json"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["delivered"] == 2
    finally:
        stop(emulator)
    events = asyncio.run(_big_orders(airflow_server))[len(before) :]
    assert sorted(e["extra"]["amount"] for e in events) == [150, 420]
    assert {e["extra"]["acklane"]["watcher"] for e in events} == {"big-orders"}


async def _big_orders(server: AirflowServer) -> list[dict[str, Any]]:
    async with server.rest() as rest:
        return await rest.asset_events(name="big_orders")
