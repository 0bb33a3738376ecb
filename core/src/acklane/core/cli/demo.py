"""``acklane demo``: a pipeline on embedded defaults, showing what becomes of each message.

No service and no file needed: a broker the demo starts itself, the SQLite event
store in a temporary directory, and three watchers sharing one poll:

- ``big-orders`` fires for orders over 100;
- ``every-order`` fires for every order and rejects poison (a body that is not
  JSON, a negative amount): those go to the dead-letter topic;
- ``audit`` is slow (back-pressure shows in its queue depth) and stalls once on a
  message past the ack timeout: that message fails, its partition is held, the
  cohort restarts and the broker redelivers it; the event store drops the
  duplicate trigger events of the redelivery.

The live table shows each message's fate and the committed offsets per partition.

The broker is a :class:`DemoBroker`. Core knows only ``memory`` (the in-process
broker); other packages register theirs under the entry-point group
``acklane.demos`` (name -> a :class:`DemoBroker` subclass): ``acklane-integration``
registers ``kafka``, a Kafka emulator, and ``pubsub`` and ``servicebus``, its own
emulators of those. ``auto`` tries the registered ones that offer themselves to it
(:attr:`DemoBroker.auto_order`, lowest first, then by name: ``kafka`` only) and
falls back to ``memory`` only when they raise :class:`DemoBrokerUnavailable`
(nothing to run them here, e.g. no emulator binary, or its extra not installed)
or when none is registered (no ``acklane-integration``), and it says why; any
other error surfaces.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, ClassVar

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ..config import parse_config
from ..connectors.deadletter import ORIGIN_OFFSET, ORIGIN_PARTITION, REJECT_REASON
from ..errors import AcklaneError
from ..message import RawMessage
from ..pipeline.runner import Runner, RunObserver
from ..producer import AdvanceItem
from ..trigger import TriggerEvent
from ._text import cell

__all__ = [
    "AUTO",
    "DEMO_YAML",
    "ENTRY_POINT_GROUP",
    "DemoBroker",
    "DemoBrokerUnavailable",
    "MemoryDemoBroker",
    "UnknownDemoBroker",
    "demo_broker_names",
    "load_demo_broker",
    "open_demo_broker",
    "run_demo",
    "slow_audit",
]

log = logging.getLogger("acklane.core.cli.demo")

#: Entry-point group of demo brokers: name -> a :class:`DemoBroker` subclass.
ENTRY_POINT_GROUP = "acklane.demos"
#: The ``--broker`` value that picks a registered broker when one can start, else memory.
AUTO = "auto"
MEMORY = "memory"

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
      function: acklane.core.cli.demo:slow_audit
"""

_STALLED: set[str] = set()
_DEBUG = bool(os.environ.get("ACKLANE_DEMO_DEBUG"))


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
    def __init__(self, rows: dict[str, _Row], broker: DemoBroker) -> None:
        self.rows = rows
        self.broker = broker
        self.restarts: list[str] = []
        self.advances = 0

    def fired(self, watcher: str, event: TriggerEvent, message_id: str | None) -> None:
        row = self.rows.get(self.broker.row_key(message_id or ""))
        if row is not None:
            row.fired[watcher] = row.fired.get(watcher, 0) + 1

    def advanced(self, key: Hashable, batch: Sequence[AdvanceItem]) -> None:
        self.advances += 1
        for item in batch:
            message_id = self.broker.message_id_of(item.broker_payload) or ""
            row = self.rows.get(self.broker.row_key(message_id))
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
    rows: dict[str, _Row], observer: _DemoObserver, runner: Runner, broker: DemoBroker
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
        table.add_row(row.label, cell(row.body), fired, cell(row.status, style=style))
    ends = broker.ends
    committed = ", ".join(
        f"p{p}: {broker.last_committed.get(p, 0)}/{end}" for p, end in sorted(ends.items())
    )
    depths = runner.manager.queue_depths()
    depth = ", ".join(f"{tid}={n}" for (_, tid), n in sorted(depths.items(), key=lambda x: x[0][1]))
    held = sum(1 for r in rows.values() if r.history and "redelivered" in r.history[-1])
    lines = [
        Text(f"{broker.progress_label}: {committed or '-'}"),
        Text(
            f"held for redelivery now: {held}   advance calls: {observer.advances}   "
            f"queue depth: {depth or '-'}"
        ),
    ]
    lines += [cell(f"restart: {r}", style="yellow") for r in observer.restarts[-3:]]
    return Group(table, *lines)


class DemoBrokerUnavailable(AcklaneError, RuntimeError):
    """The demo broker cannot run here at all (e.g. its emulator's binary is missing).

    Raise it (from the original error) only for that: ``--broker auto`` then falls
    back to the in-process broker, saying why; every other error stops the demo.
    """


class UnknownDemoBroker(AcklaneError, LookupError):
    """No demo broker of that name: neither ``memory`` nor a registered one."""


class DemoBroker(ABC):
    """A broker for ``acklane demo``: publish, committed offsets, the dead-letter topic.

    Subclasses start their broker in ``__init__`` (it may block; raise
    :class:`DemoBrokerUnavailable` when it cannot start at all, after releasing what
    was started) and release it in :meth:`close`. The demo's stream is named
    ``orders`` in the configuration, has :attr:`partitions` partitions and a
    dead-letter topic. Register a subclass under the entry-point group
    ``acklane.demos`` to offer it as ``acklane demo --broker NAME``.
    """

    #: What the broker is, for "starting ..." and "could not start ..." lines.
    description: ClassVar[str] = "a broker"
    partitions: ClassVar[int] = 3
    #: What the progress line calls :attr:`last_committed` (of :attr:`ends`) per partition.
    progress_label: ClassVar[str] = "committed offsets"
    #: ``--broker auto`` tries the brokers with an order, lowest first (then by name);
    #: ``None``: only when named explicitly.
    auto_order: ClassVar[int | None] = 0

    def __init__(self) -> None:
        #: What the demo runs on, shown in its title (may name the endpoint).
        self.label: str = self.description
        #: End offset (one past the last published message) per partition.
        self.ends: dict[int, int] = {}
        #: The consumer group's committed offset per partition, per :meth:`refresh_committed`.
        self.last_committed: dict[int, int] = {}

    @abstractmethod
    def stream_block(self) -> str:
        """The stream's YAML flow mapping (``{connector: ..., ...}``) for the demo's config."""

    @abstractmethod
    def publish(self, bodies: list[bytes]) -> list[tuple[str, int, int]]:
        """Publish in order and update :attr:`ends`; ``(message_id, partition, offset)`` of each."""

    @abstractmethod
    async def refresh_committed(self) -> None:
        """Read the consumer group's committed offsets into :attr:`last_committed`."""

    @abstractmethod
    async def dead_letters(self, count: int) -> list[tuple[str, str]]:
        """``(origin, reason)`` of the (up to ``count``) dead-lettered copies."""

    def message_id_of(self, broker_payload: Any) -> str | None:
        """The message id of a producer's broker payload (``partition/offset`` at its end).

        Default: the payload's ``message_id`` attribute (a Kafka record has one).
        """
        message_id = getattr(broker_payload, "message_id", None)
        return message_id if isinstance(message_id, str) else None

    def row_key(self, message_id: str) -> str:
        """The table's ``partition/offset`` label of a message id (as :meth:`publish` gave it).

        ``message_id`` is the producer's ``message_id()`` of a fired message, or
        :meth:`message_id_of` of an advanced one. Default: its last two ``/`` parts.
        """
        return _row_key(message_id)

    def close(self) -> None:  # noqa: B027 - optional: nothing to release by default
        """Release the broker and everything it started; called once, after the run."""

    def finished(self) -> bool:
        """True once every published message is committed."""
        return all(self.last_committed.get(p, 0) >= end for p, end in self.ends.items())

    @staticmethod
    def dead_letter_origin(headers: dict[str, str]) -> tuple[str, str]:
        """``(partition/offset, reason)`` of a dead-lettered copy, from its headers."""
        partition = headers.get(ORIGIN_PARTITION, "?")
        origin = f"{partition}/{headers.get(ORIGIN_OFFSET, '?')}"
        return origin, headers.get(REJECT_REASON, "?")


class MemoryDemoBroker(DemoBroker):
    """The in-process ``memory`` connector's broker: always available."""

    description = "the in-process memory broker"

    def __init__(self) -> None:
        super().__init__()
        from acklane.connectors.memory import MemoryBroker

        MemoryBroker.remove("acklane-demo")
        self.broker = MemoryBroker.get("acklane-demo")
        self.broker.create_topic("orders", self.partitions)

    def stream_block(self) -> str:
        return (
            "{connector: memory, broker: acklane-demo, topics: [orders], group_id: demo, "
            f"partitions: {self.partitions}, dead_letter: orders.dlq, batch_size: 8, "
            "poll_interval: 0.05}"
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
        return [self.dead_letter_origin(dict(r.headers)) for r in self.broker.records("orders.dlq")]

    def message_id_of(self, broker_payload: Any) -> str | None:
        from acklane.connectors.memory import MemoryDelivery

        if isinstance(broker_payload, MemoryDelivery):
            return broker_payload.record.message_id
        return super().message_id_of(broker_payload)

    def close(self) -> None:
        from acklane.connectors.memory import MemoryBroker

        MemoryBroker.remove("acklane-demo")


def _registered() -> dict[str, Any]:
    """Registered demo brokers' entry points by name (``auto`` and ``memory`` are core's)."""
    return {
        ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name not in (AUTO, MEMORY)
    }


def demo_broker_names() -> list[str]:
    """Every ``--broker`` value: ``auto``, ``memory`` and the registered names."""
    return [AUTO, MEMORY, *sorted(_registered())]


def load_demo_broker(name: str) -> type[DemoBroker]:
    """The demo broker class called ``name`` (``memory``, or a registered one)."""
    if name == MEMORY:
        return MemoryDemoBroker
    ep = _registered().get(name)
    if ep is None:
        raise UnknownDemoBroker(
            f"no demo broker named {name!r} (known: {', '.join(demo_broker_names())})"
        )
    obj = ep.load()
    if not (isinstance(obj, type) and issubclass(obj, DemoBroker)):
        raise TypeError(
            f"entry point {name!r} of {ENTRY_POINT_GROUP} ({ep.value}) is not a DemoBroker"
        )
    return obj


def _start(cls: type[DemoBroker], console: Console) -> DemoBroker:
    with console.status(f"starting {cls.description}..."):
        return cls()


def open_demo_broker(name: str, console: Console) -> DemoBroker:
    """Start the demo broker ``name``; ``auto``: the first registered one that can start.

    ``auto`` falls back to memory only on :class:`DemoBrokerUnavailable`, and says why
    on ``console``; any other error (and any error of a broker named explicitly)
    propagates.
    """
    if name != AUTO:
        return _start(load_demo_broker(name), console)
    candidates = []
    for other in sorted(_registered()):
        try:
            candidates.append((other, load_demo_broker(other)))
        except ImportError as exc:  # its distribution lacks what it imports
            log.debug("demo broker %r cannot load", other, exc_info=True)
            console.print(Text(f"cannot load the {other} demo broker: {exc}", style="yellow"))
    registered = sorted(
        ((cls.auto_order, name, cls) for name, cls in candidates if cls.auto_order is not None),
        key=lambda entry: (entry[0], entry[1]),
    )
    for _, other, cls in registered:
        try:
            return _start(cls, console)
        except DemoBrokerUnavailable as exc:
            log.debug("demo broker %r cannot start", other, exc_info=True)
            console.print(
                Text(
                    f"cannot start {cls.description} ({other}): {_first_line(exc)}", style="yellow"
                )
            )
    if not candidates:
        from .extras import missing_demo_broker

        console.print(Text(missing_demo_broker(), style="yellow"))
    elif not registered:
        names = ", ".join(name for name, _ in candidates)
        console.print(Text(f"no demo broker offers itself to --broker auto ({names})"))
    console.print(Text(f"using {MemoryDemoBroker.description} instead", style="yellow"))
    return MemoryDemoBroker()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _position(label: str) -> tuple[int, ...]:
    return tuple(int(x) for x in label.split("/"))


async def run_demo(messages: int = 24, console: Console | None = None, broker: str = "auto") -> int:
    """Run the demo pipeline to completion; returns a process exit code."""
    console = console or Console()
    _STALLED.clear()
    logger = logging.getLogger("acklane")
    level = logger.level
    if _DEBUG:
        logger.setLevel(logging.DEBUG)
    elif logger.getEffectiveLevel() > logging.DEBUG:
        logger.setLevel(logging.ERROR)  # the table tells the story (unless asked for DEBUG)
    try:
        demo_broker = open_demo_broker(broker, console)
        try:
            return await _run(demo_broker, messages, console)
        finally:
            demo_broker.close()
    finally:
        logger.setLevel(level)


async def _run(broker: DemoBroker, messages: int, console: Console) -> int:
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
        observer = _DemoObserver(rows, broker)
        runner = Runner(config, observer=observer)
        console.print(
            f"[bold]acklane demo[/]: {messages} messages on {broker.label}, "
            f"{broker.partitions} partition{'s' if broker.partitions != 1 else ''}, "
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
        counts = await _stored_counts(str(db), [w.name for w in config.watchers])
        dlq = await broker.dead_letters(sum(1 for r in rows.values() if "DLQ" in r.status))
        redelivered = sum(1 for r in rows.values() if any("redelivered" in h for h in r.history))
        console.print(
            f"\n[bold]done in {time.monotonic() - started:.1f}s[/]: "
            f"{sum(1 for r in rows.values() if r.history[-1:] == ['acked ✓'])} acked, "
            f"{len(dlq)} in the DLQ, {redelivered} redelivered; trigger events stored "
            f"per watcher (duplicates from redeliveries dropped): {counts}"
        )
        for origin, reason in dlq:
            console.print(cell(f"  DLQ copy of {origin}: {reason}"))  # the broker's text
        if not ok:
            console.print("[red]the demo did not finish in time[/]")
            return 1
        return 0


async def _stored_counts(url_path: str, watchers: list[str]) -> dict[str, int]:
    """Stored trigger events per watcher, in the pipeline's order of watchers (not the
    order in which each first stored one, which varies from run to run)."""
    from ..events import EventStore

    async with EventStore(f"sqlite:///{url_path}") as store:
        events = await store.list_events(limit=10_000)
    counts = dict.fromkeys(watchers, 0)
    for e in events:
        counts[e.trigger_id] = counts.get(e.trigger_id, 0) + 1
    return counts
