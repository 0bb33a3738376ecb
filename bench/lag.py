"""What reading the lag costs a running pipeline: ``acklane run`` on Kafka with the
backlog probe off (``engine.lag_interval: 0``) and reading every 0.5 s (ten times the
default's rate, with ``lag_end_offsets: last_batch``, the dearer way, one fetch of a
batch per partition and read).

``--messages`` JSON messages are produced to a 4-partition topic on the Kafka emulator,
then ``acklane run`` (the real CLI, a subprocess) consumes them with 3 watchers into
SQLite; trigger events/s from the rows' commit times, as ``bench/runner.py`` measures
them. The two settings alternate (off, on, off, on, ...) so that a busy moment of the
machine falls on both; the best of each and their ratio are printed. Then the
probe alone: the wall and CPU time of one read of a 4-partition topic, both ways
(``--reads`` reads each).

    uv run python bench/lag.py
    uv run python bench/lag.py --messages 30000 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from _pipeline import Runner, adapter_for, started_emulator, store_for, wait_for, write_config


def once(emulator: Any, messages: int, lag_interval: float, timeout: float) -> float:
    """Trigger events/s of one run."""
    adapter = adapter_for("kafka", emulator)
    try:
        for start in range(0, messages, 50_000):
            end = min(messages, start + 50_000)
            adapter.produce([json.dumps({"n": i}) for i in range(start, end)])
        with tempfile.TemporaryDirectory(prefix="lag-bench-") as tmp:
            workdir = Path(tmp)
            store = store_for("sqlite", workdir)
            try:
                stream = {**adapter.stream_block(), "lag_end_offsets": "last_batch"}
                watchers = [{"name": f"w{i}", "asset": f"a{i}"} for i in range(3)]
                config = write_config(workdir, stream, store.url, watchers)
                document = yaml.safe_load(config.read_text())
                document["engine"]["lag_interval"] = lag_interval
                config.write_text(yaml.safe_dump(document, sort_keys=False))
                runner = Runner(config, workdir / "run.log")
                runner.start()
                try:
                    wait_for(store, 3 * messages, runner, timeout)
                    events, seconds = store.span()
                finally:
                    runner.stop()
            finally:
                store.close()
    finally:
        adapter.close()
    return events / seconds if seconds > 0 else float("nan")


def probe_reads(emulator: Any, reads: int) -> dict[str, tuple[float, float]]:
    """Milliseconds of wall and CPU time per read of a 4-partition topic, by mode."""
    from acklane.connectors.kafka import KafkaConfig
    from acklane.connectors.kafka._lag import KafkaBacklogProbe

    adapter = adapter_for("kafka", emulator)
    try:
        adapter.produce([json.dumps({"n": i}) for i in range(10_000)])
        block = adapter.stream_block()
        out = {}
        for mode in ("broker", "last_batch"):
            config = KafkaConfig(
                bootstrap_servers=block["bootstrap_servers"],
                topics=block["topics"],
                group_id=block["group_id"],
                lag_end_offsets=mode,
            )

            async def measure(config: KafkaConfig = config) -> tuple[float, float]:
                probe = KafkaBacklogProbe(config)
                try:
                    await probe.read()  # connect first
                    wall, cpu = time.perf_counter(), time.process_time()
                    for _ in range(reads):
                        await probe.read()
                    return (
                        (time.perf_counter() - wall) * 1000 / reads,
                        (time.process_time() - cpu) * 1000 / reads,
                    )
                finally:
                    await probe.aclose()

            out[mode] = asyncio.run(measure())
        return out
    finally:
        adapter.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--reads", type=int, default=20)
    args = parser.parse_args()
    rates: dict[str, list[float]] = {"off": [], "on": []}
    with started_emulator("kafka") as emulator:
        print(f"{args.messages:,} messages, 3 watchers, SQLite; lag off vs read every 0.5 s")
        for round_ in range(args.rounds):
            for name, interval in (("off", 0.0), ("on", 0.5)):
                rate = once(emulator, args.messages, interval, args.timeout)
                rates[name].append(rate)
                print(f"round {round_ + 1} lag {name:<3} {rate:>10,.0f} events/s", flush=True)
        for mode, (wall, cpu) in probe_reads(emulator, args.reads).items():
            print(f"one probe read ({mode}, 4 partitions): {wall:.1f} ms wall, {cpu:.1f} ms CPU")
    off, on = max(rates["off"]), max(rates["on"])
    print(f"best: off {off:,.0f}  on {on:,.0f}  on/off {on / off:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
