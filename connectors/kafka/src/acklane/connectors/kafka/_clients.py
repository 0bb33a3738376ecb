"""The Kafka clients of one producer, and what librdkafka reports about them.

The base of the producer's layers (clients, then :mod:`._books`, :mod:`._commit`,
:mod:`._fetch`, and :mod:`._producer` on top, each using only the ones below): the
consumer and admin clients (made on connect, on the consumer thread), the thread
their calls run on, the cluster's id, the dead-letter copies, the counters, and the
client's health (unreachable, refused, failed).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from confluent_kafka import KafkaError

from ._config import KafkaConfig
from ._dlq import DeadLetterCopies
from ._handoff import ConsumerThread
from ._health import AUTH_CODES, ClientHealth, QuietClientLog
from ._identity import ClusterProbe
from ._stats import KafkaStreamStats

__all__ = ["CLIENT_LOG", "KafkaClients"]

#: librdkafka's own log lines, quietened (see :class:`QuietClientLog`).
CLIENT_LOG = QuietClientLog(logging.getLogger("acklane.connectors.kafka.librdkafka"))

T = TypeVar("T")


class KafkaClients:
    """The clients' handles and health; the books, commits and fetches build on it."""

    def __init__(self, config: KafkaConfig) -> None:
        self.config = config
        self.stats = KafkaStreamStats()
        self._thread = ConsumerThread(config.describe())
        self._dead_letters = DeadLetterCopies(config, self.stats, self._on_client_error, CLIENT_LOG)
        self._closed = False
        # Consumer-thread state.
        self._consumer: Any = None
        self._admin: Any = None
        self._cluster_id = ""  # read on connect
        self._failure: KafkaError | None = None
        # Connection state changes, told once each (consumer thread); aclose sets
        # _closing so that a connect waiting for an unreachable cluster ends now.
        self._health = ClientHealth(config.describe(), config.bootstrap_servers)
        # the metadata request that looks for the brokers while they are unreachable
        self._probe = ClusterProbe()
        self._closing = threading.Event()

    def _on_client_error(self, error: KafkaError) -> None:
        # Logged once per state change (ClientHealth); a refusal is raised by the
        # consumer thread; a fatal error fails the group (a new client starts over).
        if error.fatal() and self._failure is None and error.code() not in AUTH_CODES:
            self._failure = error
        self._health.on_error(error)

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the consumer thread, awaited."""
        return await self._thread.submit(self._closed, fn, *args)
