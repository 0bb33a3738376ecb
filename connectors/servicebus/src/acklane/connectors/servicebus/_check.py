"""Refused credentials, an unreachable namespace, and ``validate --connect`` for Service Bus.

:func:`auth_error` turns the SDK's authentication and authorisation errors (a key
the namespace does not accept, a token without ``Listen``) into a
:class:`~acklane.core.errors.BrokerAuthError`: the runner stops rather than retry
them. The connection check opens a receiver on the entity and peeks at one
message: peeking locks nothing and settles nothing (no delivery count changes).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from azure.servicebus.exceptions import (
    MessagingEntityNotFoundError,
    ServiceBusAuthenticationError,
    ServiceBusAuthorizationError,
    ServiceBusConnectionError,
)

from acklane.core.connectors import ErrorMap
from acklane.core.errors import BrokerAuthError, BrokerUnreachable, ConnectorError, ReceiveError

from ._config import ServiceBusConfig

__all__ = [
    "ERRORS",
    "NOT_SERVICE_BUS",
    "UNREACHABLE",
    "ServiceBusErrors",
    "auth_error",
    "check_connection",
    "speaks_another_protocol",
    "told_plainly",
]

#: The namespace does not answer (the SDK retried already).
UNREACHABLE = (ServiceBusConnectionError,)


#: What the SDK says when the server answers its AMQP 1.0 header with another protocol's.
_HEADER_MISMATCH = "Mismatching AMQP header protocol"

#: Said instead: the SDK's own words name neither the server nor what it answered.
NOT_SERVICE_BUS = (
    "the server is not a Service Bus namespace: it answered the AMQP 1.0 header with "
    "another protocol's (an AMQP 0-9-1 broker such as RabbitMQ on that port?); check the "
    "stream's connection_string or fully_qualified_namespace"
)


def _causes(exc: BaseException) -> list[BaseException]:
    """``exc`` and the errors it was raised from (or while handling), each once."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not seen for seen in chain):
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def speaks_another_protocol(exc: BaseException) -> bool:
    """Whether ``exc`` says the server is no AMQP 1.0 server (RabbitMQ's 0-9-1, say)."""
    return any(_HEADER_MISMATCH in str(e) for e in _causes(exc))


@contextmanager
def told_plainly() -> Iterator[None]:
    """Raise a server that speaks another protocol as :data:`NOT_SERVICE_BUS` (a
    :class:`~acklane.core.errors.ConnectorError`), the SDK's error as its cause."""
    try:
        yield
    except Exception as exc:
        if speaks_another_protocol(exc):
            raise ConnectorError(NOT_SERVICE_BUS) from exc
        raise


def _text(exc: BaseException) -> str:
    if speaks_another_protocol(exc):
        return NOT_SERVICE_BUS
    return " ".join(str(exc).split()) or type(exc).__name__


def auth_error(exc: BaseException, where: str) -> BrokerAuthError | None:
    """The :class:`BrokerAuthError` for ``exc``, or None when it is no refusal."""
    if isinstance(exc, ServiceBusAuthenticationError):
        return BrokerAuthError(
            f"Service Bus authentication failed ({where}): {_text(exc)}",
            settings=("connection_string", "fully_qualified_namespace", "credential"),
        )
    if isinstance(exc, ServiceBusAuthorizationError):
        return BrokerAuthError(
            f"Service Bus authorisation failed ({where}): {_text(exc)}",
            settings=("connection_string", "queue", "topic", "subscription"),
        )
    if type(exc).__name__ == "ClientAuthenticationError":  # azure-identity's
        return BrokerAuthError(
            f"Service Bus {where}: no usable Azure credential: {_text(exc)}",
            settings=("credential", "fully_qualified_namespace"),
        )
    return None


class ServiceBusErrors(ErrorMap):
    """azure-servicebus's errors onto acklane's kinds (see :class:`ErrorMap`)."""

    broker = "Service Bus"

    def refusal(self, exc: BaseException, where: str) -> BrokerAuthError | None:
        return auth_error(exc, where)

    def unreachable(self, exc: BaseException) -> bool:
        return isinstance(exc, UNREACHABLE)

    def transient(self, exc: BaseException) -> bool:
        # A lock that cannot be renewed lapses and its message comes again: a renewal
        # never fails the group, whatever went wrong.
        return True

    def text(self, exc: BaseException) -> str:
        return _text(exc)


#: The one map of the connector's errors.
ERRORS = ServiceBusErrors()


async def check_connection(config: ServiceBusConfig, call_timeout: float, client: Any) -> str:
    """Open a receiver on the entity and peek at one message (changes nothing).

    ``client`` is a ``ServiceBusClient`` made from the stream's settings with no
    retries and ``call_timeout`` as its socket call_timeout; it is closed here.
    """
    field = "queue" if config.queue is not None else "topic / subscription"
    async with client:
        if config.queue is not None:
            receiver = client.get_queue_receiver(config.queue, max_wait_time=call_timeout)
        else:
            receiver = client.get_subscription_receiver(
                config.topic, config.subscription, max_wait_time=call_timeout
            )
        try:
            async with receiver:
                peeked = await receiver.peek_messages(max_message_count=1, timeout=call_timeout)
        except MessagingEntityNotFoundError:
            raise ReceiveError(f"no such entity {config.entity} ({field})") from None
        except UNREACHABLE as exc:
            where = "connection_string" if config.connection_string else "fully_qualified_namespace"
            raise BrokerUnreachable(
                f"cannot reach namespace {config.namespace} ({where}): {_text(exc)}"
            ) from None
        except Exception as exc:
            refused = auth_error(exc, f"entity {config.entity}")
            if refused is not None:
                raise refused from None
            if speaks_another_protocol(exc):
                raise ReceiveError(NOT_SERVICE_BUS) from None
            raise
    waiting = "a message waiting" if peeked else "no message waiting"
    return f"namespace {config.namespace}: {config.entity} readable ({waiting})"
