"""Pub/Sub: messages/s and Pub/Sub API calls per message, acklane against a bare loop.

Three consumers drain the same number of messages from their own subscription
on one emulator (acklane's own; Google's image under
``ACKLANE_EMULATOR_BACKEND=docker``):

- baseline: a bare ``SubscriberAsyncClient`` loop: ``Pull`` (``--max-messages``)
  then one ``Acknowledge`` for what came, one call at a time (the SDK's own
  unary pull loop; the connector keeps pulls in flight and acks behind them),
  the ack ids read from the raw protobuf as the connector reads its messages;
- engine, 1 watcher: ``SharedStreamManager`` with ``PubSubMessageTrigger``, every
  trigger event confirmed persisted at once (the store is not measured here);
- engine, ``--watchers`` watchers (20 by default) sharing that one pull.

A feeder keeps each subscription's backlog between ``--backlog`` and twice that.
10,000 messages by default: at 0 ms a bare run of 3,000 lasted about 0.1 s, and
what every engine run pays once (its start, the last acks' ``advance_linger``)
weighed a fifth of it.
Each consumer runs ``--repeat`` times, interleaved, and its best run is shown.
Calls are the producer's ``api_calls`` counter (``counters()``): every Pull,
Acknowledge, ModifyAckDeadline, Publish and GetSubscription, start-up included;
the bare loop counts its own Pull and Acknowledge calls. The target is at most
0.25 calls per message (PASS/MISS).

The consumers reach the emulator through acklane's latency proxy, once per
``--rtt-ms`` round trip (default 0 and 5 ms); topics, subscriptions and the feeder
go directly. At each, the engine with one watcher is compared with the bare loop
(target >= 0.9).

    uv run python bench/pubsub.py
    uv run python bench/pubsub.py --messages 5000 --watchers 20 --repeat 3
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import logging
from collections.abc import Iterable
from typing import Any, ClassVar

from _versus_bare import (  # the bench directory, not a package: found through sys.path
    Feeder,
    Result,
    add_repeat,
    add_rtt,
    arguments,
    best_of,
    engine_seconds,
    latency,
    print_rtt_verdict,
    print_table,
    print_verdict,
    started,
    timed,
)

from acklane.connectors.pubsub import PubSubMessageTrigger, PubSubStreamProducer
from acklane.core.connectors import Action
from acklane.integration.emulator import BACKEND_ENV, emulator_for
from acklane.integration.pubsub import PubSubKit, subscriber_client


async def publish_raw(kit: PubSubKit, topic: str, bodies: Iterable[str]) -> None:
    """The feeder's publish: one ``Publish`` of raw protobuf messages (the feeder runs in
    the measured process; built through proto-plus it would cost each consumer about
    as much CPU per message as the bare loop's own work, and blur the comparison)."""
    from google.pubsub_v1 import types

    message = types.PubsubMessage.pb()
    request = types.PublishRequest.pb()(
        topic=kit.topic_path(topic), messages=[message(data=body.encode()) for body in bodies]
    )
    await kit.publisher.publish(request=types.PublishRequest.wrap(request))


async def new_subscription(
    kit: PubSubKit, prefix: str, total: int, backlog: int
) -> tuple[str, Feeder]:
    topic = await kit.create_topic(prefix)
    subscription = await kit.create_subscription(topic, f"{prefix}-sub", ack_deadline=10)
    send = functools.partial(publish_raw, kit, topic)
    return subscription, Feeder(send, total, backlog, idle=0.002)


async def bare_loop(
    kit: PubSubKit, host: str, total: int, backlog: int, max_messages: int
) -> Result:
    subscription, feeder = await new_subscription(kit, "bench-bare", total, backlog)
    client = subscriber_client(host)
    calls = 0

    async def consume() -> None:
        nonlocal calls
        while feeder.consumed < total:
            response = await client.pull(subscription=subscription, max_messages=max_messages)
            calls += 1
            # the raw protobuf, as the connector reads it (through proto-plus each
            # ack id costs microseconds: the loop would be slower than it need be)
            ack_ids = [r.ack_id for r in type(response).pb(response).received_messages]
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
    BenchWatcher.producers.clear()
    seconds = await engine_seconds(
        feeder,
        watchers,
        lambda: BenchWatcher(subscription=subscription, batch_size=max_messages, **settings),
        lambda: BenchWatcher.producers[0].acked >= total,  # the last acks land
        poll=0.001,
        # Not timed: the stop lets the pull in flight on the now empty subscription
        # finish (the emulator answers an empty pull after 2 s), to release what it got.
        time_the_stop=False,
    )
    [producer] = BenchWatcher.producers
    calls = int(producer.counters()[Action.API_CALLS])
    name = f"acklane engine, {watchers} watcher{'s' if watchers > 1 else ''}"
    return Result(name, total, seconds, calls)


def report(results: list[Result], rtt_ms: float) -> None:
    print_table(results)
    base, engine = results[0], results[1:]
    if len(engine) == 2:
        print(f"{engine[1].name} / {engine[0].name}: {engine[1].rate / engine[0].rate:.2f}x")
    print_verdict("Pub/Sub", engine)
    print_rtt_verdict("Pub/Sub", rtt_ms, base, engine[0])


async def main(args: argparse.Namespace) -> None:
    logging.getLogger("acklane.connectors.pubsub").setLevel(logging.ERROR)  # no-DLQ notices
    import os

    backend = "docker" if os.environ.get(BACKEND_ENV, "").strip().lower() == "docker" else "local"
    with started(emulator_for("pubsub", backend), "Pub/Sub") as direct:
        host, port = str(direct["emulator_host"]).rsplit(":", 1)
        for rtt_ms in args.rtt_ms:
            with latency(host, int(port), rtt_ms) as proxy:
                settings = dict(direct, emulator_host=proxy.address)

                async def one_round(
                    settings: dict[str, Any] = settings, address: str = proxy.address
                ) -> list[Result]:
                    async with PubSubKit(direct) as kit:  # entities and the feeder: direct
                        n, backlog, size = args.messages, args.backlog, args.max_messages
                        return [
                            await bare_loop(kit, address, n, backlog, size),
                            await through_engine(kit, settings, n, backlog, 1, size),
                            await through_engine(kit, settings, n, backlog, args.watchers, size),
                        ]

                print(f"\nround trip {rtt_ms:g} ms (latency proxy)")
                about = f", max_messages={args.max_messages}"
                report(await best_of(args.repeat, one_round, about), rtt_ms)


if __name__ == "__main__":
    parser = arguments(
        __doc__,
        messages=10_000,
        backlog=(300, "backlog kept by the feeder"),
        watchers=(20, "watchers sharing the engine's pull"),
    )
    parser.add_argument(
        "--max-messages", type=int, default=100, help="messages per Pull (bare loop and connector)"
    )
    add_repeat(parser, 2)
    add_rtt(parser)
    asyncio.run(main(parser.parse_args()))
