"""``acklane demo``: a pipeline on embedded defaults, showing what becomes of each message.

No service and no file needed: an in-process broker (the ``memory`` connector, or a
Kafka emulator when one can be started), the SQLite event store in a temporary
directory, and three watchers sharing one poll:

- ``big-orders`` fires for orders over 100;
- ``every-order`` fires for every order and rejects poison (a body that is not
  JSON, a negative amount): those go to the dead-letter topic;
- ``audit`` is slow (back-pressure shows in its queue depth) and stalls once on a
  message past the ack timeout: that message fails, its partition is held, the
  cohort restarts and the broker redelivers it; the event store drops the
  duplicate trigger events of the redelivery.

The live table shows each message's fate and the committed offsets per partition.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import tempfile
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from .config import parse_config
from .message import RawMessage
from .producer import AdvanceItem
from .runner import Runner, RunObserver
from .trigger import TriggerEvent

__all__ = ["DEMO_YAML", "run_demo", "slow_audit"]

DEMO_YAML = """\
engine:
  ack_timeout: 1.5            # a watcher that sits on a message longer fails it
  subscriber_queue_size: 256
  restart_backoff_initial: 0.3
  restart_backoff_max: 2
  shutdown_timeout: 5
store:
  url: sqlite:///{db}
streams:
  orders:
    connector: memory
    broker: acklane-demo
    topics: [orders]
    group_id: demo
    partitions: 3
    dlq_topic: orders.dlq
    batch_size: 8
    poll_interval: 0.05
watchers:
  - name: big-orders
    stream: orders
    filter:
      match: {{body.amount: {{gt: 100}}}}
      emit: {{order: body.id, amount: body.amount}}
  - name: every-order
    stream: orders
    filter:
      match: {{body.type: order}}
      reject: {{body.amount: {{lt: 0}}}}
      emit: {{order: body.id}}
  - name: audit
    stream: orders
    filter:
      function: acklane.core.demo:slow_audit
"""

_STALLED: set[str] = set()
_DEBUG = bool(__import__("os").environ.get("ACKLANE_DEMO_DEBUG"))


async def slow_audit(message: RawMessage) -> dict[str, Any] | None:
    """A slow watcher; it stalls past the ack timeout the first time it sees a stall order."""
    await asyncio.sleep(0.03)
    try:
        body = message.json()
    except ValueError:
        return None  # poison is every-order's business; the audit just skips it
    if isinstance(body, dict) and body.get("stall") and message.message_id not in _STALLED:
        _STALLED.add(str(message.message_id))
        await asyncio.sleep(3.0)  # longer than ack_timeout: this delivery fails
    return {"audited": body.get("id") if isinstance(body, dict) else None}


def _orders(count: int) -> list[bytes]:
    """The demo's messages: orders, two poison ones, and one that stalls the audit."""
    out: list[bytes] = []
    for i in range(1, count + 1):
        if i == 5:
            out.append(b"\x00not json at all")
        elif i == 9:
            out.append(json.dumps({"type": "order", "id": i, "amount": -40}).encode())
        elif i == 13:
            out.append(
                json.dumps({"type": "order", "id": i, "amount": 180, "stall": True}).encode()
            )
        else:
            amount = (i * 37) % 250
            out.append(json.dumps({"type": "order", "id": i, "amount": amount}).encode())
    return out


@dataclass
class _Row:
    message_id: str
    body: str
    fired: dict[str, int] = field(default_factory=dict)
    history: list[str] = field(default_factory=list)

    @property
    def status(self) -> str:
        return ", ".join(self.history) if self.history else "in flight"


_SHORT = {"big-orders": "big", "every-order": "every", "audit": "audit"}


class _DemoObserver(RunObserver):
    def __init__(self, rows: dict[str, _Row]) -> None:
        self.rows = rows
        self.restarts: list[str] = []
        self.advances = 0

    def fired(self, watcher: str, event: TriggerEvent, message_id: str | None) -> None:
        row = self.rows.get(message_id or "")
        if row is not None:
            row.fired[watcher] = row.fired.get(watcher, 0) + 1

    def advanced(self, key: Hashable, batch: Sequence[AdvanceItem]) -> None:
        self.advances += 1
        for item in batch:
            record = item.broker_payload.record
            mid = f"{record.topic}/{record.partition}/{record.offset}"
            row = self.rows.get(mid)
            if row is None:
                continue
            o = item.outcome
            if o.is_clean:
                row.history.append("acked ✓")
            elif o.rejected:
                row.history.append("rejected → DLQ")
            elif o.failed:
                row.history.append("failed → redelivered")
            else:
                row.history.append("unclaimed → redelivered")

    def cohort_failed(self, key: Hashable, error: BaseException, delay: float) -> None:
        self.restarts.append(f"{type(error).__name__}: {str(error)[:90]} (restart in {delay:.1f}s)")


def _render(rows: dict[str, _Row], observer: _DemoObserver, runner: Runner, broker: Any) -> Group:
    table = Table(title="acklane demo: each message's fate", expand=False)
    table.add_column("message")
    table.add_column("body", no_wrap=True, overflow="ellipsis", max_width=28)
    table.add_column("fired")
    table.add_column("outcome", min_width=24)
    for row in rows.values():
        last = row.history[-1] if row.history else ""
        style = (
            "red"
            if "DLQ" in last
            else "yellow"
            if "redelivered" in row.status
            else "green"
            if last == "acked ✓"
            else "dim"
        )
        fired = ",".join(_SHORT.get(w, w) for w in row.fired) or "-"
        table.add_row(row.message_id, row.body, fired, Text(row.status, style=style))
    stats = broker.stats("demo")
    committed = ", ".join(
        f"p{p}: {off}/{broker.end_offsets('orders').get(p, 0)}"
        for (_, p), off in sorted(stats.committed.items())
    )
    depths = runner.manager.queue_depths()
    depth = ", ".join(f"{tid}={n}" for (_, tid), n in sorted(depths.items(), key=lambda x: x[0][1]))
    lines = [
        Text(f"committed offsets: {committed or '-'}"),
        Text(
            f"dead-lettered: {stats.dead_lettered}   redelivered: {stats.redelivered}   "
            f"advance calls: {observer.advances}   queue depth: {depth or '-'}"
        ),
    ]
    lines += [Text(f"restart: {r}", style="yellow") for r in observer.restarts[-3:]]
    return Group(table, *lines)


async def run_demo(messages: int = 24, console: Console | None = None) -> int:
    """Run the demo pipeline to completion; returns a process exit code."""
    from .connectors.memory import MemoryBroker

    console = console or Console()
    _STALLED.clear()
    logging.getLogger("acklane").setLevel(logging.ERROR if not _DEBUG else logging.DEBUG)
    with tempfile.TemporaryDirectory(prefix="acklane-demo-") as tmp:
        db = Path(tmp) / "events.db"
        config = parse_config(DEMO_YAML.format(db=db), source="<acklane demo>")
        MemoryBroker.remove("acklane-demo")
        broker = MemoryBroker.get("acklane-demo")
        broker.create_topic("orders", 3)
        rows: dict[str, _Row] = {}
        for i, body in enumerate(_orders(messages)):
            p, off = broker.publish("orders", body, key=f"customer-{i % 5}")
            text = body.decode("utf-8", "replace").replace(", ", ",").replace(": ", ":")
            rows[f"orders/{p}/{off}"] = _Row(f"orders/{p}/{off}", text)
        rows = dict(
            sorted(rows.items(), key=lambda kv: tuple(int(x) for x in kv[0].split("/")[1:]))
        )
        observer = _DemoObserver(rows)
        runner = Runner(config, observer=observer)
        console.print(
            f"[bold]acklane demo[/]: {messages} messages on an in-process broker (3 partitions), "
            f"3 watchers sharing one poll, events in SQLite at {db}"
        )

        def finished() -> bool:
            ends = broker.end_offsets("orders")
            stats = broker.stats("demo")
            return all(stats.committed.get(("orders", p), 0) >= end for p, end in ends.items())

        started = time.monotonic()
        ok = True
        async with asyncio.TaskGroup() as tg:
            run_task = tg.create_task(runner.run())
            with Live(
                _render(rows, observer, runner, broker),
                console=console,
                refresh_per_second=8,
                transient=False,
            ) as live:
                while not finished():
                    if time.monotonic() - started > 50 or run_task.done():
                        ok = False
                        break
                    await asyncio.sleep(0.1)
                    live.update(_render(rows, observer, runner, broker))
                runner.request_stop()
                with contextlib.suppress(Exception):
                    await run_task
                live.update(_render(rows, observer, runner, broker))
        counts = await _stored_counts(str(db))
        stats = broker.stats("demo")
        dlq = broker.records("orders.dlq")
        console.print(
            f"\n[bold]done in {time.monotonic() - started:.1f}s[/]: "
            f"{sum(1 for r in rows.values() if r.history[-1:] == ['acked ✓'])} acked, "
            f"{len(dlq)} in the DLQ, {stats.redelivered} redeliveries; trigger events stored "
            f"per watcher: {counts}"
        )
        for rec in dlq:
            console.print(
                f"  DLQ: {rec.headers.get('acklane.origin.topic')}/"
                f"{rec.headers.get('acklane.origin.partition')}/"
                f"{rec.headers.get('acklane.origin.offset')}  reason: "
                f"{rec.headers.get('acklane.reject.reason', '?')}"
            )
        MemoryBroker.remove("acklane-demo")
        if not ok:
            console.print("[red]the demo did not finish in time[/]")
            return 1
        return 0


async def _stored_counts(url_path: str) -> dict[str, int]:
    from .events import EventStore

    async with EventStore(f"sqlite:///{url_path}") as store:
        events = await store.list_events(limit=10_000)
    counts: dict[str, int] = {}
    for e in events:
        counts[e.trigger_id] = counts.get(e.trigger_id, 0) + 1
    return counts
