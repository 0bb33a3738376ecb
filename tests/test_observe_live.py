"""The live view against a real ``acklane run`` on the Kafka emulator: ``acklane top`` under
tmux (the pane's figures move), ``acklane top --once``, and the Grafana dashboard and
Prometheus alert rules in deploy/, every metric they name checked against what a
scrape of that pipeline returns (and ``promtool check rules`` when it is installed).

One pipeline for the module: ``acklane run`` as a child process, its metrics port
free, fed by a thread that produces 10 orders every 0.2 s (one in 7 with a negative
amount: rejected, dead-lettered to ``orders.dlq``).
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from acklane.integration.emulator import free_port
from acklane.integration.kafka import KafkaKit

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "deploy" / "grafana" / "acklane.json"
ALERTS = ROOT / "deploy" / "prometheus" / "acklane-alerts.yml"
ACKLANE = [sys.executable, "-m", "acklane.core.cli"]


@dataclass
class Live:
    config: Path
    port: int
    topic: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def scrape(self) -> str:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as resp:
            text: str = resp.read().decode()
            return text


def _feed(kit: KafkaKit, topic: str, stop: threading.Event) -> None:
    n = 0
    while not stop.is_set():
        batch = []
        for _ in range(10):
            batch.append(json.dumps({"id": n, "amount": n % 7 - 1}))
            n += 1
        kit.produce(topic, batch)
        stop.wait(0.2)


@pytest.fixture(scope="module")
def live(kafka_kit: KafkaKit, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    tmp = tmp_path_factory.mktemp("live")
    topic = kafka_kit.new_topic("orders", partitions=2)
    kafka_kit.create_topic(f"{topic}.dlq")
    port = free_port()
    config = tmp / "live.yaml"
    config.write_text(
        textwrap.dedent(
            f"""\
            engine: {{shutdown_timeout: 5, progress_interval: 0, lag_interval: 0.5}}
            store: {{url: "sqlite:///{tmp / "e.db"}", retention: null}}
            metrics: {{port: {port}}}
            streams:
              orders:
                connector: kafka
                bootstrap_servers: {kafka_kit.bootstrap_servers}
                topics: [{topic}]
                group_id: {KafkaKit.unique("live")}
                dead_letter: {topic}.dlq
                lag_end_offsets: last_batch
                poll_timeout: 0.05
                client: {json.dumps(KafkaKit.FAST_GROUP)}
            watchers:
              - name: big-orders
                stream: orders
                filter:
                  match: {{body.amount: {{gt: 3}}}}
                  reject: {{body.amount: {{lt: 0}}}}
                  emit: {{id: body.id}}
              - name: all-orders
                stream: orders
                filter: {{emit: {{id: body.id}}}}
            """
        )
    )
    log = (tmp / "run.log").open("wb")
    run = subprocess.Popen(
        [*ACKLANE, "run", str(config)], stdin=subprocess.DEVNULL, stdout=log, stderr=log
    )
    stop = threading.Event()
    feeder = threading.Thread(target=_feed, args=(kafka_kit, topic, stop), daemon=True)
    try:
        live = Live(config, port, topic)
        deadline = time.monotonic() + 60
        while True:  # until the pipeline serves its metrics
            with contextlib.suppress(OSError):
                live.scrape()
                break
            assert run.poll() is None, (tmp / "run.log").read_text()
            assert time.monotonic() < deadline, "acklane run served no metrics"
            time.sleep(0.1)
        feeder.start()
        yield live
    finally:
        stop.set()
        if feeder.is_alive():
            feeder.join(10)
        run.terminate()
        try:
            run.wait(30)
        except subprocess.TimeoutExpired:
            run.kill()
            run.wait(10)
        log.close()


def _scraped_names(text: str) -> set[str]:
    names = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(s.name for s in family.samples)
    return names


def _until_scraped(live: Live, wanted: set[str], timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while True:
        text = live.scrape()
        if wanted <= _scraped_names(text) or time.monotonic() > deadline:
            return text
        time.sleep(0.2)


# ------------------------------------------------------------------ acklane top


def _row(pane: str, first: str) -> list[str]:
    for line in pane.splitlines():
        cells = [c.strip() for c in re.split(r"[│┃|]", line) if c.strip()]
        if cells and cells[0] == first:
            return cells
    return []


def _figure(cell: str) -> float:
    return float(cell.replace(",", "")) if cell not in ("", "-") else -1.0


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_top_under_tmux_shows_the_figures_move(live: Live, tmp_path: Path) -> None:
    socket = f"acklane-top-{uuid.uuid4().hex[:8]}"
    tmux = ["tmux", "-L", socket, "-f", "/dev/null"]
    # the pane's own size, not one inherited from the test's environment
    unset = ["env", "-u", "COLUMNS", "-u", "LINES"]
    command = " ".join([*unset, *ACKLANE, "top", str(live.config), "--interval", "0.5"])
    subprocess.run(
        [*tmux, "new-session", "-d", "-s", "top", "-x", "160", "-y", "45", command], check=True
    )
    # a command that exits leaves its last screen to read (and to show on a failure)
    subprocess.run([*tmux, "set-option", "-t", "top", "remain-on-exit", "on"], check=True)
    try:
        received: list[float] = []
        panes: list[str] = []
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            pane = subprocess.run(
                [*tmux, "capture-pane", "-p", "-t", "top"], capture_output=True, text=True
            ).stdout
            row = _row(pane, "orders")
            if len(row) >= 10 and _figure(row[3]) >= 0:
                if not received or _figure(row[3]) != received[-1]:
                    received.append(_figure(row[3]))
                    panes.append(pane)
                if len(received) >= 3 and _figure(_row(pane, "orders")[7]) > 0:
                    break
            time.sleep(0.3)
        assert len(received) >= 3, "the pane did not move:\n" + "\n".join(panes[-1:] or [pane])
        assert received == sorted(received) and received[-1] > received[0]
        pane = panes[-1]
        orders = _row(pane, "orders")
        assert orders[1] == "polling"
        assert _figure(orders[2]) > 0  # msg/s over the last refresh
        assert _figure(orders[5]) > 0 and _figure(orders[7]) > 0  # rejected, dead letters
        assert _figure(orders[8]) >= 0  # the lag, read from the broker
        big, every = _row(pane, "big-orders"), _row(pane, "all-orders")
        assert big[1] == every[1] == "orders"
        assert 0 < _figure(big[2]) < _figure(every[2])
        assert "totals" in pane and "acklane top" in pane and "ready" in pane
    finally:
        subprocess.run([*tmux, "kill-server"], check=False)


def test_top_once_prints_one_frame(live: Live) -> None:
    from typer.testing import CliRunner

    from acklane.core.cli.app import app

    _until_scraped(live, {"acklane_watcher_events_total"})
    done = CliRunner().invoke(
        app, ["top", "--once", "--url", live.url, "--interval", "0.3"], env={"COLUMNS": "160"}
    )
    assert done.exit_code == 0, done.output
    assert _row(done.output, "orders")[1] == "polling"
    assert _row(done.output, "all-orders")


def test_top_says_when_nothing_answers() -> None:
    from typer.testing import CliRunner

    from acklane.core.cli.app import app

    url = f"http://127.0.0.1:{free_port()}"
    done = CliRunner().invoke(app, ["top", "--once", "--url", url], env={"COLUMNS": "160"})
    assert done.exit_code == 1
    assert f"no answer from {url}" in done.output


# ------------------------------------------------------------------ dashboard and alerts


def _names_in(expression: str) -> set[str]:
    return set(re.findall(r"\backlane_[a-z0-9_]+", expression))


def _dashboard_expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    found = []
    for panel in dashboard["panels"]:
        found.extend(t["expr"] for t in panel.get("targets", []))
    found.extend(
        v["query"]["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"
    )
    return found


def _alert_expressions() -> list[str]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule["expr"] for group in groups for rule in group["rules"]]


def test_every_metric_of_the_dashboard_and_the_alerts_is_in_a_real_scrape(live: Live) -> None:
    expressions = _dashboard_expressions() + _alert_expressions()
    named = set().union(*map(_names_in, expressions))
    assert len(named) >= 8  # the rules and panels do name acklane's metrics
    scraped = _scraped_names(_until_scraped(live, named))
    assert named <= scraped, f"not in a scrape: {sorted(named - scraped)}"
    alerts = {r["alert"] for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]}
    assert {
        "AcklaneRestartLoop",
        "AcklaneLagGrowing",
        "AcklaneStreamNotReady",
        "AcklaneDeadLettersRising",
    } <= alerts


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_promtool_checks_the_alert_rules() -> None:
    done = subprocess.run(
        ["promtool", "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout
