"""Which cluster and which topic's life a record comes from: read on connect, per assignment.

A record's offset names it only within one topic's life on one cluster, so its
message id names the cluster (read once on connect) and the topic's id (read once
per assignment: a topic deleted and recreated under the same name comes back with a
new id). Everything here runs on the consumer thread, with the admin client.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicCollection

from ._config import KafkaConfig
from ._errors import KafkaReceiveError
from ._health import AUTH_CODES, ClientHealth, auth_error

__all__ = [
    "METADATA_TIMEOUT",
    "ClusterProbe",
    "ask_topic_ids",
    "raise_if_refused",
    "read_cluster_id",
    "read_topic_ids",
]

log = logging.getLogger("acklane.connectors.kafka")

#: Seconds to wait for the cluster id, topic ids and topic configs.
METADATA_TIMEOUT = 30.0
# Seconds between two looks at a pending metadata request (a close, a refusal).
_METADATA_SLICE = 0.2
# Seconds between two metadata requests looking for the brokers during an outage.
_PROBE_INTERVAL = 5.0


def raise_if_refused(health: ClientHealth, where: str) -> None:
    """The ``BrokerAuthError`` of credentials the brokers refused, if they did."""
    refused = health.refused
    if refused is not None:
        raise auth_error(refused, where)


def read_cluster_id(
    admin: Any, consumer: Any, health: ClientHealth, closing: threading.Event, config: KafkaConfig
) -> str:
    """The cluster's id, part of every message id.

    Read with a metadata request for no topic (``describe_cluster``): the consumer's
    ``cluster_id()`` can miss the metadata it waits for and sleep a second, and
    ``list_topics()`` lists every topic of the cluster.
    """
    cluster = _wait_for_cluster(admin, consumer, health, closing, config)
    if cluster:
        return cluster
    servers = ",".join(sorted(config.bootstrap_servers.split(",")))
    log.warning(
        "Kafka cluster of %s reports no cluster id (a broker before 0.10.1): message ids "
        "name it by its bootstrap servers %s instead",
        config.describe(),
        servers,
    )
    return servers


def _wait_for_cluster(
    admin: Any, consumer: Any, health: ClientHealth, closing: threading.Event, config: KafkaConfig
) -> str | None:
    """The cluster id, waiting as long as the brokers do not answer.

    An unreachable cluster is no reason to fail (and restart) the group: the wait
    goes on, told once (``ClientHealth``), until the brokers answer, the producer
    closes (``closing`` is set), or they refuse the credentials (``BrokerAuthError``,
    raised).
    """
    while True:
        future = admin.describe_cluster(request_timeout=METADATA_TIMEOUT)
        while not future.done():
            admin.poll(0)  # serves error_cb: the unreachable state, a refusal
            consumer.poll(0)  # the consumer's own connection errors
            raise_if_refused(health, "reading the cluster metadata")
            if closing.is_set():
                future.cancel()
                raise KafkaReceiveError(f"{config.describe()}: closed while connecting")
            try:
                future.result(timeout=_METADATA_SLICE)
            except concurrent.futures.TimeoutError:
                continue
            except Exception:
                break
        raise_if_refused(health, "reading the cluster metadata")
        try:
            cluster: str | None = future.result(timeout=0).cluster_id
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if isinstance(error, KafkaError) and error.code() in AUTH_CODES:
                raise auth_error(error, "reading the cluster metadata") from None
            if isinstance(error, KafkaError) and error.code() == KafkaError._TIMED_OUT:
                health.unanswered(error.str())  # told once, keep waiting
                continue
            raise KafkaReceiveError(
                f"cannot read the cluster id of {config.describe()}: {exc}"
            ) from exc
        except Exception as exc:
            raise KafkaReceiveError(
                f"cannot read the cluster id of {config.describe()}: {exc}"
            ) from exc
        health.alive()
        return cluster


class ClusterProbe:
    """While the brokers count as unreachable and nothing arrives (an idle topic), a
    request for the cluster's metadata every few seconds, not waited for: its answer
    is the sign of life that ends the outage (else the stream would stay unready
    until the next record)."""

    __slots__ = ("_future", "_probed_at")

    def __init__(self) -> None:
        self._future: concurrent.futures.Future[Any] | None = None
        self._probed_at = 0.0

    def look(self, admin: Any, health: ClientHealth) -> None:
        """Tell ``health`` of a probe that was answered; send the next when due."""
        probe = self._future
        if probe is not None:
            if not probe.done():
                return
            self._future = None
            if probe.exception() is None:
                health.alive()
                return
        now = time.monotonic()
        if admin is None or now - self._probed_at < _PROBE_INTERVAL:
            return
        self._probed_at = now
        self._future = admin.describe_cluster(request_timeout=METADATA_TIMEOUT)


def ask_topic_ids(admin: Any, topics: set[str]) -> Mapping[str, Any] | Exception:
    """The lookup of ``topics``' ids (KIP-516, Kafka 2.8+), sent (not waited for):
    futures by topic, or the error that refused it."""
    if admin is None or not topics:
        return {}
    try:
        futures: Mapping[str, Any] = admin.describe_topics(
            TopicCollection(sorted(topics)), request_timeout=METADATA_TIMEOUT
        )
    except KafkaException as exc:
        return exc
    return futures


def read_topic_ids(
    topics: set[str], lookup: Mapping[str, Any] | Exception, group_id: str
) -> dict[str, str]:
    """The ids a lookup of ``topics`` gave (it is waited for), by name."""
    if isinstance(lookup, Exception):
        _no_topic_id(topics, lookup, group_id)
        return {}
    ids: dict[str, str] = {}
    for topic, future in lookup.items():
        try:
            topic_id = future.result(timeout=METADATA_TIMEOUT + 5).topic_id
        except Exception as exc:
            _no_topic_id([topic], exc, group_id)
            continue
        if topic_id is None or _is_zero(topic_id):
            log.info(
                "Kafka broker gives no topic id for %s: its message ids name the cluster, "
                "topic, partition and offset only",
                topic,
            )
            continue
        ids[topic] = str(topic_id)
    return ids


def _no_topic_id(topics: Iterable[str], error: Exception, group_id: str) -> None:
    log.warning(
        "Kafka topic id of %s unknown group=%s (%s): its message ids name the cluster, "
        "topic, partition and offset only until the next assignment, so records "
        "redelivered across it may be stored twice",
        ",".join(sorted(topics)),
        group_id,
        error,
    )


def _is_zero(topic_id: Any) -> bool:
    """A topic id of all zeros: what a broker without topic ids answers."""
    return bool(
        topic_id.get_most_significant_bits() == 0 and topic_id.get_least_significant_bits() == 0
    )
