"""Reading a running pipeline's HTTP endpoints (/healthz, /readyz, /metrics) from a test.

The health tests of core and the broker-backed ones of tests/ (lag, a broker's
reachability) ask the same endpoints the same way, so the asking is written once.
"""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from collections.abc import Callable

from acklane.core.observe.metrics import MetricsServer
from acklane.core.pipeline.runner import Runner


def http_get(port: int, path: str) -> tuple[int, str]:
    """Blocking GET (run it in a thread: the server answers from its own thread)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


async def http_probe(port: int, path: str) -> tuple[int, str]:
    return await asyncio.to_thread(http_get, port, path)


async def probe_until(
    port: int, path: str, want: Callable[[int, str], bool], timeout: float = 30
) -> tuple[int, str]:
    """Probe until ``want(status, body)``; the last answer. Bounded by a generous timeout,
    never by how fast the machine is."""
    async with asyncio.timeout(timeout):
        while True:
            status, body = await http_probe(port, path)
            if want(status, body):
                return status, body
            await asyncio.sleep(0.02)


class Running:
    """A runner started by a test, with the metrics server its endpoints are read from."""

    def __init__(self, runner: Runner, server: MetricsServer, task: asyncio.Task[None]) -> None:
        self.runner, self.server, self.task = runner, server, task
        self.port = server.port
