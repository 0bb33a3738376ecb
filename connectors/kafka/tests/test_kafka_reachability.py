"""``acklane run`` while the path to a Kafka cluster comes and goes: what only Kafka has.

Against the real emulator (tansu) through a TCP proxy, through ``acklane run`` as a
user starts it: when the cluster comes back, "reconnected" is told once; one dropped
connection (the bootstrap address's) is no outage while the advertised broker
answers; and an outage is every broker down, with the last connection error.

An unreachable cluster told once and refused credentials stopping acklane are rules
of every connector: ``tests/test_conformance_run_errors.py``.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from pathlib import Path

from acklane.integration.emulator import free_port
from acklane.integration.kafka import KafkaKit
from acklane.integration.testing import AcklaneRun, write_pipeline


def _pipeline(tmp_path: Path, stream: str) -> Path:
    return write_pipeline(tmp_path, "kafka", stream)


class _Proxy:
    """A TCP forwarder to the emulator on a port of its own, started on demand."""

    def __init__(self, port: int, target: tuple[str, int]) -> None:
        self.port, self.target = port, target
        self._server: socket.socket | None = None
        self._closing = False

    def start(self) -> None:
        server = socket.create_server(("127.0.0.1", self.port), reuse_port=True)
        self._server = server
        threading.Thread(target=self._accept, args=(server,), daemon=True).start()

    def _accept(self, server: socket.socket) -> None:
        while not self._closing:
            try:
                client, _ = server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._closing = True
        if self._server is not None:
            self._server.close()


def test_reconnected_is_told_once_when_the_cluster_comes_back(
    tmp_path: Path, kafka_kit: KafkaKit
) -> None:
    topic = kafka_kit.new_topic("reconnect")
    host, _, port = kafka_kit.bootstrap_servers.rpartition(":")
    proxy = _Proxy(free_port(), (host, int(port)))
    cfg = _pipeline(
        tmp_path,
        f"bootstrap_servers: 127.0.0.1:{proxy.port}\ntopics: [{topic}]\n"
        f"group_id: {KafkaKit.unique('g')}\n"
        # the emulator's quick group join (as the engine tests have it): the group's
        # timings are not what this test is about, the dropped connection is
        f"client: {json.dumps({**KafkaKit.FAST_GROUP, 'reconnect.backoff.max.ms': 500})}\n",
    )
    with AcklaneRun(cfg) as run:
        try:
            run.wait_for("broker unreachable")
            proxy.start()
            run.wait_for("reconnected to")
            run.wait_for("Kafka consumer subscribed")
        finally:
            proxy.close()
        assert run.stop() == 0, run.output
    out = run.output
    assert out.count("broker unreachable") == 1, out
    assert out.count("reconnected to") == 1, out
    assert "Traceback" not in out


class _DroppingProxy(_Proxy):
    """A :class:`_Proxy` that can cut the connections it carries (a broker closing an
    idle connection, a load balancer timing one out)."""

    def __init__(self, port: int, target: tuple[str, int]) -> None:
        super().__init__(port, target)
        self.carried: list[socket.socket] = []

    def _accept(self, server: socket.socket) -> None:
        while not self._closing:
            try:
                client, _ = server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self.carried += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def drop(self) -> None:
        self.close()
        for s in self.carried:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


def test_one_dropped_connection_is_no_outage(tmp_path: Path, kafka_kit: KafkaKit) -> None:
    """The bootstrap connection goes through a proxy that then cuts it and refuses new
    ones; the broker the cluster advertises still answers: nothing is unreachable."""
    topic = kafka_kit.new_topic("dropped")
    host, _, port = kafka_kit.bootstrap_servers.rpartition(":")
    proxy = _DroppingProxy(free_port(), (host, int(port)))
    proxy.start()
    cfg = _pipeline(
        tmp_path,
        f"bootstrap_servers: 127.0.0.1:{proxy.port}\ntopics: [{topic}]\n"
        f"group_id: {KafkaKit.unique('g')}\n"
        # the emulator's quick group join (as the engine tests have it): the group's
        # timings are not what this test is about, the dropped connection is
        f"client: {json.dumps({**KafkaKit.FAST_GROUP, 'reconnect.backoff.max.ms': 500})}\n",
    )
    with AcklaneRun(cfg) as run:
        try:
            run.wait_for("Kafka partitions assigned")  # talking to the advertised broker
            proxy.drop()
            time.sleep(4)  # librdkafka notices, retries the bootstrap address, fails
        finally:
            proxy.close()
        assert run.stop() == 0, run.output
    out = run.output
    assert "broker unreachable" not in out, out
    assert "Traceback" not in out


def test_only_every_broker_down_is_an_outage_with_the_last_connection_error() -> None:
    from confluent_kafka import KafkaError

    from acklane.connectors.kafka._health import ClientHealth

    health = ClientHealth("kafka stream s", "a:9092,b:9092")
    health.on_error(KafkaError(KafkaError._TRANSPORT, "a:9092/1: Disconnected"))
    health.on_error(KafkaError(KafkaError._TIMED_OUT, "b:9092/2: 1 request(s) timed out"))
    assert health.unreachable is None  # one broker's connection: no outage
    health.on_error(KafkaError(KafkaError._TRANSPORT, "b:9092/2: Connection refused"))
    health.on_error(KafkaError(KafkaError._ALL_BROKERS_DOWN, "2/2 brokers are down"))
    assert health.unreachable is not None
    assert "Connection refused" in health.unreachable
    health.alive()
    assert health.unreachable is None
