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

Both consumers reach the emulator through acklane's latency proxy
(``acklane.integration.netproxy``, in a process of its own), once per
``--rtt-ms`` round trip (default 0 and 5 ms): a real namespace is a few
milliseconds away, and a settlement per round trip is what caps a receiver
there. The queues are filled directly (the fill is not timed).

    uv run python bench/servicebus.py
    uv run python bench/servicebus.py --messages 2000 --watchers 1 5 20 --rtt-ms 5
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
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
from acklane.integration.netproxy import ProxyProcess
from acklane.integration.servicebus._launcher import connection_string as connection_string_of

# The producer's receive calls, counted by wrapping its one receive helper.
RECEIVES = [0]
_receive = ServiceBusStreamProducer._receive_messages


async def _counted_receive(self: ServiceBusStreamProducer, receiver: Any) -> list[Any]:
    RECEIVES[0] += 1
    return await _receive(self, receiver)


ServiceBusStreamProducer._receive_messages = _counted_receive  # type: ignore[method-assign]


#: The local emulator's process, whose CPU time the engine rows report beside their own.
EMULATOR_PID = [0]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (0 when unknown)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def fill(client: ServiceBusClient, queue: str, total: int) -> None:
    async with client.get_queue_sender(queue) as sender:
        for start in range(0, total, 100):
            batch = await sender.create_message_batch()
            for i in range(start, min(start + 100, total)):
                batch.add_message(Outgoing(f'{{"n": {i}}}'))
            await sender.send_messages(batch)


async def bare_loop(
    client: ServiceBusClient, queue: str, total: int, batch: int, prefetch: int
) -> Result:
    done = calls = 0
    started = time.perf_counter()
    async with client.get_queue_receiver(queue, prefetch_count=prefetch) as receiver:
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
    connection_string: str, queue: str, total: int, batch: int, prefetch: int, watchers: int
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
        "prefetch": prefetch,
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
    cpu, emulator_cpu = time.process_time(), cpu_seconds(EMULATOR_PID[0])
    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(watch(i)) for i in range(watchers)]
        await all_seen.wait()
        producer = BenchWatcher.producers[0]
        while producer.completed < total:  # the last settlements land
            await asyncio.sleep(0.002)
        seconds = time.perf_counter() - started
        # (an older connector, for A/B runs, counts no dispositions: one per completion)
        dispositions = getattr(producer, "dispositions", producer.completed)
        calls = RECEIVES[0] + dispositions
        here = time.process_time() - cpu
        there = cpu_seconds(EMULATOR_PID[0]) - emulator_cpu
        print(
            f"  engine, {watchers} watcher(s): {seconds:.2f} s wall; CPU {here:.2f} s here, "
            f"{there:.2f} s in the emulator; "
            f"{RECEIVES[0]} receives, {dispositions} dispositions "
            f"({getattr(producer, 'ranged', 0)} ranges)"
        )
        await manager.stop_all()
        for task in tasks:
            task.cancel()
    name = f"acklane engine, {watchers} watcher{'s' * (watchers > 1)}"
    return Result(name, total, seconds, calls)


def report(results: list[Result], rtt_ms: float) -> None:
    print_table(results)
    print(
        "calls: receive calls + settlement calls (the bare loop one per message; acklane "
        "completes runs of consecutive messages in one disposition)"
    )
    best = max(r.rate for r in results[1:2])  # the engine with the first --watchers count
    base = results[0].rate
    target = best >= 0.9 * base and (rtt_ms < 5 or best >= 1000)
    print(
        f"{'PASS' if target else 'MISS'} at {rtt_ms:g} ms round trip: engine {best:.0f} msgs/s, "
        f"{best / base:.2f} of the bare loop (target >= 0.9"
        f"{', and >= 1000 msgs/s' if rtt_ms >= 5 else ''})"
    )


async def one_rtt(emulator: Any, args: argparse.Namespace, rtt_ms: float) -> None:
    direct = emulator.client_settings()["connection_string"]
    host, port = emulator.endpoint.removeprefix("sb://").rsplit(":", 1)
    with ProxyProcess(host, int(port), rtt=rtt_ms / 1000) as proxy:
        proxied = connection_string_of(proxy.host, proxy.port, emulator.key)
        runs: list[list[Result]] = []
        async with (
            ServiceBusClient.from_connection_string(direct) as filler,
            ServiceBusClient.from_connection_string(proxied) as client,
        ):
            for _ in range(args.repeat):  # interleaved, so a busy moment hurts all alike
                row: list[Result] = []
                queue = emulator.create_queue(lock_duration=60)
                await fill(filler, queue, args.messages)
                row.append(await bare_loop(client, queue, args.messages, args.batch, args.prefetch))
                for n in args.watchers:
                    queue = emulator.create_queue(lock_duration=60)
                    await fill(filler, queue, args.messages)
                    row.append(
                        await through_engine(
                            proxied, queue, args.messages, args.batch, args.prefetch, n
                        )
                    )
                runs.append(row)
    print(
        f"\nround trip {rtt_ms:g} ms (latency proxy): best of {args.repeat} runs per "
        f"consumer, {args.messages} messages each, batch {args.batch}, prefetch {args.prefetch}"
    )
    report([max(column, key=lambda r: r.rate) for column in zip(*runs, strict=True)], rtt_ms)


async def main(args: argparse.Namespace) -> None:
    logging.getLogger("azure").setLevel(logging.ERROR)
    emulator = emulator_for("servicebus")
    if emulator.backend != "local":
        raise SystemExit("bench/servicebus.py: the latency proxy needs the local emulator")
    emulator.start()
    process = getattr(emulator, "_process", None)
    EMULATOR_PID[0] = process.pid if process is not None else 0
    try:
        print(f"Service Bus emulator: {emulator.backend} at {emulator.endpoint}")
        for rtt_ms in args.rtt_ms:
            await one_rtt(emulator, args, rtt_ms)
    finally:
        with contextlib.suppress(Exception):
            emulator.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1000, help="messages per consumer")
    parser.add_argument("--batch", type=int, default=20, help="max messages per receive")
    parser.add_argument("--prefetch", type=int, default=100, help="the receivers' prefetch")
    parser.add_argument(
        "--rtt-ms", type=float, nargs="+", default=[0.0, 5.0], help="round trips to add, in ms"
    )
    parser.add_argument(
        "--watchers", type=int, nargs="+", default=[1, 20], help="watchers sharing the poll"
    )
    parser.add_argument("--repeat", type=int, default=2, help="runs per consumer; the best counts")
    asyncio.run(main(parser.parse_args()))
