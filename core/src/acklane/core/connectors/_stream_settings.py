"""What every connector's stream block shares: one name for one idea, on every broker.

A user who moves a pipeline from Kafka to SQS should find the dead-letter destination,
the poison bound and the batch under the same names. The settings every broker has are
declared here once (:class:`StreamSettings`), those of the brokers that lease each
message (SQS, Pub/Sub) in :class:`LeaseStreamSettings`; a connector's configuration
derives from one of them and adds only what is its broker's own.

Names change; pipelines written with the old ones must keep loading. A configuration
lists its old names in ``renamed`` (old name -> new name, the new one possibly nested:
``"heartbeat_interval": "heartbeat.interval"``); an old name is read as the new one,
with a :class:`FutureWarning` that names the new one. The YAML loader warns itself,
at the old name's file and line (:func:`rename_fields` does the rewriting for both).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping
from typing import Annotated, Any, ClassVar, Final

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_MAX_BACKOFF",
    "HeartbeatSettings",
    "LeaseStreamSettings",
    "MaxAttempts",
    "RedeliveryBackoff",
    "StreamSettings",
    "deprecated_names",
    "deprecation_message",
    "rename_fields",
]

#: Failed attempts after which a redelivered message is dead-lettered (a stream's default).
DEFAULT_MAX_ATTEMPTS: Final = 5
#: The field every connector's stream block has: ``max_attempts``, 1 to a million.
MaxAttempts = Annotated[int, Field(ge=1, le=1_000_000)]
#: Seconds a redelivery is delayed at most when ``redelivery_backoff.max`` is not given
#: (or the broker's own limit, when that is shorter).
DEFAULT_MAX_BACKOFF: Final = 900.0


def deprecated_names(model: type[BaseModel]) -> Mapping[str, str]:
    """The old names a configuration model still reads (old -> new); none for a model
    that is not a :class:`StreamSettings`."""
    renamed: Mapping[str, str] = getattr(model, "renamed", {})
    return renamed if isinstance(renamed, Mapping) else {}


def rename_fields(
    model: type[BaseModel],
    data: Mapping[str, Any],
    found: Callable[[str, str], None] | None = None,
) -> dict[str, Any]:
    """``data`` with the model's old names replaced by the new ones.

    ``found(old, new)`` is called for each old name present. An old name given
    together with its new one raises :class:`ValueError` (which one was meant cannot
    be told).
    """
    out = dict(data)
    for old, new in deprecated_names(model).items():
        if old not in out:
            continue
        if found is not None:
            found(old, new)
        value = out.pop(old)
        head, _, tail = new.partition(".")
        if not tail:
            if head in out:
                raise ValueError(f"{old} is the old name of {new}: give only {new}")
            out[head] = value
            continue
        inner = out.get(head)
        if inner is None:
            inner = {}
        if not isinstance(inner, Mapping):
            raise ValueError(f"{old} is the old name of {new}, but {head} is not a mapping")
        if tail in inner:
            raise ValueError(f"{old} is the old name of {new}: give only {new}")
        out[head] = {**inner, tail: value}
    return out


def deprecation_message(old: str, new: str) -> str:
    """The words of a deprecated name's warning (the YAML loader puts the file, the
    line and the path to ``old`` before them)."""
    return f"{old} is deprecated, now called {new}; the old name still works for now"


class StreamSettings(BaseModel):
    """The settings every connector's stream block has, under one name on every broker.

    - ``max_attempts``: failed attempts (a filter raised, an ack timeout) after which
      a redelivered message is dead-lettered instead of given to the watchers again;
    - ``dead_letter``: where rejected messages are copied (a topic, a queue URL),
      ``None`` for none: they are then acted past and counted as dropped.

    A subclass lists the names it used to have in ``renamed``; they are read as the
    new names, with a :class:`FutureWarning`.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Old names still read (old -> new; the new one may be nested: ``"a.b"``).
    renamed: ClassVar[Mapping[str, str]] = {}
    #: This broker's defaults of shared fields, where they differ from the base's.
    broker_defaults: ClassVar[Mapping[str, Any]] = {}

    max_attempts: MaxAttempts = Field(
        default=DEFAULT_MAX_ATTEMPTS,
        description="failed attempts (a filter raised, an ack timeout) after which a "
        "redelivered message is dead-lettered instead of given to the watchers again",
    )
    dead_letter: str | None = Field(
        default=None,
        description="where rejected messages are copied before they are acted past; "
        "none: they are dropped (and counted)",
    )

    @model_validator(mode="before")
    @classmethod
    def _old_names_and_broker_defaults(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data

        def warn(old: str, new: str) -> None:
            # user code -> BaseModel.__init__ / model_validate -> pydantic -> here -> warn
            warnings.warn(deprecation_message(old, new), FutureWarning, stacklevel=5)

        out = rename_fields(cls, data, warn) if cls.renamed else dict(data)
        for name, value in cls.broker_defaults.items():
            out.setdefault(name, value)
        return out

    @field_validator("dead_letter", mode="before")
    @classmethod
    def _empty_is_none(cls, value: Any) -> Any:
        """``${VAR:-}`` with VAR unset gives ``""``: read it as "not given"."""
        return None if value == "" else value


class RedeliveryBackoff(BaseModel):
    """How long a failed message waits before the broker delivers it again.

    ``base * multiplier ** (attempt - 1)`` seconds for a message delivered ``attempt``
    times, capped at ``max``. ``base: 0`` (the default) redelivers at once. A plain
    number is read as ``base``. ``max`` defaults to 900 s, or the broker's own limit
    when that is shorter (the configuration fills it in).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    base: float = Field(default=0.0, ge=0)
    multiplier: float = Field(default=2.0, ge=1.0)
    max: float | None = Field(default=None, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _number_is_base(cls, data: Any) -> Any:
        if isinstance(data, int | float) and not isinstance(data, bool):
            return {"base": data}
        return data

    def delay(self, attempt: int | None) -> int:
        """Whole seconds before a message delivered ``attempt`` times (``None``: not
        counted, taken as 1) comes again."""
        if self.base <= 0:
            return 0
        longest = DEFAULT_MAX_BACKOFF if self.max is None else self.max
        try:
            seconds = self.base * self.multiplier ** (max(attempt or 1, 1) - 1)
        except OverflowError:
            seconds = longest
        return math.ceil(min(seconds, longest))

    def within(self, limit: float, broker: str) -> RedeliveryBackoff:
        """This backoff on a broker that delays a message ``limit`` seconds at most:
        refused when it asks for more, its ``max`` filled in when not given."""
        for name in ("base", "max"):
            value = getattr(self, name)
            if value is not None and value > limit:
                raise ValueError(
                    f"redelivery_backoff.{name} ({value:g}) is longer than {broker} can "
                    f"delay a message ({limit:g} s)"
                )
        if self.max is not None:
            return self
        return self.model_copy(update={"max": min(DEFAULT_MAX_BACKOFF, limit)})


class HeartbeatSettings(BaseModel):
    """The lease heartbeat of outstanding (received, not yet advanced) messages.

    Every ``interval`` seconds the leases that would lapse within two intervals are
    extended. ``interval`` defaults to, and is capped at, a quarter of the shortest
    lease, so a lease is always extended at least once before it lapses.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    interval: float | None = Field(default=None, gt=0)


class LeaseStreamSettings(StreamSettings):
    """The settings of a broker that leases each message it delivers (SQS, Pub/Sub).

    On top of :class:`StreamSettings`: how long a failed message waits before it comes
    again (``redelivery_backoff``), how long a closing producer keeps unresolved
    leases for the next one (``restart_lease_hold``), how long a partial batch of
    settlements waits for company (``advance_linger``), and the lease heartbeat.
    A subclass says how long its broker can hold a lease (``longest_lease``) and how
    to name it (``broker_name``).
    """

    #: Seconds the broker can keep a message away at most (a lease, a delay).
    longest_lease: ClassVar[float] = math.inf
    #: The broker, as error messages name it.
    broker_name: ClassVar[str] = "the broker"

    redelivery_backoff: RedeliveryBackoff = Field(
        default_factory=RedeliveryBackoff, validate_default=True
    )
    #: Whole seconds a closing producer keeps the lease of the messages the engine never
    #: resolved, for the next producer of the stream in this process to take them over
    #: without a redelivery; 0 gives them back at once.
    restart_lease_hold: int = Field(default=60, ge=0)
    #: Seconds a partial batch of settlements waits for company (0 to 5).
    advance_linger: float = Field(default=0.05, ge=0, le=5)
    heartbeat: HeartbeatSettings = Field(default_factory=HeartbeatSettings)

    @field_validator("redelivery_backoff")
    @classmethod
    def _backoff_within_the_brokers_limit(cls, value: RedeliveryBackoff) -> RedeliveryBackoff:
        return value.within(cls.longest_lease, cls.broker_name)

    @field_validator("restart_lease_hold")
    @classmethod
    def _hold_within_the_brokers_limit(cls, value: int) -> int:
        if value > cls.longest_lease:
            raise ValueError(
                f"at most {cls.longest_lease:g} seconds: {cls.broker_name} keeps a lease no "
                f"longer (got {value})"
            )
        return value
