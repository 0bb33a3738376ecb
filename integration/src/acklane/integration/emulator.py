"""One interface for every broker emulator, whatever starts it.

Each broker's module (``kafka``, ``sqs``, ...) exposes two ``Emulator`` classes,
``LOCAL`` (a local process: used on machines without a Docker engine) and
``DOCKER`` (testcontainers with the broker's official image). The backend is
chosen by ``ACKLANE_EMULATOR_BACKEND=local|docker``, else Docker when an engine
answers, else local.

The modules are found by entry point, as connectors, demos and commands are: the
group ``acklane.emulators`` maps a broker name to its module, and names the extra
of its distribution that brings what the emulator needs
(``kafka = "acklane.integration.kafka [kafka]"``). An emulator whose extra is not
installed is refused before anything is imported, with what to install.
"""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from importlib.metadata import Distribution, EntryPoint, PackageNotFoundError, entry_points
from importlib.metadata import distribution as installed_distribution
from pathlib import Path
from typing import Any, ClassVar, Self

from packaging.requirements import InvalidRequirement, Requirement

from acklane.core.errors import AcklaneError

__all__ = [
    "BACKEND_ENV",
    "BROKERS",
    "ENTRY_POINT_GROUP",
    "Emulator",
    "EmulatorError",
    "brokers",
    "choose_backend",
    "docker_available",
    "emulator_for",
    "free_port",
    "install_hint",
    "missing_requirements",
    "require_free_port",
    "require_installed",
    "wait_for_port",
]

BACKEND_ENV = "ACKLANE_EMULATOR_BACKEND"

#: broker name -> the module exposing its ``LOCAL`` and ``DOCKER`` emulator classes.
ENTRY_POINT_GROUP = "acklane.emulators"

#: The distribution that registers acklane's own emulators (its extras are brokers').
INTEGRATION = "acklane-integration"


def _registered() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def brokers() -> list[str]:
    """The brokers with a registered emulator, whether or not what it needs is installed."""
    return sorted(_registered())


#: broker name -> module exposing ``LOCAL`` and ``DOCKER`` (the entry points, read at import).
BROKERS: dict[str, str] = {name: ep.module for name, ep in sorted(_registered().items())}


def _entry_point(broker: str) -> EntryPoint:
    ep = _registered().get(broker)
    if ep is None:
        known = ", ".join(brokers()) or "none"
        raise EmulatorError(f"no emulator for broker {broker!r} (known: {known})")
    return ep


def missing_requirements(broker: str) -> list[str]:
    """What ``broker``'s emulator needs and is not installed (empty: it can run).

    Read from its distribution's metadata: the requirements of the extras its entry
    point names, and of their own extras (``moto[server]``), each checked against
    the installed distributions by name and version.
    """
    ep = _entry_point(broker)
    if ep.dist is None or not ep.extras:
        return []
    return _unmet(ep.dist, set(ep.extras), set())


def _unmet(dist: Distribution, extras: set[str], seen: set[str]) -> list[str]:
    """The requirements of ``dist``'s ``extras`` (not its base ones) that are not met."""
    out: list[str] = []
    for text in dist.requires or ():
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        marker = req.marker
        if marker is None or marker.evaluate({"extra": ""}):
            continue  # a base requirement: installed with the distribution itself
        if not any(marker.evaluate({"extra": extra}) for extra in extras):
            continue
        extras_of = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
        wanted = f"{req.name}{extras_of}{req.specifier}"
        try:
            got = installed_distribution(req.name)
        except PackageNotFoundError:
            out.append(wanted)
            continue
        if not req.specifier.contains(got.version, prereleases=True):
            out.append(f"{wanted} ({got.version} is installed)")
            continue
        key = f"{req.name.lower()}{sorted(req.extras)}"
        if req.extras and key not in seen:
            seen.add(key)
            out += _unmet(got, set(req.extras), seen)
    return out


def install_hint(broker: str) -> str:
    """The command that installs what ``broker``'s emulator needs."""
    ep = _entry_point(broker)
    dist = ep.dist.metadata["Name"] if ep.dist is not None else INTEGRATION
    extras = f"[{','.join(ep.extras)}]" if ep.extras else ""
    hint = f'pip install "{dist}{extras}"'
    if dist == INTEGRATION:
        hint += f' (with acklane: "acklane[{broker}-testing]")'
    return hint


def require_installed(broker: str) -> None:
    """:class:`EmulatorError` naming what to install, if ``broker``'s emulator cannot run."""
    missing = missing_requirements(broker)
    if missing:
        raise EmulatorError(
            f"the {broker} emulator needs {_listed(missing)}, not installed: {install_hint(broker)}"
        )


def _listed(items: Iterable[str]) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


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

    @property
    def pid(self) -> int | None:
        """The server process's id while it runs (benches read its CPU time)."""
        return None if self._process is None else self._process.pid

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


def require_free_port(host: str, port: int) -> None:
    """:class:`EmulatorError` naming ``port`` and ``--port`` if nothing can listen there.

    Checked before an emulator is started on a port it was given: else the process
    dies with its own traceback (a bind error), or, worse, the check that it answers
    reaches whatever already listens there (another Kafka broker) and the emulator
    seems to start. ``SO_REUSEADDR`` as servers set it, so a port that only has
    connections closing (TIME_WAIT) is not reported as taken.
    """
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host.strip("[]"), port))
        except OSError as exc:
            reason = (
                "is in use by another process"
                if exc.errno == errno.EADDRINUSE
                else f"cannot be listened on ({exc.strerror or exc})"
            )
            raise EmulatorError(
                f"port {port} on {host} {reason}: stop what listens there, "
                "or pick another port with --port"
            ) from None


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
    """An unstarted emulator of ``broker`` on the chosen backend.

    :class:`EmulatorError` when no distribution registers one, or when what it needs
    is not installed (saying what to install).
    """
    ep = _entry_point(broker)
    require_installed(broker)
    module = ep.load()
    backend = backend or choose_backend()
    cls: type[Emulator] = getattr(module, backend.upper())
    return cls(**options)
