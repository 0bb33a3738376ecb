"""``python -m acklane.integration.pubsub --port P [--relaxed]``: acklane's Pub/Sub emulator."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal

from ._server import PubSubServer
from ._state import PubSubState
from ._thread import relaxed_from_env


async def _serve(host: str, port: int, relaxed: bool) -> None:
    server = PubSubServer(PubSubState(relaxed=relaxed))
    bound = await server.start(host, port)
    print(f"acklane Pub/Sub emulator listening on {host}:{bound} relaxed={relaxed}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await server.stop(0.5)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m acklane.integration.pubsub")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8085)
    parser.add_argument(
        "--relaxed",
        action="store_true",
        default=relaxed_from_env(),
        help="allow ack deadlines from 1 s and max_delivery_attempts from 1 (fast tests)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(_serve(args.host, args.port, args.relaxed))


if __name__ == "__main__":
    main()
