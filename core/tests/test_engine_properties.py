"""Random subscribe / pull / yield / confirm / reject / timeout / unsubscribe sequences.

A small model of the spec runs beside the engine; after every step the engine must
agree with it, and at the end:

- each broadcast event is advanced exactly once;
- batches are contiguous and in fan-out order per lane;
- outcome counts equal the model's and sum to the snapshot size;
- never two ``advance`` calls are in flight;
- nothing is advanced before every snapshot member resolved it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from acklane.core import (
    AdvanceItem,
    BaseEventTrigger,
    SharedStreamManager,
    SharedStreamProducer,
    TriggerEvent,
    reject_shared_stream_event,
)

MAXQ = 3
LANES = ("a", "b", None)


@dataclass
class MEvent:
    eid: int
    lane: Hashable
    snapshot: set[int]
    resolved: dict[int, str] = field(default_factory=dict)  # watcher -> acked/failed/rejected

    def unresolved(self) -> set[int]:
        return self.snapshot - set(self.resolved)


@dataclass
class MWatcher:
    wid: int
    state: str = "active"  # active | failed | gone
    queue: deque[int] = field(default_factory=deque)
    current: int | None = None
    cur_rejected: bool = False
    unconfirmed: dict[int, set[int]] = field(default_factory=dict)  # eid -> seqs
    moved: set[int] = field(default_factory=set)  # moved past, waiting for confirmations


class Model:
    def __init__(self) -> None:
        self.events: dict[int, MEvent] = {}
        self.watchers: dict[int, MWatcher] = {}
        self.frozen = False

    def resolve(self, eid: int, wid: int, kind: str) -> None:
        ev = self.events[eid]
        assert wid in ev.snapshot and wid not in ev.resolved
        ev.resolved[wid] = kind

    def active(self) -> list[MWatcher]:
        return [w for w in self.watchers.values() if w.state == "active"]

    def fail(self, w: MWatcher) -> None:
        for eid in w.queue:
            self.resolve(eid, w.wid, "failed")
        w.queue.clear()
        if w.current is not None and not w.cur_rejected:
            self.resolve(w.current, w.wid, "failed")
        w.current = None
        for eid in sorted(w.moved):
            self.resolve(eid, w.wid, "failed")
        w.moved.clear()
        w.unconfirmed.clear()
        w.state = "failed"

    def move_past(self, w: MWatcher) -> None:
        eid = w.current
        w.current = None
        if eid is None:
            return
        if w.cur_rejected:
            w.cur_rejected = False
            w.unconfirmed.pop(eid, None)
            return
        if w.unconfirmed.get(eid):
            w.moved.add(eid)
        else:
            w.unconfirmed.pop(eid, None)
            self.resolve(eid, w.wid, "acked")

    def confirmed(self, w: MWatcher, seq: int) -> None:
        for eid, seqs in list(w.unconfirmed.items()):
            if seq in seqs:
                seqs.discard(seq)
                if not seqs and eid in w.moved:
                    w.moved.discard(eid)
                    del w.unconfirmed[eid]
                    self.resolve(eid, w.wid, "acked")
                return

    def outstanding(self, w: MWatcher) -> bool:
        return bool(w.queue or w.moved or (w.current is not None and not w.cur_rejected))


class PropProducer(SharedStreamProducer):
    def __init__(self, model: Model) -> None:
        self.model = model
        self.queue: asyncio.Queue[tuple[int, Hashable]] = asyncio.Queue()
        self.batches: list[list[AdvanceItem]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.premature: list[int] = []

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        while True:
            eid, lane = await self.queue.get()
            yield eid, (eid, lane)

    def get_advance_lane(self, broker_payload: Any) -> Hashable:
        return broker_payload[1]

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        for item in batch:
            if self.model.events[item.broker_payload[0]].unresolved():
                self.premature.append(item.broker_payload[0])
        await asyncio.sleep(0)  # let others run while "the broker" works
        self.batches.append(list(batch))
        self.in_flight -= 1


class PropTrigger(BaseEventTrigger):
    producer: PropProducer

    def __init__(self) -> None:
        self.commands: asyncio.Queue[Any] = asyncio.Queue()
        self.current: Any = None

    def shared_stream_key(self) -> Hashable:
        return ("prop",)

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
        return cls.producer

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return "PropTrigger", {}

    async def filter_shared_stream(self, stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        it = stream.__aiter__()
        while True:
            cmd = await self.commands.get()
            if cmd == "next":
                self.current = await it.__anext__()
            elif cmd == "reject":
                reject_shared_stream_event("prop")
            else:
                for _ in range(cmd):
                    yield TriggerEvent(self.current)


ops = st.lists(
    st.one_of(
        st.tuples(st.just("sub"), st.integers(0, 0)),
        st.tuples(st.just("push"), st.integers(0, len(LANES) - 1)),
        st.tuples(st.just("next"), st.integers(0, 5)),
        st.tuples(st.just("yield"), st.integers(0, 5), st.integers(0, 3)),
        st.tuples(st.just("reject"), st.integers(0, 5)),
        st.tuples(st.just("confirm"), st.integers(0, 5), st.integers(1, 3)),
        st.tuples(st.just("timeout"), st.integers(0, 5)),
        st.tuples(st.just("unsub"), st.integers(0, 5)),
    ),
    min_size=1,
    max_size=40,
)


async def _settle() -> None:
    for _ in range(30):
        await asyncio.sleep(0)


async def scenario(steps: list[tuple[Any, ...]]) -> None:
    model = Model()
    producer = PropProducer(model)
    PropTrigger.producer = producer
    manager = SharedStreamManager(max_subscriber_queue=MAXQ, ack_timeout=3600.0)
    key: Hashable = ("prop",)
    triggers: dict[int, PropTrigger] = {}
    seqs: dict[int, list[int]] = {}  # watcher -> unconfirmed seqs (engine side)
    tasks: list[asyncio.Task[None]] = []
    next_eid = 0
    errors: list[BaseException] = []

    async def drive(wid: int, trigger: PropTrigger) -> None:
        try:
            async for _ in manager.events(trigger_id=f"w{wid}", trigger=trigger, key=key):
                seq = manager.bind_pending_event(trigger_id=f"w{wid}", key=key)
                w = model.watchers[wid]
                if seq is not None:
                    assert w.current is not None and not w.cur_rejected
                    seqs[wid].append(seq)
                    w.unconfirmed.setdefault(w.current, set()).add(seq)
                else:
                    assert w.cur_rejected
        except Exception as exc:
            if model.watchers[wid].state == "active":
                errors.append(exc)

    def watcher(i: int) -> MWatcher | None:
        if not model.watchers:
            return None
        return model.watchers[sorted(model.watchers)[i % len(model.watchers)]]

    async def subscribe() -> None:
        wid = len(model.watchers)
        model.watchers[wid] = MWatcher(wid)
        triggers[wid] = PropTrigger()
        seqs[wid] = []
        tasks.append(asyncio.create_task(drive(wid, triggers[wid])))
        await _settle()

    await subscribe()
    for step in steps:
        op = step[0]
        w = watcher(step[1]) if op not in ("sub", "push") else None
        if op == "sub" and len(model.watchers) < 5:
            await subscribe()
        elif op == "push":
            active = model.active()
            overflowing = [a for a in active if len(a.queue) >= MAXQ]
            if len(overflowing) == len(active):
                continue  # would empty the group (it then closes): covered elsewhere
            eid = next_eid
            next_eid += 1
            lane = LANES[step[1]]
            model.events[eid] = MEvent(eid, lane, {a.wid for a in active})
            overflowed = []
            for a in active:
                a.queue.append(eid)
                if len(a.queue) > MAXQ:
                    model.fail(a)
                    overflowed.append(a.wid)
            producer.queue.put_nowait((eid, lane))
            await _settle()
            for wid in overflowed:  # once broadcast: asking for more raises; it leaves
                triggers[wid].commands.put_nowait("next")
        elif w is None or w.state != "active":
            continue
        elif op == "next" and w.queue:
            model.move_past(w)
            w.current = w.queue.popleft()
            triggers[w.wid].commands.put_nowait("next")
        elif op == "yield" and w.current is not None:
            triggers[w.wid].commands.put_nowait(step[2])
        elif op == "reject" and w.current is not None and not w.cur_rejected:
            model.resolve(w.current, w.wid, "rejected")
            w.cur_rejected = True
            w.unconfirmed.pop(w.current, None)
            triggers[w.wid].commands.put_nowait("reject")
        elif op == "confirm" and seqs[w.wid]:
            take = seqs[w.wid][:: step[2]]
            seqs[w.wid] = [s for s in seqs[w.wid] if s not in take]
            for s in take:
                model.confirmed(w, s)
            manager.confirm_persisted(take)
        elif op == "timeout" and model.outstanding(w) and len(model.active()) > 1:
            model.fail(w)
            group = manager._groups[key]
            sub = manager._subs[(f"w{w.wid}", key)]
            group._timeout(sub)
            triggers[w.wid].commands.put_nowait("next")
        elif op == "unsub" and len(model.active()) > 1:
            for eid in w.queue:
                model.resolve(eid, w.wid, "failed")
            w.queue.clear()
            model.move_past(w)
            w.state = "gone"
            await manager.unsubscribe(f"w{w.wid}", key)
        await _settle()
        assert not producer.premature, f"advanced before resolution: {producer.premature}"
        assert not errors, errors

    # wind down: every active watcher works through its queue, everything is confirmed
    for w in model.active():
        while w.queue or w.current is not None:
            if w.current is not None:
                model.move_past(w)
            if w.queue:
                w.current = w.queue.popleft()
            triggers[w.wid].commands.put_nowait("next")
            await _settle()
    for w in model.watchers.values():
        take, seqs[w.wid] = seqs[w.wid], []
        for s in take:
            model.confirmed(w, s)
        manager.confirm_persisted(take)
    await _settle()
    assert not producer.premature

    # every event is resolved now; all of them must have been advanced, exactly once
    for ev in model.events.values():
        assert not ev.unresolved(), ev
    advanced = [item.broker_payload[0] for b in producer.batches for item in b]
    assert sorted(advanced) == sorted(model.events), (advanced, sorted(model.events))
    assert producer.max_in_flight <= 1
    for batch in producer.batches:
        lanes = {item.broker_payload[1] for item in batch}
        assert len(lanes) == 1, "a batch mixes lanes"
    for lane in LANES:
        order = [e for e in advanced if model.events[e].lane == lane]
        assert order == sorted(order), f"lane {lane!r} advanced out of fan-out order"
    for b in producer.batches:  # contiguous within its lane
        ids = [item.broker_payload[0] for item in b]
        lane_ids = sorted(
            e for e, ev in model.events.items() if ev.lane == model.events[ids[0]].lane
        )
        start = lane_ids.index(ids[0])
        assert lane_ids[start : start + len(ids)] == ids
    for b in producer.batches:
        for item in b:
            ev = model.events[item.broker_payload[0]]
            kinds = list(ev.resolved.values())
            expected = (kinds.count("acked"), kinds.count("failed"), kinds.count("rejected"))
            got = (item.outcome.acked, item.outcome.failed, item.outcome.rejected)
            assert got == expected, (ev, got)
            assert sum(got) == len(ev.snapshot)

    await manager.stop_all()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_random_sequences_keep_every_invariant(steps: list[tuple[Any, ...]]) -> None:
    asyncio.run(scenario(steps))
