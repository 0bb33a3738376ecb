"""The Docker backend without Docker: what each emulator would run, and the lifecycle
every one of them shares (:class:`ContainerEmulator`), on stand-in containers.

The containers themselves run only where a Docker engine answers; what they are made
of is plain data (:class:`ContainerSpec`), checked here.
"""

from __future__ import annotations

import importlib.util
from typing import Any, ClassVar

import pytest

from acklane.integration import _container
from acklane.integration._container import ContainerEmulator, ContainerSpec, configure
from acklane.integration.emulator import EmulatorError
from acklane.integration.kafka import KafkaDockerEmulator, broker_spec, kraft_env
from acklane.integration.pubsub import google_emulator_spec
from acklane.integration.schema_registry import confluent_specs
from acklane.integration.servicebus._launcher import (
    MICROSOFT_CONFIG_PATH,
    MICROSOFT_IMAGE,
    SQL_EDGE_IMAGE,
    microsoft_specs,
)

NO_TESTCONTAINERS = importlib.util.find_spec("testcontainers") is None


class StandIn:
    """A testcontainers container that records what it was told."""

    def __init__(self, log: list[str], name: str, *, fails: bool = False) -> None:
        self.log = log
        self.name = name
        self.fails = fails
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, method: str) -> Any:
        if not method.startswith("with_"):
            raise AttributeError(method)

        def record(*args: Any) -> StandIn:
            self.calls.append((method, args))
            return self

        return record

    def start(self) -> None:
        if self.fails:
            raise RuntimeError(f"{self.name} would not start")
        self.log.append(f"start {self.name}")

    def stop(self) -> None:
        self.log.append(f"stop {self.name}")


class Network:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def remove(self) -> None:
        self.log.append("remove network")


class TwoContainers(ContainerEmulator):
    broker: ClassVar[str] = "test"
    title: ClassVar[str] = "the test containers"

    def __init__(self, *, fails: str = "", healthy: BaseException | None = None) -> None:
        super().__init__()
        self.log: list[str] = []
        self.fails = fails
        self.healthy = healthy
        self.runs = 0

    @property
    def endpoint(self) -> str:
        return "here"

    def client_settings(self) -> dict[str, Any]:
        return {}

    def _run(self) -> None:
        self.runs += 1
        self._join_network()
        for name in ("first", "second"):
            self._start(ContainerSpec(name), StandIn(self.log, name, fails=self.fails == name))

    def wait_healthy(self, timeout: float = 60.0) -> None:
        self.log.append(f"healthy? {timeout}")
        if self.healthy is not None:
            raise self.healthy


@pytest.fixture(autouse=True)
def networks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What happened to the stand-in networks the emulators made."""
    log: list[str] = []
    monkeypatch.setattr(_container, "_new_network", lambda: Network(log))
    return log


def test_started_once_then_stopped_last_first_and_the_network_removed_once(
    networks: list[str],
) -> None:
    emulator = TwoContainers()
    with emulator:
        emulator.start()
        assert emulator.started and emulator.runs == 1
        assert emulator.log == ["start first", "start second", "healthy? 120.0"]
    assert emulator.log[-2:] == ["stop second", "stop first"]
    assert not emulator.started
    emulator.stop()
    assert networks == ["remove network"]


def test_a_container_that_does_not_start_stops_those_started_and_names_the_emulator() -> None:
    emulator = TwoContainers(fails="second")
    with pytest.raises(EmulatorError, match="the test containers did not start: second would"):
        emulator.start()
    assert emulator.log == ["start first", "stop first"]
    assert not emulator.started


def test_an_unhealthy_emulator_is_stopped_and_its_error_kept_as_it_is() -> None:
    emulator = TwoContainers(healthy=EmulatorError("never answered"))
    with pytest.raises(EmulatorError, match=r"^never answered$"):
        emulator.start()
    assert emulator.log[-2:] == ["stop second", "stop first"]


def test_an_interrupt_while_waiting_stops_the_containers_and_goes_on() -> None:
    emulator = TwoContainers(healthy=KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        emulator.start()
    assert emulator.log[-2:] == ["stop second", "stop first"]


def test_a_spec_configures_its_container_and_joins_the_network_under_its_aliases() -> None:
    container = StandIn([], "c")
    network = object()
    spec = ContainerSpec(
        "image",
        env={"A": "1"},
        command="run it",
        exposed_ports=(1, 2),
        bind_ports={9092: 4000},
        aliases=("kafka",),
        volumes=(("/here", "/there"),),
    )
    configure(container, spec, network)
    assert container.calls == [
        ("with_env", ("A", "1")),
        ("with_command", ("run it",)),
        ("with_exposed_ports", (1, 2)),
        ("with_bind_ports", (9092, 4000)),
        ("with_volume_mapping", ("/here", "/there")),
        ("with_network", (network,)),
        ("with_network_aliases", ("kafka",)),
    ]
    alone = StandIn([], "alone")
    configure(alone, ContainerSpec("image", aliases=("kafka",)), None)
    assert alone.calls == []


def test_the_kafka_broker_advertises_the_host_port_it_is_published_on() -> None:
    spec = broker_spec("apache/kafka:x", "CLUSTER", "docker-host", 4321)
    assert spec.image == "apache/kafka:x"
    assert spec.bind_ports == {9092: 4321}
    assert spec.env["KAFKA_ADVERTISED_LISTENERS"] == "PLAINTEXT://docker-host:4321"
    assert spec.env["CLUSTER_ID"] == "CLUSTER"
    assert spec.env["KAFKA_GROUP_MIN_SESSION_TIMEOUT_MS"] == "500"
    assert kraft_env("CLUSTER", "docker-host:4321").items() <= spec.env.items()


def test_the_schema_registry_reaches_its_broker_by_name_on_their_network() -> None:
    kafka, registry = confluent_specs("registry:x", "kafka:x", "CLUSTER", 5555)
    assert kafka.aliases == ("kafka",)
    assert kafka.env == kraft_env("CLUSTER", "kafka:9092")
    assert registry.env["SCHEMA_REGISTRY_KAFKASTORE_BOOTSTRAP_SERVERS"] == "PLAINTEXT://kafka:9092"
    assert registry.bind_ports == {8081: 5555}


def test_googles_emulator_serves_the_project_on_its_exposed_port() -> None:
    spec = google_emulator_spec("google:x", "proj")
    assert spec.command is not None and "--project=proj" in spec.command
    assert "--host-port=0.0.0.0:8085" in spec.command
    assert spec.exposed_ports == (8085,)


def test_microsofts_emulator_finds_sql_edge_by_name_and_mounts_a_config_given() -> None:
    sql, bus = microsoft_specs("pw", None)
    assert (sql.image, sql.aliases) == (SQL_EDGE_IMAGE, ("sqledge",))
    assert sql.env["MSSQL_SA_PASSWORD"] == bus.env["MSSQL_SA_PASSWORD"] == "pw"
    assert (bus.image, bus.env["SQL_SERVER"], bus.exposed_ports) == (
        MICROSOFT_IMAGE,
        "sqledge",
        (5672,),
    )
    assert bus.volumes == ()
    _, mounted = microsoft_specs("pw", "/tmp/Config.json")
    assert mounted.volumes == (("/tmp/Config.json", MICROSOFT_CONFIG_PATH),)


@pytest.mark.skipif(not NO_TESTCONTAINERS, reason="testcontainers is installed")
def test_without_testcontainers_a_docker_emulator_says_what_to_install() -> None:
    emulator = KafkaDockerEmulator()
    with pytest.raises(EmulatorError, match=r"acklane-integration\[docker\]"):
        emulator.start()
    assert not emulator.started
