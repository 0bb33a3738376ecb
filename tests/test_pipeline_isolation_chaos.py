"""Two pipelines on one store under SIGKILL: each receiver gets exactly its own events.

Two configurations name the same stream (``orders``), watcher and webhook sink
(``hook``) and share one event store (a SQLite file; a PostgreSQL database); only
their ``pipeline:`` names differ, and each reads its own Kafka topic and posts to its
own recording receiver (a real HTTP server). Both run as real ``acklane run``
processes, SIGKILLed and restarted while messages keep coming. At the end every
message of each pipeline is stored once in that pipeline, and each receiver has
exactly the event ids its pipeline stored: none lost, none of the other's.

Kafka emulator. Marked ``chaos`` (it SIGKILLs runners: ``uv run pytest -m chaos``).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import text

from acklane.core.sinks import event_id_for
from acklane.core.sql import sync_engine
from acklane.integration import chaos
from acklane.integration.emulator import Emulator
from acklane.integration.webhook import WebhookReceiver

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(300)]

PIPELINES = ("alpha", "beta")
ROUNDS, PER_ROUND = 3, 30


def _aware(value: Any) -> datetime:
    if isinstance(value, str):  # SQLite's text
        value = datetime.fromisoformat(value)
    assert isinstance(value, datetime)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _stored(url: str, pipeline: str) -> tuple[set[str], list[str]]:
    """The sinks' event ids of ``pipeline``'s stored events, and their payload ids."""
    engine = sync_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT id, trigger_id, stream_key, message_id, position, created_at, "
                    "payload FROM acklane_trigger_events WHERE pipeline = :p"
                ),
                {"p": pipeline},
            ).all()
    except Exception:  # the table is not there yet
        return set(), []
    finally:
        engine.dispose()
    ids = {
        event_id_for(
            watcher=r.trigger_id,
            stream=r.stream_key,
            message_id=r.message_id,
            position=r.position,
            store_id=r.id,
            created_at=_aware(r.created_at),
        )
        for r in rows
    }
    return ids, [json.loads(r.payload)["id"] for r in rows]


def _started(runner: chaos.RunnerProcess) -> bool:
    """Whether the runner's current life got as far as consuming."""
    life = runner.tail(200).rpartition("===== start")[2]
    return "partitions assigned" in life


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'shared.db'}"
    url: str = request.getfixturevalue("pg_url")
    return url


def test_two_pipelines_sharing_a_store_each_deliver_exactly_their_own_under_sigkill(
    kafka_emulator: Emulator, store_url: str, tmp_path: Path
) -> None:
    adapters = {name: chaos.KafkaAdapter(kafka_emulator) for name in PIPELINES}
    receivers = {name: WebhookReceiver() for name in PIPELINES}
    runners: dict[str, chaos.RunnerProcess] = {}
    sent: dict[str, list[str]] = {name: [] for name in PIPELINES}
    try:
        for name in PIPELINES:
            adapters[name].prepare()
            receivers[name].start()
            config: dict[str, Any] = {
                "pipeline": name,
                "engine": {"restart_backoff_initial": 0.2, "restart_backoff_max": 1.0},
                "store": {"url": store_url},
                "streams": {"orders": adapters[name].stream_block()},
                "sinks": [
                    {
                        "name": "hook",
                        "kind": "webhook",
                        "url": receivers[name].url,
                        "backoff_initial": 0.1,
                    }
                ],
                "watchers": [{"name": "orders", "stream": "orders", "sinks": ["hook"]}],
            }
            path = tmp_path / f"{name}.yaml"
            path.write_text(yaml.safe_dump(config, sort_keys=False))
            runners[name] = chaos.RunnerProcess(path, tmp_path / f"{name}.log")
            runners[name].start()
        for round_ in range(ROUNDS):
            for name in PIPELINES:
                bodies = [f"{name}-{round_}-{i}" for i in range(PER_ROUND)]
                sent[name] += bodies
                adapters[name].produce([json.dumps({"id": b}) for b in bodies])
            # kill both while they consume and deliver, then start them again
            assert chaos.wait_until(
                lambda: all(
                    receivers[n].stats().events >= len(sent[n]) - PER_ROUND // 2 for n in PIPELINES
                ),
                90,
                0.05,
            ), "\n".join(r.tail() for r in runners.values())
            for runner in runners.values():
                runner.kill()
                runner.start()

        def all_delivered() -> bool:
            for n in PIPELINES:
                ids, payloads = _stored(store_url, n)
                if sorted(payloads) != sorted(sent[n]):
                    return False
                if not ids <= set(receivers[n].stats(keys=True).keys):
                    return False
            return True

        assert chaos.wait_until(all_delivered, 120, 0.5), "\n".join(
            r.tail() for r in runners.values()
        )
        for runner in runners.values():
            # a runner restarted a moment ago: SIGTERM once it handles signals
            assert chaos.wait_until(partial(_started, runner), 60, 0.1), runner.tail()
            assert runner.terminate(timeout=30) == 0, runner.tail()
        got = {n: receivers[n].stats(keys=True) for n in PIPELINES}
    finally:
        for runner in runners.values():
            runner.kill()
        for receiver in receivers.values():
            receiver.stop()
        for adapter in adapters.values():
            adapter.close()
    alpha_ids, alpha_payloads = _stored(store_url, "alpha")
    beta_ids, beta_payloads = _stored(store_url, "beta")
    # every message stored once, in its own pipeline: 0 lost, 0 stored twice
    assert sorted(alpha_payloads) == sorted(sent["alpha"])
    assert sorted(beta_payloads) == sorted(sent["beta"])
    # each receiver: exactly its pipeline's events, none of the other's
    assert set(got["alpha"].keys) == alpha_ids
    assert set(got["beta"].keys) == beta_ids
    assert not alpha_ids & beta_ids
    print(
        f"\nstore {store_url.split(':')[0]}: delivered alpha {got['alpha'].distinct} "
        f"(repeats {got['alpha'].repeats}), beta {got['beta'].distinct} "
        f"(repeats {got['beta'].repeats}); restarts {ROUNDS} each"
    )
