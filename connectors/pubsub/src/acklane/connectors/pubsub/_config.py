"""The YAML block of a Pub/Sub stream, validated before anything connects."""

from __future__ import annotations

import re
from collections.abc import Hashable, Mapping
from typing import Any, ClassVar, Self

from pydantic import Field, field_validator, model_validator

from acklane.core.connectors import LeaseStreamSettings, RedeliveryBackoff

__all__ = ["MAX_ACK_DEADLINE", "PubSubConfig", "RedeliveryBackoff"]

#: The service's longest ack deadline (and ``ModifyAckDeadline``), in seconds.
MAX_ACK_DEADLINE = 600

_PROJECT = re.compile(r"^[a-z][a-z0-9.:-]{1,62}[a-z0-9]$|^[a-zA-Z0-9._:-]{1,100}$")
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9._~%+-]{2,254}$")
_SUBSCRIPTION_PATH = re.compile(r"^projects/([^/]+)/subscriptions/([^/]+)$")
_TOPIC_PATH = re.compile(r"^projects/([^/]+)/topics/([^/]+)$")
_HOST_PORT = re.compile(r"^[^\s/:]+(:\d{1,5})?$|^\[[0-9a-fA-F:]+\](:\d{1,5})?$")


class PubSubConfig(LeaseStreamSettings):
    """One Pub/Sub stream: which subscription, how to reach it, how to consume it.

    ``project``, ``subscription`` and the endpoint (``emulator_host`` or
    ``endpoint``) pick the upstream and form the shared stream key; every other
    field is tuning. ``subscription`` and ``dead_letter`` (a topic) take a name (in
    ``project``) or a full path (``projects/P/subscriptions/S``).
    Credentials: Application Default Credentials, or ``credentials_file`` (a
    service-account key file), or none at all with ``emulator_host``. The shared
    settings are :class:`LeaseStreamSettings`'; a redelivery backoff and a lease
    hold are at most 600 s (the longest ack deadline).
    """

    renamed: ClassVar[Mapping[str, str]] = {
        "dead_letter_topic": "dead_letter",
        "max_messages": "batch_size",
        "heartbeat_interval": "heartbeat.interval",
    }
    longest_lease: ClassVar[float] = MAX_ACK_DEADLINE
    broker_name: ClassVar[str] = "Pub/Sub"

    project: str | None = None
    subscription: str

    credentials_file: str | None = None
    emulator_host: str | None = None
    endpoint: str | None = None
    client_options: dict[str, Any] = Field(default_factory=dict)

    #: Messages asked for per ``Pull`` (1 to 1000).
    batch_size: int = Field(default=100, ge=1, le=1000)
    #: Pulled messages not yet advanced, at most; the poll waits beyond it.
    max_outstanding: int = Field(default=1000, ge=1, le=100_000)
    #: Seconds of lease each heartbeat grants (``ModifyAckDeadline``).
    ack_deadline: int = Field(default=60, ge=1, le=MAX_ACK_DEADLINE)

    @field_validator(
        "project", "credentials_file", "emulator_host", "endpoint",
        mode="before",
    )  # fmt: skip
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        """``${VAR:-}`` with VAR unset gives ``""``: read it as "not given"."""
        return None if value == "" else value

    @field_validator("emulator_host", "endpoint")
    @classmethod
    def _host_port(cls, value: str | None) -> str | None:
        if value is not None and not _HOST_PORT.match(value):
            raise ValueError(f"expected host:port (no scheme, no path), got {value!r}")
        return value

    @field_validator("client_options")
    @classmethod
    def _client_options(cls, value: dict[str, Any]) -> dict[str, Any]:
        from google.api_core.client_options import ClientOptions

        known = set(vars(ClientOptions()))
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(
                f"unknown client option(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})"
            )
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        path = _SUBSCRIPTION_PATH.match(self.subscription)
        if path is not None:
            if self.project is not None and self.project != path.group(1):
                raise ValueError(
                    f"subscription: its path names project {path.group(1)!r}, "
                    f"but project is {self.project!r}"
                )
            name = path.group(2)
        elif "/" in self.subscription:
            raise ValueError(
                f"subscription: expected a name or projects/P/subscriptions/S, "
                f"got {self.subscription!r}"
            )
        else:
            if self.project is None:
                raise ValueError("project: required when subscription is a name, not a path")
            name = self.subscription
        if not _NAME.match(name):
            raise ValueError(
                f"subscription: {name!r} is not a Pub/Sub name (3-255 characters, starting "
                "with a letter: letters, digits, - _ . ~ + %)"
            )
        if self.dead_letter is not None:
            topic = _TOPIC_PATH.match(self.dead_letter)
            dl_name = topic.group(2) if topic else self.dead_letter
            if (topic is None and "/" in self.dead_letter) or not _NAME.match(dl_name):
                raise ValueError(
                    f"dead_letter: expected a topic name or projects/P/topics/T, got "
                    f"{self.dead_letter!r}"
                )
        if self.credentials_file is not None and self.emulator_host is not None:
            raise ValueError("credentials_file / emulator_host: an emulator takes no credentials")
        if self.emulator_host is not None and self.endpoint is not None:
            raise ValueError("emulator_host / endpoint: give one of them")
        interval = self.heartbeat.interval
        if interval is not None and interval * 2 >= self.ack_deadline:
            raise ValueError(
                f"heartbeat.interval ({interval:g}) must be shorter than half of "
                f"ack_deadline ({self.ack_deadline}): leases would lapse between beats"
            )
        return self

    @property
    def project_id(self) -> str:
        path = _SUBSCRIPTION_PATH.match(self.subscription)
        if path is not None:
            return path.group(1)
        assert self.project is not None
        return self.project

    @property
    def subscription_path(self) -> str:
        if self.subscription.startswith("projects/"):
            return self.subscription
        return f"projects/{self.project_id}/subscriptions/{self.subscription}"

    @property
    def dead_letter_topic_path(self) -> str | None:
        """The ``dead_letter`` topic as a full path (``projects/P/topics/T``), or None."""
        topic = self.dead_letter
        if topic is None or topic.startswith("projects/"):
            return topic
        return f"projects/{self.project_id}/topics/{topic}"

    @property
    def where(self) -> str:
        """The endpoint as configured: the emulator, another endpoint, or ``""``."""
        return (
            self.emulator_host
            or self.endpoint
            or str(self.client_options.get("api_endpoint") or "")
        )

    def stream_key(self) -> tuple[Hashable, ...]:
        """``("pubsub", project, subscription, endpoint)``: what picks the upstream."""
        return ("pubsub", self.project_id, self.subscription_path, self.where)

    def describe(self) -> str:
        """A one-line, secret-free description."""
        where = f" endpoint={self.where}" if self.where else ""
        return f"pubsub subscription={self.subscription_path}{where}"
