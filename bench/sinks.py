"""Sinks: deliveries/s and stored -> delivered latency to a local webhook, and what a sink
costs ``acklane run``.

The receiver is ``acklane.integration.webhook`` (a real aiohttp server in its own
process, counting every event id); the store is SQLite in a temporary directory.

1. **one event per request**: ``--events`` events are stored first, then a dispatcher
   with a webhook sink (``ordered: false``, ``concurrency`` 32) delivers them; the
   rate is events over the time until the receiver has them all (target >= 3,000/s);
2. **batched**: the same with ``batch_size`` 500 and ``concurrency`` 4 and five
   times the events (target >= 30,000 events/s);
3. **latency**: events stored at 10% of the rate of (1), each with its ``time.time()``
   in the payload; the receiver takes the difference on arrival: p50 and p99 (target
   p99 < 25 ms);
4. **acklane run** with and without a webhook sink on its 3 watchers, Kafka emulator ->
   SQLite (the real CLI in a subprocess, ``bench/runner.py``'s pipeline): trigger
   events/s stored in each run, and their ratio (target >= 0.9); with the sink, also
   how long after the last event was stored the receiver had them all.

``--airflow`` also measures events/s to a real Airflow API server through the airflow
sink, one asset event per request, ordered (Airflow on SQLite takes one write at a
time): ``--airflow auto`` starts one (Airflow 3.3.2 from the ``airflow`` group, its
metadata on SQLite, the DAGs of ``tests/airflow_dags``), ``--airflow URL`` uses a running
one (``ACKLANE_BENCH_AIRFLOW_USER`` and ``..._PASSWORD``) with the asset ``--asset``.

    uv run python bench/sinks.py
    uv run python bench/sinks.py --events 5000 --skip-runner
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _pipeline import Runner, adapter_for, percentile, started_emulator, store_for, wait_for
from _pipeline import write_config as write_pipeline

from acklane.core.events import EventRecord, EventStore
from acklane.core.sinks import Dispatcher, Sink, sink_class
from acklane.integration.webhook import WebhookReceiver

TARGETS = {"single": 3_000.0, "batched": 30_000.0, "p99_ms": 25.0, "runner_ratio": 0.9}
STREAM = '["bench","orders"]'
#: The DAGs the started Airflow parses (their assets: orders, orders-by-uri, big_orders).
DAGS = Path(__file__).resolve().parents[1] / "tests" / "airflow_dags"


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def webhook(url: str, **policy: Any) -> Sink:
    cls = sink_class("webhook")
    return cls(
        cls.settings_model.model_validate({"name": "hook", "kind": "webhook", "url": url, **policy})
    )


async def fill(url: str, n: int) -> None:
    async with EventStore(url) as store:
        for i in range(n):
            await store.put(EventRecord("w", STREAM, {"n": i}, f"m-{i}", 0))
        await store.flush()


async def drain(url: str, sink: Sink, receiver: WebhookReceiver, n: int) -> float:
    """Seconds from the dispatcher's start until the receiver has ``n`` distinct events."""
    started = time.perf_counter()
    async with Dispatcher(url, [(sink, ("w",))], poll_interval=0.2):
        while receiver.stats().events < n:
            await asyncio.sleep(0.02)
        elapsed = time.perf_counter() - started
    got = receiver.stats(keys=True)
    assert got.distinct >= n, f"only {got.distinct} distinct of {n}"
    return elapsed


async def rate(workdir: Path, n: int, **policy: Any) -> float:
    url = f"sqlite:///{workdir / f'rate-{time.monotonic_ns()}.db'}"
    await fill(url, n)
    with WebhookReceiver() as receiver:
        seconds = await drain(url, webhook(receiver.url, **policy), receiver, n)
    return n / seconds


async def latency(workdir: Path, per_second: float, seconds: float) -> tuple[float, float, int]:
    """p50 and p99 (ms) of stored -> delivered at ``per_second``, and the events sent."""
    url = f"sqlite:///{workdir / 'latency.db'}"
    total = max(50, int(per_second * seconds))
    gap = 1.0 / per_second
    with WebhookReceiver() as receiver:
        sink = webhook(receiver.url, ordered=False, concurrency=8)
        async with EventStore(url) as store:
            dispatcher = Dispatcher(url, [(sink, ("w",))])
            store.add_commit_listener(dispatcher.wake)
            async with dispatcher:
                start = time.perf_counter()
                for i in range(total):
                    delay = start + i * gap - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    await store.put(
                        EventRecord("w", STREAM, {"n": i, "t": time.time()}, f"l-{i}", 0)
                    )
                await store.flush()
                while receiver.stats().events < total:
                    await asyncio.sleep(0.05)
        lat = receiver.stats(latencies=True).latencies
    return percentile(lat, 0.50) * 1000, percentile(lat, 0.99) * 1000, total


async def airflow_rate(
    workdir: Path, url: str, user: str, password: str, asset: str, n: int
) -> float:
    store = f"sqlite:///{workdir / 'airflow.db'}"
    await fill(store, n)
    cls = sink_class("airflow")
    settings = cls.settings_model.model_validate(
        {
            "name": "airflow",
            "kind": "airflow",
            "url": url,
            "username": user,
            "password": password,
            "asset": asset,
        }
    )
    sink = cls(settings)
    started = time.perf_counter()
    async with Dispatcher(store, [(sink, ("w",))], poll_interval=0.2) as d:
        while d.workers[0].stats.delivered < n:
            await asyncio.sleep(0.05)
    return n / (time.perf_counter() - started)


def runner_throughput(
    messages: int, with_sink: bool, timeout: float, *, separate: bool = False
) -> tuple[float, float | None]:
    """Trigger events/s stored by ``acklane run`` (3 watchers); with a webhook sink, also
    the seconds from the last commit until the receiver had every event."""
    with started_emulator("kafka") as emulator:
        adapter = adapter_for("kafka", emulator)
        try:
            bodies = [f'{{"n": {i}}}' for i in range(messages)]
            for start in range(0, messages, 50_000):
                adapter.produce(bodies[start : start + 50_000])
            with (
                tempfile.TemporaryDirectory(prefix="sinks-runner-") as tmp,
                WebhookReceiver() as receiver,
            ):
                workdir = Path(tmp)
                store = store_for("sqlite", workdir)
                try:
                    watchers = [{"name": f"w{i}", "asset": f"a{i}"} for i in range(3)]
                    if with_sink:
                        for w in watchers:
                            w["sinks"] = ["hook"]
                    config = write_pipeline(workdir, adapter.stream_block(), store.url, watchers)
                    if with_sink:
                        text = config.read_text()
                        text += (
                            "sinks:\n- name: hook\n  kind: webhook\n"
                            f"  url: {receiver.url}\n  ordered: false\n  concurrency: 4\n"
                            "  batch_size: 500\n"
                        )
                        config.write_text(text)
                    runner = Runner(config, workdir / "run.log")
                    deliverer = None
                    if separate:  # acklane run --no-sinks + acklane sinks run
                        runner.process.options = ("--no-sinks",)
                        deliverer = subprocess.Popen(
                            [sys.executable, "-m", "acklane.core.cli", "sinks", "run", str(config)],
                            stdout=subprocess.DEVNULL,
                            stderr=(workdir / "sinks.log").open("w"),
                        )
                    runner.start()
                    try:
                        wait_for(store, 3 * messages, runner, timeout)
                        rows, seconds = store.span()
                        behind = None
                        if with_sink:
                            stored = time.monotonic()
                            while receiver.stats().events < 3 * messages:
                                if time.monotonic() - stored > timeout:
                                    raise RuntimeError("the sink did not catch up")
                                time.sleep(0.05)
                            behind = time.monotonic() - stored
                        return rows / seconds, behind
                    finally:
                        runner.stop()
                        if deliverer is not None:
                            deliverer.terminate()
                            deliverer.wait(30)
                finally:
                    store.close()
        finally:
            adapter.close()


async def main_async(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-sinks-") as tmp:
        workdir = Path(tmp)
        single = await rate(workdir, args.events, ordered=False, concurrency=32)
        print(
            f"webhook, one event per request (concurrency 32): {single:,.0f} deliveries/s "
            f"(target >= {TARGETS['single']:,.0f}) {verdict(single >= TARGETS['single'])}",
            flush=True,
        )
        batched = await rate(workdir, args.events * 5, ordered=False, concurrency=4, batch_size=500)
        print(
            f"webhook, batches of 500 (concurrency 4): {batched:,.0f} events/s "
            f"(target >= {TARGETS['batched']:,.0f}) {verdict(batched >= TARGETS['batched'])}",
            flush=True,
        )
        load = single * 0.10
        p50, p99, sent = await latency(workdir, load, args.latency_seconds)
        print(
            f"stored -> delivered at {load:,.0f} events/s (10% of the single rate), {sent} events: "
            f"p50 {p50:.1f} ms, p99 {p99:.1f} ms (target p99 < {TARGETS['p99_ms']:g} ms) "
            f"{verdict(p99 < TARGETS['p99_ms'])}",
            flush=True,
        )
        if args.airflow == "auto":
            from acklane.integration.airflow import AirflowServer

            home = workdir / "airflow-home"
            home.mkdir()
            with AirflowServer(home, DAGS) as server:
                user = server.admin
                per_second = await airflow_rate(
                    workdir, server.url, user.username, user.password, "orders", args.airflow_events
                )
        elif args.airflow:
            per_second = await airflow_rate(
                workdir,
                args.airflow,
                os.environ.get("ACKLANE_BENCH_AIRFLOW_USER", "admin"),
                os.environ.get("ACKLANE_BENCH_AIRFLOW_PASSWORD", "admin"),
                args.asset,
                args.airflow_events,
            )
        if args.airflow:
            print(
                f"airflow sink, {args.airflow_events} asset events through the REST API: "
                f"{per_second:,.1f} events/s",
                flush=True,
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--latency-seconds", type=float, default=5.0)
    parser.add_argument("--runner-messages", type=int, default=100_000)
    parser.add_argument("--skip-runner", action="store_true")
    parser.add_argument(
        "--airflow", metavar="URL|auto", help="also an Airflow API server (auto: start one)"
    )
    parser.add_argument("--airflow-events", type=int, default=300)
    parser.add_argument("--asset", default="orders", help="the asset of --airflow")
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args()
    asyncio.run(main_async(args))
    if not args.skip_runner:
        without, _ = runner_throughput(args.runner_messages, False, args.timeout)
        for separate in (False, True):
            with_sink, behind = runner_throughput(
                args.runner_messages, True, args.timeout, separate=separate
            )
            ratio = with_sink / without
            where = (
                "delivered by acklane sinks run beside acklane run --no-sinks"
                if separate
                else "delivered in acklane run's own process"
            )
            print(
                f"acklane run, Kafka -> SQLite, 3 watchers, {args.runner_messages:,} messages: "
                f"{without:,.0f} trigger events/s without a sink, {with_sink:,.0f} with a "
                f"webhook sink (batches of 500, {where}): ratio {ratio:.2f} (target >= "
                f"{TARGETS['runner_ratio']}) {verdict(ratio >= TARGETS['runner_ratio'])}; the "
                f"receiver had every event {behind:.1f} s after the last was stored",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
