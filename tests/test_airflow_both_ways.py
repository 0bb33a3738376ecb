"""acklane's and Apache Airflow 3.3's shared-stream engines, both ways.

The same producers run under both managers, acklane's ``SharedStreamManager`` and
Airflow's ``airflow.triggers.shared_stream.SharedStreamManager``, against the
Kafka emulator:

* ``acklane``: acklane's ``KafkaStreamProducer``, through a ``KafkaMessageTrigger``;
* ``provider``: the Airflow Kafka provider's ``KafkaSharedStreamProducer``, through
  its ``KafkaSharedStreamTrigger``, unchanged but for the filter;
* ``hybrid``: acklane's ``KafkaStreamProducer`` behind an Airflow ``BaseEventTrigger``
  (what Airflow's triggerer routes to its manager).

Both managers are driven as Airflow's triggerer drives its own: ``subscribe``
returns the raw stream, the caller runs the filter, binds each event it yields
and confirms it after a simulated persist; a subscriber leaves by cancellation
and ``unsubscribe``. What the broker shows must agree: committed offsets, the
dead-letter topic, and which watcher timed out. Broker-free tests pin the
shapes: ``subscribe``, the constructor, rejects under every combination, the
fast path, reject reasons and ``AckTimeout``.

Needs the ``airflow`` dependency group (``uv run --group airflow pytest -m
airflow``); skipped when Airflow is not installed. Airflow is imported by a
fixture, never at collection, so a run that deselects these tests never loads it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import pickle
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Iterator
from dataclasses import dataclass, field
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from acklane.connectors.kafka import KafkaConnector, KafkaMessage, KafkaMessageTrigger
from acklane.core import manager as acklane_manager
from acklane.core import producer as acklane_producer
from acklane.core import trigger as acklane_trigger
from acklane.core.connectors.deadletter import outcome_reason
from acklane.integration.kafka import KafkaKit

pytestmark = [pytest.mark.airflow, pytest.mark.timeout(90)]

MANAGERS = ("acklane", "airflow")
FAMILIES = ("acklane", "provider", "hybrid")
REJECTS = ("acklane", "airflow")

# -- Airflow, imported by a fixture ------------------------------------------------------


@pytest.fixture(scope="session")
def af(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    """Airflow's modules and the trigger classes built on them (AIRFLOW_HOME: a temp dir).

    Airflow writes its config under AIRFLOW_HOME at its first import: the variable is
    set before, so a test run never creates ``~/airflow``.
    """
    old_home = os.environ.get("AIRFLOW_HOME")
    os.environ["AIRFLOW_HOME"] = str(tmp_path_factory.mktemp("airflow-home"))
    try:
        shared = pytest.importorskip(
            "airflow.triggers.shared_stream", reason="Airflow is not installed: --group airflow"
        )
        base = pytest.importorskip("airflow.triggers.base")
        kafka = pytest.importorskip("airflow.providers.apache.kafka.triggers.shared_stream")
        yield SimpleNamespace(ss=shared, base=base, kafka=kafka, **_airflow_classes(base, kafka))
    finally:
        if old_home is None:
            os.environ.pop("AIRFLOW_HOME", None)
        else:
            os.environ["AIRFLOW_HOME"] = old_home


def reject_with(kind: str) -> Callable[[], None]:
    """acklane's reject (with a reason) or Airflow's (none), looked up when called."""
    if kind == "acklane":
        return lambda: acklane_trigger.reject_shared_stream_event(reason="bad record")
    import airflow.triggers.shared_stream as shared

    return shared.reject_shared_stream_event


def make_manager(
    kind: str, af: SimpleNamespace, *, ack_timeout: float = 30.0, grace: float = 0.3
) -> Any:
    """Either manager, with the same settings, by keyword (both are keyword-only)."""
    cls = acklane_manager.SharedStreamManager if kind == "acklane" else af.ss.SharedStreamManager
    return cls(max_subscriber_queue=1024, ack_timeout=ack_timeout, cohort_grace_period=grace)


# -- the triggers ---------------------------------------------------------------------------


class AcklaneWatcher(KafkaMessageTrigger):
    """acklane's Kafka trigger: fires with the record's text; may reject ``bad-*``."""

    _rejects: Callable[[], None] | None = None

    async def filter_shared_stream(self, stream: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for message in stream:
            assert isinstance(message, KafkaMessage)
            text = message.body.decode()
            if self._rejects is not None and text.startswith("bad"):
                self._rejects()
                continue
            yield acklane_trigger.TriggerEvent(text)


def _airflow_classes(base: ModuleType, kafka: ModuleType) -> dict[str, type]:
    """The trigger classes that derive from Airflow's (made once Airflow is imported)."""

    class ProviderWatcher(kafka.KafkaSharedStreamTrigger):
        """The provider's trigger, filter overridden like the others; producer unchanged."""

        _rejects: Callable[[], None] | None = None

        async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]) -> Any:
            async for value in shared_stream:
                text = self._decode(value)
                if self._rejects is not None and text.startswith("bad"):
                    self._rejects()
                    continue
                yield base.TriggerEvent(text)

    class HybridWatcher(base.BaseEventTrigger):
        """An Airflow trigger (what Airflow's triggerer shares) over acklane's producer."""

        _rejects: Callable[[], None] | None = None

        def __init__(self, **kwargs: Any) -> None:
            super().__init__()
            self.kwargs = kwargs

        def serialize(self) -> tuple[str, dict[str, Any]]:
            return f"{__name__}.HybridWatcher", dict(self.kwargs)

        async def run(self) -> AsyncIterator[Any]:
            raise NotImplementedError
            yield  # pragma: no cover

        def shared_stream_key(self) -> Hashable:
            return KafkaConnector.stream_key(self.kwargs)

        @classmethod
        def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> Any:
            return KafkaConnector.create_producer(kwargs)

        async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]) -> Any:
            async for message in shared_stream:
                text = message.body.decode()
                if self._rejects is not None and text.startswith("bad"):
                    self._rejects()
                    continue
                yield base.TriggerEvent(text)

    class AirflowMemTrigger(base.BaseEventTrigger):
        """Ack mode over MemProducer, on Airflow's base class."""

        _rejects: Callable[[], None] | None = None

        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name

        def serialize(self) -> tuple[str, dict[str, Any]]:
            return f"{__name__}.AirflowMemTrigger", {"name": self.name}

        async def run(self) -> AsyncIterator[Any]:
            raise NotImplementedError
            yield  # pragma: no cover

        def shared_stream_key(self) -> Hashable:
            return ("mem", self.name)

        @classmethod
        def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> Any:
            return MemProducer.named(kwargs["name"])

        filter_shared_stream = _reject_odd_filter(base.TriggerEvent)

    return {
        "ProviderWatcher": ProviderWatcher,
        "HybridWatcher": HybridWatcher,
        "AirflowMemTrigger": AirflowMemTrigger,
    }


# -- driving a manager the way Airflow's triggerer does -------------------------------------


@dataclass
class Sub:
    """One subscription's record: what it fired, when, and how it ended."""

    trigger_id: int
    withhold: frozenset[str] = frozenset()  # events whose persistence is never confirmed
    events: list[Any] = field(default_factory=list)
    unbound: int = 0
    got_at: dict[Any, float] = field(default_factory=dict)
    error: BaseException | None = None
    error_at: float | None = None


class Persister:
    """The metadata database: confirms bound events in batches, like the triggerer."""

    def __init__(self, manager: Any) -> None:
        self.manager = manager
        self.pending: list[int] = []

    async def run(self) -> None:
        while True:
            await asyncio.sleep(0.05)
            seqs, self.pending = self.pending, []
            if seqs:
                self.manager.confirm_persisted(seqs)


async def watch(manager: Any, sub: Sub, trigger: Any, key: Hashable, persist: Persister) -> None:
    """subscribe -> filter -> bind -> persist; leave with ``unsubscribe``."""
    try:
        raw = manager.subscribe(trigger_id=sub.trigger_id, trigger=trigger, key=key)
        async for event in trigger.filter_shared_stream(raw):
            # bind right after the yield, no await in between (the triggerer's rule)
            seq = manager.bind_pending_event(trigger_id=sub.trigger_id, key=key)
            sub.events.append(event.payload)
            sub.got_at.setdefault(event.payload, time.monotonic())
            if seq is None:
                sub.unbound += 1
            elif event.payload not in sub.withhold:
                persist.pending.append(seq)
    except Exception as exc:
        sub.error, sub.error_at = exc, time.monotonic()
    finally:
        with contextlib.suppress(Exception):
            await manager.unsubscribe(sub.trigger_id, key)


@contextlib.asynccontextmanager
async def running(
    manager: Any, subs: list[tuple[Sub, Any, Hashable]]
) -> AsyncIterator[list[asyncio.Task[None]]]:
    """Watch each (sub, trigger, key) until the block ends; then leave and stop."""
    persist = Persister(manager)
    store = asyncio.create_task(persist.run())
    tasks = [asyncio.create_task(watch(manager, *s, persist)) for s in subs]
    try:
        yield tasks
    finally:
        for t in tasks:
            t.cancel()  # Airflow's idiom: a subscriber leaves by being cancelled
        await asyncio.gather(*tasks, return_exceptions=True)
        await manager.stop_all()
        store.cancel()
        await asyncio.gather(store, return_exceptions=True)


async def until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.02)


# -- the Kafka scenarios ----------------------------------------------------------------------

VALUES = {
    "clean": [f"ok-{i}" for i in range(8)],
    "reject": [f"bad-{i}" if i in (2, 5) else f"ok-{i}" for i in range(8)],
    "timeout": [f"ok-{i}" for i in range(8)],
}
TIMEOUT = 1.5  # the timeout scenario's ack_timeout (seconds)
WITHHELD = "ok-3"  # watcher B never confirms it in the timeout scenario


@dataclass
class Run:
    """What one manager did with one producer, as the broker and the watchers show it."""

    committed: dict[int, int | None]
    dlq: list[str]
    events: dict[str, list[str]]
    errors: dict[str, BaseException | None]
    held_commit: int | None  # highest commit while B held the withheld record
    timeout_after: float | None  # from B's withheld record to its AckTimeout
    warnings: list[str]

    def observable(self) -> dict[str, Any]:
        """What must be the same under both managers."""
        return {
            "committed": self.committed,
            "dlq": self.dlq,
            "events": {k: sorted(set(v)) for k, v in self.events.items()},
            "errors": {k: type(v).__name__ if v else None for k, v in self.errors.items()},
            "held_commit": self.held_commit,
        }


def _triggers(af: SimpleNamespace, family: str, kit: KafkaKit, topic: str, dlq: str) -> Any:
    """Triggers A and B of one family on one key; their consumer group; cleanup."""
    group = KafkaKit.unique("group")
    if family != "provider":
        kwargs = {
            "bootstrap_servers": kit.bootstrap_servers,
            "topics": [topic],
            "group_id": group,
            "poll_timeout": 0.05,
            "client": dict(KafkaKit.FAST_GROUP),
            "dead_letter": dlq,
        }
        cls = AcklaneWatcher if family == "acklane" else af.HybridWatcher
        return cls(**kwargs), cls(**kwargs), group, lambda: None
    conn_id = KafkaKit.unique("conn").replace("-", "_")
    env = f"AIRFLOW_CONN_{conn_id.upper()}"
    extra = {
        "bootstrap.servers": kit.bootstrap_servers,
        "group.id": group,
        "enable.auto.commit": "false",
        "auto.offset.reset": "earliest",
        **KafkaKit.FAST_GROUP,
    }
    os.environ[env] = json.dumps({"conn_type": "kafka", "extra": extra})
    kwargs = {"topics": [topic], "kafka_config_id": conn_id, "poll_timeout": 0.05}
    a = af.ProviderWatcher(**kwargs, dlq_topic=dlq)
    b = af.ProviderWatcher(**kwargs, dlq_topic=dlq)
    return a, b, group, lambda: os.environ.pop(env, None)


async def run_scenario(
    af: SimpleNamespace, kit: KafkaKit, manager_kind: str, family: str, scenario: str, rej: str
) -> Run:
    """Watchers A (rejects ``bad-*``) and B (withholds one in "timeout") on one topic."""
    values = VALUES[scenario]
    topic, dlq = kit.new_topic("both"), kit.new_topic("dlq")
    await asyncio.to_thread(kit.produce, topic, values)
    a, b, group, cleanup = _triggers(af, family, kit, topic, dlq)
    a._rejects = reject_with(rej)
    key = a.shared_stream_key()
    assert key == b.shared_stream_key()
    timing_out = scenario == "timeout"
    manager = make_manager(manager_kind, af, ack_timeout=TIMEOUT if timing_out else 30.0)
    sub_a, sub_b = Sub(1), Sub(2, withhold=frozenset({WITHHELD}) if timing_out else frozenset())
    held: list[int | None] = []
    committed: dict[int, int | None] = {}
    try:
        async with running(manager, [(sub_a, a, key), (sub_b, b, key)]) as tasks:
            deadline = time.monotonic() + 40
            while time.monotonic() < deadline and not all(t.done() for t in tasks):
                await asyncio.sleep(0.1)
                committed = await asyncio.to_thread(kit.committed, group, topic)
                if WITHHELD in sub_b.got_at and sub_b.error is None:
                    held.append(committed.get(0))  # B holds the record: nothing past it
                if committed.get(0) == len(values) and (sub_b.error or not timing_out):
                    break
            if manager_kind == "acklane":
                manager.producer_counters()  # what the runner's metrics scrape calls
    finally:
        cleanup()
    committed = await asyncio.to_thread(kit.committed, group, topic)
    # every copy was flushed before its commit: all there is, after a short read
    records = await asyncio.to_thread(kit.read, dlq, len(values), timeout=1.0)
    b_got = sub_b.got_at.get(WITHHELD)
    return Run(
        committed=committed,
        dlq=sorted(m.value().decode() for m in records),
        events={"A": sub_a.events, "B": sub_b.events},
        errors={"A": sub_a.error, "B": sub_b.error},
        held_commit=max((h for h in held if h is not None), default=None) if timing_out else None,
        timeout_after=None if sub_b.error_at is None or b_got is None else sub_b.error_at - b_got,
        warnings=[],
    )


_RUNS: dict[tuple[str, str, str], tuple[Run, Run]] = {}


@pytest.fixture
def runs(
    af: SimpleNamespace, kafka_kit: KafkaKit
) -> Callable[[str, str, str], Awaitable[dict[str, Run]]]:
    """Both managers on one (family, scenario, reject function), side by side, run once.

    Several tests read one pair of runs (each asserts one behaviour of it), so a pair
    is run on first use and kept for the session.
    """

    async def get(family: str, scenario: str, rej: str) -> dict[str, Run]:
        key = (family, scenario, rej)
        if key not in _RUNS:
            records: list[logging.LogRecord] = []
            handler = _Collect(records)
            acklane_log = logging.getLogger("acklane")
            old_level = acklane_log.level
            acklane_log.addHandler(handler)
            acklane_log.setLevel(logging.INFO)
            try:
                ours, theirs = await asyncio.gather(
                    run_scenario(af, kafka_kit, "acklane", family, scenario, rej),
                    run_scenario(af, kafka_kit, "airflow", family, scenario, rej),
                )
            finally:
                acklane_log.removeHandler(handler)
                acklane_log.setLevel(old_level)
            # only acklane's manager logs to acklane.core.manager
            ours.warnings = [
                r.getMessage()
                for r in records
                if r.levelno >= logging.WARNING and r.name == "acklane.core.manager"
            ]
            _RUNS[key] = (ours, theirs)
        ours, theirs = _RUNS[key]
        return {"acklane": ours, "airflow": theirs}

    return get


class _Collect(logging.Handler):
    def __init__(self, records: list[logging.LogRecord]) -> None:
        super().__init__(logging.INFO)
        self.records = records

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _default_reject(family: str) -> str:
    """The reject function a trigger of the family would call: its own framework's."""
    return "acklane" if family == "acklane" else "airflow"


OKS = [f"ok-{i}" for i in range(8)]

# -- the Kafka tests: each manager, each producer ----------------------------------------------


@pytest.mark.parametrize("manager_kind", MANAGERS)
@pytest.mark.parametrize("family", FAMILIES)
async def test_clean_records_fire_every_watcher_and_are_committed(
    runs: Any, family: str, manager_kind: str
) -> None:
    got = (await runs(family, "clean", _default_reject(family)))[manager_kind]
    assert got.errors == {"A": None, "B": None}
    assert sorted(set(got.events["A"])) == sorted(set(got.events["B"])) == OKS
    assert got.committed == {0: 8}
    assert got.dlq == []


@pytest.mark.parametrize("rej", REJECTS)
@pytest.mark.parametrize("manager_kind", MANAGERS)
@pytest.mark.parametrize("family", FAMILIES)
async def test_rejected_records_are_dead_lettered_and_committed_past(
    runs: Any, family: str, manager_kind: str, rej: str
) -> None:
    got = (await runs(family, "reject", rej))[manager_kind]
    assert got.errors == {"A": None, "B": None}
    assert got.dlq == ["bad-2", "bad-5"]
    assert got.committed == {0: 8}
    assert sorted(set(got.events["A"])) == [v for v in OKS if v not in ("ok-2", "ok-5")]
    assert sorted(set(got.events["B"])) == sorted(VALUES["reject"])  # B rejects nothing


@pytest.mark.parametrize("manager_kind", MANAGERS)
@pytest.mark.parametrize("family", FAMILIES)
async def test_a_watcher_sitting_on_a_record_times_out_and_holds_the_commit_until_then(
    af: SimpleNamespace, runs: Any, family: str, manager_kind: str
) -> None:
    got = (await runs(family, "timeout", _default_reject(family)))[manager_kind]
    assert got.errors["A"] is None
    error = got.errors["B"]
    # one AckTimeout for both: acklane's is also Airflow's while Airflow is loaded
    assert isinstance(error, af.ss.AckTimeout), repr(error)
    if manager_kind == "acklane":
        assert isinstance(error, acklane_trigger.AckTimeout)
    # both sweep ten times per timeout: failed within about 1.1 x ack_timeout
    assert got.timeout_after is not None
    # (measured from B taking the record, a moment after its broadcast)
    assert TIMEOUT - 0.1 <= got.timeout_after <= TIMEOUT * 1.1 + 0.6
    assert got.held_commit == 3  # nothing past the withheld record while B held it
    assert got.committed == {0: 8}  # redelivered to A, then committed
    assert got.dlq == []


@pytest.mark.parametrize(
    ("scenario", "rej"),
    [("clean", None), ("reject", "acklane"), ("reject", "airflow"), ("timeout", None)],
)
@pytest.mark.parametrize("family", FAMILIES)
async def test_both_managers_leave_the_same_broker_state(
    runs: Any, family: str, scenario: str, rej: str | None
) -> None:
    pair = await runs(family, scenario, rej or _default_reject(family))
    assert pair["acklane"].observable() == pair["airflow"].observable()


async def test_the_providers_producer_runs_under_acklanes_manager_without_a_warning(
    runs: Any,
) -> None:
    # it has no message_id(), counters() or open_batches(): acklane's additions, optional
    for scenario, rej in (("clean", "airflow"), ("reject", "airflow")):
        got = (await runs("provider", scenario, rej))["acklane"]
        assert got.warnings == [], got.warnings


# -- broker-free: the shapes -------------------------------------------------------------------


class MemProducer(acklane_producer.SharedStreamProducer):
    """Items 0..5, then waits forever; records how each item was advanced."""

    by_name: dict[str, MemProducer] = {}

    def __init__(self) -> None:
        self.advanced: list[tuple[Any, Any]] = []

    @classmethod
    def named(cls, name: str) -> MemProducer:
        producer = cls.by_name[name] = cls()
        return producer

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        for i in range(6):
            yield i, i
        await asyncio.Event().wait()

    async def advance(self, batch: Any) -> None:
        self.advanced.extend((item.broker_payload, item.outcome) for item in batch)


def _reject_odd_filter(event_cls: type) -> Any:
    """A filter that rejects odd items with the trigger's ``_rejects`` and fires for even."""

    async def filter_shared_stream(self: Any, stream: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for item in stream:
            if item % 2:
                self._rejects()
                continue
            yield event_cls(item)

    return filter_shared_stream


class AcklaneMemTrigger(acklane_trigger.BaseEventTrigger):
    """Ack mode over MemProducer, on acklane's base class."""

    _rejects: Callable[[], None] | None = None

    def __init__(self, name: str) -> None:
        super().__init__(name=name)

    def shared_stream_key(self) -> Hashable:
        return ("mem", self.name)

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> MemProducer:
        return MemProducer.named(kwargs["name"])

    filter_shared_stream = _reject_odd_filter(acklane_trigger.TriggerEvent)


class AcklaneFastTrigger(acklane_trigger.BaseEventTrigger):
    """acklane's fast path: ``open_shared_stream`` only, nothing acknowledged."""

    def __init__(self, name: str) -> None:
        super().__init__(name=name)

    def shared_stream_key(self) -> Hashable:
        return ("fast", self.name)

    @classmethod
    async def open_shared_stream(cls, kwargs: dict[str, Any]) -> AsyncIterator[Any]:  # type: ignore[override]
        for i in range(3):
            yield i
        await asyncio.Event().wait()

    async def filter_shared_stream(self, stream: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for item in stream:
            yield acklane_trigger.TriggerEvent(item)


def _mem_trigger(af: SimpleNamespace, base: str, name: str, rej: str) -> Any:
    trigger = AcklaneMemTrigger(name) if base == "acklane" else af.AirflowMemTrigger(name)
    trigger._rejects = reject_with(rej)
    return trigger


async def _advanced(af: SimpleNamespace, manager_kind: str, trigger: Any) -> list[tuple[Any, Any]]:
    """Run one trigger until its six items are advanced; how they were."""
    manager = make_manager(manager_kind, af)
    sub = Sub(1)
    key = trigger.shared_stream_key()
    async with running(manager, [(sub, trigger, key)]):
        await until(
            lambda: (
                sub.error is not None
                or len(getattr(MemProducer.by_name.get(trigger.name), "advanced", ())) >= 6
            )
        )
    assert sub.error is None, repr(sub.error)
    return MemProducer.by_name.pop(trigger.name).advanced


@pytest.mark.parametrize("base", ["acklane", "airflow"])
@pytest.mark.parametrize("rej", REJECTS)
@pytest.mark.parametrize("manager_kind", MANAGERS)
async def test_a_reject_resolves_the_event_under_every_manager_function_and_base_class(
    af: SimpleNamespace, manager_kind: str, rej: str, base: str
) -> None:
    trigger = _mem_trigger(af, base, f"reject-{manager_kind}-{rej}-{base}", rej)
    advanced = await _advanced(af, manager_kind, trigger)
    counts = [(i, (o.acked, o.failed, o.rejected)) for i, o in advanced]
    assert counts == [(i, (0, 0, 1) if i % 2 else (1, 0, 0)) for i in range(6)]


@pytest.mark.parametrize("rej", REJECTS)
@pytest.mark.parametrize("manager_kind", MANAGERS)
async def test_a_reject_reason_reaches_the_producer_only_from_acklanes_function_and_manager(
    af: SimpleNamespace, manager_kind: str, rej: str
) -> None:
    trigger = _mem_trigger(af, "acklane", f"reason-{manager_kind}-{rej}", rej)
    advanced = await _advanced(af, manager_kind, trigger)
    reasons = {acklane_producer.reject_reasons_of(o) for i, o in advanced if i % 2}
    carried = manager_kind == "acklane" and rej == "acklane"
    assert reasons == ({("bad record",)} if carried else {()})
    # whichever outcome, a producer names the copy's reason from it
    texts = {outcome_reason(o) for i, o in advanced if i % 2}
    assert texts == ({"bad record"} if carried else {"rejected by 1 watcher"})


@pytest.mark.parametrize("manager_kind", MANAGERS)
async def test_subscribe_is_a_plain_call_returning_the_raw_stream_under_both_managers(
    af: SimpleNamespace, manager_kind: str
) -> None:
    manager = make_manager(manager_kind, af)
    trigger = AcklaneMemTrigger(f"shape-{manager_kind}")
    key = trigger.shared_stream_key()
    with pytest.raises(ValueError):
        manager.subscribe(trigger_id=1, trigger=trigger, key=None)
    raw = manager.subscribe(trigger_id=1, trigger=trigger, key=key)
    try:
        with pytest.raises(RuntimeError):
            manager.subscribe(trigger_id=1, trigger=trigger, key=key)
        async with asyncio.timeout(5):
            assert await anext(raw) == 0  # the raw item: the caller runs the filter
    finally:
        await manager.unsubscribe(1, key)
        await manager.stop_all()
        MemProducer.by_name.pop(trigger.name, None)


@pytest.mark.parametrize("manager_kind", MANAGERS)
def test_the_constructor_is_keyword_only_and_takes_a_bound_logger(
    af: SimpleNamespace, manager_kind: str
) -> None:
    import structlog

    cls = (
        acklane_manager.SharedStreamManager
        if manager_kind == "acklane"
        else af.ss.SharedStreamManager
    )
    cls(
        log=structlog.get_logger("t"),
        max_subscriber_queue=4,
        ack_timeout=1.0,
        cohort_grace_period=0,
    )
    with pytest.raises(TypeError):
        cls(4, 1.0)


@pytest.mark.parametrize("manager_kind", MANAGERS)
async def test_an_acklane_fast_path_trigger_is_on_the_fast_path_under_both_managers(
    af: SimpleNamespace, manager_kind: str
) -> None:
    manager = make_manager(manager_kind, af)
    sub = Sub(1)
    trigger = AcklaneFastTrigger(f"fast-{manager_kind}")
    async with running(manager, [(sub, trigger, trigger.shared_stream_key())]):
        await until(lambda: len(sub.events) >= 3 or sub.error is not None)
    assert sub.error is None, repr(sub.error)
    assert sub.events == [0, 1, 2]
    assert sub.unbound == 3  # nothing to bind: no ack channel


def test_both_managers_put_each_trigger_class_in_the_same_mode(af: SimpleNamespace) -> None:
    expected = {
        AcklaneFastTrigger: False,
        AcklaneMemTrigger: True,
        AcklaneWatcher: True,
        af.kafka.KafkaSharedStreamTrigger: True,
        af.ProviderWatcher: True,
        af.HybridWatcher: True,
        af.AirflowMemTrigger: True,
        af.base.BaseEventTrigger: False,
        acklane_trigger.BaseEventTrigger: False,
    }
    for cls, ack in expected.items():
        theirs = af.ss._SharedStreamGroup._is_ack_required(SimpleNamespace(trigger_class=cls))
        assert (acklane_trigger.uses_ack_channel(cls), theirs) == (ack, ack), cls


def test_an_airflow_outcome_gives_no_reasons_and_the_default_dead_letter_reason(
    af: SimpleNamespace,
) -> None:
    outcome = af.ss.AdvanceOutcome(acked=1, failed=0, rejected=2)
    assert not hasattr(outcome, "reject_reasons")
    assert acklane_producer.reject_reasons_of(outcome) == ()
    assert outcome_reason(outcome) == "rejected by 2 watchers"


def test_acklanes_ack_timeout_is_airflows_too_and_pickles_as_acklanes(
    af: SimpleNamespace,
) -> None:
    error = acklane_trigger.ack_timeout_error("trigger 1 did not resolve")
    assert isinstance(error, acklane_trigger.AckTimeout)
    assert isinstance(error, af.ss.AckTimeout)
    assert type(error).__name__ == "AckTimeout"
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is acklane_trigger.AckTimeout and again.args == error.args


# -- Airflow to the letter: what Airflow's callers would notice, under both managers ---------


def _raised(call: Callable[[], Any]) -> tuple[type[BaseException], str]:
    """The type and text of what ``call()`` raised."""
    try:
        call()
    except Exception as exc:
        return type(exc), str(exc)
    raise AssertionError("it did not raise")


def test_a_none_key_is_refused_with_airflows_value_error_under_both_managers(
    af: SimpleNamespace,
) -> None:
    trigger = AcklaneMemTrigger("none-key")
    got = {
        kind: _raised(
            lambda kind=kind: make_manager(kind, af).subscribe(
                trigger_id=1, trigger=trigger, key=None
            )
        )
        for kind in MANAGERS
    }
    assert got["acklane"] == got["airflow"] == (ValueError, "shared stream key must not be None")


async def test_a_second_subscription_is_refused_with_airflows_runtime_error_under_both_managers(
    af: SimpleNamespace,
) -> None:
    got = {}
    for kind in MANAGERS:
        manager = make_manager(kind, af)
        trigger = AcklaneMemTrigger(f"twice-{kind}")
        key = trigger.shared_stream_key()
        manager.subscribe(trigger_id=1, trigger=trigger, key=key)
        try:
            error, text = _raised(
                lambda m=manager, t=trigger, k=key: m.subscribe(trigger_id=1, trigger=t, key=k)
            )
            got[kind] = (error, text.replace(kind, "KIND"))
        finally:
            await manager.unsubscribe(1, key)
            await manager.stop_all()
            MemProducer.by_name.pop(trigger.name, None)
    assert got["acklane"] == got["airflow"]
    assert got["acklane"] == (
        RuntimeError,
        "Trigger 1 already subscribed to shared stream ('mem', 'twice-KIND')",
    )


class NoFilter(acklane_trigger.BaseEventTrigger):
    """Ack mode, a key and a producer, but no filter of its own."""

    def __init__(self, name: str) -> None:
        super().__init__(name=name)

    def shared_stream_key(self) -> Hashable:
        return ("no-filter", self.name)

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> MemProducer:
        return MemProducer.named(kwargs["name"])


def _airflow_no_filter(af: SimpleNamespace) -> type:
    """NoFilter on Airflow's base class, under the same name."""

    class NoFilter(af.base.BaseEventTrigger):
        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name

        def serialize(self) -> tuple[str, dict[str, Any]]:
            return f"{__name__}.NoFilter", {"name": self.name}

        async def run(self) -> AsyncIterator[Any]:
            raise NotImplementedError
            yield  # pragma: no cover

        def shared_stream_key(self) -> Hashable:
            return ("no-filter", self.name)

        @classmethod
        def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> MemProducer:
            return MemProducer.named(kwargs["name"])

    return NoFilter


@pytest.mark.parametrize("manager_kind", MANAGERS)
async def test_a_trigger_without_a_filter_fails_as_on_airflows_base_under_both_managers(
    af: SimpleNamespace, manager_kind: str
) -> None:
    got = []
    for cls in (NoFilter, _airflow_no_filter(af)):
        trigger = cls(f"no-filter-{manager_kind}-{cls.__module__}")
        manager = make_manager(manager_kind, af)
        key = trigger.shared_stream_key()
        raw = manager.subscribe(trigger_id=1, trigger=trigger, key=key)
        try:
            with pytest.raises(NotImplementedError) as raised:
                await anext(trigger.filter_shared_stream(raw))
            got.append(str(raised.value))
        finally:
            await manager.unsubscribe(1, key)
            await manager.stop_all()
            MemProducer.by_name.pop(trigger.name, None)
    ours, theirs = got
    assert (
        ours
        == theirs
        == ("NoFilter declares a shared_stream_key but does not implement filter_shared_stream")
    )


class NoStream(acklane_trigger.BaseEventTrigger):
    """A key and a filter, but neither a stream (fast path) nor a producer (ack mode)."""

    def __init__(self, name: str) -> None:
        super().__init__(name=name)

    def shared_stream_key(self) -> Hashable:
        return ("no-stream", self.name)

    async def filter_shared_stream(self, stream: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for item in stream:
            yield acklane_trigger.TriggerEvent(item)


def _airflow_no_stream(af: SimpleNamespace) -> type:
    """NoStream on Airflow's base class, under the same name."""

    class NoStream(af.base.BaseEventTrigger):
        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name

        def serialize(self) -> tuple[str, dict[str, Any]]:
            return f"{__name__}.NoStream", {"name": self.name}

        async def run(self) -> AsyncIterator[Any]:
            raise NotImplementedError
            yield  # pragma: no cover

        def shared_stream_key(self) -> Hashable:
            return ("no-stream", self.name)

        async def filter_shared_stream(self, stream: AsyncIterator[Any]) -> AsyncIterator[Any]:
            async for item in stream:
                yield af.base.TriggerEvent(item)

    return NoStream


@pytest.mark.parametrize("manager_kind", MANAGERS)
async def test_the_base_classes_create_shared_stream_producer_leaves_a_trigger_on_the_fast_path(
    af: SimpleNamespace, manager_kind: str
) -> None:
    # Both bases define it (raising); neither puts NoStream in ack mode under either
    # manager: its group fails for want of open_shared_stream, in Airflow's words.
    got = []
    for cls in (NoStream, _airflow_no_stream(af)):
        manager = make_manager(manager_kind, af)
        sub = Sub(1)
        trigger = cls(f"no-stream-{manager_kind}")
        async with running(manager, [(sub, trigger, trigger.shared_stream_key())]):
            await until(lambda sub=sub: sub.error is not None)
        got.append((type(sub.error), str(sub.error)))
    ours, theirs = got
    assert (
        ours
        == theirs
        == (
            NotImplementedError,
            "NoStream declares a shared_stream_key but does not implement open_shared_stream",
        )
    )


def test_the_base_classes_create_shared_stream_producer_raises_airflows_error(
    af: SimpleNamespace,
) -> None:
    theirs = _airflow_no_stream(af)
    for call in (
        lambda: NoStream.create_shared_stream_producer({}),
        lambda: NoStream("x").create_shared_stream_producer({}),
    ):
        assert _raised(call) == _raised(lambda: theirs.create_shared_stream_producer({}))
        assert _raised(call) == (
            NotImplementedError,
            "NoStream does not implement create_shared_stream_producer",
        )
    assert callable(acklane_trigger.BaseEventTrigger.create_shared_stream_producer)


class LoneProducer(acklane_producer.SharedStreamProducer):
    """One raw event, then nothing; records when (in loop turns) it was advanced."""

    def __init__(self, turns: list[int]) -> None:
        self.turns = turns
        self.advanced_at: int | None = None

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        yield "bad-0", "bad-0"
        await asyncio.Event().wait()

    async def advance(self, batch: Any) -> None:
        if self.advanced_at is None:
            self.advanced_at = self.turns[0]


class LoneTrigger(acklane_trigger.BaseEventTrigger):
    """Ack mode over LoneProducer; rejects ``bad-*`` with its ``_rejects``."""

    producers: dict[str, LoneProducer] = {}
    _rejects: Callable[[], None] = staticmethod(lambda: None)

    def __init__(self, name: str) -> None:
        super().__init__(name=name)

    def shared_stream_key(self) -> Hashable:
        return ("lone", self.name)

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> LoneProducer:
        producer = cls.producers[kwargs["name"]]
        return producer

    async def filter_shared_stream(self, stream: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for item in stream:
            if item.startswith("bad"):
                self._rejects()
                continue
            yield acklane_trigger.TriggerEvent(item)  # pragma: no cover


async def _turns_to_advance(af: SimpleNamespace, manager_kind: str, rej: str) -> int:
    """Event-loop turns from subscribing to the lone rejected event's advance.

    As a caller drives Airflow's manager: subscribe, run the filter in a task, then
    let the loop turn (one ``sleep(0)`` is one turn of this task) until it is advanced.
    """
    turns = [0]
    name = f"lone-{manager_kind}-{rej}"
    producer = LoneTrigger.producers[name] = LoneProducer(turns)
    trigger = LoneTrigger(name)
    trigger._rejects = reject_with(rej)
    manager = make_manager(manager_kind, af, grace=0)  # a grace period is a sleep: no turns
    key = trigger.shared_stream_key()
    raw = manager.subscribe(trigger_id=1, trigger=trigger, key=key)
    filtering = asyncio.create_task(anext(trigger.filter_shared_stream(raw), None))
    try:
        while producer.advanced_at is None and turns[0] < 50:
            await asyncio.sleep(0)
            turns[0] += 1
    finally:
        filtering.cancel()
        await asyncio.gather(filtering, return_exceptions=True)
        await manager.unsubscribe(1, key)
        await manager.stop_all()
        del LoneTrigger.producers[name]
    assert producer.advanced_at is not None, "never advanced"
    return producer.advanced_at


@pytest.mark.parametrize("rej", REJECTS)
async def test_a_lone_rejected_event_is_advanced_as_promptly_under_both_managers(
    af: SimpleNamespace, rej: str
) -> None:
    ours = await _turns_to_advance(af, "acklane", rej)
    theirs = await _turns_to_advance(af, "airflow", rej)
    assert ours == theirs, f"acklane's manager: {ours} turns, Airflow's: {theirs}"
