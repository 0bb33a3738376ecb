"""Kafka at a distance: the engine with one watcher against the bare loop, both through
acklane's latency proxy, at each ``--rtt-ms`` round trip (default 0 and 5 ms).

A Kafka client bootstraps, then connects to the address the broker advertises in its
metadata: tansu is started advertising the proxy's port, so every connection of
every client (the fill included) goes through the proxy. The proxy runs in a
process of its own, started again on the same port for each round trip.

The consumers are those of ``bench/kafka.py`` (its bare ``consume`` + synchronous
``commit`` loop, and ``SharedStreamManager`` with one ``KafkaMessageTrigger``
watcher), each in a group of its own, reading the same pre-produced topic. Target
(PASS/MISS): the engine at least 0.9 of the bare loop at every round trip.

    uv run python bench/kafka_rtt.py
    uv run python bench/kafka_rtt.py --messages 100000 --rtt-ms 0 2 5 10
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time

from _versus_bare import TARGET_VERSUS_BARE, latency  # the bench directory, on sys.path
from kafka import Result, bare_loop, fill, through_engine, timed

from acklane.integration.emulator import free_port
from acklane.integration.kafka import KafkaKit, TansuEmulator


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=30_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--rtt-ms", type=float, nargs="+", default=[0.0, 5.0])
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    proxy_port = free_port()
    emulator = TansuEmulator(advertised=f"127.0.0.1:{proxy_port}")
    with emulator:
        assert emulator.port is not None
        print(f"Kafka emulator: tansu at {emulator.endpoint}, advertised as 127.0.0.1:{proxy_port}")
        topic = None
        for rtt_ms in args.rtt_ms:
            with latency("127.0.0.1", emulator.port, rtt_ms, listen_port=proxy_port):
                kit = KafkaKit(f"127.0.0.1:{proxy_port}")
                try:
                    if topic is None:
                        started = time.perf_counter()
                        topic = fill(kit, args.partitions, args.messages)
                        print(
                            f"{args.messages} messages on {args.partitions} partitions produced "
                            f"in {time.perf_counter() - started:.1f}s"
                        )
                    best: dict[str, Result] = {}
                    for _ in range(args.repeat):
                        runs = [
                            await timed(asyncio.to_thread(bare_loop, kit, topic, args.messages)),
                            await timed(through_engine(kit, topic, args.messages, 1)),
                        ]
                        for r in runs:
                            if r.name not in best or r.rate > best[r.name].rate:
                                best[r.name] = r
                finally:
                    kit.close()
            bare, engine = best["bare consume+commit"], best["engine, 1 watcher"]
            ratio = engine.rate / bare.rate
            print(f"\nround trip {rtt_ms:g} ms (latency proxy), best of {args.repeat}")
            print(f"{'consumer':<26} {'messages/s':>11} {'x bare':>7}")
            for r in (bare, engine):
                print(f"{r.name:<26} {r.rate:>11,.0f} {r.rate / bare.rate:>7.2f}")
            verdict = "PASS" if ratio >= TARGET_VERSUS_BARE else "MISS"
            print(
                f"{verdict} Kafka at {rtt_ms:g} ms round trip: engine, 1 watcher / bare loop = "
                f"{ratio:.2f} (target >= {TARGET_VERSUS_BARE})"
            )


if __name__ == "__main__":
    asyncio.run(main())
