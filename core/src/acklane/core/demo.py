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
  orders: {stream}
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
    label: str
    body: str
    fired: dict[str, int] = field(default_factory=dict)
    history: list[str] = field(default_factory=list)

    @property
    def status(self) -> str:
        return ", ".join(self.history) if self.history else "in flight"


def _row_key(message_id: str) -> str:
    """``partition/offset`` of a message id (the demo has one topic; ids end that way)."""
    return "/".join(message_id.rsplit("/", 2)[-2:])


_SHORT = {"big-orders": "big", "every-order": "every", "audit": "audit"}


class _DemoObserver(RunObserver):
    def __init__(self, rows: dict[str, _Row]) -> None:
        self.rows = rows
        self.restarts: list[str] = []
        self.advances = 0

    def fired(self, watcher: str, event: TriggerEvent, message_id: str | None) -> None:
        row = self.rows.get(_row_key(message_id or ""))
        if row is not None:
            row.fired[watcher] = row.fired.get(watcher, 0) + 1

    def advanced(self, key: Hashable, batch: Sequence[AdvanceItem]) -> None:
        self.advances += 1
        for item in batch:
            payload = item.broker_payload
            mid = (
                payload.message_id if hasattr(payload, "message_id") else payload.record.message_id
            )
            row = self.rows.get(_row_key(mid))
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


def _render(
    rows: dict[str, _Row], observer: _DemoObserver, runner: Runner, broker: _DemoBroker
) -> Group:
    table = Table(title=f"acklane demo on {broker.label}: each message's fate", expand=False)
    table.add_column("partition/offset")
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
        table.add_row(row.label, row.body, fired, Text(row.status, style=style))
    ends = broker.ends
    committed = ", ".join(
        f"p{p}: {broker.last_committed.get(p, 0)}/{end}" for p, end in sorted(ends.items())
    )
    depths = runner.manager.queue_depths()
    depth = ", ".join(f"{tid}={n}" for (_, tid), n in sorted(depths.items(), key=lambda x: x[0][1]))
    held = sum(1 for r in rows.values() if r.history and "redelivered" in r.history[-1])
    lines = [
        Text(f"committed offsets: {committed or '-'}"),
        Text(
            f"held for redelivery now: {held}   advance calls: {observer.advances}   "
            f"queue depth: {depth or '-'}"
        ),
    ]
    lines += [Text(f"restart: {r}", style="yellow") for r in observer.restarts[-3:]]
    return Group(table, *lines)


class _DemoBroker:
    """What the demo needs of a broker: publish, committed offsets, the DLQ."""

    label = ""
    partitions = 3

    def __init__(self) -> None:
        self.ends: dict[int, int] = {}
        self.last_committed: dict[int, int] = {}

    def stream_block(self) -> str:
        raise NotImplementedError

    def publish(self, bodies: list[bytes]) -> list[tuple[str, int, int]]:
        """Publish in order; ``(message_id, partition, offset)`` of each."""
        raise NotImplementedError

    async def refresh_committed(self) -> None:
        raise NotImplementedError

    async def dead_letters(self, count: int) -> list[tuple[str, str]]:
        """``(origin, reason)`` of the dead-lettered copies."""
        raise NotImplementedError

    def close(self) -> None:
        pass

    def finished(self) -> bool:
        return all(self.last_committed.get(p, 0) >= end for p, end in self.ends.items())


class _MemoryDemoBroker(_DemoBroker):
    label = "the in-process memory broker"

    def __init__(self) -> None:
        super().__init__()
        from .connectors.memory import MemoryBroker

        MemoryBroker.remove("acklane-demo")
        self.broker = MemoryBroker.get("acklane-demo")
        self.broker.create_topic("orders", self.partitions)

    def stream_block(self) -> str:
        return (
            "{connector: memory, broker: acklane-demo, topics: [orders], group_id: demo, "
            "partitions: 3, dlq_topic: orders.dlq, batch_size: 8, poll_interval: 0.05}"
        )

    def publish(self, bodies: list[bytes]) -> list[tuple[str, int, int]]:
        out = []
        for i, body in enumerate(bodies):
            p, off = self.broker.publish("orders", body, key=f"customer-{i % 5}")
            self.ends[p] = max(self.ends.get(p, 0), off + 1)
            out.append((f"orders/{p}/{off}", p, off))
        return out

    async def refresh_committed(self) -> None:
        stats = self.broker.stats("demo")
        self.last_committed = {p: off for (_, p), off in stats.committed.items()}

    async def dead_letters(self, count: int) -> list[tuple[str, str]]:
        return [_origin(dict(r.headers)) for r in self.broker.records("orders.dlq")]

    def close(self) -> None:
        from .connectors.memory import MemoryBroker

        MemoryBroker.remove("acklane-demo")


class _KafkaDemoBroker(_DemoBroker):
    """A Kafka-protocol emulator started for the demo (tansu, or Kafka under Docker)."""

    def __init__(self) -> None:
        super().__init__()
        from acklane.integration.emulator import emulator_for
        from acklane.integration.kafka import KafkaKit

        self.emulator = emulator_for("kafka")
        self.emulator.start()
        self.label = f"a Kafka emulator ({self.emulator.backend}, {self.emulator.endpoint})"
        self.kit = KafkaKit.of(self.emulator)
        self.topic = self.kit.new_topic("orders", partitions=self.partitions)
        self.dlq = self.kit.new_topic("orders-dlq", partitions=1)
        self.group = KafkaKit.unique("demo")

    def stream_block(self) -> str:
        from acklane.integration.kafka import KafkaKit

        client = ", ".join(f'"{k}": {v}' for k, v in KafkaKit.FAST_GROUP.items())
        return (
            f"{{connector: kafka, bootstrap_servers: '{self.kit.bootstrap_servers}', "
            f"topics: [{self.topic}], group_id: {self.group}, dlq_topic: {self.dlq}, "
            f"poll_timeout: 0.1, batch_size: 8, client: {{{client}}}}}"
        )

    def publish(self, bodies: list[bytes]) -> list[tuple[str, int, int]]:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.kit.bootstrap_servers})
        out: list[tuple[str, int, int]] = []

        def delivered(error: Any, msg: Any) -> None:
            if error is None:
                out.append(
                    (
                        f"{msg.topic()}/{msg.partition()}/{msg.offset()}",
                        msg.partition(),
                        msg.offset(),
                    )
                )

        for i, body in enumerate(bodies):
            producer.produce(self.topic, value=body, key=f"customer-{i % 5}", on_delivery=delivered)
            producer.flush(10)  # one at a time: offsets in publish order
        for _, p, off in out:
            self.ends[p] = max(self.ends.get(p, 0), off + 1)
        return out

    async def refresh_committed(self) -> None:
        got = await asyncio.to_thread(self.kit.committed, self.group, self.topic, self.partitions)
        self.last_committed = {p: off for p, off in got.items() if off is not None}

    async def dead_letters(self, count: int) -> list[tuple[str, str]]:
        records = await asyncio.to_thread(self.kit.read, self.dlq, count, timeout=5.0)
        out = []
        for r in records:
            headers = {
                k: (v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v))
                for k, v in (r.headers() or [])
            }
            out.append(_origin(headers))
        return out

    def close(self) -> None:
        self.kit.close()
        self.emulator.stop()


def _position(label: str) -> tuple[int, ...]:
    return tuple(int(x) for x in label.split("/"))


def _origin(headers: dict[str, str]) -> tuple[str, str]:
    partition = headers.get("acklane.origin.partition", "?")
    origin = f"{partition}/{headers.get('acklane.origin.offset', '?')}"
    return origin, headers.get("acklane.reject.reason", "?")


def _open_broker(kind: str, console: Console) -> _DemoBroker:
    if kind in ("auto", "kafka"):
        try:
            with console.status("starting a Kafka emulator..."):
                return _KafkaDemoBroker()
        except Exception as exc:  # no integration package, no binary, no port...
            if kind == "kafka":
                raise
            console.print(
                f"[yellow]could not start a Kafka emulator ({type(exc).__name__}: {exc}); "
                f"using the in-process memory broker instead[/]"
            )
    return _MemoryDemoBroker()


async def run_demo(messages: int = 24, console: Console | None = None, broker: str = "auto") -> int:
    """Run the demo pipeline to completion; returns a process exit code."""
    console = console or Console()
    _STALLED.clear()
    logger = logging.getLogger("acklane")
    level = logger.level
    logger.setLevel(logging.ERROR if not _DEBUG else logging.DEBUG)  # the table tells the story
    try:
        demo_broker = _open_broker(broker, console)
        try:
            return await _run(demo_broker, messages, console)
        finally:
            demo_broker.close()
    finally:
        logger.setLevel(level)


async def _run(broker: _DemoBroker, messages: int, console: Console) -> int:
    with tempfile.TemporaryDirectory(prefix="acklane-demo-") as tmp:
        db = Path(tmp) / "events.db"
        config = parse_config(
            DEMO_YAML.format(db=db, stream=broker.stream_block()), source="<acklane demo>"
        )
        bodies = _orders(messages)
        rows: dict[str, _Row] = {}
        for (mid, p, off), body in zip(broker.publish(bodies), bodies, strict=True):
            text = body.decode("utf-8", "replace").replace(", ", ",").replace(": ", ":")
            rows[f"{p}/{off}"] = _Row(mid, f"{p}/{off}", text)
        rows = dict(sorted(rows.items(), key=lambda kv: _position(kv[1].label)))
        observer = _DemoObserver(rows)
        runner = Runner(config, observer=observer)
        console.print(
            f"[bold]acklane demo[/]: {messages} messages on {broker.label}, 3 partitions, "
            f"3 watchers sharing one poll, events in SQLite at {db}"
        )
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
                while not broker.finished():
                    if time.monotonic() - started > 50 or run_task.done():
                        ok = False
                        break
                    await asyncio.sleep(0.2)
                    await broker.refresh_committed()
                    live.update(_render(rows, observer, runner, broker))
                runner.request_stop()
                with contextlib.suppress(Exception):
                    await run_task
                live.update(_render(rows, observer, runner, broker))
        counts = await _stored_counts(str(db))
        dlq = await broker.dead_letters(sum(1 for r in rows.values() if "DLQ" in r.status))
        redelivered = sum(1 for r in rows.values() if any("redelivered" in h for h in r.history))
        console.print(
            f"\n[bold]done in {time.monotonic() - started:.1f}s[/]: "
            f"{sum(1 for r in rows.values() if r.history[-1:] == ['acked ✓'])} acked, "
            f"{len(dlq)} in the DLQ, {redelivered} redelivered; trigger events stored "
            f"per watcher (duplicates from redeliveries dropped): {counts}"
        )
        for origin, reason in dlq:
            console.print(f"  DLQ copy of {origin}: {reason}")
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
