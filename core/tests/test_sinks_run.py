"""Sinks in a running pipeline and in the YAML: the runner delivers what it stores, and a
sinks: section with a mistake says where."""

from __future__ import annotations

import asyncio
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from runner_harness import all_committed, run_until
from sink_functions import RECEIVED
from typer.testing import CliRunner

from acklane.connectors.memory import MemoryBroker
from acklane.core.cli.app import app
from acklane.core.config import ConfigError, parse_config
from acklane.core.pipeline.runner import Runner

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.topics(orders=2),
    pytest.mark.usefixtures("sink_received"),
]


def _yaml(db: str, broker: str, *, sinks: str, watcher_sinks: str = "[calls]") -> str:
    head = textwrap.dedent(
        f"""\
        engine: {{shutdown_timeout: 5, restart_backoff_initial: 0.05}}
        store: {{url: "{db}"}}
        streams:
          orders: {{connector: memory, broker: {broker}, topics: [orders], group_id: g,
                    partitions: 2, poll_interval: 0.02}}
        sinks:
        """
    )
    tail = textwrap.dedent(
        f"""\
        watchers:
          - name: big
            stream: orders
            asset: orders
            filter: {{match: {{body.amount: {{gt: 10}}}}}}
            sinks: {watcher_sinks}
          - name: all
            stream: orders
        """
    )
    return head + textwrap.indent(textwrap.dedent(sinks).rstrip("\n") + "\n", "  ") + tail


FUNCTION_SINK = """\
- name: calls
  kind: function
  function: "sink_functions:record"
"""


async def test_a_running_pipeline_delivers_each_stored_event_of_a_watcher_to_its_sink(
    broker: MemoryBroker, tmp_path: Path
) -> None:
    db = f"sqlite:///{tmp_path / 'e.db'}"
    config = parse_config(_yaml(db, broker.name, sinks=FUNCTION_SINK), source="p.yaml")
    for i, amount in enumerate([5, 20, 30, 1, 40]):
        broker.publish("orders", json.dumps({"id": i, "amount": amount}).encode(), key=f"k{i}")
    runner = Runner(config, handle_signals=False)
    await run_until(runner, lambda: all_committed(broker) and len(RECEIVED) == 3)
    assert sorted(d.payload["amount"] for d in RECEIVED) == [20, 30, 40]
    assert {d.watcher for d in RECEIVED} == {"big"}  # the watcher without sinks: none
    assert len({d.event_id for d in RECEIVED}) == 3


async def test_sinks_status_counts_what_was_delivered(broker: MemoryBroker, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'e.db'}"
    text = _yaml(db, broker.name, sinks=FUNCTION_SINK)
    config = parse_config(text, source="p.yaml")
    broker.publish("orders", json.dumps({"id": 1, "amount": 50}).encode(), key="k")
    runner = Runner(config, handle_signals=False)
    await run_until(runner, lambda: len(RECEIVED) == 1)
    path = tmp_path / "p.yaml"
    path.write_text(text)
    result = await asyncio.to_thread(
        CliRunner().invoke, app, ["sinks", "status", str(path), "--format", "json"]
    )
    assert result.exit_code == 0, result.output
    (doc,) = [json.loads(line) for line in result.output.splitlines()]
    assert doc["sink"] == "calls" and doc["delivered"] == 1 and doc["lag"] == 0


def _problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, source="p.yaml")
    return [str(p) for p in caught.value.problems]


def test_an_unknown_sink_kind_is_named_with_the_kinds_there_are(tmp_path: Path) -> None:
    problems = _problems(
        _yaml(f"sqlite:///{tmp_path}/e.db", "b", sinks="- {name: x, kind: telegram}")
    )
    assert any(
        p.startswith("p.yaml:")
        and "sinks[0].kind" in p
        and "airflow, broker, function, webhook" in p
        for p in problems
    ), problems


def test_a_watcher_naming_no_configured_sink_is_refused(tmp_path: Path) -> None:
    problems = _problems(
        _yaml(f"sqlite:///{tmp_path}/e.db", "b", sinks=FUNCTION_SINK, watcher_sinks="[cals]")
    )
    assert any("watchers[0].sinks[0]" in p and "did you mean 'calls'" in p for p in problems), (
        problems
    )


def test_a_function_sink_that_does_not_import_is_refused_at_load(tmp_path: Path) -> None:
    sinks = '- {name: calls, kind: function, function: "no_such_module_here:f"}'
    problems = _problems(_yaml(f"sqlite:///{tmp_path}/e.db", "b", sinks=sinks))
    assert any("sinks[0].function" in p and "no_such_module_here" in p for p in problems), problems


def test_sinks_need_a_store_that_outlives_the_process() -> None:
    problems = _problems(_yaml("sqlite://", "b", sinks=FUNCTION_SINK))
    assert any("store.url" in p and "in-memory" in p for p in problems), problems


def test_an_ordered_sink_with_concurrency_is_refused_with_the_fix(tmp_path: Path) -> None:
    sinks = '- {name: calls, kind: function, function: "sink_functions:record", concurrency: 4}'
    problems = _problems(_yaml(f"sqlite:///{tmp_path}/e.db", "b", sinks=sinks))
    assert any("sinks[0]" in p and "ordered: false" in p for p in problems), problems


def test_two_sinks_with_one_name_are_refused(tmp_path: Path) -> None:
    sinks = FUNCTION_SINK + FUNCTION_SINK
    problems = _problems(_yaml(f"sqlite:///{tmp_path}/e.db", "b", sinks=sinks))
    assert any("sinks[1].name" in p and "duplicate sink name 'calls'" in p for p in problems), (
        problems
    )


async def test_the_sinks_metrics_and_readiness_are_served(
    broker: MemoryBroker, tmp_path: Path
) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from acklane.core.observe.metrics import EngineCollector

    db = f"sqlite:///{tmp_path / 'e.db'}"
    config = parse_config(_yaml(db, broker.name, sinks=FUNCTION_SINK), source="p.yaml")
    broker.publish("orders", json.dumps({"id": 1, "amount": 50}).encode(), key="k")
    runner = Runner(config, handle_signals=False)
    registry = CollectorRegistry()
    registry.register(EngineCollector(runner))
    seen: dict[str, Any] = {}

    def scraped() -> bool:
        if runner.sinks is None:
            return False
        stats = runner.sinks.stats()[0]  # settled, and the status read since
        if stats.delivered < 1 or stats.status is None or stats.status.delivered < 1:
            return False
        seen["text"] = generate_latest(registry).decode()
        seen["ready"] = runner.health.readiness()
        return True

    await run_until(runner, scraped)
    text = seen["text"]
    assert 'acklane_sink_deliveries_total{outcome="delivered",sink="calls"} 1.0' in text
    assert 'acklane_sink_lag_events{pipeline="default",sink="calls"}' in text
    assert 'acklane_sink_oldest_pending_seconds{pipeline="default",sink="calls"}' in text
    assert 'acklane_sink_parked_events{pipeline="default",sink="calls"} 0.0' in text
    assert 'acklane_sink_delivering{sink="calls"} 1.0' in text
    assert 'acklane_sink_delivery_latency_seconds_count{sink="calls"} 1.0' in text
    _, body = seen["ready"]
    assert body["sinks"]["calls"]["ok"] is True and body["sinks"]["calls"]["delivering"]
