"""Azure Service Bus: messages/s of acklane's engine against a bare SDK loop.

On one Service Bus emulator (acklane's own, or Microsoft's image under Docker with
``ACKLANE_EMULATOR_BACKEND=docker``), each consumer drains ``--messages`` messages
from a queue of its own, filled before it starts:

- baseline: a bare async ``receive_messages`` (``--batch``) + ``complete_message``
  loop on one receiver (the official SDK, peek-lock, same prefetch);
- engine:   ``SharedStreamManager`` with 1, then 20 watchers sharing one
  ``ServiceBusStreamProducer``; every trigger event is confirmed persisted at once
  (the event store is not measured here).

API calls per message are counted too: receive calls plus settlement calls (the
SDK completes one message per call, so at least 1 per message).

Each consumer runs ``--repeat`` times, interleaved, and its best run is shown,
with its ratio to the baseline.

    uv run python bench/servicebus.py
    uv run python bench/servicebus.py --messages 2000 --watchers 1 5 20
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from _versus_bare import (  # the bench directory, not a package: found through sys.path
    Result,
    print_table,
)
from azure.servicebus import ServiceBusMessage as Outgoing
from azure.servicebus.aio import ServiceBusClient

from acklane.connectors.servicebus import (
    ServiceBusMessage,
    ServiceBusMessageTrigger,
    ServiceBusStreamProducer,
)
from acklane.core.manager import SharedStreamManager
from acklane.core.trigger import TriggerEvent
from acklane.integration.emulator import emulator_for

# The producer's receive calls, counted by wrapping its one receive helper.
RECEIVES = [0]
_receive = ServiceBusStreamProducer._receive_messages


async def _counted_receive(self: ServiceBusStreamProducer, receiver: Any) -> list[Any]:
    RECEIVES[0] += 1
    return await _receive(self, receiver)


ServiceBusStreamProducer._receive_messages = _counted_receive  # type: ignore[method-assign]


async def fill(client: ServiceBusClient, queue: str, total: int) -> None:
    async with client.get_queue_sender(queue) as sender:
        for start in range(0, total, 100):
            batch = await sender.create_message_batch()
            for i in range(start, min(start + 100, total)):
                batch.add_message(Outgoing(f'{{"n": {i}}}'))
            await sender.send_messages(batch)


async def bare_loop(client: ServiceBusClient, queue: str, total: int, batch: int) -> Result:
    done = calls = 0
    started = time.perf_counter()
    async with client.get_queue_receiver(queue, prefetch_count=batch) as receiver:
        while done < total:
            messages = await receiver.receive_messages(max_message_count=batch, max_wait_time=1)
            calls += 1
            for message in messages:
                await receiver.complete_message(message)
                calls += 1
            done += len(messages)
    return Result("bare receive+complete", total, time.perf_counter() - started, calls)


class BenchWatcher(ServiceBusMessageTrigger):
    producers: list[ServiceBusStreamProducer] = []

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> ServiceBusStreamProducer:
        producer = super().create_shared_stream_producer(kwargs)
        assert isinstance(producer, ServiceBusStreamProducer)
        cls.producers.append(producer)
        return producer

    async def filter_shared_stream(self, stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        async for record in stream:
            assert isinstance(record, ServiceBusMessage)
            yield TriggerEvent({"seq": record.sequence_number})


async def through_engine(
    connection_string: str, queue: str, total: int, batch: int, watchers: int
) -> Result:
    manager = SharedStreamManager(max_subscriber_queue=4096, ack_timeout=300.0)
    BenchWatcher.producers.clear()
    RECEIVES[0] = 0
    seen = [0] * watchers
    all_seen = asyncio.Event()
    settings = {
        "connection_string": connection_string,
        "queue": queue,
        "batch_size": batch,
        "prefetch": batch,
        "max_wait_time": 1,
    }

    async def watch(i: int) -> None:
        trigger = BenchWatcher(**settings)
        key = trigger.shared_stream_key()
        async for _event in manager.events(trigger_id=f"w{i}", trigger=trigger, key=key):
            seq = manager.bind_pending_event(trigger_id=f"w{i}", key=key)
            if seq is not None:
                manager.confirm_persisted([seq])
            seen[i] += 1
            if min(seen) >= total:
                all_seen.set()

    started = time.perf_counter()
    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(watch(i)) for i in range(watchers)]
        await all_seen.wait()
        producer = BenchWatcher.producers[0]
        while producer.completed < total:  # the last settlements land
            await asyncio.sleep(0.002)
        seconds = time.perf_counter() - started
        calls = RECEIVES[0] + producer.completed
        await manager.stop_all()
        for task in tasks:
            task.cancel()
    name = f"acklane engine, {watchers} watcher{'s' * (watchers > 1)}"
    return Result(name, total, seconds, calls)


def report(results: list[Result]) -> None:
    print_table(results)
    print(
        "calls: receive calls + one settlement call per message (the SDK has no batch "
        "settle); no calls/message target on Service Bus"
    )


async def main(args: argparse.Namespace) -> None:
    logging.getLogger("azure").setLevel(logging.ERROR)
    emulator = emulator_for("servicebus")
    emulator.start()
    try:
        connection_string = emulator.client_settings()["connection_string"]
        print(f"Service Bus emulator: {emulator.backend} at {emulator.endpoint}")
        runs: list[list[Result]] = []
        async with ServiceBusClient.from_connection_string(connection_string) as client:
            for _ in range(args.repeat):  # interleaved, so a busy moment hurts all alike
                row: list[Result] = []
                queue = emulator.create_queue(lock_duration=60)  # type: ignore[attr-defined]
                await fill(client, queue, args.messages)
                row.append(await bare_loop(client, queue, args.messages, args.batch))
                for n in args.watchers:
                    queue = emulator.create_queue(lock_duration=60)  # type: ignore[attr-defined]
                    await fill(client, queue, args.messages)
                    row.append(
                        await through_engine(connection_string, queue, args.messages, args.batch, n)
                    )
                runs.append(row)
        print(f"best of {args.repeat} runs per consumer, {args.messages} messages each")
        report([max(column, key=lambda r: r.rate) for column in zip(*runs, strict=True)])
    finally:
        with contextlib.suppress(Exception):
            emulator.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1000, help="messages per consumer")
    parser.add_argument("--batch", type=int, default=20, help="max batch and prefetch")
    parser.add_argument(
        "--watchers", type=int, nargs="+", default=[1, 20], help="watchers sharing the poll"
    )
    parser.add_argument("--repeat", type=int, default=2, help="runs per consumer; the best counts")
    asyncio.run(main(parser.parse_args()))
