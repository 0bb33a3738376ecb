"""The YAML block of an SQS stream, validated before anything connects."""

from __future__ import annotations

import re
from collections.abc import Hashable, Mapping
from typing import Any, ClassVar, Self

from pydantic import Field, SecretStr, field_validator, model_validator

from acklane.core.connectors import HeartbeatSettings, LeaseStreamSettings, RedeliveryBackoff

__all__ = [
    "MAX_VISIBILITY_TIMEOUT",
    "RedeliveryBackoff",
    "SqsConfig",
    "SqsHeartbeat",
]

#: SQS's cap on a message's total invisibility, counted from its receipt (12 hours).
MAX_VISIBILITY_TIMEOUT = 43_200

_AWS_QUEUE_URL = re.compile(r"^https?://sqs[.-]([a-z0-9-]+)\.(?:amazonaws\.com|api\.aws)(?:\.cn)?/")


class SqsHeartbeat(HeartbeatSettings):
    """The visibility heartbeat of outstanding (pulled, not yet advanced) messages.

    Every ``interval`` seconds, messages whose visibility ends within two
    intervals are made invisible for ``extension`` more seconds (never past
    SQS's 12-hour cap). Both default from the queue's visibility timeout:
    ``interval`` = a quarter of it (and never more), ``extension`` = all of it.
    ``enabled: false`` turns it off (a watcher slower than the visibility timeout
    then sees its message redelivered).
    """

    enabled: bool = True
    extension: int | None = Field(default=None, ge=1, le=MAX_VISIBILITY_TIMEOUT)

    @model_validator(mode="after")
    def _extension_outlasts_two_intervals(self) -> Self:
        if (
            self.interval is not None
            and self.extension is not None
            and self.extension <= 2 * self.interval
        ):
            raise ValueError(
                f"heartbeat.extension ({self.extension}) must be longer than two "
                f"heartbeat.interval ({self.interval}): a message would expire between beats"
            )
        return self

    def timing(self, visibility_timeout: int) -> tuple[float, int]:
        """``(interval, extension)`` for a queue whose visibility timeout is given.

        The interval is capped at a quarter of the shorter of the two, so a message
        is always extended at least one beat before its visibility lapses.
        """
        extension = self.extension or max(visibility_timeout, 1)
        shortest = min(extension, max(visibility_timeout, 1))
        interval = min(self.interval or shortest / 4, shortest / 4)
        return max(interval, 0.05), extension


class SqsConfig(LeaseStreamSettings):
    """One SQS stream: which queue, how to reach it, and how to consume it.

    ``queue_url``, or ``queue_name`` (plus ``account_id`` for another account's
    queue), with ``region`` and ``endpoint_url``, pick the upstream and form the
    shared stream key; every other field is tuning. Credentials come the usual
    AWS ways: the default chain (environment, shared files, instance role), a
    named ``profile``, or explicit keys (write them as ``${ENV_VAR}``).
    ``dead_letter`` is the dead-letter queue's URL (default: the queue's redrive
    target); the other shared settings are :class:`LeaseStreamSettings`'.
    """

    renamed: ClassVar[Mapping[str, str]] = {
        "dead_letter_queue_url": "dead_letter",
        "max_messages": "batch_size",
    }
    broker_defaults: ClassVar[Mapping[str, Any]] = {"advance_linger": 0.1}
    longest_lease: ClassVar[float] = MAX_VISIBILITY_TIMEOUT
    broker_name: ClassVar[str] = "SQS"

    queue_url: str | None = None
    queue_name: str | None = None
    account_id: str | None = None
    region: str | None = None
    endpoint_url: str | None = None

    profile: str | None = None
    aws_access_key_id: SecretStr | None = None
    aws_secret_access_key: SecretStr | None = None
    aws_session_token: SecretStr | None = None

    visibility_timeout: int | None = Field(default=None, ge=1, le=MAX_VISIBILITY_TIMEOUT)
    wait_time_seconds: int = Field(default=20, ge=0, le=20)
    #: Messages asked for per ``ReceiveMessage`` (1 to 10).
    batch_size: int = Field(default=10, ge=1, le=10)
    heartbeat: SqsHeartbeat = Field(default_factory=SqsHeartbeat)
    #: Attempts for batch entries SQS reports as failed (not for vanished handles).
    entry_retries: int = Field(default=5, ge=1, le=20)

    @field_validator(
        "region",
        "endpoint_url",
        "profile",
        "aws_access_key_id",
        "aws_secret_access_key",
        "aws_session_token",
        mode="before",
    )
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        """``${VAR:-}`` with VAR unset gives ``""``: read it as "not given"."""
        return None if value == "" else value

    @field_validator("queue_url", "endpoint_url", "dead_letter")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[^/\s]+", value):
            raise ValueError(f"expected an http(s) URL, got {value!r}")
        return value.rstrip("/") if value is not None else None

    @field_validator("queue_name")
    @classmethod
    def _queue_name(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"(?=.{1,80}$)[A-Za-z0-9_-]+(\.fifo)?", value):
            raise ValueError(
                f"{value!r} is not an SQS queue name (1-80 characters: letters, digits, "
                "'-', '_', optionally ending in '.fifo')"
            )
        return value

    @field_validator("account_id")
    @classmethod
    def _account_id(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"\d{12}", value):
            raise ValueError(f"expected a 12-digit AWS account id, got {value!r}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if (self.queue_url is None) == (self.queue_name is None):
            raise ValueError("queue_url / queue_name: give exactly one of them")
        if self.account_id is not None and self.queue_name is None:
            raise ValueError(
                "account_id: only meaningful with queue_name (a URL names its account)"
            )
        if (self.aws_access_key_id is None) != (self.aws_secret_access_key is None):
            raise ValueError("aws_access_key_id / aws_secret_access_key: give both or neither")
        if self.aws_session_token is not None and self.aws_access_key_id is None:
            raise ValueError("aws_session_token: needs aws_access_key_id and aws_secret_access_key")
        if self.profile is not None and self.aws_access_key_id is not None:
            raise ValueError(
                "profile / aws_access_key_id: give a profile or explicit keys, not both"
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _region_from_aws_url(cls, data: Any) -> Any:
        """An AWS queue URL names its region; use it when ``region`` is not given."""
        if isinstance(data, dict) and data.get("region") is None:
            match = _AWS_QUEUE_URL.match(str(data.get("queue_url") or ""))
            if match:
                return {**data, "region": match.group(1)}
        return data

    @property
    def queue_ref(self) -> str:
        """The queue as configured: its URL, else ``[account/]name``."""
        if self.queue_url is not None:
            return self.queue_url
        assert self.queue_name is not None
        return f"{self.account_id}/{self.queue_name}" if self.account_id else self.queue_name

    @property
    def is_fifo_name(self) -> bool:
        """True when the configured URL or name ends in ``.fifo``."""
        return self.queue_ref.endswith(".fifo")

    def stream_key(self) -> tuple[Hashable, ...]:
        """``("sqs", queue, region, endpoint)``: the fields that pick the upstream."""
        return ("sqs", self.queue_ref, self.region or "", self.endpoint_url or "")

    def describe(self) -> str:
        """A one-line, secret-free description."""
        where = f" region={self.region}" if self.region else ""
        endpoint = f" endpoint={self.endpoint_url}" if self.endpoint_url else ""
        return f"sqs queue={self.queue_ref}{where}{endpoint}"
