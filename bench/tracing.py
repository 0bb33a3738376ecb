"""What tracing costs the engine: bench/engine.py's ack-mode run with tracing off, and
on with ``sample_ratio`` 1 (every message recorded), 0.01 and 0, in one process.

Tracing on here is the engine's share of it: the spans of each message and of each
watcher's verdict (``received``, ``filtered`` and ``advanced``, the hooks of
``acklane.core.observe.tracing``), made by the real SDK and handed to its batch
processor, whose exporter drops them (no network: the export runs in the SDK's
thread anyway). The store's ``stored`` events and the sinks' spans are not in it.

    uv run python bench/tracing.py
    uv run python bench/tracing.py --subscribers 1,20 --deliveries 200000
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import engine as bench
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.sampling import ParentBased

from acklane.core import SharedStreamManager
from acklane.core.observe.tracing import MessageTracer, sampled_roots


class Dropping(SpanExporter):
    """Counts the spans and forgets them."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS


TRACER: list[MessageTracer | None] = [None]


def traced_manager(**kwargs: Any) -> SharedStreamManager:
    """bench/engine.py's manager, with the tracer of the current mode."""
    tracer = TRACER[0]
    return SharedStreamManager(**kwargs, tracer=tracer)  # (its advanced hook included)


def tracer_for(ratio: float) -> tuple[MessageTracer, Dropping]:
    """A tracer as ``tracing: {sample_ratio: RATIO}`` makes one, exporting to nowhere."""
    exporter = Dropping()
    provider = TracerProvider(sampler=ParentBased(sampled_roots(ratio)))
    provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=65536))
    return MessageTracer(provider, ratio), exporter


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subscribers", default="1,20")
    parser.add_argument("--deliveries", type=int, default=400_000)
    args = parser.parse_args()
    bench.SharedStreamManager = traced_manager  # type: ignore[misc,assignment]
    print(f"python {sys.version.split()[0]}; ack mode, in-memory confirmation")
    header = (
        f"{'subs':>4} {'tracing':>12} {'events/s':>10} {'deliv/s':>10} {'vs off':>7} {'spans':>9}"
    )
    print(header)
    print("-" * len(header))
    for n in [int(x) for x in args.subscribers.split(",")]:
        total = max(5000, args.deliveries // n)
        off: float | None = None
        modes = (("off", None), ("ratio 1", 1.0), ("ratio 0.01", 0.01), ("ratio 0", 0.0))
        for mode, ratio in modes:
            exporter = None
            if ratio is None:
                TRACER[0] = None
            else:
                TRACER[0], exporter = tracer_for(ratio)
            r = await bench.engine_run(n, total, "memory", f"tracing-{mode}-{n}")
            tracer = TRACER[0]
            if tracer is not None:
                tracer.provider.shutdown()  # export (and count) what is queued
            off = r["events_s"] if off is None else off
            spans = "-" if exporter is None else f"{exporter.spans:,}"
            print(
                f"{n:>4} {mode:>12} {r['events_s']:>10,.0f} {r['deliveries_s']:>10,.0f} "
                f"{r['events_s'] / off:>7.2f} {spans:>9}"
            )


if __name__ == "__main__":
    asyncio.run(main())
