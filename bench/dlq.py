"""``acklane dlq redrive`` throughput, against publishing the same messages (same run).

Per broker (Kafka on tansu, SQS on moto; ``--brokers`` picks): N messages are
dead-lettered through the connector's own producer (rejected), then

- baseline: the connector's publisher sends N messages of the same size to the
  source (what ``acklane publish`` does: one send per batch, confirmed);
- redrive: the dead-letter reader sends the N letters back (read held, copy,
  confirm, remove), as ``acklane dlq redrive`` does, without the CLI start-up.

It prints messages/s of both and the ratio redrive/publish: a redrive reads and
removes as well as sends, so it can only be slower; the ratio says by how much.

    uv run python bench/dlq.py [--brokers kafka,sqs] [--kafka 3000] [--sqs 300]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from acklane.core.connectors import OutgoingMessage, load_connector
from acklane.core.connectors.dlq import Selection, redrive
from acklane.core.testing import rejected
from acklane.integration.emulator import emulator_for
from acklane.integration.kits import kit_for
from acklane.integration.testing import StreamDriver


async def one(broker: str, count: int) -> tuple[float, float]:
    emulator = emulator_for(broker)
    emulator.start()
    try:
        async with kit_for(broker, emulator) as kit:
            source = await kit.create()
            bodies = [json.dumps({"id": i, "pad": "x" * 200}) for i in range(count)]
            await kit.publish(source, bodies)
            connector = load_connector(broker)
            fields = kit.fields(source)
            async with StreamDriver(connector.create_producer(fields)) as stream:
                done = 0
                while done < count:
                    pairs = await stream.take(min(100, count - done), within=60)
                    done += len(pairs)
                    await stream.advance(*((p, rejected("watcher bench: no")) for p in pairs))
            # baseline: publish N messages of the same size to the source
            publisher = connector.create_publisher(fields)
            started = time.perf_counter()
            async with publisher:
                for start in range(0, count, publisher.max_batch):
                    chunk = bodies[start : start + publisher.max_batch]
                    await publisher.send([OutgoingMessage(b.encode()) for b in chunk])
            published = count / (time.perf_counter() - started)
            started = time.perf_counter()
            async with connector.create_dead_letter_reader(fields) as reader:
                report = await redrive(reader, Selection())
            redriven = len(report.redriven) / (time.perf_counter() - started)
            assert len(report.redriven) == count, report.document()
            return published, redriven
    finally:
        emulator.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--brokers", default="kafka,sqs")
    parser.add_argument("--kafka", type=int, default=3000)
    parser.add_argument("--sqs", type=int, default=300)
    args = parser.parse_args()
    for broker in args.brokers.split(","):
        count = getattr(args, broker, 300)
        published, redriven = asyncio.run(one(broker, count))
        print(
            f"{broker:6} {count:6} msgs  publish {published:9.0f} msgs/s  "
            f"redrive {redriven:9.0f} msgs/s  redrive/publish {redriven / published:.2f}"
        )


if __name__ == "__main__":
    main()
