"""A webhook receiver for acklane's webhook sink: checks each request's signature, drops
repeats by their Idempotency-Key, and prints every event it accepts.

    uv run python examples/sinks/webhook_receiver.py --port 8765

It shares its signing key with the pipeline (``WEBHOOK_SECRET``). acklane delivers at
least once: after a crash a request can come again, with the same Idempotency-Key.
A real receiver keeps the keys it has seen in its own database, in the transaction
that does the work; this one keeps them in memory.
"""

from __future__ import annotations

import argparse
import json
import os

from aiohttp import web

from acklane.core.sinks.webhook import SignatureError, verify_signature

SECRET = os.environ.get("WEBHOOK_SECRET", "dev-only-signing-key-change-me")


def make_app() -> web.Application:
    seen: set[str] = set()

    async def orders(request: web.Request) -> web.Response:
        body = await request.read()
        try:
            verify_signature(body, request.headers.get("Acklane-Signature"), SECRET)
        except SignatureError as exc:
            return web.Response(status=401, text=f"bad signature: {exc}")
        key = request.headers["Idempotency-Key"]
        if key in seen:
            return web.Response(text="already done")  # a repeat: answer 2xx, do nothing
        document = json.loads(body)
        for event in document.get("events", [document]):
            payload = json.dumps(event["payload"])
            print(f"event {event['event_id']} from {event['watcher']}: {payload}", flush=True)
        seen.add(key)
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/orders", orders)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()
    print(f"listening on http://127.0.0.1:{args.port}/orders", flush=True)
    web.run_app(make_app(), host="127.0.0.1", port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
