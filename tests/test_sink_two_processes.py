"""Two ``acklane run`` processes on one PostgreSQL store and one webhook sink: they share
the sink's work through its lease, and when the one delivering is SIGKILLed the other
takes the sink over once the lease lapses: every event delivered, and repeats only of
what the killed process had in flight.

Kafka emulator, a recording webhook receiver, two real ``acklane run`` subprocesses.
Marked ``chaos`` (it SIGKILLs a runner and waits out a lease: ``uv run pytest -m chaos``).
"""

from __future__ import annotations

import json
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

FIRST, SECOND = 40, 40


def _stored_ids(url: str) -> set[str]:
    engine = sync_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT id, trigger_id, stream_key, message_id, position, created_at "
                    "FROM acklane_trigger_events"
                )
            ).all()
    finally:
        engine.dispose()
    return {
        event_id_for(
            watcher=r.trigger_id,
            stream=r.stream_key,
            message_id=r.message_id,
            position=r.position,
            store_id=r.id,
            created_at=r.created_at,
        )
        for r in rows
    }


def _lease_owner(url: str) -> str | None:
    engine = sync_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(
                text("SELECT owner FROM acklane_sink_state WHERE sink = 'hook'")
            ).scalar()
    except Exception:  # the table is not there yet
        return None
    finally:
        engine.dispose()


def test_the_survivor_delivers_every_event_once_the_killed_owners_lease_lapses(
    kafka_emulator: Emulator, pg_url: str, tmp_path: Path
) -> None:
    kafka = chaos.KafkaAdapter(kafka_emulator)
    kafka.prepare()
    with WebhookReceiver() as receiver:
        config: dict[str, Any] = {
            "engine": {"restart_backoff_initial": 0.2, "restart_backoff_max": 1.0},
            "store": {"url": pg_url},
            "streams": {"orders": kafka.stream_block()},
            "sinks": [
                {
                    "name": "hook",
                    "kind": "webhook",
                    "url": receiver.url,
                    "ordered": False,
                    "concurrency": 2,
                    "backoff_initial": 0.1,
                }
            ],
            "watchers": [{"name": "orders", "stream": "orders", "sinks": ["hook"]}],
        }
        path = tmp_path / "pipeline.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        runners = [chaos.RunnerProcess(path, tmp_path / f"runner-{i}.log") for i in (0, 1)]
        try:
            for runner in runners:
                runner.start()
            kafka.produce([json.dumps({"id": f"a-{i}"}) for i in range(FIRST)])
            assert chaos.wait_until(lambda: receiver.stats().events >= FIRST // 2, 90, 0.05), (
                runners[0].tail() + runners[1].tail()
            )
            owner = _lease_owner(pg_url)
            assert owner is not None
            (victim,) = [
                r for r in runners if r.process is not None and f":{r.process.pid}:" in owner
            ]
            survivor = runners[1 - runners.index(victim)]
            victim.kill()
            kafka.produce([json.dumps({"id": f"b-{i}"}) for i in range(SECOND)])

            def all_delivered() -> bool:
                stored = _stored_ids(pg_url)
                return len(stored) == FIRST + SECOND and stored <= set(
                    receiver.stats(keys=True).keys
                )

            assert chaos.wait_until(all_delivered, 120, 0.5), survivor.tail()
            assert survivor.alive(), survivor.tail()
            took_over = _lease_owner(pg_url)
            assert survivor.process is not None
            assert took_over is not None and f":{survivor.process.pid}:" in took_over
            assert survivor.terminate(timeout=30) == 0, survivor.tail()
        finally:
            for runner in runners:
                runner.kill()
            kafka.close()
        got = receiver.stats(keys=True)
    assert set(got.keys) == _stored_ids(pg_url)
    # repeats only of what the killed owner had in flight: one round at most
    assert got.repeats <= 16, got.repeats
