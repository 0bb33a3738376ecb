"""One test per rule of the engine's contract (docs/engine.md), named after the rule."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Hashable, Iterator
from typing import Any

import pytest
from engine_harness import AckTrigger, FastTrigger, Gate, Upstream, Watcher, settle

from acklane.core import (
    AckTimeout,
    AdvanceOutcome,
    BaseEventTrigger,
    SharedStreamManager,
    SharedStreamProducer,
    StreamEnded,
    SubscriberOverflow,
    TriggerEvent,
    reject_shared_stream_event,
)
from acklane.core.connectors.deadletter import outcome_reason
from acklane.core.producer import reject_reasons_of
from acklane.core.testing import eventually
from acklane.core.trigger import uses_ack_channel

#: ``up``, ``manager`` and ``stop_watchers``: engine_harness's, through the conftest.
pytestmark = pytest.mark.usefixtures("stop_watchers")


@pytest.fixture(params=["generator", "inline"], autouse=True)
def watcher_path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every rule holds for a generator filter and for a pure one the group evaluates
    inline (each Watcher whose behavior is synchronous subscribes inline)."""
    Watcher.inline_mode = request.param == "inline"
    yield request.param
    Watcher.inline_mode = False


def _yield_nothing(raw: Any) -> list[Any]:
    return []


# -- public shapes -----------------------------------------------------------------


def test_advance_outcome_is_clean_means_no_failure_no_reject_and_one_ack() -> None:
    assert AdvanceOutcome(1, 0).is_clean
    assert AdvanceOutcome(3, 0, 0).is_clean
    assert not AdvanceOutcome(0, 0, 0).is_clean
    assert not AdvanceOutcome(2, 1, 0).is_clean
    assert not AdvanceOutcome(2, 0, 1).is_clean
    assert AdvanceOutcome(1, 0, 1, ("x",)) == AdvanceOutcome(1, 0, 1)


async def test_trigger_subclass_whose_init_passes_no_arguments_works(
    manager: SharedStreamManager, up: Upstream
) -> None:
    class Bare(AckTrigger):
        def __init__(self) -> None:  # never calls the base class with arguments
            self.upstream = up.name
            self._behavior = None

    w = Watcher(manager, "bare", Bare()).start()
    up.push(1)
    await eventually(lambda: len(up.items) == 1)
    assert w.events == [1]


def test_the_constructor_is_keyword_only_and_accepts_airflows_log() -> None:
    m = SharedStreamManager(
        log=logging.getLogger("x"), max_subscriber_queue=4, ack_timeout=1.0, cohort_grace_period=0
    )
    assert m.max_subscriber_queue == 4 and m.ack_timeout == 1.0
    with pytest.raises(TypeError):
        SharedStreamManager(4, 1.0)  # type: ignore[misc]


async def test_subscribe_raises_at_once_on_a_none_key(
    manager: SharedStreamManager, up: Upstream
) -> None:
    with pytest.raises(ValueError, match="shared stream key must not be None"):
        manager.subscribe(trigger_id="t", trigger=AckTrigger(up.name), key=None)  # no await
    assert not manager._groups


async def test_subscribe_raises_at_once_on_a_second_subscription_of_one_trigger_id_and_key(
    manager: SharedStreamManager, up: Upstream
) -> None:
    t = AckTrigger(up.name)
    key = t.shared_stream_key()
    manager.subscribe(trigger_id="t1", trigger=t, key=key)
    with pytest.raises(RuntimeError, match="already subscribed"):
        manager.subscribe(trigger_id="t1", trigger=t, key=key)
    await manager.unsubscribe("t1", key)


async def test_subscribe_returns_the_raw_stream_and_unsubscribe_leaves(
    manager: SharedStreamManager, up: Upstream
) -> None:
    # Airflow's shape: the caller runs the filter; leaving is unsubscribe's (it acks
    # the event the subscriber is on: it moved past it).
    t = AckTrigger(up.name)
    key = t.shared_stream_key()
    raw = manager.subscribe(trigger_id="t", trigger=t, key=key)
    up.push(5)
    async with asyncio.timeout(5):
        first = await anext(raw)
    assert first == 5  # the raw event, not a TriggerEvent
    await manager.unsubscribe("t", key)
    await eventually(lambda: len(up.items) == 1)
    assert up.outcomes() == {5: (1, 0, 0)}
    assert not manager._groups


async def test_unsubscribe_with_an_error_fails_the_subscriber_out_of_what_it_holds(
    manager: SharedStreamManager, up: Upstream
) -> None:
    t = AckTrigger(up.name)
    key = t.shared_stream_key()
    Watcher(manager, "keeper", AckTrigger(up.name)).start()
    raw = manager.subscribe(trigger_id="t", trigger=t, key=key)
    up.push(5)
    async with asyncio.timeout(5):
        await anext(raw)
    await manager.unsubscribe("t", key, error=RuntimeError("filter bug"))
    await eventually(lambda: len(up.items) == 1)
    assert up.outcomes() == {5: (1, 1, 0)}  # failed: redelivered, never acked


async def test_events_raises_on_a_none_key_at_its_first_step(
    manager: SharedStreamManager, up: Upstream
) -> None:
    with pytest.raises(ValueError):
        async for _ in manager.events(trigger_id="t", trigger=AckTrigger(up.name), key=None):
            pass


async def test_events_of_a_second_subscription_of_one_trigger_id_and_key_raises(
    manager: SharedStreamManager, up: Upstream
) -> None:
    t = AckTrigger(up.name)
    Watcher(manager, "t1", t).start()
    await settle()
    with pytest.raises(RuntimeError):
        async for _ in manager.events(trigger_id="t1", trigger=t, key=t.shared_stream_key()):
            pass


# -- fast path and ack mode ----------------------------------------------------------


async def test_fast_path_broadcasts_and_acknowledges_nothing(
    manager: SharedStreamManager, up: Upstream, caplog: pytest.LogCaptureFixture
) -> None:
    a = Watcher(manager, "a", FastTrigger(up.name)).start()
    b = Watcher(manager, "b", FastTrigger(up.name)).start()
    await settle()
    up.push(1, 2, 3)
    await eventually(lambda: len(a.events) == 3 and len(b.events) == 3)
    assert a.events == b.events == [1, 2, 3]
    assert a.seqs == [None, None, None]  # nothing to bind: no ack channel
    assert up.opened == 1
    assert "outside a binding window" in caplog.text  # reject on the fast path only warns


async def test_ack_mode_when_the_class_overrides_the_producer_factory(
    manager: SharedStreamManager, up: Upstream
) -> None:
    assert AckTrigger.uses_ack_channel()
    assert not FastTrigger.uses_ack_channel()
    w = Watcher(manager, "a", AckTrigger(up.name)).start()
    up.push(1)
    await eventually(lambda: len(up.items) == 1)
    assert w.seqs[0] is not None
    assert up.items[0].outcome == AdvanceOutcome(1, 0, 0)


async def test_producer_factory_called_once_per_group_with_first_subscribers_kwargs(
    manager: SharedStreamManager, up: Upstream
) -> None:
    Watcher(manager, "a", AckTrigger(up.name)).start()
    Watcher(manager, "b", AckTrigger(up.name)).start()
    await settle()
    up.push(1)
    await eventually(lambda: len(up.items) == 1)
    assert up.factory_calls == 1
    assert up.factory_kwargs[0] == {"upstream": up.name}


# -- fan-out ------------------------------------------------------------------------


async def test_snapshot_excludes_late_subscriber_and_there_is_no_replay(
    manager: SharedStreamManager, up: Upstream
) -> None:
    gate = Gate()
    a = Watcher(manager, "a", AckTrigger(up.name, gate)).start()
    await settle()
    up.push(1)
    await eventually(lambda: gate.entered == [1])
    late = Watcher(manager, "late", AckTrigger(up.name)).start()
    await settle()
    gate.release(1)
    up.push(2)
    gate.release(2)
    await eventually(lambda: len(up.items) == 2)
    assert late.events == [2]  # never saw event 1
    assert up.outcomes() == {1: (1, 0, 0), 2: (2, 0, 0)}
    assert a.events == [1, 2]


async def test_event_broadcast_to_empty_snapshot_resolves_at_once_not_clean(
    up: Upstream,
) -> None:
    manager = SharedStreamManager(max_subscriber_queue=1, ack_timeout=30.0)
    failed = asyncio.Event()
    hold = asyncio.Event()

    class Wedged(AckTrigger):
        """Catches its own overflow and stays subscribed: the group lives, its snapshot is empty."""

        async def filter_shared_stream(
            self, stream: AsyncIterator[Any]
        ) -> AsyncIterator[TriggerEvent]:
            try:
                async for raw in stream:
                    await hold.wait()
                    yield TriggerEvent(raw)
            except SubscriberOverflow:
                failed.set()
                await asyncio.Event().wait()

    Watcher(manager, "a", Wedged(up.name)).start()
    await settle()
    up.push(1)
    await settle()
    up.push(2, 3)  # queue of one: "a" holds 1, queues 2, overflows on 3 -> force-failed
    await settle()
    hold.set()
    await eventually(failed.is_set)
    up.push(4)
    await eventually(lambda: 4 in up.outcomes())
    assert up.outcomes() == {1: (0, 1, 0), 2: (0, 1, 0), 3: (0, 1, 0), 4: (0, 0, 0)}
    assert not up.items[-1].outcome.is_clean
    await manager.stop_all()


async def test_queue_overflow_force_fails_only_that_subscriber(up: Upstream) -> None:
    manager = SharedStreamManager(max_subscriber_queue=2, ack_timeout=30.0)
    slow_gate = Gate()
    slow = Watcher(manager, "slow", AckTrigger(up.name, slow_gate)).start()
    fast = Watcher(manager, "fast", AckTrigger(up.name)).start()
    await settle()
    for i in range(1, 6):
        up.push(i)
        await settle()
    assert slow.task is not None and not slow.task.done()  # stuck in its filter
    slow_gate.release(1)  # when it asks for more, its iterator raises the overflow
    await eventually(lambda: slow.task is not None and slow.task.done())
    assert isinstance(slow.error, SubscriberOverflow)
    await eventually(lambda: len(up.items) == 5)
    assert fast.events == [1, 2, 3, 4, 5]
    outcomes = up.outcomes()
    # slow held 1, queued 2 and 3, overflowed on 4: failed in all four, 5 is past it
    assert outcomes == {1: (1, 1, 0), 2: (1, 1, 0), 3: (1, 1, 0), 4: (1, 1, 0), 5: (1, 0, 0)}
    await manager.stop_all()


# -- resolution ---------------------------------------------------------------------


class HoldAfterYield(AckTrigger):
    """Yields for each raw event, then stays on it until released."""

    gate: asyncio.Event

    async def filter_shared_stream(self, stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        async for raw in stream:
            yield TriggerEvent(raw)
            await self.gate.wait()
            self.gate.clear()


async def test_acked_only_when_moved_past_and_every_yield_confirmed(
    manager: SharedStreamManager, up: Upstream
) -> None:
    t = HoldAfterYield(up.name)
    t.gate = asyncio.Event()
    w = Watcher(manager, "a", t, auto_confirm=False).start()
    await settle()
    up.push(1)
    await eventually(lambda: len(w.events) == 1)
    await settle()
    assert up.items == []  # yielded, not confirmed, not moved past
    w.confirm_all()
    await settle()
    assert up.items == []  # confirmed, but still on the event (window open)
    t.gate.set()  # asking for the next raw event moves past 1
    await eventually(lambda: len(up.items) == 1)
    assert up.outcomes() == {1: (1, 0, 0)}


async def test_moved_past_but_unconfirmed_waits_for_confirmation(
    manager: SharedStreamManager, up: Upstream
) -> None:
    w = Watcher(manager, "a", AckTrigger(up.name), auto_confirm=False).start()
    await settle()
    up.push(1, 2)
    await eventually(lambda: len(w.events) == 2)
    await settle()
    assert up.items == []  # moved past 1, its event unconfirmed
    w.manager.confirm_persisted([w.unconfirmed[0]])
    await eventually(lambda: len(up.items) == 1)
    assert up.outcomes() == {1: (1, 0, 0)}


async def test_filter_that_yields_nothing_acks_when_it_asks_for_the_next_event(
    manager: SharedStreamManager, up: Upstream
) -> None:
    gate = Gate(yields=0)
    Watcher(manager, "a", AckTrigger(up.name, gate)).start()
    await settle()
    up.push(1)
    await eventually(lambda: gate.entered == [1])
    await settle()
    assert up.items == []  # still on it
    gate.release(1)  # done with 1, yielded nothing, asks for the next (none there yet)
    await eventually(lambda: len(up.items) == 1)
    assert up.outcomes() == {1: (1, 0, 0)}


async def test_several_yields_gate_the_ack_on_all_of_them(
    manager: SharedStreamManager, up: Upstream
) -> None:
    def three(raw: Any) -> list[Any]:
        return [raw, raw, raw]

    w = Watcher(manager, "a", AckTrigger(up.name, three), auto_confirm=False).start()
    await settle()
    up.push(1, 2)
    await eventually(lambda: len(w.events) == 6)
    first_three = w.unconfirmed[:3]
    manager.confirm_persisted(first_three[:2])
    await settle()
    assert up.items == []
    manager.confirm_persisted(first_three[2:])
    await eventually(lambda: len(up.items) == 1)


async def test_bound_event_carries_message_id_and_position(
    manager: SharedStreamManager, up: Upstream
) -> None:
    positions: list[Any] = []

    class Two(AckTrigger):
        pass

    async def two(raw: Any) -> list[Any]:
        return [raw, raw]

    t = Two(up.name, two)
    key = t.shared_stream_key()

    async def drive() -> None:
        async for _ in manager.events(trigger_id="p", trigger=t, key=key):
            positions.append(manager.bind_event(trigger_id="p", key=key))

    task = asyncio.create_task(drive())
    up.push(7)
    await eventually(lambda: len(positions) == 2)
    assert [(b.message_id, b.position) for b in positions] == [("m7", 0), ("m7", 1)]
    task.cancel()


async def test_reject_resolves_at_once_without_waiting_for_persistence(
    manager: SharedStreamManager, up: Upstream
) -> None:
    def reject_odd(raw: Any) -> list[Any] | str:
        return "reject" if raw % 2 else [raw]

    Watcher(manager, "a", AckTrigger(up.name, reject_odd), auto_confirm=False).start()
    await settle()
    up.push(1)
    await eventually(lambda: len(up.items) == 1)  # still on 1, nothing persisted: resolved
    item = up.items[0]
    assert (item.outcome.acked, item.outcome.failed, item.outcome.rejected) == (0, 0, 1)
    assert item.outcome.reject_reasons == ("rejected 1",)


async def test_yield_after_reject_fires_but_is_not_bound(
    manager: SharedStreamManager, up: Upstream
) -> None:
    class RejectThenYield(AckTrigger):
        async def filter_shared_stream(
            self, stream: AsyncIterator[Any]
        ) -> AsyncIterator[TriggerEvent]:
            async for raw in stream:
                reject_shared_stream_event("bad")
                yield TriggerEvent(raw)

    w = Watcher(manager, "a", RejectThenYield(up.name)).start()
    await settle()
    up.push(1)
    await eventually(lambda: len(w.events) == 1)
    assert w.seqs == [None]
    assert up.outcomes() == {1: (0, 0, 1)}


async def test_reject_between_two_events_only_warns(
    manager: SharedStreamManager, up: Upstream, caplog: pytest.LogCaptureFixture
) -> None:
    reject_shared_stream_event()  # no window at all in this task
    assert "outside a binding window" in caplog.text


async def test_reject_is_task_local(manager: SharedStreamManager, up: Upstream) -> None:
    gate = Gate()
    Watcher(manager, "a", AckTrigger(up.name, gate)).start()
    await settle()
    up.push(1)
    await eventually(lambda: gate.entered == [1])
    reject_shared_stream_event()  # the test's task has no window; "a" is unaffected
    gate.release(1)
    up.push(2)
    await eventually(lambda: len(up.items) == 1)
    assert up.outcomes() == {1: (1, 0, 0)}


async def test_ack_timeout_fails_subscriber_out_of_all_outstanding_events(up: Upstream) -> None:
    manager = SharedStreamManager(max_subscriber_queue=16, ack_timeout=0.2)
    gate = Gate()
    stuck = Watcher(manager, "stuck", AckTrigger(up.name, gate)).start()
    ok = Watcher(manager, "ok", AckTrigger(up.name)).start()
    await settle()
    up.push(1, 2, 3)
    await eventually(lambda: len(up.items) == 3)
    assert up.outcomes() == {1: (1, 1, 0), 2: (1, 1, 0), 3: (1, 1, 0)}
    assert ok.events == [1, 2, 3]
    gate.release(1)  # when the stuck filter asks for more, its iterator raises
    err = await stuck.wait_failed()
    assert isinstance(err, AckTimeout)
    await manager.stop_all()


async def test_ack_timeout_counts_unconfirmed_yields(up: Upstream) -> None:
    manager = SharedStreamManager(max_subscriber_queue=16, ack_timeout=0.2)
    w = Watcher(manager, "w", AckTrigger(up.name), auto_confirm=False).start()
    await settle()
    up.push(1, 2)
    err = await w.wait_failed()
    assert isinstance(err, AckTimeout)
    await eventually(lambda: len(up.items) == 2)
    assert up.outcomes() == {1: (0, 1, 0), 2: (0, 1, 0)}
    await manager.stop_all()


async def test_unsubscribe_fails_unread_events_and_acks_the_one_pulled(
    manager: SharedStreamManager, up: Upstream
) -> None:
    gate = Gate(yields=0)
    leaver = Watcher(manager, "leaver", AckTrigger(up.name, gate)).start()
    stayer = Watcher(manager, "stayer", AckTrigger(up.name)).start()
    await settle()
    up.push(1, 2, 3)
    await eventually(lambda: gate.entered == [1] and len(stayer.events) == 3)
    await manager.unsubscribe("leaver", leaver.key)
    await eventually(lambda: len(up.items) == 3)
    # pulled 1 and yielded nothing for it: acked; 2 and 3 were unread: failed
    assert up.outcomes() == {1: (2, 0, 0), 2: (1, 1, 0), 3: (1, 1, 0)}


# -- lanes and advance ----------------------------------------------------------------


async def test_lane_advances_longest_contiguous_resolved_prefix_in_fanout_order(
    manager: SharedStreamManager, up: Upstream
) -> None:
    gate = Gate()
    Watcher(manager, "a", AckTrigger(up.name, gate)).start()
    await settle()
    up.push(*({"id": i} for i in range(1, 6)))
    for i in (1, 2, 3, 5):
        gate.release(i)
    await eventually(lambda: len(up.items) == 3)
    await settle()
    assert [i.broker_payload["id"] for i in up.items] == [1, 2, 3]  # 4 is still open
    gate.release(4)
    await eventually(lambda: len(up.items) == 5)
    assert [i.broker_payload["id"] for i in up.items] == [1, 2, 3, 4, 5]


async def test_resolved_event_behind_unresolved_head_waits_then_goes_out_together(
    manager: SharedStreamManager, up: Upstream
) -> None:
    a = Watcher(manager, "a", AckTrigger(up.name), auto_confirm=False).start()
    await settle()
    up.push({"id": 1}, {"id": 2}, {"id": 3})
    await eventually(lambda: len(a.events) == 3)
    manager.confirm_persisted([a.unconfirmed[1]])  # 2 resolves first
    await settle()
    assert up.items == []
    manager.confirm_persisted([a.unconfirmed[0]])  # then the head
    await eventually(lambda: len(up.items) == 2)
    assert len(up.batches) == 1
    assert [i.broker_payload["id"] for i in up.batches[0]] == [1, 2]


async def test_lanes_never_wait_for_each_other(manager: SharedStreamManager, up: Upstream) -> None:
    a = Watcher(manager, "a", AckTrigger(up.name), auto_confirm=False).start()
    await settle()
    up.push({"id": 1, "lane": "x"}, {"id": 2, "lane": "y"}, {"id": 3, "lane": "y"})
    await eventually(lambda: len(a.events) == 3)
    manager.confirm_persisted(a.unconfirmed[1:])  # lane y resolves; lane x's head does not
    await eventually(lambda: len(up.items) == 2)
    assert [i.broker_payload["id"] for i in up.items] == [2, 3]
    manager.confirm_persisted(a.unconfirmed[:1])
    await eventually(lambda: len(up.items) == 3)
    assert [i.broker_payload["id"] for i in up.items] == [2, 3, 1]


async def test_at_most_one_advance_in_flight_per_group(
    manager: SharedStreamManager, up: Upstream
) -> None:
    up.advance_gate = asyncio.Event()
    Watcher(manager, "a", AckTrigger(up.name, _yield_nothing)).start()
    await settle()
    up.push(*({"id": i, "lane": i % 3} for i in range(10)))
    await settle(50)
    assert up.in_flight == 1
    up.advance_gate.set()
    await eventually(lambda: len(up.items) == 10)
    assert up.max_in_flight == 1


async def test_advance_error_fails_the_whole_group_loudly(
    manager: SharedStreamManager, up: Upstream
) -> None:
    boom = RuntimeError("broker said no")
    up.advance_error = boom
    a = Watcher(manager, "a", AckTrigger(up.name)).start()
    b = Watcher(manager, "b", AckTrigger(up.name)).start()
    await settle()
    up.push(1, 2)
    assert await a.wait_failed() is boom
    assert await b.wait_failed() is boom
    await eventually(lambda: up.aclosed == 1)
    up.advance_error = None
    up.push(3)
    await settle()
    assert up.items == []  # nothing more advanced
    # the failed group is gone: a new subscriber gets a fresh group and producer
    c = Watcher(manager, "c", AckTrigger(up.name)).start()
    await eventually(lambda: c.events == [3])
    assert up.factory_calls == 2


async def test_stream_that_ends_fails_the_group(manager: SharedStreamManager, up: Upstream) -> None:
    a = Watcher(manager, "a", AckTrigger(up.name)).start()
    await settle()
    up.end()
    assert isinstance(await a.wait_failed(), StreamEnded)


async def test_stream_error_fails_the_group_after_advancing_what_was_resolved(
    manager: SharedStreamManager, up: Upstream
) -> None:
    gate = Gate(yields=0)
    a = Watcher(manager, "a", AckTrigger(up.name, gate)).start()
    await settle()
    up.push(1, 2)
    gate.release(1)
    await eventually(lambda: gate.entered == [1, 2])
    up.raise_(ConnectionError("broker went away"))
    await eventually(lambda: up.aclosed == 1)
    gate.release(2)
    assert isinstance(await a.wait_failed(), ConnectionError)
    assert up.outcomes() == {1: (1, 0, 0)}  # 2 was unresolved: abandoned, redelivered


async def test_lane_that_cannot_be_computed_fails_the_group(
    manager: SharedStreamManager, up: Upstream
) -> None:
    up.lane_error = KeyError("no lane")
    a = Watcher(manager, "a", AckTrigger(up.name)).start()
    await settle()
    up.push(1)
    assert isinstance(await a.wait_failed(), KeyError)


async def test_unhashable_lane_fails_the_group(manager: SharedStreamManager, up: Upstream) -> None:
    a = Watcher(manager, "a", AckTrigger(up.name)).start()
    await settle()
    up.push({"id": 1, "lane": ["not", "hashable"]})
    assert isinstance(await a.wait_failed(), TypeError)


# -- lifecycle ----------------------------------------------------------------------


async def test_cohort_grace_period_lets_siblings_join_before_first_broadcast(
    up: Upstream,
) -> None:
    manager = SharedStreamManager(ack_timeout=30.0, cohort_grace_period=0.1)
    up.push(1)
    a = Watcher(manager, "a", AckTrigger(up.name)).start()
    await asyncio.sleep(0.02)
    b = Watcher(manager, "b", AckTrigger(up.name)).start()
    await eventually(lambda: a.events == [1] and b.events == [1])
    await manager.stop_all()


async def test_on_stop_resolved_events_are_advanced_the_rest_abandoned_then_aclose_once(
    manager: SharedStreamManager, up: Upstream
) -> None:
    gate = Gate(yields=0)
    a = Watcher(manager, "a", AckTrigger(up.name, gate)).start()
    b = Watcher(manager, "b", AckTrigger(up.name), auto_confirm=False).start()
    await settle()
    up.push(1, 2)
    gate.release(1)
    await eventually(lambda: gate.entered == [1, 2] and len(b.events) == 2)
    b.confirm_all()
    await settle()
    await manager.stop_all()
    assert up.outcomes() == {1: (2, 0, 0)}
    assert up.aclosed == 1
    assert a.task is not None and b.task is not None


async def test_last_subscriber_leaving_stops_the_poll_and_closes_the_producer(
    manager: SharedStreamManager, up: Upstream
) -> None:
    a = Watcher(manager, "a", AckTrigger(up.name)).start()
    await settle()
    up.push(1)
    await eventually(lambda: a.events == [1])
    await manager.unsubscribe("a", a.key)
    assert up.aclosed == 1
    assert not manager.group_stats()


async def test_aclose_error_is_logged_not_raised(
    manager: SharedStreamManager, up: Upstream, caplog: pytest.LogCaptureFixture
) -> None:
    up.aclose_error = OSError("flush failed")
    a = Watcher(manager, "a", AckTrigger(up.name)).start()
    await settle()
    await manager.unsubscribe("a", a.key)
    assert up.aclosed == 1
    assert "aclose failed" in caplog.text


async def test_aclose_not_called_when_the_factory_never_ran(manager: SharedStreamManager) -> None:
    class FactoryFails(AckTrigger):
        @classmethod
        def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
            raise ValueError("bad config")

    name = f"nofactory-{uuid.uuid4().hex[:6]}"
    up = Upstream(name)
    w = Watcher(manager, "a", FactoryFails(name)).start()
    assert isinstance(await w.wait_failed(), ValueError)
    assert up.aclosed == 0


async def test_group_started_log_line_once_per_group_at_info(
    manager: SharedStreamManager, up: Upstream, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="acklane.core.manager")
    m = SharedStreamManager(ack_timeout=30.0, cohort_grace_period=0.05)
    for i in range(3):
        Watcher(m, f"w{i}", AckTrigger(up.name)).start()
    await asyncio.sleep(0.15)
    lines = [r for r in caplog.records if "Shared stream group started" in r.getMessage()]
    assert len(lines) == 1
    assert lines[0].levelno == logging.INFO
    assert "subscribers=3" in lines[0].getMessage()
    assert repr(("fake", up.name)) in lines[0].getMessage()
    await m.stop_all()


async def test_a_poll_stopped_from_its_own_step_that_then_ends_closes_the_group_in_order(
    up: Upstream,
) -> None:
    # The group's task polls: stop_polling() from inside its own step (here by the
    # failure observer, on an overflow) cancels that task, and the stream then ends
    # without awaiting again. That cancellation is the group's own: the advance under
    # way completes and the producer is closed after it.
    manager: SharedStreamManager | None = None

    def stop(_key: Hashable, _trigger_id: str, _exc: BaseException) -> None:
        assert manager is not None
        manager.stop_polling()

    manager = SharedStreamManager(
        max_subscriber_queue=1, ack_timeout=30.0, on_subscriber_failed=stop
    )
    up.advance_gate = asyncio.Event()
    up.push(1, 2)
    up.end()  # all there before the poll starts: taken without awaiting
    t = AckTrigger(up.name)
    raw = manager.subscribe(trigger_id="a", trigger=t, key=t.shared_stream_key())
    await eventually(lambda: up.in_flight == 1)
    await settle()
    up.advance_gate.set()
    await eventually(lambda: up.aclosed == 1)
    assert up.outcomes() == {1: (0, 1, 0), 2: (0, 1, 0)}
    with pytest.raises(SubscriberOverflow):
        await anext(raw)
    await manager.stop_all()


async def test_standalone_trigger_with_none_key_is_not_shared() -> None:
    class Alone(BaseEventTrigger):
        async def run(self) -> AsyncIterator[TriggerEvent]:
            reject_shared_stream_event()  # only warns in a standalone run()
            yield TriggerEvent("x")

    t = Alone()
    key: Hashable = t.shared_stream_key()
    assert key is None
    assert [e.payload async for e in t.run()] == ["x"]


# -- overflow="pause" (acklane's option) ----------------------------------------------


async def test_pause_mode_waits_for_room_instead_of_failing_a_slow_subscriber(
    up: Upstream,
) -> None:
    manager = SharedStreamManager(max_subscriber_queue=2, ack_timeout=30.0, overflow="pause")
    gate = Gate()
    slow = Watcher(manager, "slow", AckTrigger(up.name, gate)).start()
    fast = Watcher(manager, "fast", AckTrigger(up.name)).start()
    await settle()
    up.push(*range(1, 8))
    await settle(50)
    # slow holds 1 and has 2, 3 queued: the poll waits instead of overflowing it
    assert fast.events == [1, 2, 3]
    assert manager.group_stats()[("fake", up.name)].pauses >= 1
    for i in range(1, 8):
        gate.release(i)
    await eventually(lambda: len(up.items) == 7)
    assert slow.error is None
    assert all(o == (2, 0, 0) for o in up.outcomes().values())
    await manager.stop_all()


async def test_pause_mode_still_fails_a_stuck_subscriber_by_ack_timeout(up: Upstream) -> None:
    manager = SharedStreamManager(max_subscriber_queue=2, ack_timeout=0.2, overflow="pause")
    stuck = Watcher(manager, "stuck", AckTrigger(up.name, Gate())).start()
    ok = Watcher(manager, "ok", AckTrigger(up.name)).start()
    await settle()
    up.push(*range(1, 6))
    await eventually(lambda: len(up.items) == 5)  # the poll resumed once stuck was failed
    assert ok.events == [1, 2, 3, 4, 5]
    assert up.outcomes()[1] == (1, 1, 0)
    assert stuck.task is not None and not stuck.task.done()  # still inside its filter
    await manager.stop_all()


async def test_filter_that_crashes_is_failed_out_of_its_event_not_acked(
    manager: SharedStreamManager, up: Upstream
) -> None:
    def crash_on_two(raw: Any) -> list[Any]:
        if raw == 2:
            raise RuntimeError("filter bug")
        return [raw]

    crashing = Watcher(manager, "crashing", AckTrigger(up.name, crash_on_two)).start()
    Watcher(manager, "other", AckTrigger(up.name)).start()
    await settle()
    up.push(1, 2)
    assert isinstance(await crashing.wait_failed(), RuntimeError)
    await eventually(lambda: len(up.items) == 2)
    assert up.outcomes() == {1: (2, 0, 0), 2: (1, 1, 0)}  # crashed on 2: failed, not acked


async def test_subscriber_failure_is_reported_to_the_failure_observer(up: Upstream) -> None:
    seen: list[tuple[Any, str, str]] = []
    manager = SharedStreamManager(
        max_subscriber_queue=1,
        ack_timeout=30.0,
        on_subscriber_failed=lambda key, tid, exc: seen.append((key, tid, type(exc).__name__)),
    )
    gate = Gate()
    Watcher(manager, "a", AckTrigger(up.name, gate)).start()
    await settle()
    up.push(1)
    await settle()
    up.push(2, 3)
    await eventually(lambda: bool(seen))
    assert seen == [(("fake", up.name), "a", "SubscriberOverflow")]
    await manager.stop_all()


async def test_abort_all_cancels_a_producer_stuck_in_advance(up: Upstream) -> None:
    manager = SharedStreamManager(ack_timeout=30.0)
    up.advance_gate = asyncio.Event()  # never set: advance hangs
    Watcher(manager, "a", AckTrigger(up.name)).start()
    await settle()
    up.push(1, 2)
    await eventually(lambda: up.in_flight == 1)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.1):
            await manager.stop_all()
    await manager.abort_all()
    assert up.items == []
    assert up.aclosed == 1  # the stuck group was reached and closed
    assert not manager._closing


# -- regressions found in review ---------------------------------------------------


async def test_group_closed_before_its_task_ran_never_polls(
    manager: SharedStreamManager, up: Upstream
) -> None:
    class CrashAtOnce(AckTrigger):
        async def filter_shared_stream(
            self, stream: AsyncIterator[Any]
        ) -> AsyncIterator[TriggerEvent]:
            raise ValueError("bad config")
            yield  # pragma: no cover

    key = ("fake", up.name)
    with pytest.raises(ValueError):
        async for _ in manager.events(trigger_id="a", trigger=CrashAtOnce(up.name), key=key):
            pass
    up.push(1, 2)
    async with asyncio.timeout(2):
        await manager.wait_key_closed(key)
    await settle()
    assert up.opened == 0 and up.queue.qsize() == 2  # nobody consumed from the broker
    assert not manager._closing


async def test_old_subscription_finishing_late_does_not_bind_to_a_new_ones_event(
    manager: SharedStreamManager, up: Upstream
) -> None:
    key = ("fake", up.name)
    slow = asyncio.Event()

    async def slow_on_one(raw: Any) -> list[Any]:
        if raw == 1:
            await slow.wait()
        return [raw]

    got: list[tuple[str, Any, Any]] = []

    async def old() -> None:
        trigger = AckTrigger(up.name, slow_on_one)
        async for ev in manager.events(trigger_id="a", trigger=trigger, key=key):
            got.append(("old", ev.payload, manager.bind_event(trigger_id="a", key=key)))

    async def new() -> None:
        async for ev in manager.events(trigger_id="a", trigger=AckTrigger(up.name), key=key):
            got.append(("new", ev.payload, manager.bind_event(trigger_id="a", key=key)))
            await asyncio.Event().wait()

    Watcher(manager, "keeper", AckTrigger(up.name)).start()
    tasks = [asyncio.create_task(old())]
    await settle()
    up.push(1)
    await settle()
    await manager.unsubscribe("a", key)  # leaves while its filter is still on raw 1
    tasks.append(asyncio.create_task(new()))
    await settle()
    up.push(2)
    await settle()
    slow.set()  # the old filter yields its event for raw 1 only now
    await settle()
    by = {who: (payload, bound) for who, payload, bound in got}
    assert by["old"] == (1, None)  # its window closed when it left: not bound
    assert by["new"][1] is not None and by["new"][1].message_id == "m2"
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_finished_groups_are_not_retained(manager: SharedStreamManager, up: Upstream) -> None:
    for i in range(5):
        w = Watcher(manager, "a", AckTrigger(up.name)).start()
        await settle()
        up.push(i)
        await eventually(lambda w=w: len(w.events) == 1)  # type: ignore[misc]
        await w.stop()
        await settle()
    assert not manager._groups and not manager._closing


async def test_orderly_close_runs_the_filters_cleanup_at_once_in_its_task(
    manager: SharedStreamManager, up: Upstream
) -> None:
    ran: list[str | None] = []

    class Cleans(AckTrigger):
        async def filter_shared_stream(
            self, stream: AsyncIterator[Any]
        ) -> AsyncIterator[TriggerEvent]:
            try:
                async for raw in stream:
                    yield TriggerEvent(raw)
            finally:
                task = asyncio.current_task()
                ran.append(task.get_name() if task else None)

    key = ("fake", up.name)

    async def consume() -> None:
        async with contextlib.aclosing(
            manager.events(trigger_id="a", trigger=Cleans(up.name), key=key)
        ) as it:
            async for _ in it:
                break

    up.push(1)
    await asyncio.create_task(consume(), name="the-watcher")
    assert ran == ["the-watcher"]


async def test_group_stats_count_outcomes(manager: SharedStreamManager, up: Upstream) -> None:
    def reject_odd(raw: Any) -> list[Any] | str:
        return "reject" if raw % 2 else [raw]

    Watcher(manager, "a", AckTrigger(up.name, reject_odd)).start()
    Watcher(manager, "b", AckTrigger(up.name)).start()
    await settle()
    up.push(1, 2)
    await eventually(lambda: len(up.items) == 2)
    stats = manager.group_stats()[("fake", up.name)]
    assert (stats.acked, stats.failed, stats.rejected) == (3, 0, 1)
    assert stats.broadcast == 2 and stats.advanced_events == 2


# -- leaving in order, and the leaving observer (acklane's addition) -----------------


class ReturnsOn(AckTrigger):
    """Fires for each raw event; on ``on`` it waits for ``gate``, then its filter returns."""

    def __init__(self, upstream: str, on: Any, gate: asyncio.Event) -> None:
        super().__init__(upstream)
        self._on = on
        self._gate = gate

    async def filter_shared_stream(self, stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        async for raw in stream:
            if raw == self._on:
                await self._gate.wait()
                return
            yield TriggerEvent(raw)


async def test_filter_that_returns_leaves_in_order_and_acks_the_event_it_was_on(
    manager: SharedStreamManager, up: Upstream
) -> None:
    # Airflow's rule, kept for direct users of the manager: no observer, orderly leave.
    gate = asyncio.Event()
    leaver = Watcher(manager, "leaver", ReturnsOn(up.name, 2, gate)).start()
    stayer = Watcher(manager, "stayer", AckTrigger(up.name)).start()
    await settle()
    up.push(1, 2)
    await eventually(lambda: len(up.items) == 1 and stayer.events == [1, 2])
    gate.set()
    assert leaver.task is not None
    await leaver.task
    assert leaver.error is None
    up.push(3)  # broadcast after it left: its snapshot is the stayer alone
    await eventually(lambda: len(up.items) == 3)
    assert up.outcomes() == {1: (2, 0, 0), 2: (2, 0, 0), 3: (1, 0, 0)}


async def test_leaving_observer_runs_before_the_subscriber_detaches_and_may_fail_the_group(
    up: Upstream,
) -> None:
    calls: list[tuple[Hashable, str, str, list[str]]] = []

    def leaving(key: Hashable, trigger_id: str, how: str) -> None:
        members = [tid for (_, tid) in manager.queue_depths()]  # still a member here
        calls.append((key, trigger_id, how, members))
        manager.fail_group(key, RuntimeError(f"{trigger_id} left"))

    manager = SharedStreamManager(ack_timeout=30.0, on_subscriber_leaving=leaving)
    gate = asyncio.Event()
    leaver = Watcher(manager, "leaver", ReturnsOn(up.name, 2, gate)).start()
    stayer = Watcher(manager, "stayer", AckTrigger(up.name)).start()
    await settle()
    up.push(1, 2)
    await eventually(lambda: len(up.items) == 1 and stayer.events == [1, 2])
    gate.set()
    error = await stayer.wait_failed()
    assert str(error) == "leaver left"
    await eventually(lambda: leaver.task is not None and leaver.task.done())
    assert leaver.error is None  # it left; the group's failure is what its siblings raise
    key = ("fake", up.name)
    assert calls == [(key, "leaver", "its filter returned", ["leaver", "stayer"])]
    up.push(3)
    await settle()
    assert up.outcomes() == {1: (2, 0, 0)}  # 2 (the leaver was on it) and 3: never advanced
    await manager.stop_all()
    assert up.aclosed == 1


async def test_leaving_observer_is_told_when_the_consumer_closes_the_subscription(
    up: Upstream,
) -> None:
    calls: list[tuple[str, str]] = []
    manager = SharedStreamManager(
        ack_timeout=30.0, on_subscriber_leaving=lambda key, tid, how: calls.append((tid, how))
    )
    trigger = AckTrigger(up.name)
    it = manager.events(trigger_id="a", trigger=trigger, key=trigger.shared_stream_key())
    up.push(1)
    async with asyncio.timeout(5):
        await anext(it)
    await it.aclose()
    assert calls == [("a", "its consumer closed the subscription")]
    await manager.stop_all()


async def test_leaving_observer_is_not_called_for_failures_unsubscribes_or_a_stop(
    up: Upstream,
) -> None:
    calls: list[str] = []
    manager = SharedStreamManager(
        ack_timeout=30.0, on_subscriber_leaving=lambda key, tid, how: calls.append(tid)
    )

    def crash_on_two(raw: Any) -> list[Any]:
        if raw == 2:
            raise RuntimeError("filter bug")
        return [raw]

    crashing = Watcher(manager, "crashing", AckTrigger(up.name, crash_on_two)).start()
    unsubscribed = Watcher(manager, "unsubscribed", AckTrigger(up.name)).start()
    stopped = Watcher(manager, "stopped", AckTrigger(up.name)).start()
    await settle()
    up.push(1, 2)
    await crashing.wait_failed()
    await manager.unsubscribe("unsubscribed", unsubscribed.key)
    await manager.stop_all()
    for w in (unsubscribed, stopped):
        assert w.task is not None
        async with asyncio.timeout(5):
            await w.task
    assert calls == []


# -- Airflow's triggers and producers under this manager -------------------------------


def test_the_mode_is_airflows_rule_a_class_below_the_base_defines_the_producer_factory() -> None:
    # Airflow's manager walks the MRO for the first class defining the factory and does
    # not stop at acklane's base: the base must not define it, or every trigger acks.
    assert "create_shared_stream_producer" not in vars(BaseEventTrigger)
    assert uses_ack_channel(AckTrigger) and AckTrigger.uses_ack_channel()
    assert not uses_ack_channel(FastTrigger) and not FastTrigger.uses_ack_channel()

    class Inherits(AckTrigger):
        pass

    assert uses_ack_channel(Inherits)


class AirflowShapedProducer:
    """A producer with Airflow's methods only: no open_batches, message_id or counters."""

    def __init__(self, up: Upstream) -> None:
        self.up = up

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        while True:
            item = await self.up.queue.get()
            yield item, item

    async def advance(self, batch: Any) -> None:
        self.up.batches.append(list(batch))

    def get_advance_lane(self, broker_payload: Any) -> Hashable:
        return None

    async def aclose(self) -> None:
        self.up.aclosed += 1


class AirflowShapedTrigger(AckTrigger):
    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> Any:
        return AirflowShapedProducer(Upstream.registry[kwargs["upstream"]])


async def test_a_producer_without_acklanes_additions_runs_without_a_warning(
    manager: SharedStreamManager, up: Upstream, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="acklane")
    w = Watcher(manager, "a", AirflowShapedTrigger(up.name)).start()
    await settle()
    up.push(1, 2)
    await eventually(lambda: len(up.items) == 2)
    assert w.seqs[0] is not None  # bound: ack mode
    assert manager.producer_counters() == {}  # no counters(): left out
    assert up.outcomes() == {1: (1, 0, 0), 2: (1, 0, 0)}
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


async def test_the_ack_timeout_names_the_event_without_printing_its_payload(
    up: Upstream, caplog: pytest.LogCaptureFixture
) -> None:
    manager = SharedStreamManager(ack_timeout=0.2)
    w = Watcher(manager, "slow", AirflowShapedTrigger(up.name), auto_confirm=False).start()
    await settle()
    up.push({"id": 1, "card": "4111-secret"})
    error = await w.wait_failed()
    await manager.stop_all()
    assert isinstance(error, AckTimeout)
    assert "secret" not in str(error) and "secret" not in caplog.text
    assert "<dict in lane None>" in str(error)


def test_reject_reasons_are_read_from_outcomes_that_carry_none() -> None:
    class Theirs:  # Airflow's AdvanceOutcome: no reject_reasons
        acked, failed, rejected = 0, 0, 2

    assert reject_reasons_of(Theirs()) == ()
    assert reject_reasons_of(AdvanceOutcome(0, 0, 1, ("why",))) == ("why",)
    assert outcome_reason(Theirs()) == "rejected by 2 watchers"  # type: ignore[arg-type]
