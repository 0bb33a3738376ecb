"""The engine's per-batch shortcuts: LaneBatch (a batch of one lane) and message ids
asked once per raw event, whatever the number of members."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Hashable, Iterable, Iterator, Sequence
from typing import Any

from acklane.core import AdvanceItem, BaseEventTrigger, SharedStreamManager, TriggerEvent
from acklane.core.producer import LaneBatch, SharedStreamProducer


class LaneProducer(SharedStreamProducer):
    """Yields the batches it is given (LaneBatch or plain), then waits forever."""

    def __init__(self, batches: list[Any]) -> None:
        self.batches = batches
        self.advanced: list[list[Any]] = []
        self.lane_calls = 0
        self.id_calls = 0
        self.done = asyncio.Event()
        self.expected = sum(len(list(_pairs(b))) for b in batches)

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        raise AssertionError("open_batches is offered")
        yield  # pragma: no cover

    def open_batches(self) -> AsyncIterator[Iterable[tuple[Any, Any]] | LaneBatch]:
        return self._batches()

    async def _batches(self) -> AsyncIterator[Iterable[tuple[Any, Any]] | LaneBatch]:
        for batch in self.batches:
            yield batch
        await asyncio.Event().wait()

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        self.advanced.append([item.broker_payload for item in batch])
        if sum(map(len, self.advanced)) >= self.expected:
            self.done.set()

    def get_advance_lane(self, broker_payload: Any) -> Hashable:
        self.lane_calls += 1
        return broker_payload[0]

    def message_id(self, broker_payload: Any) -> str | None:
        self.id_calls += 1
        return f"m{broker_payload[1]}"


def _pairs(batch: Any) -> Iterable[tuple[Any, Any]]:
    return batch.pairs if type(batch) is LaneBatch else batch


PRODUCERS: dict[str, LaneProducer] = {}


class Watcher(BaseEventTrigger):
    def __init__(self, run: str, slow: float = 0.0) -> None:
        self.run = run
        self.slow = slow

    def shared_stream_key(self) -> Hashable:
        return ("lanes", self.run)

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
        return PRODUCERS[kwargs["run"]]

    async def filter_shared_stream(self, stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        async for raw in stream:
            if self.slow:
                await asyncio.sleep(self.slow)
            yield TriggerEvent(raw[1])


async def _run(
    batches: list[Any], watchers: int, *, slow: float = 0.0, **manager: Any
) -> tuple[LaneProducer, list[list[Any]]]:
    """Drive ``watchers`` members until everything is advanced; what each bound."""
    run = uuid.uuid4().hex
    producer = PRODUCERS[run] = LaneProducer(batches)
    engine = SharedStreamManager(**manager)
    bound: list[list[Any]] = [[] for _ in range(watchers)]

    async def watch(i: int) -> None:
        trigger = Watcher(run, slow)
        key = trigger.shared_stream_key()
        async for _event in engine.events(trigger_id=f"w{i}", trigger=trigger, key=key):
            b = engine.bind_event(trigger_id=f"w{i}", key=key)
            assert b is not None
            bound[i].append(b.message_id)
            engine.confirm_persisted((b.seq,))

    async with asyncio.timeout(10), asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(watch(i)) for i in range(watchers)]
        await producer.done.wait()
        for t in tasks:
            t.cancel()
    await engine.stop_all()
    return producer, bound


async def test_a_lane_batch_gives_the_lane_of_its_pairs_without_asking_the_producer() -> None:
    a = [("a", 1), ("a", 2)]
    b = [("b", 3)]
    producer, _ = await _run(
        [LaneBatch("a", [(p, p) for p in a]), LaneBatch("b", [(p, p) for p in b])], 1
    )
    assert producer.lane_calls == 0
    # each advance holds one lane's records, in order
    assert sorted(producer.advanced) == [a, b]


async def test_plain_batches_still_ask_the_lane_of_each_pair() -> None:
    pairs = [(("a", 1), ("a", 1)), (("b", 2), ("b", 2))]
    producer, _ = await _run([pairs], 1)
    assert producer.lane_calls == 2
    assert sorted(producer.advanced) == [[("a", 1)], [("b", 2)]]


async def test_the_message_id_is_asked_once_per_raw_event_whatever_the_members() -> None:
    records = [("a", i) for i in range(5)]
    producer, bound = await _run([LaneBatch("a", [(r, r) for r in records])], 3)
    assert producer.id_calls == len(records)
    assert bound == [[f"m{i}" for i in range(5)]] * 3


async def test_a_lane_batch_paused_midway_goes_on_where_it_stopped() -> None:
    # A queue of 2 pauses the poll mid-batch (overflow="pause"), several times: the
    # rest of the batch is broadcast after each pause, in order, in its lane.
    records = [("a", i) for i in range(8)]
    producer, _ = await _run(
        [LaneBatch("a", [(r, r) for r in records])],
        1,
        slow=0.01,
        max_subscriber_queue=2,
        overflow="pause",
    )
    assert [r for batch in producer.advanced for r in batch] == records


async def test_a_lane_batch_is_taken_at_once_or_pair_by_pair_alike() -> None:
    # pairs with a length are broadcast at once (one extend per member) when every
    # queue has room; pairs without (a lazy producer's) are taken one by one: members
    # see the same events, in order, and each lane is advanced in order either way
    records = [("a", i) for i in range(6)]
    at_once, bound_at_once = await _run([LaneBatch("a", [(r, r) for r in records])], 2)
    lazy, bound_lazy = await _run([LaneBatch("a", _Lazy([(r, r) for r in records]))], 2)
    assert bound_at_once == bound_lazy == [[f"m{i}" for i in range(6)]] * 2
    for producer in (at_once, lazy):
        assert [r for batch in producer.advanced for r in batch] == records


class _Lazy:
    """Pairs without a length, each made as it is taken (as a lazy producer's are)."""

    def __init__(self, pairs: list[tuple[Any, Any]]) -> None:
        self.pairs = pairs

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        yield from self.pairs
