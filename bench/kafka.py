"""Kafka: messages/s of acklane's engine against a bare loop and the filter API's floor.

Every consumer reads the same pre-produced topic on one Kafka emulator (tansu
locally, apache/kafka under Docker), each in its own consumer group, and is done
when its group has committed every message:

- bare loop: a bare ``consume(batch)`` + synchronous ``commit`` loop (auto-commit
  off, the commit after each batch), the fastest safe at-least-once loop;
- API floor: the bare loop plus only what the filter API demands (one record
  object and two async generator steps per message, no engine): the ceiling of
  any engine that keeps the API;
- bare fan-out (for N > 1 watchers): the API floor's records put on N asyncio
  queues, each drained by a task (no bookkeeping, nothing acknowledged);
- producer: ``KafkaStreamProducer`` driven directly (no engine), advancing each
  partition every 500 records: what the connector itself costs;
- engine:   ``SharedStreamManager`` with N watchers sharing one consumer
  (``KafkaMessageTrigger``), each yielding one trigger event per message that is
  confirmed persisted at once (the event store is measured in bench/event_store.py):
  the generator path, Airflow's shape;
- declarative: N YAML-style watchers (``WatcherTrigger`` with a ``filter:`` block,
  as ``acklane run`` builds them), inline (the group evaluates them as it
  broadcasts, as the runner does) and, to compare, on the generator path
  (``engine.inline_filters: false``). One watcher: no ``match``, each message
  decoded and emitted (one trigger event per message); N watchers: watcher i
  matches ``body.k == i`` (each message fires one watcher of twenty, every watcher
  evaluates every message). Each event confirmed at once, as above.

The clock starts at the first message each consumer receives (a consumer group
join is not throughput) and stops when the last commit returned (the fan-out: when
every queue is drained). Each consumer runs ``--repeat`` times, interleaved, and
its best run is shown, with its ratio to the API floor. Targets, checked at the end
(PASS/MISS): the generator path with one watcher at least 0.5 of the API floor, with
20 at least 700,000 deliveries/s (messages x watchers) or 0.6 of the bare fan-out;
one declarative watcher at least 1.0 of the API floor; twenty declarative watchers
at least 1,000,000 filter evaluations/s (messages x watchers).

    uv run python bench/kafka.py
    uv run python bench/kafka.py --messages 50000 --partitions 8 --watchers 1 5 20
    uv run python bench/kafka.py --pad 1000    # ~1 KB messages
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from acklane.connectors.kafka import (
    KafkaConfig,
    KafkaMessage,
    KafkaMessageTrigger,
    KafkaStreamProducer,
)
from acklane.core.manager import BoundEvent, SharedStreamManager
from acklane.core.pipeline.watcher import WatcherTrigger
from acklane.core.producer import AdvanceItem
from acklane.core.testing import CLEAN
from acklane.core.trigger import TriggerEvent
from acklane.integration.emulator import emulator_for
from acklane.integration.kafka import KafkaKit

TARGET_FLOOR_RATIO = 0.5  # engine with 1 watcher / API floor
TARGET_DELIVERIES = 700_000  # deliveries/s with 20 watchers ...
TARGET_FANOUT_RATIO = 0.6  # ... or this much of the bare fan-out
TARGET_DECLARATIVE_RATIO = 1.0  # one declarative watcher (inline) / API floor
TARGET_EVALUATIONS = 1_000_000  # filter evaluations/s with 20 declarative watchers
KEYS = 20  # each message's "k" is its number modulo this
BATCH = 500


@dataclass
class Result:
    name: str
    messages: int
    seconds: float
    fanout: int = 1  # subscribers each message reaches
    cpu: float = 0.0  # CPU seconds of the whole process over the call (group join included)
    main_cpu: float = 0.0  # ... of the event loop's thread alone

    @property
    def rate(self) -> float:
        return self.messages / self.seconds

    @property
    def deliveries(self) -> float:
        return self.rate * self.fanout


def fill(kit: KafkaKit, partitions: int, total: int, pad: int = 0) -> str:
    """A topic holding ``total`` JSON messages spread over ``partitions``.

    Each is ``{"n": i, "k": i % 20}`` (about 20 bytes), plus a ``"pad"`` string of
    ``pad`` bytes.
    """
    topic = kit.new_topic("bench", partitions=partitions)
    producer = Producer({"bootstrap.servers": kit.bootstrap_servers, "linger.ms": 20})
    padding = b', "pad": "%s"' % (b"x" * pad) if pad else b""
    for i in range(total):
        while True:
            try:
                value = b'{"n": %d, "k": %d%s}' % (i, i % KEYS, padding)
                producer.produce(topic, value=value, partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(60):
        raise RuntimeError("the emulator did not take every benchmark message")
    return topic


def group_settings() -> dict[str, Any]:
    return {**KafkaKit.FAST_GROUP, "fetch.wait.max.ms": 100}


def plain_consumer(kit: KafkaKit, topic: str, prefix: str) -> Consumer:
    """A confluent-kafka consumer of ``topic`` in a new group, auto-commit off."""
    consumer = Consumer(
        {
            "bootstrap.servers": kit.bootstrap_servers,
            "group.id": KafkaKit.unique(prefix),
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            **group_settings(),
        }
    )
    consumer.subscribe([topic])
    return consumer


def bare_loop(kit: KafkaKit, topic: str, total: int) -> Result:
    """consume(500) then a synchronous commit of each partition's last offset, until done."""
    consumer = plain_consumer(kit, topic, "bench-bare")
    consumed = 0
    started: float | None = None
    try:
        while consumed < total:
            messages = consumer.consume(num_messages=BATCH, timeout=0.1)
            last: dict[int, int] = {}
            for m in messages:
                if m.error() is None:
                    last[m.partition()] = m.offset()
                    consumed += 1
            if not last:
                continue
            if started is None:
                started = time.perf_counter()
            consumer.commit(
                offsets=[TopicPartition(topic, p, o + 1) for p, o in last.items()],
                asynchronous=False,
            )
        assert started is not None
        return Result("bare consume+commit", total, time.perf_counter() - started)
    finally:
        consumer.close()


async def api_floor(kit: KafkaKit, topic: str, total: int) -> Result:
    """The bare loop plus only what the filter API itself demands: no engine at all.

    Each record becomes a ``KafkaMessage`` and passes through an async generator of
    raw events into a filter (an async generator yielding one ``TriggerEvent``), as
    a watcher's filter receives it; commits as the bare loop does, on the event
    loop's thread (no hand-off). Whatever an engine keeping that API adds (fan-out,
    lanes, binding, confirmation, the pump) comes on top: this is its ceiling.
    """
    consumer = plain_consumer(kit, topic, "bench-floor")
    consumed = 0
    started: float | None = None

    async def raw_stream() -> AsyncIterator[KafkaMessage]:
        nonlocal consumed, started
        while consumed < total:
            last: dict[int, int] = {}
            for m in consumer.consume(num_messages=BATCH, timeout=0.1):
                if m.error() is None:
                    if started is None:
                        started = time.perf_counter()
                    partition, offset = m.partition(), m.offset()
                    yield KafkaMessage(m, 0, (topic, partition), offset)
                    last[partition] = offset
                    consumed += 1
            if last:
                consumer.commit(
                    offsets=[TopicPartition(topic, p, o + 1) for p, o in last.items()],
                    asynchronous=False,
                )

    watcher = BenchWatcher(**engine_config(kit, topic, "unused").model_dump(exclude_defaults=True))
    try:
        async for _event in watcher.filter_shared_stream(raw_stream()):
            pass
        assert started is not None
        return Result("API floor (no engine)", total, time.perf_counter() - started)
    finally:
        consumer.close()


async def bare_fanout(kit: KafkaKit, topic: str, total: int, n: int) -> Result:
    """The API floor's loop, each record put on ``n`` asyncio queues, each drained by a task.

    No ledger, no binding, nothing acknowledged: what handing each record to ``n``
    asyncio consumers costs at least (commits as the bare loop, after each batch).
    """
    consumer = plain_consumer(kit, topic, "bench-fanout")
    queues: list[asyncio.Queue[KafkaMessage]] = [asyncio.Queue(maxsize=1024) for _ in range(n)]
    started: float | None = None

    async def drain(q: asyncio.Queue[KafkaMessage]) -> None:
        for _ in range(total):
            await q.get()

    async def poll() -> None:
        nonlocal started
        consumed = 0
        while consumed < total:
            last: dict[int, int] = {}
            for m in consumer.consume(num_messages=BATCH, timeout=0.1):
                if m.error() is None:
                    if started is None:
                        started = time.perf_counter()
                    partition, offset = m.partition(), m.offset()
                    record = KafkaMessage(m, 0, (topic, partition), offset)
                    for q in queues:
                        if q.full():
                            await q.put(record)
                        else:
                            q.put_nowait(record)
                    last[partition] = offset
                    consumed += 1
            if last:
                consumer.commit(
                    offsets=[TopicPartition(topic, p, o + 1) for p, o in last.items()],
                    asynchronous=False,
                )
            await asyncio.sleep(0)  # let the consumers drain the batch

    try:
        async with asyncio.TaskGroup() as tg:
            for q in queues:
                tg.create_task(drain(q))
            tg.create_task(poll())
        assert started is not None
        return Result(f"bare fan-out, {n} tasks", total, time.perf_counter() - started, n)
    finally:
        consumer.close()


async def timed(run: Awaitable[Result]) -> Result:
    """``run``'s result, with the CPU time the process and this thread spent on it."""
    cpu, main_cpu = time.process_time(), time.thread_time()
    result = await run
    result.cpu = time.process_time() - cpu
    result.main_cpu = time.thread_time() - main_cpu
    return result


def engine_config(kit: KafkaKit, topic: str, prefix: str) -> KafkaConfig:
    return KafkaConfig(
        bootstrap_servers=kit.bootstrap_servers,
        topics=[topic],
        group_id=KafkaKit.unique(prefix),
        batch_size=BATCH,
        client=group_settings(),
    )


async def producer_direct(kit: KafkaKit, topic: str, total: int) -> Result:
    """The connector alone: pull records, advance each partition every BATCH records."""
    producer = KafkaStreamProducer(engine_config(kit, topic, "bench-producer"))
    stream = producer.open_stream()
    pending: dict[Hashable, list[AdvanceItem]] = {}
    advanced = 0
    started: float | None = None
    try:
        async for _raw, delivery in stream:
            if started is None:
                started = time.perf_counter()
            items = pending.setdefault(producer.get_advance_lane(delivery), [])
            items.append(AdvanceItem(delivery, CLEAN))
            if len(items) >= BATCH or advanced + sum(map(len, pending.values())) >= total:
                for lane_items in pending.values():
                    if lane_items:
                        await producer.advance(lane_items)
                        advanced += len(lane_items)
                pending = {}
            if advanced >= total:
                break
        assert started is not None
        return Result("acklane producer alone", total, time.perf_counter() - started)
    finally:
        await stream.aclose()
        await producer.aclose()


class BenchWatcher(KafkaMessageTrigger):
    """One trigger event per message, as cheap as a filter gets."""

    async def filter_shared_stream(self, stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        async for message in stream:
            yield TriggerEvent(message.offset)


async def through_engine(kit: KafkaKit, topic: str, total: int, watchers: int) -> Result:
    advanced = 0
    started: float | None = None
    done = asyncio.Event()

    def on_advance(_key: Hashable, batch: Sequence[AdvanceItem]) -> None:
        nonlocal advanced
        advanced += len(batch)
        if advanced >= total:
            done.set()

    manager = SharedStreamManager(max_subscriber_queue=1024, on_advance=on_advance)
    fields = engine_config(kit, topic, "bench-engine").model_dump(exclude_defaults=True)

    async def watch(i: int) -> None:
        nonlocal started
        trigger = BenchWatcher(**fields)
        key = trigger.shared_stream_key()
        tid = f"w{i}"
        bind = manager.bind_event
        confirm = manager.confirm_persisted
        # as the runner does: the filter's own iterator (no generator in between), each
        # event bound and confirmed (here at once, no store)
        subscription = manager.subscription(trigger_id=tid, trigger=trigger, key=key)
        try:
            async for _event in subscription.events:
                if started is None:
                    started = time.perf_counter()
                bound = bind(trigger_id=tid, key=key)
                if bound is not None:
                    confirm((bound.seq,))
        finally:
            await subscription.aclose()

    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(watch(i)) for i in range(watchers)]
        await done.wait()
        finished = time.perf_counter()
        for task in tasks:
            task.cancel()
    await manager.stop_all()
    assert started is not None
    name = f"engine, {watchers} watcher{'s' if watchers > 1 else ''}"
    return Result(name, total, finished - started, watchers)


def declarative_watchers(fields: dict[str, Any], n: int) -> list[WatcherTrigger]:
    """``n`` watchers as ``acklane run`` builds them from YAML: one emits every message's
    body; of several, watcher i matches ``body.k == i``."""
    return [
        WatcherTrigger(
            name=f"d{i}",
            stream="bench",
            connector="kafka",
            connector_config=fields,
            filter_spec={} if n == 1 else {"match": {"body.k": i}},
        )
        for i in range(n)
    ]


async def through_declarative(
    kit: KafkaKit, topic: str, total: int, watchers: int, inline: bool
) -> Result:
    """Declarative watchers under the engine, inline or on the generator path."""
    advanced = 0
    done = asyncio.Event()

    def on_advance(_key: Hashable, batch: Sequence[AdvanceItem]) -> None:
        nonlocal advanced
        advanced += len(batch)
        if advanced >= total:
            done.set()

    manager = SharedStreamManager(max_subscriber_queue=1024, on_advance=on_advance)
    fields = engine_config(kit, topic, "bench-declarative").model_dump(exclude_defaults=True)
    triggers = declarative_watchers(fields, watchers)
    confirm = manager.confirm_persisted
    first_pull: float | None = None

    def emit(_payload: Any, bound: BoundEvent | None) -> None:
        nonlocal first_pull
        if first_pull is None:  # the clock starts at the first event (not at the group join)
            first_pull = time.perf_counter()
        if bound is not None:
            confirm((bound.seq,))

    async def watch(trigger: WatcherTrigger) -> None:
        nonlocal first_pull
        key = trigger.shared_stream_key()
        tid = trigger.name
        if inline:
            # the filter as the runner passes it (its evaluator: one call per message)
            subscription = manager.inline_subscription(
                trigger_id=tid,
                trigger=trigger,
                key=key,
                evaluate=trigger.compiled_filter.evaluator,
                emit=emit,
            )
            try:
                await subscription.wait()
            finally:
                await subscription.aclose()
            return
        bind = manager.bind_event
        generator = manager.subscription(trigger_id=tid, trigger=trigger, key=key)
        try:
            async for _event in generator.events:
                if first_pull is None:  # the clock starts at the first event
                    first_pull = time.perf_counter()
                bound = bind(trigger_id=tid, key=key)
                if bound is not None:
                    confirm((bound.seq,))
        finally:
            await generator.aclose()

    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(watch(t)) for t in triggers]
        await done.wait()
        finished = time.perf_counter()
        for task in tasks:
            task.cancel()
    await manager.stop_all()
    assert first_pull is not None
    path = "inline" if inline else "generator"
    name = f"declarative {watchers}, {path}"
    return Result(name, total, finished - first_pull, watchers)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--watchers", type=int, nargs="+", default=[1, 20])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--declarative",
        type=int,
        nargs="*",
        default=[1, 20],
        help="numbers of declarative watchers to run, inline and on the generator path",
    )
    parser.add_argument(
        "--pad",
        type=int,
        default=0,
        help="bytes of padding per message (default: ~10-byte messages)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    with emulator_for("kafka") as emulator:
        kit = KafkaKit.of(emulator)
        print(
            f"Kafka emulator: {emulator.backend} ({type(emulator).__name__}) at {emulator.endpoint}"
        )
        started = time.perf_counter()
        topic = fill(kit, args.partitions, args.messages, args.pad)
        print(
            f"{args.messages} messages (+{args.pad} bytes of padding) on {args.partitions} "
            f"partitions produced in "
            f"{time.perf_counter() - started:.1f}s; best of {args.repeat} runs each\n"
        )
        best: dict[str, Result] = {}
        total = args.messages
        for _ in range(args.repeat):
            runs = [await timed(asyncio.to_thread(bare_loop, kit, topic, total))]
            runs.append(await timed(api_floor(kit, topic, total)))
            runs.append(await timed(producer_direct(kit, topic, total)))
            for n in args.watchers:
                if n > 1:
                    runs.append(await timed(bare_fanout(kit, topic, total, n)))
                runs.append(await timed(through_engine(kit, topic, total, n)))
            for n in args.declarative:
                for inline in (False, True):
                    runs.append(await timed(through_declarative(kit, topic, total, n, inline)))
            for r in runs:
                if r.name not in best or r.rate > best[r.name].rate:
                    best[r.name] = r
        kit.close()

    floor = best["API floor (no engine)"]
    print(
        f"{'consumer':<26} {'messages/s':>11} {'deliveries/s':>13} {'/ floor':>8} "
        f"{'CPU us/msg':>11} {'loop thread':>12}"
    )
    for r in best.values():
        us = 1e6 / r.messages
        print(
            f"{r.name:<26} {r.rate:>11,.0f} {r.deliveries:>13,.0f} {r.rate / floor.rate:>8.2f} "
            f"{r.cpu * us:>11.2f} {r.main_cpu * us:>12.2f}"
        )
    print(
        "(CPU: of the whole process, and of the event loop's thread, over each call, its "
        "group join included;\n a consumer whose CPU per message is near its wall time per "
        "message is CPU-bound)\n"
    )
    one = best.get("engine, 1 watcher")
    if one is not None:
        ratio = one.rate / floor.rate
        print(
            f"{'PASS' if ratio >= TARGET_FLOOR_RATIO else 'MISS'} engine, 1 watcher / API floor "
            f"= {ratio:.2f} (target >= {TARGET_FLOOR_RATIO})"
        )
    one_d = best.get("declarative 1, inline")
    if one_d is not None:
        ratio = one_d.rate / floor.rate
        print(
            f"{'PASS' if ratio >= TARGET_DECLARATIVE_RATIO else 'MISS'} one declarative "
            f"watcher (inline) / API floor = {ratio:.2f} (target >= {TARGET_DECLARATIVE_RATIO})"
        )
    many_d = best.get("declarative 20, inline")
    if many_d is not None:
        print(
            f"{'PASS' if many_d.deliveries >= TARGET_EVALUATIONS else 'MISS'} twenty "
            f"declarative watchers (inline): {many_d.deliveries:,.0f} filter evaluations/s "
            f"(target >= {TARGET_EVALUATIONS:,})"
        )
    many = best.get("engine, 20 watchers")
    fanout = best.get("bare fan-out, 20 tasks")
    if many is not None and fanout is not None:
        ratio = many.rate / fanout.rate
        ok = many.deliveries >= TARGET_DELIVERIES or ratio >= TARGET_FANOUT_RATIO
        print(
            f"{'PASS' if ok else 'MISS'} engine, 20 watchers: {many.deliveries:,.0f} "
            f"deliveries/s (target >= {TARGET_DELIVERIES:,}), {ratio:.2f} of the bare fan-out "
            f"(target >= {TARGET_FANOUT_RATIO}); either passes"
        )


if __name__ == "__main__":
    asyncio.run(main())
