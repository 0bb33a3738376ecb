"""Launchers of the Service Bus emulator, and a small kit for tests.

``LOCAL`` runs acklane's own emulator (``python -m acklane.integration.servicebus``)
as a subprocess; ``DOCKER`` runs Microsoft's official emulator image with its SQL
Edge companion through testcontainers (``acklane-integration[docker]``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar

from .._container import ContainerEmulator, ContainerSpec
from ..emulator import (
    EmulatorError,
    LocalProcessEmulator,
    free_port,
    require_free_port,
    wait_for_port,
)
from ._sas import DEFAULT_KEY, DEFAULT_KEY_NAME

__all__ = [
    "MicrosoftServiceBusEmulator",
    "ServiceBusEmulator",
    "ServiceBusKit",
    "connection_string",
]

MICROSOFT_IMAGE = "mcr.microsoft.com/azure-messaging/servicebus-emulator:latest"
SQL_EDGE_IMAGE = "mcr.microsoft.com/azure-sql-edge:latest"
#: Where Microsoft's emulator reads the entities it serves.
MICROSOFT_CONFIG_PATH = "/ServiceBus_Emulator/ConfigFiles/Config.json"


def connection_string(host: str, port: int, key: str = DEFAULT_KEY) -> str:
    """The SDK's connection string for an emulator (no TLS: ``UseDevelopmentEmulator``)."""
    return (
        f"Endpoint=sb://{host}:{port};SharedAccessKeyName={DEFAULT_KEY_NAME};"
        f"SharedAccessKey={key};UseDevelopmentEmulator=true;"
    )


class ServiceBusEmulator(LocalProcessEmulator):
    """acklane's emulator in a subprocess, on a free port, with an HTTP admin endpoint."""

    broker: ClassVar[str] = "servicebus"
    backend: ClassVar[str] = "local"
    log_tail_lines: ClassVar[int] = 30

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        config: str | Path | None = None,
        key: str = DEFAULT_KEY,
    ) -> None:
        self.host = host
        self.port = port
        self.admin_port: int | None = None
        self.config = config
        self.key = key
        self._process: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    @property
    def endpoint(self) -> str:
        if self.port is None:
            raise EmulatorError("the Service Bus emulator is not started")
        return f"sb://{self.host}:{self.port}"

    @property
    def connection_string(self) -> str:
        if self.port is None:
            raise EmulatorError("the Service Bus emulator is not started")
        return connection_string(self.host, self.port, self.key)

    @property
    def admin_url(self) -> str:
        return f"http://{self.host}:{self.admin_port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def client_settings(self) -> dict[str, Any]:
        return {"connection_string": self.connection_string}

    def start(self) -> None:
        if self._process is not None:
            return
        if self.port is not None:
            require_free_port(self.host, self.port)
        self.port = self.port or free_port()
        self.admin_port = free_port()
        self._log = tempfile.NamedTemporaryFile(prefix="acklane-sb-", suffix=".log", delete=False)  # noqa: SIM115
        command = [
            sys.executable,
            "-m",
            "acklane.integration.servicebus",
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--admin-port",
            str(self.admin_port),
            "--key",
            self.key,
        ]
        if self.config is not None:
            command += ["--config", str(self.config)]
        self._process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            self.wait_healthy()
        except BaseException:
            tail = self._log_tail()
            self.stop()
            raise EmulatorError(f"Service Bus emulator did not start:\n{tail}") from None

    def wait_healthy(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        wait_for_port(self.host, self.port or 0, timeout)
        while True:
            try:
                with urllib.request.urlopen(f"{self.admin_url}/health", timeout=2) as answer:
                    answer.read()
                return
            except OSError as exc:
                if not self.running or time.monotonic() > deadline:
                    raise EmulatorError(f"Service Bus emulator unhealthy: {exc}") from exc
                time.sleep(0.05)

    # -- administration (tests)

    def _admin(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"{self.admin_url}{urllib.parse.quote(path)}", data=data, method=method
        )
        try:
            with urllib.request.urlopen(request, timeout=15) as answer:
                return json.loads(answer.read() or b"{}")
        except urllib.error.HTTPError as exc:
            raise EmulatorError(f"{method} {path}: {exc.read().decode(errors='replace')}") from exc

    def create_queue(self, name: str | None = None, **properties: Any) -> str:
        """Create a queue (``lock_duration=2``, ``max_delivery_count=3``, ...)."""
        name = name or f"q-{uuid.uuid4().hex[:12]}"
        self._admin("POST", "/entities", {"queue": name, "properties": properties})
        return name

    def create_topic(
        self,
        name: str | None = None,
        subscriptions: Iterable[str] = ("sub",),
        *,
        rules: dict[str, list[dict[str, Any]]] | None = None,
        **properties: Any,
    ) -> str:
        """Create a topic with subscriptions sharing ``properties``; ``rules`` by
        subscription (``{"name": ..., "sql": ...}``, ``"correlation": {...}``,
        ``"action": ...``, or the ``Config.json`` shape), else each gets ``$Default``."""
        name = name or f"t-{uuid.uuid4().hex[:12]}"
        subs = [
            {"name": s, "properties": properties, "rules": (rules or {}).get(s, [])}
            for s in subscriptions
        ]
        self._admin("POST", "/entities", {"topic": name, "subscriptions": subs})
        return name

    def delete_entity(self, name: str) -> None:
        self._admin("DELETE", f"/entities/{name}")

    def counts(self, path: str) -> dict[str, int]:
        """``messages``, ``locked``, ``deferred``, ``scheduled``, ``dead_letter`` of an entity."""
        result: dict[str, int] = self._admin("GET", f"/entities/{path}")
        return result

    def refuse_settlements(self, path: str, times: int = 1) -> None:
        """Make the next ``times`` settlements (complete, abandon, dead-letter) of the entity
        fail with an error, as a broker's fault would; their messages stay locked until
        their locks lapse. ``times=0`` clears it."""
        self._admin("POST", "/faults", {"entity": path, "settlements": times})


def microsoft_specs(password: str, config: str | Path | None) -> tuple[ContainerSpec, ...]:
    """SQL Edge (named ``sqledge`` on their network), then the emulator beside it."""
    sql = ContainerSpec(
        SQL_EDGE_IMAGE,
        env={"ACCEPT_EULA": "Y", "MSSQL_SA_PASSWORD": password},
        aliases=("sqledge",),
    )
    volumes = () if config is None else ((str(config), MICROSOFT_CONFIG_PATH),)
    bus = ContainerSpec(
        MICROSOFT_IMAGE,
        env={"ACCEPT_EULA": "Y", "SQL_SERVER": "sqledge", "MSSQL_SA_PASSWORD": password},
        exposed_ports=(5672,),
        volumes=volumes,
    )
    return sql, bus


class MicrosoftServiceBusEmulator(ContainerEmulator):
    """Microsoft's emulator image and its SQL Edge companion (untested here: needs Docker)."""

    broker: ClassVar[str] = "servicebus"
    title: ClassVar[str] = "the Service Bus emulator"

    def __init__(self, *, config: str | Path | None = None, key: str = DEFAULT_KEY) -> None:
        super().__init__()
        self.config = config
        self.key = key
        self._port: int | None = None

    @property
    def endpoint(self) -> str:
        if self._port is None:
            raise EmulatorError("the Service Bus emulator is not started")
        return f"sb://127.0.0.1:{self._port}"

    def client_settings(self) -> dict[str, Any]:
        assert self._port is not None
        return {"connection_string": connection_string("127.0.0.1", self._port, self.key)}

    def _run(self) -> None:
        password = f"Acklane-{uuid.uuid4().hex[:12]}!"
        self._join_network()
        sql, bus = microsoft_specs(password, self.config)
        self._start(sql)
        self._port = int(self._start(bus).get_exposed_port(5672))

    def wait_healthy(self, timeout: float = 120.0) -> None:
        wait_for_port("127.0.0.1", self._port or 0, timeout)


class ServiceBusKit:
    """Send, receive-and-complete and peek with the official SDK (sync), for checks."""

    def __init__(self, connection_string: str) -> None:
        self.connection_string = connection_string

    def _client(self) -> Any:
        from azure.servicebus import ServiceBusClient

        return ServiceBusClient.from_connection_string(self.connection_string)

    def send(
        self,
        queue: str,
        bodies: Iterable[bytes | str],
        *,
        session_id: str | None = None,
        properties: dict[str | bytes, Any] | None = None,
    ) -> None:
        from azure.servicebus import ServiceBusMessage

        messages = [
            ServiceBusMessage(body, session_id=session_id, application_properties=properties)
            for body in bodies
        ]
        # keep_alive=0: no keep-alive thread, whose 1 s naps the sender's close would
        # wait out (about 0.5 s a send); a send this short needs no keep-alive
        with self._client() as client, client.get_queue_sender(queue, keep_alive=0) as sender:
            for message in messages:
                sender.send_messages(message)

    def receive(
        self, queue: str, count: int, *, sub_queue: str | None = None, wait: float = 2.0
    ) -> list[Any]:
        """Receive up to ``count`` messages (peek-lock) and complete them."""
        out: list[Any] = []
        with (
            self._client() as client,
            client.get_queue_receiver(queue, sub_queue=sub_queue, max_wait_time=wait) as receiver,
        ):
            deadline = time.monotonic() + wait
            while len(out) < count and time.monotonic() < deadline:
                batch = receiver.receive_messages(
                    max_message_count=count - len(out), max_wait_time=wait
                )
                for message in batch:
                    receiver.complete_message(message)
                out.extend(batch)
        return out

    def peek_dead_letters(self, queue: str, count: int = 100) -> list[Any]:
        with (
            self._client() as client,
            client.get_queue_receiver(queue, sub_queue="deadletter") as receiver,
        ):
            result: list[Any] = receiver.peek_messages(max_message_count=count)
            return result
