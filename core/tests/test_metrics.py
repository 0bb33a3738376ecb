"""The Prometheus collector reads the engine's counters at scrape time."""

from __future__ import annotations

import asyncio
import contextlib
import textwrap
import uuid
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from runner_harness import all_committed, run_until

from acklane.connectors.memory import MemoryBroker
from acklane.core.config import parse_config
from acklane.core.observe.metrics import EngineCollector
from acklane.core.pipeline.runner import Runner


async def test_collector_exposes_broadcast_outcomes_advances_and_persisted(tmp_path: Path) -> None:
    name = f"m-{uuid.uuid4().hex[:8]}"
    broker = MemoryBroker.get(name)
    broker.create_topic("orders", 2)
    for i in range(10):
        broker.publish("orders", f'{{"id": {i}}}'.encode())
    cfg = parse_config(
        textwrap.dedent(
            f"""\
            store: {{url: "sqlite:///{tmp_path / "e.db"}"}}
            streams:
              orders: {{connector: memory, broker: {name}, topics: [orders], group_id: g,
                        partitions: 2, poll_interval: 0.02}}
            watchers:
              - {{name: all, stream: orders}}
            """
        ),
        source="m.yaml",
    )
    runner = Runner(cfg, handle_signals=False)
    registry = CollectorRegistry()
    registry.register(EngineCollector(runner))
    scraped: list[str] = []

    def done() -> bool:
        if all_committed(broker) and runner._store is not None:
            scraped.append(generate_latest(registry).decode())
            return True
        return False

    await run_until(runner, done)
    text = scraped[0]
    assert "acklane_events_broadcast_total{key=" in text
    assert "acklane_advanced_events_total" in text
    assert "acklane_event_outcomes_total{key=" in text
    assert 'acklane_events_persisted_total{kind="inserted"}' in text
    assert 'acklane_connector_actions_total{action="delivered",key=' in text
    assert 'acklane_connector_actions_total{action="dead_lettered",key=' in text
    MemoryBroker.remove(name)
    scraped_names = {
        line.split("{", 1)[0].split(" ", 1)[0]
        for line in text.splitlines()
        if line.startswith("acklane_")
    }
    assert scraped_names == _documented_metrics()


def _documented_metrics() -> set[str]:
    """The metric names of docs/engine.md's table: what users alert on must exist."""
    docs = Path(__file__).resolve().parents[2] / "docs" / "engine.md"
    names = set()
    for line in docs.read_text(encoding="utf-8").splitlines():
        if line.startswith("| `acklane_"):
            names.add(line.split("`")[1])
    return names


async def test_a_producer_whose_counters_fail_is_left_out_of_a_scrape() -> None:
    from collections.abc import Mapping

    from engine_harness import AckTrigger, FakeProducer, Upstream

    from acklane.core import SharedStreamManager

    class Broken(FakeProducer):
        def counters(self) -> Mapping[str, float]:
            raise RuntimeError("bug")

    up = Upstream(f"up-{uuid.uuid4().hex[:8]}")
    manager = SharedStreamManager()
    trigger = AckTrigger(up.name)
    events = manager.events(trigger_id="t", trigger=trigger, key=trigger.shared_stream_key())
    pending = asyncio.ensure_future(anext(events))
    await asyncio.sleep(0.01)
    assert manager.producer_counters() == {trigger.shared_stream_key(): {}}
    group = manager._groups[trigger.shared_stream_key()]
    group.producer = Broken(up)
    assert manager.producer_counters() == {}  # logged, not raised
    pending.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await pending
    await events.aclose()
    await manager.stop_all()
