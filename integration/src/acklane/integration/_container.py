"""The Docker backend's base: an emulator run as containers through testcontainers.

Each Docker-backed emulator says *what* to run as plain data (a
:class:`ContainerSpec` per container: image, environment, command, ports, network
aliases, volumes), built without Docker so that it is unit-tested here; this base
does the lifecycle they all share: start once, wait until healthy, and on a failure
or :meth:`~ContainerEmulator.stop` stop the containers (the last started first) and
remove their network, once. testcontainers comes with ``acklane-integration[docker]``
and is imported only when a container starts.
"""

from __future__ import annotations

import contextlib
from abc import abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .emulator import Emulator, EmulatorError

__all__ = ["DOCKER_EXTRA_HINT", "ContainerEmulator", "ContainerSpec", "docker_container"]

DOCKER_EXTRA_HINT = (
    'the docker backend needs testcontainers: pip install "acklane-integration[docker]"'
)


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    """One container to run, as data: what a Docker-backed emulator is made of."""

    image: str
    env: Mapping[str, str] = field(default_factory=dict)
    command: str | None = None
    exposed_ports: tuple[int, ...] = ()
    #: container port -> host port, published as given (clients reach what it advertises)
    bind_ports: Mapping[int, int] = field(default_factory=dict)
    #: names the other containers of the emulator's network reach it by
    aliases: tuple[str, ...] = ()
    #: (host path, container path)
    volumes: tuple[tuple[str, str], ...] = ()


def docker_container(image: str) -> Any:
    """testcontainers' generic container of ``image`` (not started), or
    :class:`EmulatorError` saying what to install."""
    try:
        from testcontainers.core.container import DockerContainer
    except ImportError:
        raise EmulatorError(DOCKER_EXTRA_HINT) from None
    return DockerContainer(image)


def _new_network() -> Any:
    try:
        from testcontainers.core.network import Network
    except ImportError:
        raise EmulatorError(DOCKER_EXTRA_HINT) from None
    network = Network()
    network.create()
    return network


def configure(container: Any, spec: ContainerSpec, network: Any) -> Any:
    """``container`` set up as ``spec`` says, on ``network`` when there is one."""
    for name, value in spec.env.items():
        container.with_env(name, value)
    if spec.command is not None:
        container.with_command(spec.command)
    if spec.exposed_ports:
        container.with_exposed_ports(*spec.exposed_ports)
    for inside, outside in spec.bind_ports.items():
        container.with_bind_ports(inside, outside)
    for host_path, inside_path in spec.volumes:
        container.with_volume_mapping(host_path, inside_path)
    if network is not None:
        container.with_network(network)
        if spec.aliases:
            container.with_network_aliases(*spec.aliases)
    return container


class ContainerEmulator(Emulator):
    """An emulator run as Docker containers.

    Subclasses start their containers in :meth:`_run` with :meth:`_start` (on a
    network of their own from :meth:`_join_network`, when the containers talk to
    each other) and note where clients connect; :meth:`start` then waits
    ``startup_timeout`` seconds for :meth:`wait_healthy`. A subclass that keeps an
    endpoint clears it in ``stop`` after calling this one.
    """

    backend: ClassVar[str] = "docker"
    #: What error messages call the emulator.
    title: ClassVar[str]
    #: Seconds :meth:`start` waits for :meth:`wait_healthy`.
    startup_timeout: float = 120.0

    def __init__(self) -> None:
        self._containers: list[Any] = []
        self._network: Any = None

    @property
    def started(self) -> bool:
        """True from the first container started until :meth:`stop`."""
        return bool(self._containers)

    def start(self) -> None:
        if self.started:
            return
        try:
            self._run()
            self.wait_healthy(self.startup_timeout)
        except BaseException as exc:
            self.stop()
            if isinstance(exc, EmulatorError) or not isinstance(exc, Exception):
                raise
            raise EmulatorError(f"{self.title} did not start: {exc}") from exc

    @abstractmethod
    def _run(self) -> None:
        """Start the containers (with :meth:`_start`) and note the endpoint."""

    def _start(self, spec: ContainerSpec, container: Any = None) -> Any:
        """Start ``spec``'s container: ``container`` when one is made already (a
        module's own container class), else testcontainers' generic one."""
        if container is None:
            container = docker_container(spec.image)
        configure(container, spec, self._network)
        container.start()
        self._containers.append(container)
        return container

    def _join_network(self) -> None:
        """Put the containers started from now on a network of their own."""
        if self._network is None:
            self._network = _new_network()

    def stop(self) -> None:
        containers, self._containers = self._containers, []
        for container in reversed(containers):
            with contextlib.suppress(Exception):
                container.stop()
        network, self._network = self._network, None
        if network is not None:
            with contextlib.suppress(Exception):
                network.remove()
