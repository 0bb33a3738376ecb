"""The emulator on a thread of its own (in-process use), and its relaxed mode as the
environment asks for it.
"""

from __future__ import annotations

import asyncio
import os
import threading

from ._server import PubSubServer
from ._state import (
    PubSubState,
)

__all__ = ["RELAXED_ENV", "ServerThread", "relaxed_from_env"]

#: Set to ``1`` to start the server in relaxed mode (``python -m`` and the launcher).
RELAXED_ENV = "ACKLANE_PUBSUB_RELAXED"


def relaxed_from_env() -> bool:
    return os.environ.get(RELAXED_ENV, "").strip().lower() in ("1", "true", "yes", "on")


class ServerThread:
    """The emulator on a thread of its own, with its own event loop (in-process use)."""

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, relaxed: bool = False) -> None:
        self.host = host
        self.requested_port = port
        self.relaxed = relaxed
        self.port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: PubSubServer | None = None

    @property
    def endpoint(self) -> str:
        if self.port is None:
            raise RuntimeError("the Pub/Sub emulator thread is not started")
        return f"{self.host}:{self.port}"

    def start(self) -> None:
        if self._thread is not None:
            return
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            try:
                server = PubSubServer(PubSubState(relaxed=self.relaxed))
                self.port = loop.run_until_complete(server.start(self.host, self.requested_port))
                self._server = server
            except BaseException as exc:
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(server.stop(0))
                loop.close()

        self._thread = threading.Thread(target=run, name="acklane-pubsub-emulator", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread = None
            raise failure[0]

    def stop(self) -> None:
        thread, self._thread = self._thread, None
        if thread is None or self._loop is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        thread.join(timeout=10)
        self.port = None
