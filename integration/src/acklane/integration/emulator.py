"""One interface for every broker emulator, whatever starts it.

Each broker module (``kafka``, ``sqs``, ...) exposes two ``Emulator`` classes,
``LOCAL`` (a local process: used on machines without a Docker engine) and
``DOCKER`` (testcontainers with the broker's official image). The backend is
chosen by ``ACKLANE_EMULATOR_BACKEND=local|docker``, else Docker when an engine
answers, else local.
"""

from __future__ import annotations

import importlib
import os
import socket
import subprocess
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, Self

from acklane.core.errors import AcklaneError

__all__ = [
    "BACKEND_ENV",
    "BROKERS",
    "Emulator",
    "EmulatorError",
    "choose_backend",
    "docker_available",
    "emulator_for",
    "free_port",
    "wait_for_port",
]

BACKEND_ENV = "ACKLANE_EMULATOR_BACKEND"

#: broker name -> module exposing ``LOCAL`` and ``DOCKER`` emulator classes.
BROKERS: dict[str, str] = {
    "kafka": "acklane.integration.kafka",
    "sqs": "acklane.integration.sqs",
    "servicebus": "acklane.integration.servicebus",
    "pubsub": "acklane.integration.pubsub",
}


class EmulatorError(AcklaneError, RuntimeError):
    """An emulator could not be started or did not become healthy."""


class Emulator(ABC):
    """A running (or startable) broker for tests and local development."""

    broker: ClassVar[str]
    backend: ClassVar[str]  # "local" or "docker"

    @abstractmethod
    def start(self) -> None:
        """Start the broker and return once :meth:`wait_healthy` passed."""

    @abstractmethod
    def stop(self) -> None:
        """Stop the broker and everything it started; safe to call twice."""

    @property
    @abstractmethod
    def endpoint(self) -> str:
        """Where clients connect (``host:port`` or a URL)."""

    @abstractmethod
    def client_settings(self) -> dict[str, Any]:
        """The connector's YAML fields that reach this broker (credentials included)."""

    @abstractmethod
    def wait_healthy(self, timeout: float = 60.0) -> None:
        """Block until the broker answers real requests, or raise EmulatorError."""

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class LocalProcessEmulator(Emulator):
    """An emulator run as a local subprocess whose output goes to a temporary log file.

    Subclasses start it with :meth:`_launch` (which sets ``_process`` and ``_log``, a
    named temporary file) and may wait for it with :meth:`_wait_answering`; this base
    stops the one and removes the other, once.
    """

    _process: subprocess.Popen[bytes] | None
    _log: Any
    #: How many lines of the log an error message shows.
    log_tail_lines: ClassVar[int] = 20

    @property
    def running(self) -> bool:
        """True while the server process is alive."""
        return self._process is not None and self._process.poll() is None

    def _launch(self, command: Sequence[str], log_prefix: str, failure: str) -> None:
        """Run ``command``, its output to a new log file (``{log_prefix}*.log``), and
        return once :meth:`wait_healthy` passed; else stop it and raise EmulatorError
        ``{failure}:`` with the log's last lines."""
        self._log = tempfile.NamedTemporaryFile(prefix=log_prefix, suffix=".log", delete=False)  # noqa: SIM115
        self._process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a terminal's Ctrl-C reaches us, and we stop it
        )
        try:
            self.wait_healthy()
        except BaseException:
            tail = self._log_tail()
            self.stop()
            raise EmulatorError(f"{failure}:\n{tail}") from None

    def _wait_answering(
        self,
        what: str,
        host: str,
        port: int,
        timeout: float,
        answers: Callable[[float, Callable[[], bool]], None],
    ) -> None:
        """Block until something listens on ``host:port``, then until
        ``answers(seconds_left, alive)`` returns (at least 1 s left for it): the
        check of a real request, which gives up when ``alive()`` turns false."""
        process = self._process
        if process is None:
            raise EmulatorError(f"{what} is not started")
        deadline = time.monotonic() + timeout
        wait_for_port(host, port, timeout)
        answers(max(deadline - time.monotonic(), 1.0), lambda: process.poll() is None)

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)
        if self._log is not None:
            self._log.close()
            Path(self._log.name).unlink(missing_ok=True)
            self._log = None

    def _log_tail(self) -> str:
        if self._log is None:
            return ""
        self._log.flush()
        text = Path(self._log.name).read_text(errors="replace")
        return "\n".join(text.splitlines()[-self.log_tail_lines :])


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_for_port(host: str, port: int, timeout: float) -> None:
    """Block until something accepts TCP connections on host:port."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError as exc:
            if time.monotonic() > deadline:
                raise EmulatorError(f"nothing listens on {host}:{port} after {timeout}s") from exc
            time.sleep(0.05)


def docker_available(timeout: float = 2.0) -> bool:
    """True when a Docker engine answers (not merely when the client is installed)."""
    try:
        import docker
    except ImportError:
        return False
    try:
        client = docker.from_env(timeout=timeout)
        client.ping()
        client.close()
    except Exception:
        return False
    return True


def choose_backend() -> str:
    """``local`` or ``docker``, per ``ACKLANE_EMULATOR_BACKEND`` or what answers."""
    chosen = os.environ.get(BACKEND_ENV, "").strip().lower()
    if chosen in ("local", "docker"):
        return chosen
    if chosen:
        raise EmulatorError(f"{BACKEND_ENV}={chosen!r}: expected 'local' or 'docker'")
    return "docker" if docker_available() else "local"


def emulator_for(broker: str, backend: str | None = None, **options: Any) -> Emulator:
    """An unstarted emulator of ``broker`` on the chosen backend."""
    try:
        module = importlib.import_module(BROKERS[broker])
    except KeyError:
        raise EmulatorError(
            f"no emulator for broker {broker!r} (known: {', '.join(sorted(BROKERS))})"
        ) from None
    backend = backend or choose_backend()
    cls: type[Emulator] = getattr(module, backend.upper())
    return cls(**options)
