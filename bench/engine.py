"""Engine throughput: ack mode, one trigger event per raw event, 1/20/100 subscribers.

Prints events/s, subscriber deliveries/s, p50/p99 broadcast-to-advance latency and
peak memory, with confirmation done in memory and through the SQLite event store,
next to a bare fan-out baseline (N asyncio queues, no bookkeeping) measured in the
same process, and the engine's ratio to it.

    uv run python bench/engine.py                 # the full table
    uv run python bench/engine.py --subscribers "" --stores "" --skip-memory-check \
        --declarative 1,20                        # declarative watchers only
    uv run python bench/engine.py --subscribers 20 --deliveries 200000 --stores memory
    (stores: memory, sqlite, postgres; PostgreSQL at ACKLANE_BENCH_PG_URL, default
    postgresql://postgres@127.0.0.1:5432/test, in a schema made and dropped per run)
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import tempfile
import time
import tracemalloc
import uuid
from collections.abc import AsyncIterator, Hashable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from acklane.core import (
    AdvanceItem,
    BaseEventTrigger,
    RawMessage,
    SharedStreamManager,
    SharedStreamProducer,
    TriggerEvent,
)
from acklane.core.manager import BoundEvent
from acklane.core.pipeline.filters import CompiledFilter, compile_filter
from acklane.core.producer import LaneBatch

BATCH = 256  # raw events per upstream poll, like a broker client's batch


class BenchProducer(SharedStreamProducer):
    def __init__(self, total: int) -> None:
        self.total = total
        self.advanced = 0
        self.done = asyncio.Event()

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        for i in range(self.total):
            yield i, i
            if i % BATCH == BATCH - 1:
                await asyncio.sleep(0)
        await asyncio.Event().wait()  # a shared stream never ends

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        self.advanced += len(batch)
        if self.advanced >= self.total:
            self.done.set()

    def message_id(self, broker_payload: Any) -> str | None:
        return str(broker_payload)


PRODUCERS: dict[str, BenchProducer] = {}


class BenchTrigger(BaseEventTrigger):
    def __init__(self, run: str) -> None:
        self.run = run

    def shared_stream_key(self) -> Hashable:
        return ("bench", self.run)

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
        return PRODUCERS[kwargs["run"]]

    async def filter_shared_stream(self, stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        async for raw in stream:
            yield TriggerEvent(raw)


class DeclarativeProducer(SharedStreamProducer):
    """JSON messages ``{"n": i, "k": i % 20}`` in LaneBatches of BATCH, as Kafka hands
    out a fetch (four lanes, in turn)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.advanced = 0
        self.done = asyncio.Event()
        self.messages = [
            RawMessage(body=b'{"n": %d, "k": %d}' % (i, i % 20), message_id=str(i))
            for i in range(total)
        ]

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        raise AssertionError("open_batches is preferred")
        yield  # pragma: no cover

    def open_batches(self) -> AsyncIterator[Any] | None:
        return self._batches()

    async def _batches(self) -> AsyncIterator[Any]:
        for start in range(0, self.total, BATCH):
            chunk = self.messages[start : start + BATCH]
            yield LaneBatch((start // BATCH) % 4, [(m, m) for m in chunk])
            await asyncio.sleep(0)
        await asyncio.Event().wait()

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        self.advanced += len(batch)
        if self.advanced >= self.total:
            self.done.set()

    def get_advance_lane(self, broker_payload: Any) -> Hashable:
        return int(broker_payload.message_id) // BATCH % 4

    def message_id(self, broker_payload: Any) -> str | None:
        return str(broker_payload.message_id)


DECLARATIVE: dict[str, DeclarativeProducer] = {}


class DeclarativeTrigger(BaseEventTrigger):
    """A YAML-style watcher: its compiled filter, run as a generator or inline."""

    def __init__(self, run: str, spec: dict[str, Any]) -> None:
        self.run = run
        self.spec = spec
        self.compiled: CompiledFilter = compile_filter(spec)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {"run": self.run})

    def shared_stream_key(self) -> Hashable:
        return ("declarative", self.run)

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
        return DECLARATIVE[kwargs["run"]]

    async def filter_shared_stream(self, stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        async for event in self.compiled.run(stream, self):
            yield event


async def declarative_run(n: int, total: int, inline: bool) -> tuple[float, float]:
    """Filter evaluations/s and CPU ns per evaluation of ``n`` declarative watchers (one:
    no match, the body emitted; several: watcher i matches ``body.k == i``), each
    event confirmed at once."""
    run = f"decl-{n}-{inline}-{uuid.uuid4().hex[:6]}"
    producer = DECLARATIVE[run] = DeclarativeProducer(total)
    manager = SharedStreamManager(max_subscriber_queue=1024, ack_timeout=300.0)
    confirm = manager.confirm_persisted
    triggers = [
        DeclarativeTrigger(run, {} if n == 1 else {"match": {"body.k": i}}) for i in range(n)
    ]
    key = triggers[0].shared_stream_key()

    def emit(_payload: Any, bound: BoundEvent | None) -> None:
        if bound is not None:
            confirm((bound.seq,))

    async def watch(i: int, trigger: DeclarativeTrigger) -> None:
        tid = f"w{i}"
        if inline:
            sub = manager.inline_subscription(
                trigger_id=tid,
                trigger=trigger,
                key=key,
                evaluate=trigger.compiled.evaluator,
                emit=emit,
            )
            try:
                await sub.wait()
            finally:
                await sub.aclose()
            return
        bind = manager.bind_event
        subscription = manager.subscription(trigger_id=tid, trigger=trigger, key=key)
        try:
            async for _event in subscription.events:
                bound = bind(trigger_id=tid, key=key)
                if bound is not None:
                    confirm((bound.seq,))
        finally:
            await subscription.aclose()

    gc.collect()
    started, cpu = time.perf_counter(), time.process_time()
    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(watch(i, t)) for i, t in enumerate(triggers)]
        await producer.done.wait()
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
        for task in tasks:
            task.cancel()
    await manager.stop_all()
    del DECLARATIVE[run]
    evaluations = total * n
    return evaluations / seconds, cpu / evaluations * 1e9


class RssSampler:
    """Peak resident memory during a run, sampled from /proc."""

    def __init__(self) -> None:
        self.peak = self.start = _rss()

    async def run(self) -> None:
        while True:
            self.peak = max(self.peak, _rss())
            await asyncio.sleep(0.02)


def _rss() -> int:
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except OSError:
        return 0
    return pages * 4096


async def bare_fanout(n: int, total: int) -> float:
    """N asyncio queues and a producer that puts every event on each: deliveries/s."""
    queues: list[asyncio.Queue[int]] = [asyncio.Queue(maxsize=1024) for _ in range(n)]
    done = asyncio.Event()
    remaining = [n]

    async def consume(q: asyncio.Queue[int]) -> None:
        for _ in range(total):
            await q.get()
        remaining[0] -= 1
        if remaining[0] == 0:
            done.set()

    async with asyncio.TaskGroup() as tg:
        for q in queues:
            tg.create_task(consume(q))
        await asyncio.sleep(0)
        start = time.perf_counter()
        for i in range(total):
            for q in queues:
                q.put_nowait(i)
            if i % BATCH == BATCH - 1:
                await asyncio.sleep(0)
        await done.wait()
        elapsed = time.perf_counter() - start
    return n * total / elapsed


async def engine_run(
    n: int, total: int, store_kind: str, run: str, *, record_latency: bool = True
) -> dict[str, float]:
    producer = PRODUCERS[run] = BenchProducer(total)
    # "pause": when the store is slower than the upstream, the poll waits for room
    # instead of failing the subscriber (the runner's default)
    manager = SharedStreamManager(max_subscriber_queue=1024, ack_timeout=300.0, overflow="pause")
    triggers = [BenchTrigger(run) for _ in range(n)]
    key = triggers[0].shared_stream_key()
    store: Any = None
    tmp = None
    schema = None
    if store_kind in ("sqlite", "postgres"):
        from acklane.core.events import EventRecord, EventStore

        if store_kind == "sqlite":
            tmp = tempfile.TemporaryDirectory()
            url = f"sqlite:///{tmp.name}/bench.db"
        else:
            schema, url = _pg_schema()
        store = EventStore(url, on_confirmed=manager.confirm_persisted)
        await store.open()
        key_text = repr(key)

    async def drive(i: int, trigger: BenchTrigger) -> None:
        tid = f"w{i}"
        bind = manager.bind_event
        confirm = manager.confirm_persisted
        async for event in manager.events(trigger_id=tid, trigger=trigger, key=key):
            bound = bind(trigger_id=tid, key=key)
            assert bound is not None
            if store is None:
                confirm((bound.seq,))
            else:
                await store.put(
                    EventRecord(tid, key_text, event.payload, bound.message_id, bound.position),
                    bound.seq,
                )

    sampler = RssSampler()
    gc.collect()
    latencies: list[float] = []
    async with asyncio.TaskGroup() as tg:
        sample_task = tg.create_task(sampler.run())
        tasks = [tg.create_task(drive(i, t)) for i, t in enumerate(triggers)]
        await asyncio.sleep(0)
        if record_latency:  # the bench's own list grows with events: off for the memory check
            manager._groups[key].latencies = latencies
        start = time.perf_counter()
        await producer.done.wait()
        elapsed = time.perf_counter() - start
        for t in tasks:
            t.cancel()
        sample_task.cancel()
    await manager.stop_all()
    if store is not None:
        await store.close()
        if tmp is not None:
            tmp.cleanup()
        if schema is not None:
            _drop_pg_schema(schema)
    latencies.sort()
    if not latencies:
        latencies = [float("nan")]
    return {
        "events_s": total / elapsed,
        "deliveries_s": n * total / elapsed,
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[int(len(latencies) * 0.99)],
        "peak_rss_mb": (sampler.peak - sampler.start) / 2**20,
    }


PG_URL = os.environ.get("ACKLANE_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")


def _pg_schema() -> tuple[str, str]:
    """A fresh schema (so every row is a real insert, not a duplicate) and its URL."""
    import psycopg

    schema = f"bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in PG_URL else "?"
    return schema, f"{PG_URL}{sep}options={quote(f'-csearch_path={schema}', safe='')}"


def _drop_pg_schema(schema: str) -> None:
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


async def traced_peak(n: int, total: int) -> float:
    """Peak Python heap (tracemalloc) of one in-memory run, in MiB."""
    tracemalloc.start()
    await engine_run(n, total, "memory", f"traced-{n}-{total}", record_latency=False)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak / 2**20


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subscribers", default="1,20,100")
    parser.add_argument("--deliveries", type=int, default=1_000_000)
    parser.add_argument("--stores", default="memory,sqlite,postgres")
    parser.add_argument("--skip-memory-check", action="store_true")
    parser.add_argument(
        "--declarative",
        default="1,20",
        help="numbers of declarative watchers, inline and as generators ('' for none)",
    )
    parser.add_argument("--messages", type=int, default=100_000, help="for --declarative")
    args = parser.parse_args()
    sizes = [int(x) for x in args.subscribers.split(",") if x]
    stores = [x for x in args.stores.split(",") if x]
    print(
        f"python {sys.version.split()[0]}; ack mode, 1 trigger event per raw event; "
        f"upstream batch {BATCH}; queue 1024"
    )
    header = (
        f"{'subs':>4} {'confirm':>7} {'events/s':>10} {'deliv/s':>10} {'bare deliv/s':>12} "
        f"{'ratio':>6} {'p50 ms':>8} {'p99 ms':>8} {'peak RSS MB':>11}"
    )
    print(header)
    print("-" * len(header))
    for n in sizes:
        total = max(5000, args.deliveries // n)
        bare = await bare_fanout(n, total)
        for kind in stores:
            total_k = total if kind == "memory" else max(5000, min(total, 200_000 // n))
            r = await engine_run(n, total_k, kind, f"{kind}-{n}")
            print(
                f"{n:>4} {kind:>7} {r['events_s']:>10,.0f} {r['deliveries_s']:>10,.0f} "
                f"{bare:>12,.0f} {r['deliveries_s'] / bare:>6.2f} {r['p50_ms']:>8.2f} "
                f"{r['p99_ms']:>8.2f} {r['peak_rss_mb']:>11.1f}"
            )
    declarative = [int(x) for x in args.declarative.split(",") if x]
    if declarative:
        print(
            f"\ndeclarative watchers, {args.messages:,} JSON messages in batches of {BATCH}, "
            "each event confirmed at once (one watcher: every message fires; twenty: "
            "watcher i matches body.k == i)"
        )
        print(f"{'watchers':>8} {'path':>9} {'evaluations/s':>14} {'CPU ns/evaluation':>18}")
        for n in declarative:
            for inline in (False, True):
                rate, ns = await declarative_run(n, args.messages, inline)
                path = "inline" if inline else "generator"
                print(f"{n:>8} {path:>9} {rate:>14,.0f} {ns:>18,.0f}", flush=True)
    if not args.skip_memory_check:
        n = 20
        small, large = 2_000, 8_000
        a = await traced_peak(n, small)
        b = await traced_peak(n, large)
        print(
            f"memory bound check ({n} subs, tracemalloc peak): {small:,} events -> {a:.2f} MiB, "
            f"{large:,} events -> {b:.2f} MiB (ratio {b / a:.2f}; bounded if ~1)"
        )


if __name__ == "__main__":
    asyncio.run(main())
