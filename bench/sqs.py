"""SQS: messages/s and SQS API calls per message, acklane against a bare loop.

Three consumers drain the same number of messages from their own queue on one
SQS emulator (moto's server locally, LocalStack under Docker):

- baseline: a bare ``ReceiveMessage`` (10, long poll) + ``DeleteMessageBatch`` loop;
- producer: ``SqsStreamProducer`` driven directly, advancing each message as its
  own lane (what the engine does on a standard queue);
- engine:   ``SharedStreamManager`` with N watchers sharing one poll, every
  trigger event confirmed persisted at once (the store is not measured here).

A feeder keeps each queue's backlog between ``--backlog`` and twice that (the
local server slows down past a few hundred messages). Each consumer runs
``--repeat`` times, interleaved, and its best run is shown. Calls counted are the
steady-state ones (receive, delete, visibility), not the start-up look-ups;
the target is at most 0.25 calls per message.

The consumers reach the emulator through acklane's latency proxy, once per
``--rtt-ms`` round trip (default 0 and 5 ms); the feeder sends directly. At each,
the engine with one watcher is compared with the bare loop (target >= 0.9).

    uv run python bench/sqs.py
    uv run python bench/sqs.py --messages 3000 --watchers 5 --rtt-ms 5
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
from typing import Any
from urllib.parse import urlsplit

import aioboto3
from _versus_bare import (  # the bench directory, not a package: found through sys.path
    CpuClock,
    Feeder,
    Result,
    add_repeat,
    add_rtt,
    arguments,
    best_of,
    engine_seconds,
    latency,
    metered,
    print_rtt_verdict,
    print_table,
    print_verdict,
    started,
    timed,
)

from acklane.connectors.sqs import SqsConfig, SqsMessageTrigger, SqsStreamProducer
from acklane.core.producer import AdvanceItem
from acklane.core.testing import CLEAN
from acklane.integration.emulator import emulator_for
from acklane.integration.sqs import SqsQueues

STEADY_OPERATIONS = ("ReceiveMessage", "DeleteMessageBatch", "ChangeMessageVisibilityBatch")


def feeder_of(queues: SqsQueues, url: str, total: int, backlog: int) -> Feeder:
    """Keeps the queue's backlog small but never empty until ``total`` messages were sent."""
    return Feeder(functools.partial(queues.send, url), total, backlog, idle=0.005)


async def bare_loop(
    settings: dict[str, Any], queues: SqsQueues, total: int, backlog: int
) -> Result:
    url = await queues.create("bench-bare")
    feeder = feeder_of(queues, url, total, backlog)
    calls = 0
    session = aioboto3.Session(
        aws_access_key_id=settings["aws_access_key_id"],
        aws_secret_access_key=settings["aws_secret_access_key"],
        region_name=settings["region"],
    )
    async with session.client("sqs", endpoint_url=settings["endpoint_url"]) as client:

        async def consume() -> None:
            nonlocal calls
            while feeder.consumed < total:
                response = await client.receive_message(
                    QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1
                )
                calls += 1
                messages = response.get("Messages", [])
                if not messages:
                    continue
                await client.delete_message_batch(
                    QueueUrl=url,
                    Entries=[
                        {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                        for i, m in enumerate(messages)
                    ],
                )
                calls += 1
                feeder.consumed += len(messages)

        seconds = await timed(feeder, consume)
    return Result("bare receive+delete", total, seconds, calls)


def steady_calls(producer: SqsStreamProducer) -> int:
    return sum(producer.api_calls[op] for op in STEADY_OPERATIONS)


async def producer_direct(
    settings: dict[str, Any], queues: SqsQueues, total: int, backlog: int
) -> Result:
    url = await queues.create("bench-producer")
    feeder = feeder_of(queues, url, total, backlog)
    producer = SqsStreamProducer(SqsConfig(queue_url=url, wait_time_seconds=1, **settings))
    stream = producer.open_stream()

    async def consume() -> None:
        async for _message, delivery in stream:
            await producer.advance([AdvanceItem(delivery, CLEAN)])  # one lane per message
            feeder.consumed += 1
            if feeder.consumed == total:
                break
        await producer.flush()

    try:
        seconds = await timed(feeder, consume)
    finally:
        await stream.aclose()
        await producer.aclose()
    return Result("acklane producer", total, seconds, steady_calls(producer))


class BenchWatcher(SqsMessageTrigger):
    producers: list[SqsStreamProducer] = []

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SqsStreamProducer:
        producer = super().create_shared_stream_producer(kwargs)
        cls.producers.append(producer)
        return producer


async def through_engine(
    settings: dict[str, Any], queues: SqsQueues, total: int, backlog: int, watchers: int
) -> Result:
    url = await queues.create("bench-engine")
    feeder = feeder_of(queues, url, total, backlog)
    BenchWatcher.producers.clear()
    stops: list[float] = []
    seconds = await engine_seconds(
        feeder,
        watchers,
        lambda: BenchWatcher(queue_url=url, wait_time_seconds=1, **settings),
        lambda: BenchWatcher.producers[0].deleted >= total,  # the last deletes landed
        poll=0.005,
        # Not timed (as the bare loop's client close is not): the stop waits out the
        # receive in flight on the now empty queue (its 1 s long poll), to release
        # what it may get. The timed span ends when the last delete has landed.
        time_the_stop=False,
        stops=stops,
    )
    [producer] = BenchWatcher.producers
    name = f"acklane engine, {watchers} watcher{'s' * (watchers > 1)}"
    result = Result(name, total, seconds, steady_calls(producer))
    result.note = f"stop {stops[0]:.2f} s, not timed"
    return result


def report(results: list[Result], rtt_ms: float) -> None:
    print_table(results)
    print_verdict("SQS", results[1:])
    base, engine = results[0], results[-1]
    print(f"acklane engine / bare loop = {engine.rate / base.rate:.2f} (messages/s)")
    one = next(r for r in results if r.name == "acklane engine, 1 watcher")
    print_rtt_verdict("SQS", rtt_ms, base, one)


async def main(args: argparse.Namespace) -> None:
    logging.getLogger("acklane.connectors.sqs").setLevel(logging.ERROR)  # no-DLQ notices
    emulator = emulator_for("sqs")
    with started(emulator, "SQS") as direct:
        where = urlsplit(direct["endpoint_url"])
        assert where.hostname is not None and where.port is not None
        counts = sorted({1, args.watchers})
        for rtt_ms in args.rtt_ms:
            with latency(where.hostname, where.port, rtt_ms) as proxy:
                settings = dict(direct, endpoint_url=f"http://{proxy.address}")
                # CPU of this process (the feeder's included), moto's and the proxy's.
                clock = CpuClock({"moto": getattr(emulator, "pid", None), "proxy": proxy.pid})

                async def one_round(
                    settings: dict[str, Any] = settings, clock: CpuClock = clock
                ) -> list[Result]:
                    n, backlog = args.messages, args.backlog
                    async with SqsQueues(direct) as queues:  # created and fed directly
                        results = [
                            await metered(clock, bare_loop(settings, queues, n, backlog)),
                            await metered(clock, producer_direct(settings, queues, n, backlog)),
                        ]
                        for w in counts:
                            results.append(
                                await metered(
                                    clock, through_engine(settings, queues, n, backlog, w)
                                )
                            )
                        return results

                print(f"\nround trip {rtt_ms:g} ms (latency proxy)")
                report(await best_of(args.repeat, one_round, show_runs=True), rtt_ms)


if __name__ == "__main__":
    parser = arguments(
        __doc__,
        messages=3000,
        backlog=(30, "queue backlog kept by the feeder"),
        watchers=(3, "watchers sharing the engine's poll"),
    )
    add_repeat(parser, 2)
    add_rtt(parser)
    asyncio.run(main(parser.parse_args()))
