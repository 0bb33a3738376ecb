"""Periodic INFO progress: one line per stream, cumulative counts and what they grew by."""

from __future__ import annotations

import json
import logging
import re
import textwrap

import pytest
from runner_harness import all_committed, run_until

from acklane.connectors.memory import MemoryBroker
from acklane.core.config import parse_config
from acklane.core.observe.progress import COUNTS, Progress
from acklane.core.pipeline.runner import Runner
from acklane.core.producer import AdvanceItem, AdvanceOutcome

pytestmark = pytest.mark.topics(orders=2)

LINE = re.compile(
    r"^progress stream=(?P<stream>\S+) "
    + " ".join(rf"{name}=(?P<{name}>\d+) \(\+(?P<{name}_delta>\d+)\)" for name in COUNTS)
    + r" restarts=(?P<restarts>\d+)(?: state=(?P<state>\w+))?$"
)


def _config(db: str, broker: str, filter_: str, interval: float = 0.05) -> str:
    return textwrap.dedent(
        f"""\
        engine:
          progress_interval: {interval}
          restart_backoff_initial: 0.05
          restart_backoff_max: 0.2
          shutdown_timeout: 5
        store: {{url: "sqlite:///{db}"}}
        streams:
          orders: {{connector: memory, broker: {broker}, topics: [orders], group_id: g,
                    partitions: 2, dead_letter: orders.dlq, batch_size: 4, poll_interval: 0.02}}
        watchers:
          - {{name: all, stream: orders, filter: {filter_}}}
        """
    )


def _lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, str]]:
    found = []
    for record in caplog.records:
        if record.name == "acklane.core.observe.progress" and record.levelno == logging.INFO:
            match = LINE.match(record.getMessage())
            assert match is not None, record.getMessage()
            found.append(match.groupdict())
    return found


def _counts(line: dict[str, str]) -> dict[str, int]:
    return {name: int(line[name]) for name in (*COUNTS, "restarts")}


async def test_progress_lines_count_received_stored_acked_and_rejected(
    tmp_path: object, broker: MemoryBroker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="acklane.core.observe.progress")
    for i in range(10):
        broker.publish("orders", json.dumps({"id": i}).encode(), key=f"k{i % 3}")
    broker.publish("orders", b"\xffnot json", key="k0")  # rejected: dead-lettered
    cfg = parse_config(
        _config(f"{tmp_path}/e.db", broker.name, "{emit: {id: body.id}}"), source="p.yaml"
    )
    runner = Runner(cfg, handle_signals=False)
    # at least one periodic line while running, however fast the machine is
    await run_until(runner, lambda: all_committed(broker) and bool(_lines(caplog)), timeout=30)

    lines = _lines(caplog)
    assert len(lines) >= 2  # periodic ones, then the totals at the stop
    assert {line["stream"] for line in lines} == {"orders"}
    assert all(line["state"] in ("polling", "stopped", "starting") for line in lines)
    final = _counts(lines[-1])
    assert final == {
        "received": 11,
        "events": 10,
        "acked": 10,
        "rejected": 1,
        "failed": 0,
        "restarts": 0,
    }
    # what each line says it grew by adds up to the totals
    for name in COUNTS:
        assert sum(int(line[f"{name}_delta"]) for line in lines) == final[name], name
    assert len(broker.records("orders.dlq")) == 1


async def test_progress_counts_a_restart_and_the_redelivered_messages(
    tmp_path: object, broker: MemoryBroker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="acklane.core.observe.progress")
    bodies = [{"id": i, "crash": i == 4} for i in range(8)]
    for i, body in enumerate(bodies):
        broker.publish("orders", json.dumps(body).encode(), key=f"k{i % 2}")
    cfg = parse_config(
        _config(f"{tmp_path}/e.db", broker.name, '{function: "runner_filters:crash_once"}'),
        source="p.yaml",
    )
    runner = Runner(cfg, handle_signals=False)
    await run_until(runner, lambda: all_committed(broker), timeout=30)
    final = _counts(_lines(caplog)[-1])
    assert final["restarts"] == 1
    assert final["acked"] == 8  # every message, once it went through
    assert final["rejected"] == 0
    # the crash failed its group: what it had broadcast came again
    assert final["received"] > 8
    assert final["events"] >= 8


async def test_no_progress_lines_when_the_interval_is_zero(
    tmp_path: object, broker: MemoryBroker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="acklane.core.observe.progress")
    broker.publish("orders", b'{"id": 1}')
    cfg = parse_config(
        _config(f"{tmp_path}/e.db", broker.name, "{emit: {id: body.id}}", interval=0),
        source="p.yaml",
    )
    await run_until(Runner(cfg, handle_signals=False), lambda: all_committed(broker))
    assert _lines(caplog) == []


def test_the_default_interval_is_a_minute() -> None:
    cfg = parse_config(
        "streams: {s: {connector: memory, topics: [t]}}\nwatchers: [{name: w, stream: s}]\n",
        source="p.yaml",
    )
    assert cfg.engine.progress_interval == 60


def test_outcomes_are_counted_as_the_connector_treats_them() -> None:
    progress = Progress(dict)
    progress.add("k", "orders", '"k"')
    batch = [
        AdvanceItem(1, AdvanceOutcome(acked=2, failed=0)),  # commit
        AdvanceItem(2, AdvanceOutcome(acked=1, failed=0, rejected=1)),  # dead-letter
        AdvanceItem(3, AdvanceOutcome(acked=0, failed=1, rejected=1)),  # redeliver
        AdvanceItem(4, AdvanceOutcome(acked=0, failed=0)),  # nobody: redeliver
    ]
    progress.advanced("k", batch)
    progress.advanced("other", batch)  # a key without a cohort: ignored
    p = progress.streams["k"]
    assert (p.acked, p.rejected, p.failed) == (1, 1, 2)
    assert p.line().endswith("acked=1 (+1) rejected=1 (+1) failed=2 (+2) restarts=0")
    assert "acked=1 (+0)" in p.line()


def test_the_counts_agree_with_the_connectors_verdict_for_every_outcome() -> None:
    import itertools

    from acklane.core.connectors import Verdict, verdict

    names = {Verdict.COMMIT: "acked", Verdict.DEAD_LETTER: "rejected", Verdict.REDELIVER: "failed"}
    for acked, failed, rejected in itertools.product(range(3), repeat=3):
        outcome = AdvanceOutcome(acked=acked, failed=failed, rejected=rejected)
        progress = Progress(dict)
        p = progress.add("k", "s", '"k"')
        progress.advanced("k", [AdvanceItem(None, outcome)])
        counted = {"acked": p.acked, "rejected": p.rejected, "failed": p.failed}
        assert counted == {n: int(n == names[verdict(outcome)]) for n in counted}, outcome
