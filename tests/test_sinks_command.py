"""``acklane sinks run``: the stored events delivered by a process of their own, apart
from consumption (``acklane run --no-sinks``), to a real webhook receiver."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from acklane.core.events import EventRecord, EventStore
from acklane.integration.webhook import WebhookReceiver

pytestmark = pytest.mark.timeout(120)


async def _store(url: str, ns: range) -> None:
    async with EventStore(url) as store:
        for n in ns:
            await store.put(EventRecord("w", '["memory","orders"]', {"n": n}, f"m-{n}", 0))
        await store.flush()


def test_acklane_sinks_run_delivers_what_another_process_stores(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'events.db'}"
    with WebhookReceiver() as receiver:
        config = tmp_path / "pipeline.yaml"
        config.write_text(
            textwrap.dedent(
                f"""\
                store: {{url: "{url}"}}
                streams:
                  orders: {{connector: memory, topics: [orders]}}
                sinks:
                  - {{name: hook, kind: webhook, url: "{receiver.url}"}}
                watchers:
                  - {{name: w, stream: orders, sinks: [hook]}}
                """
            )
        )
        asyncio.run(_store(url, range(5)))
        log = (tmp_path / "sinks.log").open("w")
        deliverer = subprocess.Popen(
            [sys.executable, "-m", "acklane.core.cli", "sinks", "run", str(config)],
            stdout=log,
            stderr=log,
        )
        try:
            deadline = time.monotonic() + 60
            while receiver.stats(keys=True).distinct < 5:
                assert deliverer.poll() is None and time.monotonic() < deadline, (
                    tmp_path / "sinks.log"
                ).read_text()
                time.sleep(0.1)
            asyncio.run(_store(url, range(5, 8)))  # stored later, by "another process"
            while receiver.stats(keys=True).distinct < 8:
                assert time.monotonic() < deadline, (tmp_path / "sinks.log").read_text()
                time.sleep(0.05)
        finally:
            deliverer.send_signal(signal.SIGTERM)
            code = deliverer.wait(30)
        assert code == 0, (tmp_path / "sinks.log").read_text()
        assert receiver.stats(keys=True).repeats == 0
