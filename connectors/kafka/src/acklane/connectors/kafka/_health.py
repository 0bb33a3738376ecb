"""What librdkafka reports, told once per change: unreachable, reachable again, refused.

librdkafka calls a client's ``error_cb`` for every failed connection attempt (every
second or so, per broker) and logs the same failure through its logger: a broker
that does not answer made hundreds of identical lines. Here:

- a connection error puts the stream in the *unreachable* state, logged once with
  the servers and the first reason; the next sign of life (cluster metadata, an
  assignment, a record, a commit) logs *reconnected* once (both kept by a
  :class:`~acklane.core.connectors.Reachability`, whose problem the producer's
  ``broker_problem()`` returns for ``/readyz``);
- other client errors are logged once per error code until the client recovers;
- authentication and authorisation errors are remembered: the consumer thread
  raises :class:`~acklane.core.errors.BrokerAuthError` on them (the runner stops
  rather than retry credentials that will not change);
- librdkafka's own log lines about failures go to DEBUG (``error_cb`` reports them).
"""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka import KafkaError

from acklane.core.connectors import Reachability
from acklane.core.errors import BrokerAuthError

__all__ = ["AUTH_CODES", "ClientHealth", "QuietClientLog", "auth_error"]

log = logging.getLogger("acklane.connectors.kafka")

_SASL_SETTINGS = ("security_protocol", "sasl_mechanism", "sasl_username", "sasl_password")
_SSL_SETTINGS = (
    "security_protocol",
    "ssl_ca_location",
    "ssl_certificate_location",
    "ssl_key_location",
)

#: Error codes no retry can fix -> the settings of the stream's block to check.
AUTH_CODES: dict[int, tuple[str, ...]] = {
    KafkaError._AUTHENTICATION: _SASL_SETTINGS,
    KafkaError.SASL_AUTHENTICATION_FAILED: _SASL_SETTINGS,
    KafkaError.UNSUPPORTED_SASL_MECHANISM: ("sasl_mechanism",),
    KafkaError.ILLEGAL_SASL_STATE: _SASL_SETTINGS,
    KafkaError._SSL: _SSL_SETTINGS,
    KafkaError.TOPIC_AUTHORIZATION_FAILED: ("topics", "sasl_username"),
    KafkaError.GROUP_AUTHORIZATION_FAILED: ("group_id", "sasl_username"),
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: ("sasl_username",),
}

#: Codes about one broker's connection (librdkafka retries on its own). They make the
#: stream unreachable only once every broker is down (``_ALL_BROKERS_DOWN``): a broker
#: closing an idle connection, or one broker of several restarting, is no outage.
_CONNECTION = frozenset({KafkaError._TRANSPORT, KafkaError._RESOLVE, KafkaError._TIMED_OUT})

#: librdkafka log facilities that repeat what ``error_cb`` reports.
_ERROR_FACILITIES = frozenset({"FAIL", "ERROR"})


def auth_error(error: KafkaError, where: str) -> BrokerAuthError:
    """The :class:`BrokerAuthError` for a refused connection or request."""
    code = error.code()
    kind = (
        "authorisation"
        if code
        in (
            KafkaError.TOPIC_AUTHORIZATION_FAILED,
            KafkaError.GROUP_AUTHORIZATION_FAILED,
            KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        )
        else "authentication"
    )
    return BrokerAuthError(
        f"Kafka {kind} failed ({where}): {error.str()}", settings=AUTH_CODES.get(code, ())
    )


class ClientHealth:
    """The state of one producer's clients, for its log lines; consumer thread only."""

    def __init__(self, describe: str, servers: str) -> None:
        self.describe = describe
        self.servers = servers
        #: Whether the brokers answer; written here (consumer thread), its problem read
        #: from the event loop too (one str attribute).
        self.reachability = Reachability(describe, "broker", servers, logger=log)
        #: The first authentication or authorisation error, until it is raised.
        self.refused: KafkaError | None = None
        self._told: set[int] = set()
        #: The last failure of one broker's connection (the reason of an outage).
        self._connection_error: str | None = None

    @property
    def unreachable(self) -> str | None:
        """Why the brokers are unreachable, while they are."""
        return self.reachability.problem

    def on_error(self, error: KafkaError) -> None:
        """An ``error_cb`` call: change the state, log only when it changes."""
        code = error.code()
        if code in AUTH_CODES:
            if self.refused is None:
                self.refused = error
            return
        if code in _CONNECTION:
            # kept as the reason to give if every broker goes down
            self._connection_error = error.str()
            log.debug("%s: %s", self.describe, error.str())
            return
        if code == KafkaError._ALL_BROKERS_DOWN:
            # follows the error that took the last broker down: that one is the reason
            self.unanswered(self._connection_error or error.str())
            return
        if code in self._told:
            log.debug("%s: Kafka client error again: %s", self.describe, error.str())
            return
        self._told.add(code)
        log.warning("%s: Kafka client error: %s", self.describe, error.str())

    def unanswered(self, reason: str) -> None:
        """No broker answers: all are down, or a request to the cluster timed out."""
        self.reachability.failed(reason)  # librdkafka itself retries

    def alive(self) -> None:
        """The brokers answered (metadata, an assignment, a record, a commit)."""
        self.reachability.answered()
        self._told.clear()


class QuietClientLog:
    """librdkafka's ``logger``: its failure lines at DEBUG, everything else as it says.

    confluent-kafka calls ``log(level, "%s [%s] %s", facility, client, text)``.
    """

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger

    def log(self, level: int, msg: str, *args: Any) -> None:
        if args and args[0] in _ERROR_FACILITIES:
            level = logging.DEBUG
        self.logger.log(level, msg, *args)
