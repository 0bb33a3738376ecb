"""Running the Service Bus emulator: the frame sequencer in front, the AMQP server
behind it, and the HTTP admin endpoint tests use (``--admin-port``)."""

from __future__ import annotations

import json
import logging
import os
import threading
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from proton.reactor import Container

from ..emulator import free_port
from ._config import EmulatorConfig
from ._sas import DEFAULT_KEY, DEFAULT_KEY_NAME
from ._sequencer import FrameSequencer
from ._server import ServiceBusServer

__all__ = ["SEQUENCER_ENV", "serve"]

log = logging.getLogger("acklane.integration.servicebus")

#: Set to 0 to serve proton directly, without the frame sequencer in front of it.
SEQUENCER_ENV = "ACKLANE_SERVICEBUS_SEQUENCER"


class _Admin(BaseHTTPRequestHandler):
    server_handler: ServiceBusServer

    def log_message(self, format: str, *args: Any) -> None:
        log.debug(format, *args)

    def _answer(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _run(self, command: Callable[[], Any]) -> None:
        try:
            result = self.server_handler.call(command)
        except KeyError as exc:
            self._answer(404, {"error": f"not found: {exc}"})
        except Exception as exc:
            self._answer(400, {"error": str(exc)})
        else:
            self._answer(200, result if result is not None else {})

    def do_GET(self) -> None:
        path = urllib.parse.unquote(self.path)
        if path == "/health":
            self._run(lambda: {"namespace": self.server_handler.broker.namespace})
        elif path.startswith("/entities/"):
            name = path[len("/entities/") :]
            self._run(lambda: self.server_handler.counts(name))
        else:
            self._answer(404, {"error": "unknown path"})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        spec = json.loads(self.rfile.read(length) or b"{}")
        if urllib.parse.unquote(self.path) == "/faults":
            entity, times = str(spec.get("entity", "")), int(spec.get("settlements", 1))
            self._run(lambda: self.server_handler.refuse_settlements(entity, times))
        else:
            self._run(lambda: self.server_handler.create(spec))

    def do_DELETE(self) -> None:
        name = urllib.parse.unquote(self.path)[len("/entities/") :]
        self._run(lambda: self.server_handler.delete(name))


def serve(
    config: EmulatorConfig,
    *,
    host: str = "127.0.0.1",
    port: int = 5672,
    admin_port: int | None = None,
    key_name: str = DEFAULT_KEY_NAME,
    key: str = DEFAULT_KEY,
) -> None:
    """Run the emulator until the process ends.

    Clients connect to ``port``, where the frame sequencer listens (see
    ``_sequencer``); proton serves on a loopback port of its own behind it.
    """
    if os.environ.get(SEQUENCER_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        handler = ServiceBusServer(config, host=host, port=port, key_name=key_name, key=key)
    else:
        engine_port = free_port()
        sequencer = FrameSequencer(host, port, ("127.0.0.1", engine_port))
        handler = ServiceBusServer(
            config, host="127.0.0.1", port=engine_port, key_name=key_name, key=key
        )
        sequencer.start()
    if admin_port is not None:
        admin_class = type("Admin", (_Admin,), {"server_handler": handler})
        httpd = ThreadingHTTPServer((host, admin_port), admin_class)
        threading.Thread(target=httpd.serve_forever, name="admin", daemon=True).start()
    Container(handler).run()
