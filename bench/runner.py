"""Persisted throughput and memory of ``acklane run`` (the real CLI, in a subprocess) on Kafka.

Throughput: ``--messages`` JSON messages are produced to a 4-partition topic on the
Kafka emulator first; then ``acklane run`` starts on a YAML pipeline with 3 watchers
(each fires once per message, the whole message decoded) and a real event store
(SQLite in a temporary directory; PostgreSQL at ``ACKLANE_BENCH_PG_URL``, default
``postgresql://postgres@127.0.0.1:5432/test``, in a fresh schema). Trigger events/s
is read from the store: rows over the span of their ``created_at`` (commit times),
so the group join and the start-up are not counted. Targets: at least 100,000 trigger
events/s to SQLite and 60,000 to PostgreSQL (PASS/MISS). The CPU column is what the
``acklane run`` process spent per trigger event (all its threads, and its main
thread, the event loop's, alone), from its first stored event on.

Same-run baseline (``--no-bare`` skips it): before each ``acklane run``, a bare loop
in this process does the same job on a topic of its own (see :func:`bare_loop`:
consume, decode and encode each body once, 3 rows per message, one INSERT and COMMIT
per batch into acklane's table with its SQLite settings, then a synchronous Kafka
commit, nothing overlapped). ``/ bare`` is acklane's rate over the bare loop's, a
ratio that the machine's load moves far less than either rate.

Memory: ``acklane run`` with 20 watchers (SQLite) over ``--rss-messages`` messages
each (default 100k, 300k and 1M): every message goes to all 20 filters, each firing
for one message in a thousand. The peak RSS of the process (``VmHWM``) after the
last one is reported for each size; bounded memory means about the same figure
whatever the size (the check compares the two largest runs: the first 200k or so
messages warm the process up), and the RSS at each tenth of the largest run shows
the plateau. librdkafka's own prefetch is bounded to 10,000 records per
partition there (``queued.min.messages``; its default, 100,000, lets the client's
buffer alone grow with the backlog up to 400,000 records on 4 partitions).

    uv run python bench/runner.py
    uv run python bench/runner.py --messages 50000 --stores sqlite --rss-messages 100000 300000
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from _pipeline import Runner, adapter_for, started_emulator, store_for, wait_for, write_config

TARGETS = {"sqlite": 100_000, "postgres": 60_000}
EVENTS = "acklane_trigger_events"
PREFETCH = 10_000  # librdkafka's queued.min.messages in the memory runs


def produce(adapter: Any, total: int, body: Any) -> float:
    started = time.monotonic()
    for start in range(0, total, 50_000):
        adapter.produce([json.dumps(body(i)) for i in range(start, min(total, start + 50_000))])
    return time.monotonic() - started


def cpu_seconds(pid: int) -> tuple[float, float]:
    """CPU seconds (user + system) the process has used so far: all its threads, and
    its main thread alone (the event loop's; the others are SQLite's worker, the
    Kafka consumer's and librdkafka's)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = main = 0.0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except FileNotFoundError:  # a thread that just ended
            continue
        fields = stat.rsplit(")", 1)[1].split()
        used = (int(fields[11]) + int(fields[12])) / tick
        total += used
        if int(tid) == pid:
            main = used
    return total, main


# -- the same-run baseline: a bare loop doing the same job -----------------------------------


def bare_loop(emulator: Any, kind: str, messages: int, timeout: float) -> tuple[int, float, float]:
    """The same job without acklane, in this process, one thread: confluent-kafka's
    consume (500 at a time), each body decoded and encoded once (msgspec), 3 rows per
    message written to the same table (acklane's schema and SQLite settings: WAL,
    synchronous=FULL) by one INSERT ... ON CONFLICT DO NOTHING per batch (PostgreSQL:
    COPY into a staging table, then INSERT ... SELECT), COMMIT, then a synchronous
    Kafka commit; nothing overlaps. Returns rows, the seconds between the first and
    the last commit (as for acklane run) and the CPU microseconds per row."""
    import msgspec
    from confluent_kafka import Consumer

    from acklane.core.events import metadata
    from acklane.core.sql import sync_engine

    adapter = adapter_for("kafka", emulator)
    try:
        produce(adapter, messages, lambda i: {"n": i})
        block = adapter.stream_block()
        settings = {
            **block["client"],
            "bootstrap.servers": block["bootstrap_servers"],
            "group.id": block["group_id"] + "-bare",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
        key = json.dumps(["kafka", block["bootstrap_servers"], block["topics"], "bare"])
        with tempfile.TemporaryDirectory(prefix=f"runner-bare-{kind}-") as tmp:
            store = store_for(kind, Path(tmp))
            engine = sync_engine(store.url)
            metadata.create_all(engine)
            engine.dispose()
            write, finish = _bare_writer(kind, store)
            consumer = Consumer(settings)
            consumer.subscribe(block["topics"])
            decode, encode = msgspec.json.Decoder().decode, msgspec.json.Encoder().encode
            names = [f"w{j}" for j in range(3)]
            rows_done = 0
            cpu = time.process_time()
            deadline = time.monotonic() + timeout
            try:
                while rows_done < 3 * messages and time.monotonic() < deadline:
                    batch = consumer.consume(500, timeout=0.1)
                    if not batch:
                        continue
                    if rows_done == 0:
                        cpu = time.process_time()
                    rows = []
                    for m in batch:
                        if m.error():
                            continue
                        text = encode(decode(m.value())).decode()
                        mid = f"{m.topic()}/{m.partition()}/{m.offset()}"
                        rows.extend((name, key, text, mid, 0) for name in names)
                    write(rows)
                    consumer.commit(asynchronous=False)
                    rows_done += len(rows)
                cpu = time.process_time() - cpu
            finally:
                consumer.close()
                finish()
            events, seconds = store.span()
            store.close()
            return events, seconds, cpu / max(events, 1) * 1e6
    finally:
        adapter.close()


def _bare_writer(kind: str, store: Any) -> tuple[Any, Any]:
    """write(rows) in one transaction stamped now, and finish(), for the bare loop."""
    from datetime import UTC, datetime
    from itertools import chain

    cols = "trigger_id, stream_key, payload, message_id, position"
    conflict = (
        " ON CONFLICT (trigger_id, message_id, position, stream_key) "
        "WHERE message_id IS NOT NULL DO NOTHING"
    )
    if kind == "sqlite":
        import sqlite3

        conn = sqlite3.connect(store.db, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")

        def write(rows: list[tuple[Any, ...]]) -> None:
            stamp = datetime.now(UTC).replace(tzinfo=None).isoformat(sep=" ")
            conn.execute("BEGIN")
            for first in range(0, len(rows), 5000):
                chunk = rows[first : first + 5000]
                values = ",".join(["(?, ?, ?, ?, ?, ?)"] * len(chunk))
                sql = f"INSERT INTO {EVENTS} ({cols}, created_at) VALUES {values}{conflict}"
                conn.execute(sql, tuple(chain.from_iterable((*r, stamp) for r in chunk)))
            conn.execute("COMMIT")

        return write, conn.close

    import psycopg

    pg = psycopg.connect(store.url)
    stage = "bare_stage"
    pg.execute(
        f"CREATE TEMPORARY TABLE {stage} (trigger_id text, stream_key text, payload text, "
        "message_id text, position integer) ON COMMIT DELETE ROWS"
    )
    pg.commit()

    def write_pg(rows: list[tuple[Any, ...]]) -> None:
        with pg.cursor() as cur:
            with cur.copy(f"COPY {stage} ({cols}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
            cur.execute(
                f"INSERT INTO {EVENTS} ({cols}, created_at) SELECT {cols}, %s FROM {stage}"
                + conflict,
                (datetime.now(UTC),),
            )
        pg.commit()

    return write_pg, pg.close


def throughput(
    emulator: Any, kind: str, messages: int, timeout: float
) -> tuple[int, float, float, float]:
    """Trigger events committed, the seconds they took (3 watchers, one store), and the
    CPU microseconds ``acklane run`` spent per event from its first stored one on, in
    all its threads and in the main one (figures a machine shared with other work
    disturbs less than the rate)."""
    adapter = adapter_for("kafka", emulator)
    try:
        produce(adapter, messages, lambda i: {"n": i})
        with tempfile.TemporaryDirectory(prefix=f"runner-{kind}-") as tmp:
            workdir = Path(tmp)
            store = store_for(kind, workdir)
            try:
                watchers = [{"name": f"w{i}", "asset": f"a{i}"} for i in range(3)]
                config = write_config(workdir, adapter.stream_block(), store.url, watchers)
                runner = Runner(config, workdir / "run.log")
                runner.start()
                try:
                    first: list[tuple[int, tuple[float, float]]] = []

                    def mark(count: int) -> None:
                        if count and not first:
                            first.append((count, cpu_seconds(runner.pid)))

                    wait_for(store, 3 * messages, runner, timeout, mark)
                    cpu_end = cpu_seconds(runner.pid)
                    events, seconds = store.span()
                    if not first:
                        return events, seconds, float("nan"), float("nan")
                    done, cpu_start = first[0]
                    per = 1e6 / (events - done)
                    return (
                        events,
                        seconds,
                        (cpu_end[0] - cpu_start[0]) * per,
                        (cpu_end[1] - cpu_start[1]) * per,
                    )
                finally:
                    runner.stop()
            finally:
                store.close()
    finally:
        adapter.close()


def peak_rss(emulator: Any, messages: int, timeout: float) -> tuple[float, float, list[float]]:
    """Peak RSS (MiB) of acklane run with 20 watchers over ``messages``, its seconds, and
    its RSS when each tenth of the messages was done."""
    adapter = adapter_for("kafka", emulator)
    try:
        produce(adapter, messages, lambda i: {"n": i, "k": i % 1000})
        with tempfile.TemporaryDirectory(prefix="runner-rss-") as tmp:
            workdir = Path(tmp)
            store = store_for("sqlite", workdir)
            try:
                watchers = [
                    {"name": f"w{j}", "asset": f"a{j}", "filter": {"match": {"body.k": j}}}
                    for j in range(20)
                ]
                stream = adapter.stream_block()
                # librdkafka prefetches up to queued.min.messages records per partition
                # (100,000 by default): its buffer alone would grow with the backlog up
                # to 400,000 records on 4 partitions. Bounded lower, what is left to
                # grow is acklane's.
                stream["client"] = {**stream["client"], "queued.min.messages": PREFETCH}
                config = write_config(workdir, stream, store.url, watchers)
                runner = Runner(config, workdir / "run.log")
                runner.start()
                try:
                    started = time.monotonic()
                    rows = 20 * (messages // 1000)
                    tenths: list[float] = []

                    def sample(count: int) -> None:
                        while len(tenths) < 10 * count // rows:
                            tenths.append(runner.rss_mb())

                    # every watcher fires for the messages whose k is its number
                    wait_for(store, rows, runner, timeout, sample)
                    tenths.append(runner.rss_mb())
                    return runner.peak_rss_mb(), time.monotonic() - started, tenths[-10:]
                finally:
                    runner.stop()
            finally:
                store.close()
    finally:
        adapter.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--stores", nargs="*", default=["sqlite", "postgres"])
    parser.add_argument(
        "--rss-messages", type=int, nargs="*", default=[100_000, 300_000, 1_000_000]
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run at most")
    parser.add_argument(
        "--no-bare", dest="bare", action="store_false", help="skip the bare-loop baseline"
    )
    args = parser.parse_args()

    verdicts = []
    with started_emulator("kafka") as emulator:
        print(f"throughput: {args.messages:,} messages, 3 watchers, 1 trigger event each")
        print(
            "(bare: the same job in one thread without acklane, see bare_loop; CPU in all "
            "threads, and in the main one)"
        )
        print(
            f"{'store':<9} {'run':<12} {'events':>9} {'seconds':>8} {'events/s':>10} "
            f"{'/ bare':>7} {'target':>8} {'CPU us/event':>13} {'main':>6}"
        )
        for kind in args.stores:
            bare: float | None = None
            if args.bare:
                rows, secs, bare_cpu = bare_loop(emulator, kind, args.messages, args.timeout)
                bare = rows / secs if secs > 0 else float("nan")
                print(
                    f"{kind:<9} {'bare loop':<12} {rows:>9,} {secs:>8.2f} {bare:>10,.0f} "
                    f"{1:>7.2f} {'':>8} {bare_cpu:>13.1f} {bare_cpu:>6.1f}",
                    flush=True,
                )
            events, seconds, cpu, main_cpu = throughput(emulator, kind, args.messages, args.timeout)
            rate = events / seconds if seconds > 0 else float("nan")
            target = TARGETS.get(kind, 0)
            ratio = f"{rate / bare:>7.2f}" if bare else f"{'':>7}"
            print(
                f"{kind:<9} {'acklane run':<12} {events:>9,} {seconds:>8.2f} {rate:>10,.0f} "
                f"{ratio} {target:>8,} {cpu:>13.1f} {main_cpu:>6.1f}",
                flush=True,
            )
            verdicts.append(
                f"{'PASS' if rate >= target else 'MISS'} Kafka -> {kind}: {rate:,.0f} trigger "
                f"events/s (target >= {target:,})"
                + (f", {rate / bare:.2f} of the bare loop in the same run" if bare else "")
            )
        if args.rss_messages:
            print("\npeak RSS of acklane run, 20 watchers (SQLite)")
            print(f"{'messages':>10} {'peak RSS MiB':>13} {'seconds':>8}")
            peaks = []
            tenths: list[float] = []
            for n in args.rss_messages:
                rss, seconds, tenths = peak_rss(emulator, n, args.timeout)
                peaks.append(rss)
                print(f"{n:>10,} {rss:>13.1f} {seconds:>8.1f}", flush=True)
            print(
                f"RSS (MiB) of the {args.rss_messages[-1]:,}-message run at each tenth of it: "
                + " ".join(f"{m:.0f}" for m in tenths)
            )
            if len(peaks) > 1:
                # the first ~200k messages warm the process up (allocator arenas, caches):
                # flat means the two largest runs peak alike
                growth = peaks[-1] / peaks[-2]
                verdicts.append(
                    f"{'PASS' if growth < 1.15 else 'MISS'} peak RSS from "
                    f"{args.rss_messages[-2]:,} to {args.rss_messages[-1]:,} messages: "
                    f"x{growth:.2f} (flat: under x1.15)"
                )
    print()
    for line in verdicts:
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
