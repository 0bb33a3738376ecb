"""``sinks:`` entries: what every sink kind shares (its name and its delivery policy).

Each kind's own settings subclass :class:`SinkSettings` in the kind's module
(``kind: Literal["webhook"]`` and its fields); the dispatcher reads only the fields
here.
"""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..durations import Duration
from ..names import NAME_PATTERN

__all__ = ["SinkSettings"]


class SinkSettings(BaseModel):
    """One entry of ``sinks:``: a name, a kind, and how events are delivered to it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, Field(pattern=NAME_PATTERN, max_length=200)]
    kind: str
    #: Deliver in store order (one request at a time); ``false`` lets ``concurrency``
    #: requests fly at once and a retrying event no longer holds back the next ones.
    ordered: bool = True
    #: Requests in flight at most (only with ``ordered: false``).
    concurrency: int = Field(default=1, ge=1, le=256)
    #: Events per request, for kinds with a batch form (webhook, broker).
    batch_size: int = Field(default=1, ge=1, le=1000)
    #: Attempts before an event is parked for this sink.
    max_attempts: int = Field(default=10, ge=1)
    #: An event older than this (since it was stored) is parked instead of retried.
    max_age: Annotated[Duration, Field(gt=0)] | None = None
    #: Capped exponential backoff between attempts, with full jitter.
    backoff_initial: Annotated[Duration, Field(gt=0)] = 1.0
    backoff_max: Annotated[Duration, Field(gt=0)] = 300.0
    #: Where a sink new to the store begins: every stored event of its watchers
    #: (``all``), or only those stored from now on (``new``).
    start: Literal["all", "new"] = "all"

    @model_validator(mode="after")
    def _policy(self) -> Self:
        if self.ordered and self.concurrency > 1:
            raise ValueError(
                "concurrency > 1 needs ordered: false (an ordered sink sends one request "
                "at a time, so that events arrive in store order)"
            )
        if self.backoff_max < self.backoff_initial:
            raise ValueError("backoff_max must be >= backoff_initial")
        return self
