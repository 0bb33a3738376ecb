"""The YAML block of an SQS stream, validated before anything connects."""

from __future__ import annotations

import math
import re
from collections.abc import Hashable
from typing import Any, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)

from acklane.core.pipeline.poison import DEFAULT_MAX_ATTEMPTS, MaxAttempts

__all__ = [
    "MAX_VISIBILITY_TIMEOUT",
    "HeartbeatSettings",
    "RedeliveryBackoff",
    "SqsConfig",
]

#: SQS's cap on a message's total invisibility, counted from its receipt (12 hours).
MAX_VISIBILITY_TIMEOUT = 43_200

_AWS_QUEUE_URL = re.compile(r"^https?://sqs[.-]([a-z0-9-]+)\.(?:amazonaws\.com|api\.aws)(?:\.cn)?/")


class RedeliveryBackoff(BaseModel):
    """How long a failed message stays invisible before it is redelivered.

    The delay grows with the message's receive count: ``base * multiplier **
    (receive_count - 1)`` seconds, capped at ``max``. ``base: 0`` (the default)
    makes failed messages visible again at once. A plain number is read as ``base``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    base: float = Field(default=0.0, ge=0, le=MAX_VISIBILITY_TIMEOUT)
    multiplier: float = Field(default=2.0, ge=1.0)
    max: float = Field(default=900.0, ge=0, le=MAX_VISIBILITY_TIMEOUT)

    @model_validator(mode="before")
    @classmethod
    def _number_is_base(cls, data: Any) -> Any:
        if isinstance(data, int | float) and not isinstance(data, bool):
            return {"base": data}
        return data

    def delay(self, receive_count: int) -> int:
        """Whole seconds of invisibility for a message received ``receive_count`` times."""
        if self.base <= 0:
            return 0
        exponent = max(receive_count, 1) - 1
        try:
            seconds = self.base * self.multiplier**exponent
        except OverflowError:
            seconds = self.max
        return math.ceil(min(seconds, self.max))


class HeartbeatSettings(BaseModel):
    """The visibility heartbeat of outstanding (pulled, not yet advanced) messages.

    Every ``interval`` seconds, messages whose visibility ends within two
    intervals are made invisible for ``extension`` more seconds (never past
    SQS's 12-hour cap). Both default from the queue's visibility timeout:
    ``interval`` = a quarter of it (and never more), ``extension`` = all of it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    interval: float | None = Field(default=None, gt=0)
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


class SqsConfig(BaseModel):
    """One SQS stream: which queue, how to reach it, and how to consume it.

    ``queue_url``, or ``queue_name`` (plus ``account_id`` for another account's
    queue), with ``region`` and ``endpoint_url``, pick the upstream and form the
    shared stream key; every other field is tuning. Credentials come the usual
    AWS ways: the default chain (environment, shared files, instance role), a
    named ``profile``, or explicit keys (write them as ``${ENV_VAR}``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

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
    max_messages: int = Field(default=10, ge=1, le=10)
    dead_letter_queue_url: str | None = None
    redelivery_backoff: RedeliveryBackoff = Field(default_factory=RedeliveryBackoff)
    heartbeat: HeartbeatSettings = Field(default_factory=HeartbeatSettings)
    #: Seconds a partial batch of deletes / visibility changes waits for company.
    advance_linger: float = Field(default=0.1, ge=0, le=5)
    #: Attempts for batch entries SQS reports as failed (not for vanished handles).
    entry_retries: int = Field(default=5, ge=1, le=20)
    #: Seconds a closing producer keeps the messages the engine never resolved
    #: invisible, for the next producer of the queue in this process to take over
    #: without a new receive (which would raise their receive count). 0 releases
    #: them at once (so does a hold too short for a take-over, 5 seconds or less).
    restart_lease_hold: int = Field(default=60, ge=0, le=MAX_VISIBILITY_TIMEOUT)
    #: Failed attempts (a filter raised, an ack timeout) after which a redelivered
    #: message is dead-lettered instead of given to the watchers again.
    max_attempts: MaxAttempts = DEFAULT_MAX_ATTEMPTS

    @field_validator(
        "region",
        "endpoint_url",
        "profile",
        "aws_access_key_id",
        "aws_secret_access_key",
        "aws_session_token",
        "dead_letter_queue_url",
        mode="before",
    )
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        """``${VAR:-}`` with VAR unset gives ``""``: read it as "not given"."""
        return None if value == "" else value

    @field_validator("queue_url", "endpoint_url", "dead_letter_queue_url")
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
