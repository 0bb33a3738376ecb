"""The runner end to end on the memory broker and the SQLite event store."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import runner_filters
from runner_harness import all_committed, both_filter_paths, run_until

from acklane.connectors.memory import MemoryBroker
from acklane.core.config import parse_config
from acklane.core.events import EventStore
from acklane.core.pipeline.runner import Runner

pytestmark = pytest.mark.topics(orders=2)

TESTS = Path(__file__).parent


def _config(db: Path, broker: str, watchers: str, ack_timeout: float = 5) -> Any:
    text = textwrap.dedent(
        f"""\
        engine:
          ack_timeout: {ack_timeout}
          restart_backoff_initial: 0.05
          restart_backoff_max: 0.2
          shutdown_timeout: 5
        store:
          url: sqlite:///{db}
        streams:
          orders:
            connector: memory
            broker: {broker}
            topics: [orders]
            group_id: g
            partitions: 2
            dead_letter: orders.dlq
            batch_size: 4
            poll_interval: 0.02
        watchers:
        """
    ) + textwrap.indent(textwrap.dedent(watchers), "  ")
    return parse_config(text, source="test.yaml")


def _publish(broker: MemoryBroker, bodies: list[Any]) -> None:
    for i, body in enumerate(bodies):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        broker.publish("orders", data, key=f"k{i % 3}")


async def _stored(db: Path) -> list[Any]:
    async with EventStore(f"sqlite:///{db}") as store:
        return await store.list_events(limit=10_000)


@both_filter_paths
async def test_every_message_fires_each_watcher_once_and_is_committed(
    tmp_path: Path, broker: MemoryBroker
) -> None:
    db = tmp_path / "e.db"
    cfg = _config(
        db,
        broker.name,
        """\
        - name: all
          stream: orders
          filter: {emit: {id: body.id}}
        - name: big
          stream: orders
          filter: {match: {body.amount: {gt: 50}}, emit: {id: body.id}}
        """,
    )
    _publish(broker, [{"id": i, "amount": i * 10} for i in range(20)])
    runner = Runner(cfg, handle_signals=False)
    await run_until(runner, lambda: all_committed(broker))
    events = await _stored(db)
    by = {w: sorted(e.payload["id"] for e in events if e.trigger_id == w) for w in ("all", "big")}
    assert by["all"] == list(range(20))
    assert by["big"] == list(range(6, 20))
    assert all(e.message_id and e.message_id.split("/")[-3] == "orders" for e in events)


@both_filter_paths
async def test_poison_message_is_dead_lettered_with_its_reason(
    tmp_path: Path, broker: MemoryBroker
) -> None:
    db = tmp_path / "e.db"
    cfg = _config(
        db,
        broker.name,
        """\
        - name: all
          stream: orders
          filter: {emit: {id: body.id}}
        """,
    )
    _publish(broker, [{"id": 0}, b"\xffnot json", {"id": 2}])
    await run_until(Runner(cfg, handle_signals=False), lambda: all_committed(broker))
    dlq = broker.records("orders.dlq")
    assert len(dlq) == 1
    assert dlq[0].value == b"\xffnot json"
    assert "not" in dlq[0].headers["acklane.reject.reason"]
    assert sorted(e.payload["id"] for e in await _stored(db)) == [0, 2]


@both_filter_paths
async def test_payload_that_is_not_json_rejects_the_message_instead_of_looping(
    tmp_path: Path, broker: MemoryBroker
) -> None:
    db = tmp_path / "e.db"
    cfg = _config(
        db,
        broker.name,
        """\
        - name: odd
          stream: orders
          filter: {function: "runner_filters:not_json"}
        """,
    )
    _publish(broker, [{"id": i} for i in range(4)])
    await run_until(Runner(cfg, handle_signals=False), lambda: all_committed(broker))
    dlq = broker.records("orders.dlq")
    assert len(dlq) == 2
    assert all("odd" in r.headers["acklane.reject.reason"] for r in dlq)
    assert "set" in dlq[0].headers["acklane.reject.reason"]
    assert sorted(e.payload["id"] for e in await _stored(db)) == [0, 2]


@both_filter_paths
async def test_crashing_filter_restarts_the_cohort_and_loses_nothing(
    tmp_path: Path, broker: MemoryBroker, caplog: pytest.LogCaptureFixture
) -> None:
    runner_filters.CRASHED.clear()
    db = tmp_path / "e.db"
    cfg = _config(
        db,
        broker.name,
        """\
        - name: fragile
          stream: orders
          filter: {function: "runner_filters:crash_once"}
        - name: sturdy
          stream: orders
          filter: {emit: {id: body.id}}
        """,
    )
    _publish(broker, [{"id": i, "crash": i == 7} for i in range(16)])
    await run_until(Runner(cfg, handle_signals=False), lambda: all_committed(broker))
    events = await _stored(db)
    for watcher in ("fragile", "sturdy"):
        ids = sorted(e.payload["id"] for e in events if e.trigger_id == watcher)
        assert ids == list(range(16)), watcher  # each once: redelivered copies deduped
    assert "Restarting watchers fragile, sturdy" in caplog.text
    assert "filter bug" in caplog.text
    assert broker.stats("g").redelivered > 0


@both_filter_paths
async def test_ack_timeout_of_one_watcher_restarts_its_cohort_with_redelivery(
    tmp_path: Path, broker: MemoryBroker
) -> None:
    # the slow watcher is force-failed; its siblings must not commit past what it missed
    db = tmp_path / "e.db"
    cfg = _config(
        db,
        broker.name,
        """\
        - name: slow
          stream: orders
          filter: {function: "runner_filters:stall_once"}
        - name: fast
          stream: orders
          filter: {emit: {id: body.id}}
        """,
        ack_timeout=0.5,
    )
    runner_filters.STALLED.clear()
    _publish(broker, [{"id": i, "stall": i == 3} for i in range(10)])
    await run_until(Runner(cfg, handle_signals=False), lambda: all_committed(broker))
    events = await _stored(db)
    slow = sorted(e.payload["audited"] for e in events if e.trigger_id == "slow")
    assert slow == list(range(10))


@both_filter_paths
async def test_graceful_stop_then_restart_processes_every_message_once(
    tmp_path: Path, broker: MemoryBroker
) -> None:
    db = tmp_path / "e.db"
    cfg = _config(
        db,
        broker.name,
        """\
        - name: all
          stream: orders
          filter: {emit: {id: body.id}}
        """,
    )
    _publish(broker, [{"id": i} for i in range(200)])
    first = Runner(cfg, handle_signals=False)
    await run_until(first, lambda: broker.stats("g").delivered >= 40)
    stats = broker.stats("g")
    committed = sum(stats.committed.values())
    stored_after_first = len(await _stored(db))
    assert stored_after_first >= committed  # nothing committed without its event stored
    await run_until(Runner(cfg, handle_signals=False), lambda: all_committed(broker))
    ids = [e.payload["id"] for e in await _stored(db)]
    assert sorted(ids) == list(range(200))  # no loss, no duplicate row


@both_filter_paths
async def test_watcher_with_an_asset_gets_that_assets_store(
    tmp_path: Path, broker: MemoryBroker
) -> None:
    db = tmp_path / "e.db"
    cfg = _config(
        db,
        broker.name,
        """\
        - name: mark
          stream: orders
          asset: orders_high
          filter: {function: "runner_filters:watermark"}
        """,
    )
    _publish(broker, [{"id": i} for i in (3, 9, 4)])
    await run_until(Runner(cfg, handle_signals=False), lambda: all_committed(broker))
    from acklane.core.stores import AssetStore, open_backend

    backend = open_backend(f"sqlite:///{db}")
    try:
        assert AssetStore(asset="orders_high", backend=backend).get("high") == 9
    finally:
        backend.close()


@both_filter_paths
async def test_a_stop_requested_before_run_starts_nothing(
    tmp_path: Path, broker: MemoryBroker
) -> None:
    # `acklane run` forwards a signal that came during its start-up this way.
    db = tmp_path / "e.db"
    cfg = _config(
        db,
        broker.name,
        """\
        - name: all
          stream: orders
        """,
    )
    _publish(broker, [{"id": 1}])
    runner = Runner(cfg, handle_signals=False)
    runner.request_stop()
    async with asyncio.timeout(5):
        await runner.run()
    assert not db.exists()  # the event store was never opened
    assert broker.stats("g").delivered == 0  # nor the broker polled


def test_acklane_run_shuts_down_gracefully_on_sigterm(tmp_path: Path) -> None:
    cfg = tmp_path / "p.yaml"
    cfg.write_text(
        textwrap.dedent(
            f"""\
            store: {{url: "sqlite:///{tmp_path / "e.db"}"}}
            streams:
              s: {{connector: memory, topics: [t]}}
            watchers:
              - {{name: w, stream: s}}
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "acklane.core.cli", "run", str(cfg)],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if "Shared stream group started" in line:
                break
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=20)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert "Stopping" in out


def test_validate_names_file_line_and_field(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(
        "streams:\n  s: {connector: memory, topics: [t]}\nwatchers:\n  - {name: w, stream: nope}\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "acklane.core.cli", "validate", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "bad.yaml:4" in proc.stderr
    assert "stream" in proc.stderr


async def test_an_inline_watchers_store_error_restarts_the_cohort_and_loses_nothing(
    tmp_path: Path, broker: MemoryBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The inline path's emit: the store refusing an event (not for its content) fails
    # the group while the watcher is subscribed (nothing advanced without it); the
    # cohort restarts, the broker redelivers, the store drops what it already had.
    refused: list[int] = []
    put = EventStore.put_event_nowait

    def flaky_put(
        self: EventStore, trigger_id: str, stream_key: str, payload: Any, *rest: Any
    ) -> None:
        if trigger_id == "all" and payload["id"] == 3 and not refused:
            refused.append(3)
            raise RuntimeError("the event store is broken")
        put(self, trigger_id, stream_key, payload, *rest)

    monkeypatch.setattr(EventStore, "put_event_nowait", flaky_put)
    db = tmp_path / "e.db"
    cfg = _config(
        db,
        broker.name,
        """\
        - name: all
          stream: orders
          filter: {emit: {id: body.id}}
        - name: odd
          stream: orders
          filter: {match: {body.odd: true}, emit: {id: body.id}}
        """,
    )
    _publish(broker, [{"id": i, "odd": i % 2 == 1} for i in range(10)])
    runner = Runner(cfg, handle_signals=False)
    restarts: list[BaseException] = []
    runner.observer.cohort_failed = lambda key, error, delay: restarts.append(error)  # type: ignore[method-assign]
    await run_until(runner, lambda: all_committed(broker))
    assert refused == [3]
    assert restarts and "the event store is broken" in str(restarts[0])
    events = await _stored(db)
    by = {w: sorted(e.payload["id"] for e in events if e.trigger_id == w) for w in ("all", "odd")}
    assert by == {"all": list(range(10)), "odd": [1, 3, 5, 7, 9]}
