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

    uv run python bench/sqs.py
    uv run python bench/sqs.py --messages 3000 --watchers 5
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aioboto3

from acklane.connectors.sqs import SqsConfig, SqsMessageTrigger, SqsStreamProducer
from acklane.core.manager import SharedStreamManager
from acklane.core.producer import AdvanceItem, AdvanceOutcome
from acklane.integration.emulator import emulator_for
from acklane.integration.sqs import SqsQueues

STEADY_OPERATIONS = ("ReceiveMessage", "DeleteMessageBatch", "ChangeMessageVisibilityBatch")
TARGET_CALLS_PER_MESSAGE = 0.25
CLEAN = AdvanceOutcome(acked=1, failed=0)


@dataclass
class Result:
    name: str
    messages: int
    seconds: float
    calls: int

    @property
    def rate(self) -> float:
        return self.messages / self.seconds

    @property
    def calls_per_message(self) -> float:
        return self.calls / self.messages


class Feeder:
    """Keeps a queue's backlog small but never empty until ``total`` messages were sent."""

    def __init__(self, queues: SqsQueues, url: str, total: int, backlog: int) -> None:
        self.queues, self.url, self.total, self.backlog = queues, url, total, backlog
        self.sent = 0
        self.consumed = 0

    async def prefill(self) -> None:
        await self._send(min(2 * self.backlog, self.total))

    async def run(self) -> None:
        while self.sent < self.total:
            if self.sent - self.consumed < self.backlog:
                await self._send(min(self.backlog, self.total - self.sent))
            else:
                await asyncio.sleep(0.005)

    async def _send(self, n: int) -> None:
        await self.queues.send(self.url, (f'{{"n": {self.sent + i}}}' for i in range(n)))
        self.sent += n


async def timed(feeder: Feeder, consume: Callable[[], Any]) -> float:
    await feeder.prefill()
    started = time.perf_counter()
    async with asyncio.TaskGroup() as tg:
        tg.create_task(feeder.run())
        await consume()
    return time.perf_counter() - started


async def bare_loop(
    settings: dict[str, Any], queues: SqsQueues, total: int, backlog: int
) -> Result:
    url = await queues.create("bench-bare")
    feeder = Feeder(queues, url, total, backlog)
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
    feeder = Feeder(queues, url, total, backlog)
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
    feeder = Feeder(queues, url, total, backlog)
    manager = SharedStreamManager(max_subscriber_queue=1024, ack_timeout=300.0)
    BenchWatcher.producers.clear()
    seen = [0] * watchers
    all_seen = asyncio.Event()

    async def watch(i: int) -> None:
        trigger = BenchWatcher(queue_url=url, wait_time_seconds=1, **settings)
        key = trigger.shared_stream_key()
        events: AsyncIterator[Any] = manager.events(trigger_id=f"w{i}", trigger=trigger, key=key)
        async for _event in events:
            seq = manager.bind_pending_event(trigger_id=f"w{i}", key=key)
            if seq is not None:
                manager.confirm_persisted([seq])
            seen[i] += 1
            if i == 0:
                feeder.consumed = seen[0]
            if min(seen) >= total:
                all_seen.set()

    async def consume() -> None:
        async with asyncio.TaskGroup() as tg:
            for i in range(watchers):
                tg.create_task(watch(i))
            await all_seen.wait()
            producer = BenchWatcher.producers[0]
            while producer.deleted < total:  # the last advances land
                await asyncio.sleep(0.005)
            await manager.stop_all()

    seconds = await timed(feeder, consume)
    [producer] = BenchWatcher.producers
    return Result(f"acklane engine, {watchers} watchers", total, seconds, steady_calls(producer))


def report(results: list[Result]) -> None:
    base = results[0]
    print(f"{'consumer':<30} {'msgs':>6} {'msgs/s':>9} {'x base':>7} {'calls/msg':>10}")
    for r in results:
        print(
            f"{r.name:<30} {r.messages:>6} {r.rate:>9.1f} {r.rate / base.rate:>7.2f} "
            f"{r.calls_per_message:>10.3f}"
        )
    worst = max(r.calls_per_message for r in results[1:])
    verdict = "PASS" if worst <= TARGET_CALLS_PER_MESSAGE else "MISS"
    print(
        f"{verdict} acklane SQS calls/message = {worst:.3f} at worst "
        f"(target <= {TARGET_CALLS_PER_MESSAGE})"
    )
    engine = results[-1]
    print(f"acklane engine / bare loop = {engine.rate / base.rate:.2f} (messages/s)")


async def main(args: argparse.Namespace) -> None:
    logging.getLogger("acklane.connectors.sqs").setLevel(logging.ERROR)  # no-DLQ notices
    emulator = emulator_for("sqs")
    emulator.start()
    try:
        settings = emulator.client_settings()
        print(f"SQS emulator: {emulator.backend} at {emulator.endpoint}")
        runs: list[list[Result]] = []
        for _ in range(args.repeat):  # interleaved, so a busy moment hurts all alike
            async with SqsQueues(settings) as queues:
                runs.append(
                    [
                        await bare_loop(settings, queues, args.messages, args.backlog),
                        await producer_direct(settings, queues, args.messages, args.backlog),
                        await through_engine(
                            settings, queues, args.messages, args.backlog, args.watchers
                        ),
                    ]
                )
        print(f"best of {args.repeat} runs per consumer")
        report([max(column, key=lambda r: r.rate) for column in zip(*runs, strict=True)])
    finally:
        with contextlib.suppress(Exception):
            emulator.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1000, help="messages per consumer")
    parser.add_argument("--backlog", type=int, default=30, help="queue backlog kept by the feeder")
    parser.add_argument(
        "--watchers", type=int, default=3, help="watchers sharing the engine's poll"
    )
    parser.add_argument("--repeat", type=int, default=3, help="runs per consumer; the best counts")
    asyncio.run(main(parser.parse_args()))
