"""Kafka path, CPU only: instructions per record under callgrind, no broker, no noise.

What the engine and the Kafka producer cost per record, measured deterministically
(``valgrind --tool=callgrind`` instruction counts), so that an optimisation can be
judged on a shared, noisy machine. The consumer is a stand-in holding real
confluent-kafka ``Message`` objects (runs of 125 records of each of 4 partitions,
as a fetch returns them), so everything above librdkafka runs for real:

- floor:    the API floor of bench/kafka.py (a ``KafkaMessage`` per record through an
  async generator into a filter yielding one ``TriggerEvent``), no engine;
- producer: ``KafkaStreamProducer.open_batches`` driven directly, advancing each run;
- engine1 / engine20: ``SharedStreamManager`` with 1 or 20 watchers, each event
  bound and confirmed at once (as bench/kafka.py does): the generator path, Airflow's
  shape;
- fanout20: the floor's records put on 20 asyncio queues, each drained by a task (the
  bare fan-out of bench/kafka.py, engine20's baseline), no engine;
- decl1 / decl20: declarative (YAML) watchers evaluated inline by the group, as
  ``acklane run`` runs them (``compiled_filter.evaluator``), each event confirmed at
  once: one watcher emitting every body; twenty, watcher i matching ``body.k == i``
  (each message fires one, every watcher evaluates it).

Each is run at two sizes in its own process under callgrind; the difference over
the difference in records, less the same for building the messages, is the cost
of one record (engine20, fanout20 and decl20: of one record delivered to 20
watchers). The ratios floor/engine1, floor/decl1, floor/producer and
fanout20/engine20 track the ratios bench/kafka.py measures.

    uv run python bench/kafka_cpu.py                  # needs valgrind (apt-get install valgrind)
    uv run python bench/kafka_cpu.py --only floor engine1 decl1
    uv run python bench/kafka_cpu.py --run engine1 100000   # one run, wall clock, no valgrind
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Hashable
from pathlib import Path
from typing import Any

from confluent_kafka import Message, TopicPartition

from acklane.connectors.kafka import (
    KafkaConfig,
    KafkaMessage,
    KafkaMessageTrigger,
    KafkaStreamProducer,
)
from acklane.core.manager import BoundEvent, SharedStreamManager
from acklane.core.pipeline.watcher import WatcherTrigger
from acklane.core.producer import AdvanceItem, AdvanceOutcome
from acklane.core.trigger import TriggerEvent

TOPIC = "bench"
PARTITIONS = 4
RUN = 125  # records of one partition in a row, as a fetch holds them
BATCH = 500
VARIANTS = {"floor": (10_000, 30_000), "producer": (10_000, 30_000)}
VARIANTS |= {"engine1": (10_000, 30_000), "engine20": (3_000, 9_000)}
VARIANTS |= {"fanout20": (3_000, 9_000), "decl1": (10_000, 30_000), "decl20": (3_000, 9_000)}
KEYS = 20  # each message's "k" is its number modulo this (as in bench/kafka.py)
MESSAGES: list[Any] = []


def make_messages(total: int) -> list[Any]:
    offsets = [0] * PARTITIONS
    out = []
    for i in range(total):
        p = (i // RUN) % PARTITIONS
        value = b'{"n": %d, "k": %d}' % (i, i % KEYS)
        out.append(Message(topic=TOPIC, partition=p, offset=offsets[p], value=value))
        offsets[p] += 1
    return out


class StandInConsumer:
    """Hands out MESSAGES in order; commits succeed at once."""

    def __init__(self) -> None:
        self.position = 0

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Any]:
        out = MESSAGES[self.position : self.position + num_messages]
        self.position += len(out)
        if not out and timeout:
            time.sleep(min(timeout, 0.001))
        return out

    def commit(self, offsets: Any = None, asynchronous: bool = True) -> Any:
        return offsets

    def pause(self, partitions: Any) -> None:
        pass

    def resume(self, partitions: Any) -> None:
        pass

    def close(self) -> None:
        pass


class StandInProducer(KafkaStreamProducer):
    def _connect(self) -> None:
        self._consumer = consumer = StandInConsumer()
        self._cluster_id = "bench"
        self._on_assign(consumer, [TopicPartition(TOPIC, p) for p in range(PARTITIONS)])


def config() -> KafkaConfig:
    return KafkaConfig(bootstrap_servers="127.0.0.1:9", topics=[TOPIC], group_id="g")


class BenchWatcher(KafkaMessageTrigger):
    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> KafkaStreamProducer:
        return StandInProducer(KafkaConfig(**kwargs))

    async def filter_shared_stream(self, stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        async for message in stream:
            yield TriggerEvent(message.offset)


async def floor(total: int) -> None:
    consumer = StandInConsumer()
    consumed = 0

    async def raw_stream() -> AsyncIterator[KafkaMessage]:
        nonlocal consumed
        while consumed < total:
            last: dict[int, int] = {}
            for m in consumer.consume(num_messages=BATCH, timeout=0.1):
                if m.error() is None:
                    partition, offset = m.partition(), m.offset()
                    yield KafkaMessage(m, 0, (TOPIC, partition), offset)
                    last[partition] = offset
                    consumed += 1
            if last:
                consumer.commit(
                    offsets=[TopicPartition(TOPIC, p, o + 1) for p, o in last.items()],
                    asynchronous=False,
                )

    watcher = BenchWatcher(**config().model_dump(exclude_defaults=True))
    async for _event in watcher.filter_shared_stream(raw_stream()):
        pass


async def producer(total: int) -> None:
    clean = AdvanceOutcome(1, 0)
    stand_in = StandInProducer(config())
    batches = stand_in.open_batches()
    advanced = 0
    async for batch in batches:
        items = [AdvanceItem(payload, clean) for _raw, payload in batch.pairs]
        await stand_in.advance(items)
        advanced += len(items)
        if advanced >= total:
            break
    await batches.aclose()
    await stand_in.aclose()


async def engine(total: int, watchers: int) -> None:
    advanced = 0
    done = asyncio.Event()

    def on_advance(_key: Hashable, batch: Any) -> None:
        nonlocal advanced
        advanced += len(batch)
        if advanced >= total:
            done.set()

    manager = SharedStreamManager(max_subscriber_queue=1024, on_advance=on_advance)
    fields = config().model_dump(exclude_defaults=True)

    async def watch(i: int) -> None:
        trigger = BenchWatcher(**fields)
        key = trigger.shared_stream_key()
        tid = f"w{i}"
        bind = manager.bind_event
        confirm = manager.confirm_persisted
        # as the runner drives it: the filter's own iterator, no generator in between
        subscription = manager.subscription(trigger_id=tid, trigger=trigger, key=key)
        try:
            async for _event in subscription.events:
                bound = bind(trigger_id=tid, key=key)
                if bound is not None:
                    confirm((bound.seq,))
        finally:
            await subscription.aclose()

    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(watch(i)) for i in range(watchers)]
        await done.wait()
        for task in tasks:
            task.cancel()
    await manager.stop_all()


async def fanout(total: int, n: int) -> None:
    """The floor's loop, each record put on ``n`` queues, each drained by a task."""
    consumer = StandInConsumer()
    queues: list[asyncio.Queue[KafkaMessage]] = [asyncio.Queue(maxsize=1024) for _ in range(n)]

    async def drain(q: asyncio.Queue[KafkaMessage]) -> None:
        for _ in range(total):
            await q.get()

    async def poll() -> None:
        consumed = 0
        while consumed < total:
            last: dict[int, int] = {}
            for m in consumer.consume(num_messages=BATCH, timeout=0.1):
                if m.error() is None:
                    partition, offset = m.partition(), m.offset()
                    record = KafkaMessage(m, 0, (TOPIC, partition), offset)
                    for q in queues:
                        if q.full():
                            await q.put(record)
                        else:
                            q.put_nowait(record)
                    last[partition] = offset
                    consumed += 1
            if last:
                consumer.commit(
                    offsets=[TopicPartition(TOPIC, p, o + 1) for p, o in last.items()],
                    asynchronous=False,
                )
            await asyncio.sleep(0)

    async with asyncio.TaskGroup() as tg:
        for q in queues:
            tg.create_task(drain(q))
        tg.create_task(poll())


class BenchDeclarative(WatcherTrigger):
    """A YAML watcher on the stand-in consumer (its filter is evaluated inline)."""

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> KafkaStreamProducer:
        return StandInProducer(KafkaConfig(**kwargs["connector_config"]))


async def declarative(total: int, watchers: int) -> None:
    advanced = 0
    done = asyncio.Event()

    def on_advance(_key: Hashable, batch: Any) -> None:
        nonlocal advanced
        advanced += len(batch)
        if advanced >= total:
            done.set()

    manager = SharedStreamManager(max_subscriber_queue=1024, on_advance=on_advance)
    fields = config().model_dump(exclude_defaults=True)
    confirm = manager.confirm_persisted

    def emit(_payload: Any, bound: BoundEvent | None) -> None:
        if bound is not None:
            confirm((bound.seq,))

    async def watch(i: int) -> None:
        trigger = BenchDeclarative(
            name=f"d{i}",
            stream="bench",
            connector="kafka",
            connector_config=fields,
            filter_spec={} if watchers == 1 else {"match": {"body.k": i}},
        )
        assert trigger.inline
        subscription = manager.inline_subscription(
            trigger_id=trigger.name,
            trigger=trigger,
            key=trigger.shared_stream_key(),
            evaluate=trigger.compiled_filter.evaluator,  # as the runner does
            emit=emit,
        )
        try:
            await subscription.wait()
        finally:
            await subscription.aclose()

    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(watch(i)) for i in range(watchers)]
        await done.wait()
        for task in tasks:
            task.cancel()
    await manager.stop_all()


def run_one(variant: str, total: int) -> float:
    """Build the messages, run ``variant`` over them; records/s (wall clock)."""
    MESSAGES[:] = make_messages(total)
    gc.collect()
    started = time.perf_counter()
    if variant == "floor":
        asyncio.run(floor(total))
    elif variant == "producer":
        asyncio.run(producer(total))
    elif variant.startswith("engine"):
        asyncio.run(engine(total, int(variant.removeprefix("engine"))))
    elif variant.startswith("fanout"):
        asyncio.run(fanout(total, int(variant.removeprefix("fanout"))))
    elif variant.startswith("decl"):
        asyncio.run(declarative(total, int(variant.removeprefix("decl"))))
    elif variant != "none":
        raise SystemExit(f"unknown variant {variant!r}")
    return total / (time.perf_counter() - started)


def instructions(variant: str, total: int) -> int:
    """Instructions of one run of ``variant`` under callgrind."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        done = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={out}",
                sys.executable,
                __file__,
                "--run",
                variant,
                str(total),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count from callgrind:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def per_record(variant: str, small: int, large: int) -> float:
    return (instructions(variant, large) - instructions(variant, small)) / (large - small)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--run", nargs=2, metavar=("VARIANT", "RECORDS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        rate = run_one(args.run[0], int(args.run[1]))
        print(f"{args.run[0]}: {rate:,.0f} records/s (wall clock)", file=sys.stderr)
        return 0
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    setup = {sizes: per_record("none", *sizes) for sizes in set(VARIANTS.values())}
    costs = {}
    print(f"{'variant':<9} {'instructions/record':>20} {'/ floor':>8}")
    for variant in args.only:
        sizes = VARIANTS[variant]
        costs[variant] = per_record(variant, *sizes) - setup[sizes]
        ratio = costs[variant] / costs["floor"] if "floor" in costs else float("nan")
        print(f"{variant:<9} {costs[variant]:>20,.0f} {ratio:>8.2f}", flush=True)
    print()
    # the ratios bench/kafka.py measures in messages/s, here in instructions: the
    # baseline's per record over the variant's (1.0 = as cheap as the baseline)
    for variant, baseline, what in (
        ("producer", "floor", "acklane producer alone / API floor"),
        ("engine1", "floor", "engine, 1 watcher (generator path) / API floor"),
        ("decl1", "floor", "one declarative watcher (inline) / API floor"),
        ("engine20", "fanout20", "engine, 20 watchers (generator path) / bare fan-out"),
    ):
        if variant in costs and baseline in costs:
            print(f"{what}: {costs[baseline] / costs[variant]:.2f} (CPU-only ratio)")
    for variant in ("engine20", "fanout20", "decl20"):
        if variant in costs:
            print(f"{variant} per delivery: {costs[variant] / 20:,.0f} instructions")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
