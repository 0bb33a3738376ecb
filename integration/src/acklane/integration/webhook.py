"""A recording webhook receiver: a real HTTP server in a process of its own.

``python -m acklane.integration.webhook --port P [--secret S]`` answers every POST
with 200 (after checking the ``Acklane-Signature`` when ``--secret`` is given: 401
when it does not verify) and counts, per event id, how many times each event
arrived: a webhook sink's body is one event document, or ``{"events": [...]}``.
``GET /_stats`` tells what it saw (``?keys=1`` adds the count per event id,
``?latencies=1`` the seconds from each event's ``payload.t``, a ``time.time()`` the
sender put there, to its arrival). ``POST /_fail?status=503&count=N`` makes the next N
requests fail with that status.

The chaos run, the sink benchmark and the webhook example use it through
:class:`WebhookReceiver`, which starts and stops the process by pid.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .emulator import free_port

__all__ = ["ReceiverStats", "WebhookReceiver", "main"]


@dataclass(frozen=True, slots=True)
class ReceiverStats:
    """What the receiver saw since it started."""

    requests: int
    events: int
    #: Requests refused (a bad signature, or a failure asked for by ``/_fail``).
    refused: int
    keys: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)

    @property
    def distinct(self) -> int:
        return len(self.keys)

    @property
    def repeats(self) -> int:
        """Arrivals of an event id seen before (what an idempotent receiver drops)."""
        return sum(n - 1 for n in self.keys.values())


class WebhookReceiver:
    """The receiver as a subprocess: ``with WebhookReceiver() as r: ... r.stats()``."""

    def __init__(self, port: int | None = None, *, secret: str | None = None) -> None:
        self.port = port or free_port()
        self.secret = secret
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def start(self, timeout: float = 20.0) -> WebhookReceiver:
        command = [sys.executable, "-m", "acklane.integration.webhook", "--port", str(self.port)]
        if self.secret is not None:
            command += ["--secret", self.secret]
        self._process = subprocess.Popen(command, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.stats()
                return self
            except OSError:
                if self._process.poll() is not None:
                    raise RuntimeError(
                        f"the webhook receiver exited with {self._process.returncode}"
                    ) from None
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        f"the webhook receiver did not answer in {timeout:g}s"
                    ) from None
                time.sleep(0.05)

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def __enter__(self) -> WebhookReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _get(self, path: str) -> Any:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as r:
            return json.loads(r.read())

    def stats(self, *, keys: bool = False, latencies: bool = False) -> ReceiverStats:
        doc = self._get(f"/_stats?keys={int(keys)}&latencies={int(latencies)}")
        return ReceiverStats(
            requests=doc["requests"],
            events=doc["events"],
            refused=doc["refused"],
            keys=Counter(doc.get("keys", {})),
            latencies=list(doc.get("latencies", [])),
        )

    def fail_next(self, count: int, status: int = 503) -> None:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/_fail?status={status}&count={count}", method="POST"
        )
        with urllib.request.urlopen(request, timeout=10):
            pass


def _app(secret: str | None) -> Any:
    from aiohttp import web

    keys: Counter[str] = Counter()
    latencies: list[float] = []
    seen = {"requests": 0, "events": 0, "refused": 0}
    failing = {"count": 0, "status": 503}
    verify = None
    if secret is not None:
        from acklane.core.sinks.webhook import SignatureError, verify_signature

        def verify(body: bytes, header: str | None) -> bool:
            try:
                verify_signature(body, header, secret)
            except SignatureError:
                return False
            return True

    async def hook(request: web.Request) -> web.Response:
        now = time.time()
        body = await request.read()
        seen["requests"] += 1
        if failing["count"] > 0:
            failing["count"] -= 1
            seen["refused"] += 1
            return web.Response(status=failing["status"], text="failing on purpose")
        if verify is not None and not verify(body, request.headers.get("Acklane-Signature")):
            seen["refused"] += 1
            return web.Response(status=401, text="bad signature")
        doc = json.loads(body)
        events = doc["events"] if isinstance(doc, dict) and "events" in doc else [doc]
        for event in events:
            keys[str(event.get("event_id"))] += 1
            payload = event.get("payload")
            if isinstance(payload, dict) and isinstance(payload.get("t"), int | float):
                latencies.append(now - payload["t"])
        seen["events"] += len(events)
        return web.Response(status=200, text="ok")

    async def stats(request: web.Request) -> web.Response:
        doc: dict[str, Any] = dict(seen)
        if request.query.get("keys") == "1":
            doc["keys"] = dict(keys)
        if request.query.get("latencies") == "1":
            doc["latencies"] = latencies
        return web.json_response(doc)

    async def fail(request: web.Request) -> web.Response:
        failing["count"] = int(request.query.get("count", "1"))
        failing["status"] = int(request.query.get("status", "503"))
        return web.Response(text="ok")

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_get("/_stats", stats)
    app.router.add_post("/_fail", fail)
    app.router.add_post("/{tail:.*}", hook)
    return app


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m acklane.integration.webhook",
        description="A webhook receiver that counts each event id it gets.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--secret", help="check the Acklane-Signature with this key")
    args = parser.parse_args(argv)
    from aiohttp import web

    web.run_app(_app(args.secret), host=args.host, port=args.port, print=None, access_log=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
