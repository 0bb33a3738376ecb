"""acklane's triggers in a real Apache Airflow 3.3.2, end to end, on the four emulators.

The test session starts the Kafka, SQS, Pub/Sub and Service Bus emulators, makes a
topic or queue (and a dead-letter destination) on each, publishes the same six
messages to each, then runs Airflow as Airflow runs: ``airflow db migrate`` on a
SQLite metadata database in a temporary AIRFLOW_HOME, then ``airflow dag-processor``
(parses the example DAGs of ``examples/airflow``, stores them, creates the
watchers' triggers), ``airflow triggerer`` (runs the triggers through its shared
stream manager, acklane's producers behind them), ``airflow scheduler`` (makes
DAG runs of the asset events; its LocalExecutor runs their tasks) and ``airflow
api-server`` (the tasks' execution API), each a subprocess started and stopped by
pid, on ports picked free.

What Airflow's metadata database and the brokers show is then checked: one asset
event per accepted message, DAG runs whose tasks succeeded, the rejected messages
in each dead-letter destination with acklane's reason, the Kafka offset committed
past all six, the SQS queue, the Pub/Sub subscription and the Service Bus queue
empty, the asset store written by a filter.

Needs the ``airflow`` dependency group (``uv run --group airflow pytest -m airflow``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from acklane.core.connectors.deadletter import REJECT_REASON
from acklane.integration.emulator import Emulator, free_port
from acklane.integration.kafka import KafkaKit

pytestmark = [pytest.mark.airflow, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[3]
DAGS = ROOT / "examples" / "airflow"
AIRFLOW = Path(sys.executable).with_name("airflow")

BODIES = [
    json.dumps({"type": "order", "id": 1, "amount": 10}),
    json.dumps({"type": "order", "id": 2, "amount": -5}),  # rejected by a rule
    json.dumps({"type": "refund", "id": 3, "amount": 4}),  # not matched: no event
    json.dumps({"type": "order", "id": 4, "amount": 7}),
    "not json",  # rejected: a rule reads the body
    json.dumps({"type": "order", "id": 5, "amount": 1}),
]
ACCEPTED = [1, 4, 5]
RULE_REASON = "watcher orders: reject rule matched: body.amount lt 0 (value: -5)"
JSON_REASON = "body is not JSON"
ASSETS = {
    "kafka_orders": len(ACCEPTED),
    "kafka_audit": len(BODIES),  # the audit watcher fires for every message
    "sqs_orders": len(ACCEPTED),
    "pubsub_orders": len(ACCEPTED),
    "servicebus_orders": len(ACCEPTED),
}
DAG_IDS = [
    "acklane_kafka_orders",
    "acklane_kafka_audit",
    "acklane_sqs_orders",
    "acklane_pubsub_orders",
    "acklane_servicebus_orders",
]


@dataclass
class Outcome:
    """What Airflow's database and the brokers showed once the events were in."""

    events: dict[str, list[Any]] = field(default_factory=dict)  # asset -> payloads
    dag_runs: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # dag -> runs
    state_store: dict[tuple[str, str], Any] = field(default_factory=dict)
    triggers: list[str] = field(default_factory=list)
    dlq_reasons: dict[str, list[str]] = field(default_factory=dict)  # broker -> reasons
    kafka_committed: dict[int, int | None] = field(default_factory=dict)
    sqs_left: tuple[int, int] = (-1, -1)
    pubsub_left: dict[str, int] = field(default_factory=dict)
    servicebus_left: dict[str, int] = field(default_factory=dict)
    waited: float = 0.0
    logs: dict[str, str] = field(default_factory=dict)


# -- Airflow as subprocesses ----------------------------------------------------------------


class AirflowProcesses:
    """``airflow <component>`` subprocesses, each in its own session, stopped by pid."""

    def __init__(self, home: Path, env: dict[str, str]) -> None:
        self.home = home
        self.env = env
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def run(self, *args: str, timeout: float = 120) -> None:
        result = subprocess.run(
            [str(AIRFLOW), *args], env=self.env, capture_output=True, timeout=timeout, check=False
        )
        if result.returncode != 0:
            raise AssertionError(
                f"airflow {' '.join(args)} exited {result.returncode}:\n"
                + result.stderr.decode(errors="replace")[-4000:]
            )

    def start(self, component: str) -> None:
        log = open(self.home / f"{component}.log", "wb")  # noqa: SIM115 - closed by the child's end
        self.procs[component] = subprocess.Popen(
            [str(AIRFLOW), component],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()

    def check_alive(self) -> None:
        for component, proc in self.procs.items():
            if proc.poll() is not None:
                raise AssertionError(
                    f"airflow {component} exited {proc.returncode}:\n{self.log_tail(component)}"
                )

    def log_tail(self, component: str, chars: int = 6000) -> str:
        path = self.home / f"{component}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def stop(self) -> None:
        """SIGTERM each (graceful: the triggerer closes its producers), then its group."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        for proc in self.procs.values():
            # the component's own children (the triggerer's runner, the processor's
            # parsers) are in the session the test created for it
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)


# -- the metadata database --------------------------------------------------------------------


def _query(db: Path, sql: str) -> list[tuple[Any, ...]]:
    uri = f"file:{db}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=10)) as conn:
        return list(conn.execute(sql))


def _events(db: Path) -> dict[str, list[Any]]:
    rows = _query(
        db,
        "select a.name, e.extra from asset_event e join asset a on a.id = e.asset_id order by e.id",
    )
    out: dict[str, list[Any]] = {}
    for name, extra in rows:
        data = json.loads(extra) if extra else {}
        out.setdefault(name, []).append(data.get("payload", data))
    return out


# -- the brokers ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def airflow_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    if not AIRFLOW.exists():
        pytest.skip("Airflow is not installed: uv sync --group airflow")
    yield tmp_path_factory.mktemp("airflow-home")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def outcome(
    airflow_home: Path,
    kafka_kit: KafkaKit,
    sqs_emulator: Emulator,
    pubsub_emulator: Emulator,
    servicebus_emulator: Any,
) -> AsyncIterator[Outcome]:
    """Publish, run Airflow until every asset event is in, collect what everything shows."""
    from acklane.integration.pubsub import PubSubKit
    from acklane.integration.servicebus import ServiceBusKit
    from acklane.integration.sqs import SqsQueues

    sqs_settings = sqs_emulator.client_settings()
    pubsub_settings = pubsub_emulator.client_settings()
    async with SqsQueues(sqs_settings) as queues, PubSubKit(pubsub_settings) as pubsub:
        # -- the upstreams, and the same six messages on each
        topic, kafka_dlq = kafka_kit.new_topic("airflow"), kafka_kit.new_topic("airflow-dlq")
        group = KafkaKit.unique("airflow")
        await asyncio.to_thread(kafka_kit.produce, topic, BODIES)
        queue_url = await queues.create("airflow", visibility_timeout=30)
        sqs_dlq = await queues.create("airflow-dlq")
        await queues.send(queue_url, BODIES)
        ps_topic = await pubsub.create_topic("airflow")
        ps_sub = await pubsub.create_subscription(ps_topic, "airflow-sub", ack_deadline=30)
        ps_dlq = await pubsub.create_topic("airflow-dlq")
        ps_dlq_sub = await pubsub.create_subscription(ps_dlq, "airflow-dlq-sub")
        await pubsub.publish(ps_topic, BODIES)
        sb_queue = servicebus_emulator.create_queue(lock_duration=30, max_delivery_count=10)
        sb_kit = ServiceBusKit(servicebus_emulator.connection_string)
        await asyncio.to_thread(sb_kit.send, sb_queue, BODIES)

        # -- Airflow's environment: everything through variables, AIRFLOW_HOME a temp dir
        home = airflow_home
        db = home / "airflow.db"
        api_port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_", "AIRFLOW__"))}
        env.update(
            AIRFLOW_HOME=str(home),
            PYTHONDONTWRITEBYTECODE="1",  # no __pycache__ in examples/airflow
            # the filter function's module, for the triggerer (the DAGs folder is on the
            # dag-processor's sys.path only)
            PYTHONPATH=os.pathsep.join(p for p in (str(DAGS), os.environ.get("PYTHONPATH")) if p),
            AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{db}",
            AIRFLOW__CORE__DAGS_FOLDER=str(DAGS),
            AIRFLOW__CORE__LOAD_EXAMPLES="False",
            AIRFLOW__CORE__UNIT_TEST_MODE="False",
            AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL="600",
            AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC="1",
            AIRFLOW__TRIGGERER__SHARED_STREAM_COHORT_GRACE_PERIOD="2",
            AIRFLOW__TRIGGERER__SHARED_STREAM_ACK_TIMEOUT="60",
            # the tasks of the DAG runs: LocalExecutor's workers, through the API server
            AIRFLOW__CORE__PARALLELISM="2",
            AIRFLOW__API__HOST="127.0.0.1",
            AIRFLOW__API__PORT=str(api_port),
            AIRFLOW__API__WORKERS="1",
            AIRFLOW__CORE__EXECUTION_API_SERVER_URL=f"http://127.0.0.1:{api_port}/execution/",
            AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT=str(free_port()),
            AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT=str(free_port()),
            ACKLANE_EXAMPLE_KAFKA_TOPIC=topic,
            ACKLANE_EXAMPLE_KAFKA_GROUP=group,
            ACKLANE_EXAMPLE_KAFKA_DLQ=kafka_dlq,
            ACKLANE_EXAMPLE_SQS_QUEUE_URL=queue_url,
            ACKLANE_EXAMPLE_SQS_DLQ_URL=sqs_dlq,
            ACKLANE_EXAMPLE_PUBSUB_SUBSCRIPTION=ps_sub,
            ACKLANE_EXAMPLE_PUBSUB_DLQ=ps_dlq,
            ACKLANE_EXAMPLE_SERVICEBUS_QUEUE=sb_queue,
            # the connections: the secrets live here, never in the DAG's trigger kwargs
            AIRFLOW_CONN_ACKLANE_KAFKA=json.dumps(
                {
                    "conn_type": "kafka",
                    "extra": {
                        "bootstrap.servers": kafka_kit.bootstrap_servers,
                        "enable.auto.commit": "false",
                        **KafkaKit.FAST_GROUP,
                    },
                }
            ),
            AIRFLOW_CONN_ACKLANE_SQS=json.dumps(
                {
                    "conn_type": "aws",
                    "login": sqs_settings["aws_access_key_id"],
                    "password": sqs_settings["aws_secret_access_key"],
                    "extra": {
                        "region_name": sqs_settings["region"],
                        "endpoint_url": sqs_settings["endpoint_url"],
                    },
                }
            ),
            AIRFLOW_CONN_ACKLANE_PUBSUB=json.dumps(
                {"conn_type": "google_cloud_platform", "extra": pubsub_settings}
            ),
            AIRFLOW_CONN_ACKLANE_SERVICEBUS=json.dumps(
                {"conn_type": "azure_service_bus", "schema": servicebus_emulator.connection_string}
            ),
        )
        airflow = AirflowProcesses(home, env)
        result = Outcome()
        started = time.monotonic()
        try:
            await asyncio.to_thread(airflow.run, "db", "migrate")
            for component in ("api-server", "dag-processor", "triggerer", "scheduler"):
                airflow.start(component)
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline:
                airflow.check_alive()
                if db.exists():
                    with contextlib.suppress(sqlite3.OperationalError):
                        events = _events(db)
                        if all(len(events.get(a, [])) >= n for a, n in ASSETS.items()):
                            runs = _query(db, "select dag_id, state from dag_run")
                            done = {d for d, state in runs if state in ("success", "failed")}
                            if done >= set(DAG_IDS):
                                break
                await asyncio.sleep(1)
            result.waited = time.monotonic() - started
            print(
                f"Airflow: every asset event and DAG run in {result.waited:.1f} s from db migrate"
            )
            await asyncio.sleep(3)  # the last advances: commits, deletes, acks
            result.events = _events(db)
            for dag_id, run_type, state in _query(
                db, "select dag_id, run_type, state from dag_run order by id"
            ):
                result.dag_runs.setdefault(dag_id, []).append((run_type, state))
            for name, key, value in _query(
                db,
                "select a.name, s.key, s.value from asset_state_store s "
                "join asset a on a.id = s.asset_id",
            ):
                result.state_store[(name, key)] = json.loads(value)
            result.triggers = [r[0] for r in _query(db, "select classpath from trigger")]
        finally:
            airflow.stop()
            result.logs = {c: airflow.log_tail(c) for c in airflow.procs}

        # -- the brokers, after Airflow stopped
        result.kafka_committed = await asyncio.to_thread(kafka_kit.committed, group, topic)
        records = await asyncio.to_thread(kafka_kit.read, kafka_dlq, 10, timeout=2.0)
        result.dlq_reasons["kafka"] = [
            dict(m.headers() or [])[REJECT_REASON].decode() for m in records
        ]
        result.sqs_left = await queues.counts(queue_url)
        copies = await queues.receive(sqs_dlq, max_messages=10, wait=1)
        result.dlq_reasons["sqs"] = [
            m["MessageAttributes"][REJECT_REASON]["StringValue"] for m in copies
        ]
        result.pubsub_left = await pubsub.stats(ps_sub)
        received = await pubsub.drain(ps_dlq_sub, expect=2, within=5)
        result.dlq_reasons["pubsub"] = [r.message.attributes[REJECT_REASON] for r in received]
        result.servicebus_left = servicebus_emulator.counts(sb_queue)
        dead = await asyncio.to_thread(sb_kit.peek_dead_letters, sb_queue)
        result.dlq_reasons["servicebus"] = [str(m.dead_letter_reason) for m in dead]
        yield result


def _explain(outcome: Outcome) -> str:
    return "\n".join(f"--- {c}.log\n{tail}" for c, tail in outcome.logs.items())


# -- the checks ---------------------------------------------------------------------------------

BROKERS = ["kafka", "sqs", "pubsub", "servicebus"]


def test_the_dag_processor_stored_one_trigger_per_distinct_watcher(outcome: Outcome) -> None:
    assert sorted(outcome.triggers) == sorted(
        [
            "acklane.airflow.kafka.KafkaEventTrigger",
            "acklane.airflow.kafka.KafkaEventTrigger",
            "acklane.airflow.sqs.SqsEventTrigger",
            "acklane.airflow.pubsub.PubSubEventTrigger",
            "acklane.airflow.servicebus.ServiceBusEventTrigger",
        ]
    ), _explain(outcome)


@pytest.mark.parametrize("broker", BROKERS)
def test_each_accepted_message_became_one_asset_event(outcome: Outcome, broker: str) -> None:
    payloads = outcome.events.get(f"{broker}_orders", [])
    assert sorted(p["id"] for p in payloads) == ACCEPTED, _explain(outcome)
    assert {p["amount"] for p in payloads} == {10, 7, 1}


def test_two_watchers_of_one_kafka_group_shared_its_poll_and_both_saw_everything(
    outcome: Outcome,
) -> None:
    # one consumer group, one partition: two separate consumers would have split it
    audit = outcome.events.get("kafka_audit", [])
    assert sorted(p["seen"] for p in audit) == list(range(1, len(BODIES) + 1)), _explain(outcome)
    assert len({p["message_id"] for p in audit}) == len(BODIES)


def test_a_filter_wrote_airflows_asset_state_store_through_acklanes_name(
    outcome: Outcome,
) -> None:
    assert outcome.state_store.get(("kafka_audit", "seen")) == len(BODIES), outcome.state_store


@pytest.mark.parametrize("dag_id", DAG_IDS)
def test_the_scheduler_made_asset_triggered_dag_runs(outcome: Outcome, dag_id: str) -> None:
    runs = outcome.dag_runs.get(dag_id, [])
    assert runs, _explain(outcome)
    assert {run_type for run_type, _ in runs} == {"asset_triggered"}


@pytest.mark.parametrize("dag_id", DAG_IDS)
def test_the_dag_runs_ran_their_tasks_to_success(outcome: Outcome, dag_id: str) -> None:
    # LocalExecutor's workers ran the tasks through the API server's execution API
    states = [state for _, state in outcome.dag_runs.get(dag_id, [])]
    assert states and "success" in states and "failed" not in states, (
        states,
        _explain(outcome),
    )


@pytest.mark.parametrize("broker", BROKERS)
def test_rejected_messages_reached_the_dead_letter_destination_with_acklanes_reason(
    outcome: Outcome, broker: str
) -> None:
    reasons = sorted(outcome.dlq_reasons.get(broker, []))
    assert len(reasons) == 2, (reasons, _explain(outcome))
    assert any(JSON_REASON in r and r.startswith("watcher orders: ") for r in reasons), reasons
    expected_rule = RULE_REASON[:256] if broker == "servicebus" else RULE_REASON
    assert expected_rule in reasons, reasons


def test_kafka_offsets_were_committed_past_every_message(outcome: Outcome) -> None:
    assert outcome.kafka_committed == {0: len(BODIES)}, _explain(outcome)


def test_sqs_messages_were_all_deleted(outcome: Outcome) -> None:
    assert outcome.sqs_left == (0, 0), _explain(outcome)


def test_pubsub_messages_were_all_acked(outcome: Outcome) -> None:
    left = outcome.pubsub_left
    assert left.get("backlog", 0) == 0 and left.get("leased", 0) == 0, left


def test_servicebus_messages_were_completed_or_dead_lettered(outcome: Outcome) -> None:
    left = outcome.servicebus_left
    assert left["messages"] == 0 and left.get("locked", 0) == 0, left
    assert left["dead_letter"] == 2, left
