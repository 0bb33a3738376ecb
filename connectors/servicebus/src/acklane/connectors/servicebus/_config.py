"""The YAML block of an Azure Service Bus stream, validated before anything connects."""

from __future__ import annotations

import re
from collections.abc import Hashable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Self

from pydantic import ConfigDict, Field, SecretStr, field_validator, model_validator

from acklane.core.connectors import HeartbeatSettings, StreamSettings

from ._sdk_logs import quiet_sdk_tracebacks

if TYPE_CHECKING:
    from azure.servicebus.aio import ServiceBusClient

__all__ = ["ServiceBusConfig", "namespace_of"]

_ENDPOINT = re.compile(r"(?:^|;)\s*Endpoint\s*=\s*sb://([^/;]+)", re.IGNORECASE)


def namespace_of(connection_string: str) -> str:
    """The namespace host (``name.servicebus.windows.net``, ``localhost:5672``) of a
    connection string; never any part of its key."""
    match = _ENDPOINT.search(connection_string)
    if not match:
        raise ValueError("connection_string: no 'Endpoint=sb://<namespace>' in it")
    return match.group(1).strip().lower()


class ServiceBusConfig(StreamSettings):
    """One Service Bus stream: a queue, or a topic's subscription, and how to consume it.

    The namespace (from ``connection_string`` or ``fully_qualified_namespace``) and the
    entity (``queue``, or ``topic`` + ``subscription``) pick the upstream and form the
    shared stream key; everything else is tuning. Write the connection string as
    ``${ENV_VAR}``: it holds the key, and is never printed. Rejected messages go to
    the entity's own dead-letter sub-queue, so ``dead_letter`` is not set here.
    """

    # hide_input_in_errors: a refused block must not print its connection string.
    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)
    renamed: ClassVar[Mapping[str, str]] = {
        "max_batch": "batch_size",
        "renew_interval": "heartbeat.interval",
    }

    connection_string: SecretStr | None = None
    fully_qualified_namespace: str | None = None
    #: With ``fully_qualified_namespace``: ``default`` is azure-identity's
    #: DefaultAzureCredential (install ``azure-identity``).
    credential: Literal["default"] | None = None

    queue: str | None = None
    topic: str | None = None
    subscription: str | None = None

    #: The entity is session-enabled: the lane is the session id.
    sessions: bool = False
    #: Sessions accepted at once (each a receiver holding its session's lock).
    max_sessions: int = Field(default=4, ge=1, le=256)
    #: Receivers (each a link on a connection of its own) on a sessionless entity at
    #: once: each receives and settles on its own, so round trips overlap.
    receivers: int = Field(default=2, ge=1, le=64)
    #: Seconds an accepted session stays with nothing to deliver before it is let go.
    session_idle_timeout: float = Field(default=5.0, gt=0)
    prefetch: int = Field(default=20, ge=0, le=10_000)
    #: Most messages per receive call.
    batch_size: int = Field(default=20, ge=1, le=1000)
    #: Seconds a receive call waits for a first message.
    max_wait_time: float = Field(default=5.0, gt=0, le=300)
    #: Seconds a message's lock is renewed at most (then it may lapse: redelivery).
    max_lock_renewal: float = Field(default=3600.0, ge=0)
    #: The lock renewal: ``interval`` seconds between passes (default: a quarter of
    #: the shortest lock held, at most 5 s).
    heartbeat: HeartbeatSettings = Field(default_factory=HeartbeatSettings)
    #: Passed to ``ServiceBusClient`` as keyword arguments (``retry_total``, ...).
    client_options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("connection_string", "fully_qualified_namespace", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        return None if value == "" else value

    @field_validator("dead_letter")
    @classmethod
    def _no_other_dead_letter_destination(cls, value: str | None) -> str | None:
        if value is not None:
            raise ValueError(
                "Service Bus dead-letters into the entity's own dead-letter sub-queue "
                "(<entity>/$deadletterqueue); there is no other destination to set: remove it"
            )
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if (self.connection_string is None) == (self.fully_qualified_namespace is None):
            raise ValueError("connection_string / fully_qualified_namespace: give exactly one")
        if self.fully_qualified_namespace is not None and self.credential is None:
            raise ValueError("fully_qualified_namespace: needs credential: default")
        if self.connection_string is not None:
            namespace_of(self.connection_string.get_secret_value())
        if (self.queue is None) == (self.topic is None):
            raise ValueError("queue / topic: give exactly one of them")
        if self.topic is not None and not self.subscription:
            raise ValueError("topic: needs subscription")
        if self.queue is not None and self.subscription is not None:
            raise ValueError("subscription: only with topic")
        if "receive_mode" in self.client_options or "prefetch_count" in self.client_options:
            raise ValueError("client_options: receive_mode / prefetch_count are the connector's")
        return self

    @property
    def namespace(self) -> str:
        if self.fully_qualified_namespace is not None:
            return self.fully_qualified_namespace.strip().lower()
        assert self.connection_string is not None
        return namespace_of(self.connection_string.get_secret_value())

    @property
    def entity(self) -> str:
        """``queue`` or ``topic/Subscriptions/subscription``."""
        if self.queue is not None:
            return self.queue
        return f"{self.topic}/Subscriptions/{self.subscription}"

    def stream_key(self) -> tuple[Hashable, ...]:
        """``("servicebus", namespace, entity)``: never the secret."""
        return ("servicebus", self.namespace, self.entity.lower())

    def describe(self) -> str:
        sessions = f" sessions={self.max_sessions}" if self.sessions else ""
        return f"servicebus {self.namespace} entity={self.entity}{sessions}"

    def make_client(self) -> ServiceBusClient:
        """The stream's asyncio ``ServiceBusClient``, with ``client_options`` as keywords.

        From ``connection_string``, or from ``fully_qualified_namespace`` with
        ``DefaultAzureCredential`` (azure-identity, an optional dependency). Not
        connected yet: the consumer, the publisher and ``validate --connect`` each
        open their own.
        """
        from azure.servicebus.aio import ServiceBusClient

        quiet_sdk_tracebacks()  # each fault is told once, by the connector
        options = dict(self.client_options)
        if self.connection_string is not None:
            return ServiceBusClient.from_connection_string(
                self.connection_string.get_secret_value(), **options
            )
        from azure.identity.aio import DefaultAzureCredential  # optional dependency

        assert self.fully_qualified_namespace is not None
        return ServiceBusClient(self.fully_qualified_namespace, DefaultAzureCredential(), **options)
