"""Pub/Sub: messages/s and Pub/Sub API calls per message, acklane against a bare loop.

Three consumers drain the same number of messages from their own subscription
on one emulator (acklane's own; Google's image under
``ACKLANE_EMULATOR_BACKEND=docker``):

- baseline: a bare ``SubscriberAsyncClient`` loop: ``Pull`` (``--max-messages``)
  then one ``Acknowledge`` for what came;
- engine, 1 watcher: ``SharedStreamManager`` with ``PubSubMessageTrigger``, every
  trigger event confirmed persisted at once (the store is not measured here);
- engine, ``--watchers`` watchers (20 by default) sharing that one pull.

A feeder keeps each subscription's backlog between ``--backlog`` and twice that.
Each consumer runs ``--repeat`` times, interleaved, and its best run is shown.
Calls are the producer's ``api_calls`` counter (``counters()``): every Pull,
Acknowledge, ModifyAckDeadline, Publish and GetSubscription, start-up included;
the bare loop counts its own Pull and Acknowledge calls. The target is at most
0.25 calls per message (PASS/MISS).

    uv run python bench/pubsub.py
    uv run python bench/pubsub.py --messages 5000 --watchers 20 --repeat 3
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from acklane.connectors.pubsub import PubSubMessageTrigger, PubSubStreamProducer
from acklane.core.connectors import Action
from acklane.core.manager import SharedStreamManager
from acklane.integration.emulator import BACKEND_ENV, emulator_for
from acklane.integration.pubsub import PubSubKit, subscriber_client

TARGET_CALLS_PER_MESSAGE = 0.25


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
    """Keeps a topic's backlog bounded but never empty until ``total`` messages were sent."""

    def __init__(self, kit: PubSubKit, topic: str, total: int, backlog: int) -> None:
        self.kit, self.topic, self.total, self.backlog = kit, topic, total, backlog
        self.sent = 0
        self.consumed = 0

    async def prefill(self) -> None:
        await self._send(min(2 * self.backlog, self.total))

    async def run(self) -> None:
        while self.sent < self.total:
            if self.sent - self.consumed < self.backlog:
                await self._send(min(self.backlog, self.total - self.sent))
            else:
                await asyncio.sleep(0.002)

    async def _send(self, n: int) -> None:
        await self.kit.publish(self.topic, (f'{{"n": {self.sent + i}}}' for i in range(n)))
        self.sent += n


async def timed(feeder: Feeder, consume: Callable[[], Any]) -> float:
    """Seconds from the prefill to the last ack (``consume`` may return that moment)."""
    await feeder.prefill()
    started = time.perf_counter()
    async with asyncio.TaskGroup() as tg:
        tg.create_task(feeder.run())
        done = await consume()
    return (done or time.perf_counter()) - started


async def new_subscription(
    kit: PubSubKit, prefix: str, total: int, backlog: int
) -> tuple[str, Feeder]:
    topic = await kit.create_topic(prefix)
    subscription = await kit.create_subscription(topic, f"{prefix}-sub", ack_deadline=10)
    return subscription, Feeder(kit, topic, total, backlog)


async def bare_loop(kit: PubSubKit, total: int, backlog: int, max_messages: int) -> Result:
    subscription, feeder = await new_subscription(kit, "bench-bare", total, backlog)
    client = subscriber_client(kit.host)
    calls = 0

    async def consume() -> None:
        nonlocal calls
        while feeder.consumed < total:
            response = await client.pull(subscription=subscription, max_messages=max_messages)
            calls += 1
            ack_ids = [r.ack_id for r in response.received_messages]
            if not ack_ids:
                continue
            await client.acknowledge(subscription=subscription, ack_ids=ack_ids)
            calls += 1
            feeder.consumed += len(ack_ids)

    try:
        seconds = await timed(feeder, consume)
    finally:
        with contextlib.suppress(Exception):
            await client.transport.close()
    return Result("bare pull+ack", total, seconds, calls)


class BenchWatcher(PubSubMessageTrigger):
    producers: ClassVar[list[PubSubStreamProducer]] = []

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> PubSubStreamProducer:
        producer = super().create_shared_stream_producer(kwargs)
        assert isinstance(producer, PubSubStreamProducer)
        cls.producers.append(producer)
        return producer


async def through_engine(
    kit: PubSubKit,
    settings: dict[str, Any],
    total: int,
    backlog: int,
    watchers: int,
    max_messages: int,
) -> Result:
    subscription, feeder = await new_subscription(kit, "bench-engine", total, backlog)
    manager = SharedStreamManager(max_subscriber_queue=1024, ack_timeout=300.0)
    BenchWatcher.producers.clear()
    seen = [0] * watchers
    all_seen = asyncio.Event()

    async def watch(i: int) -> None:
        trigger = BenchWatcher(subscription=subscription, max_messages=max_messages, **settings)
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

    async def consume() -> float:
        async with asyncio.TaskGroup() as tg:
            for i in range(watchers):
                tg.create_task(watch(i))
            await all_seen.wait()
            producer = BenchWatcher.producers[0]
            while producer.acked < total:  # the last acks land
                await asyncio.sleep(0.001)
            done = time.perf_counter()
            # Not timed: the stop lets the pull in flight on the now empty subscription
            # finish (the emulator answers an empty pull after 2 s), to release what it got.
            await manager.stop_all()
        return done

    seconds = await timed(feeder, consume)
    [producer] = BenchWatcher.producers
    calls = int(producer.counters()[Action.API_CALLS])
    name = f"acklane engine, {watchers} watcher{'s' if watchers > 1 else ''}"
    return Result(name, total, seconds, calls)


def report(results: list[Result]) -> None:
    base = results[0]
    print(f"{'consumer':<30} {'msgs':>6} {'msgs/s':>9} {'x base':>7} {'calls/msg':>10}")
    for r in results:
        print(
            f"{r.name:<30} {r.messages:>6} {r.rate:>9.1f} {r.rate / base.rate:>7.2f} "
            f"{r.calls_per_message:>10.3f}"
        )
    engine = results[1:]
    if len(engine) == 2:
        print(f"{engine[1].name} / {engine[0].name}: {engine[1].rate / engine[0].rate:.2f}x")
    worst = max(r.calls_per_message for r in engine)
    verdict = "PASS" if worst <= TARGET_CALLS_PER_MESSAGE else "MISS"
    print(
        f"{verdict} acklane Pub/Sub calls/message = {worst:.3f} at worst "
        f"(target <= {TARGET_CALLS_PER_MESSAGE})"
    )
    print(f"acklane engine, 1 watcher / bare loop = {engine[0].rate / base.rate:.2f} (messages/s)")


async def main(args: argparse.Namespace) -> None:
    logging.getLogger("acklane.connectors.pubsub").setLevel(logging.ERROR)  # no-DLQ notices
    import os

    backend = "docker" if os.environ.get(BACKEND_ENV, "").strip().lower() == "docker" else "local"
    emulator = emulator_for("pubsub", backend)
    emulator.start()
    try:
        settings = emulator.client_settings()
        print(f"Pub/Sub emulator: {emulator.backend} at {emulator.endpoint}")
        runs: list[list[Result]] = []
        for _ in range(args.repeat):  # interleaved, so a busy moment hurts all alike
            async with PubSubKit(settings) as kit:
                n, backlog, size = args.messages, args.backlog, args.max_messages
                runs.append(
                    [
                        await bare_loop(kit, n, backlog, size),
                        await through_engine(kit, settings, n, backlog, 1, size),
                        await through_engine(kit, settings, n, backlog, args.watchers, size),
                    ]
                )
        print(f"best of {args.repeat} runs per consumer, max_messages={args.max_messages}")
        report([max(column, key=lambda r: r.rate) for column in zip(*runs, strict=True)])
    finally:
        with contextlib.suppress(Exception):
            emulator.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=3000, help="messages per consumer")
    parser.add_argument("--backlog", type=int, default=300, help="backlog kept by the feeder")
    parser.add_argument(
        "--watchers", type=int, default=20, help="watchers sharing the engine's pull"
    )
    parser.add_argument(
        "--max-messages", type=int, default=100, help="messages per Pull (bare loop and connector)"
    )
    parser.add_argument("--repeat", type=int, default=2, help="runs per consumer; the best counts")
    asyncio.run(main(parser.parse_args()))
