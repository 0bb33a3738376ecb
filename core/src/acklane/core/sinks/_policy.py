"""What becomes of an attempt: pure rules, tested without a database or a receiver.

An attempt's result is None (delivered) or an exception. A :class:`RefusedDelivery`
parks the event at once; anything else is retried after a capped exponential
backoff with jitter, unless the event has used its ``max_attempts`` or is older
than ``max_age``, in which case it is parked with its last error.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from ._base import DeliveryError, DeliveryResult, RefusedDelivery, RetryableDelivery
from ._settings import SinkSettings

__all__ = ["Verdict", "backoff_delay", "judge", "reason_of"]

#: The longest reason kept per event (a receiver's error page can be large).
MAX_REASON = 500


@dataclass(frozen=True, slots=True)
class Verdict:
    """What to do with one event after an attempt."""

    outcome: Literal["delivered", "retry", "parked"]
    #: The attempts made so far, this one included.
    attempts: int
    reason: str | None = None
    #: When to try again (``retry`` only).
    next_attempt_at: datetime | None = None


def reason_of(error: BaseException) -> str:
    """A one-line reason for ``error``: a DeliveryError's own words, else its type and text."""
    if isinstance(error, DeliveryError):
        text = error.reason
    else:
        text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    text = " ".join(text.split())
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 1] + "…"


def backoff_delay(
    attempts: int, initial: float, cap: float, *, rng: random.Random | None = None
) -> float:
    """Seconds before the attempt after ``attempts`` failed ones: ``initial * 2**(n-1)``
    capped at ``cap``, with "equal jitter" (between half of it and all of it), so that
    retries spread out but never come back at once."""
    base = min(cap, initial * 2.0 ** max(0, min(attempts - 1, 60)))
    r = (rng or random).random()
    return base / 2 + r * base / 2


def judge(
    result: DeliveryResult,
    *,
    attempts: int,
    stored_at: datetime,
    now: datetime,
    settings: SinkSettings,
    rng: random.Random | None = None,
) -> Verdict:
    """The verdict on one event whose attempt number ``attempts`` gave ``result``."""
    if result is None:
        return Verdict("delivered", attempts)
    reason = reason_of(result)
    if isinstance(result, RefusedDelivery):
        return Verdict("parked", attempts, f"refused: {reason}")
    if attempts >= settings.max_attempts:
        return Verdict("parked", attempts, f"gave up after {attempts} attempt(s): {reason}")
    delay = backoff_delay(attempts, settings.backoff_initial, settings.backoff_max, rng=rng)
    if isinstance(result, RetryableDelivery) and result.retry_after is not None:
        # Whoever asked for the pause (a receiver's Retry-After, a function sink's
        # retry_after=) is untrusted: at most backoff_max, and NaN asks for nothing.
        asked = result.retry_after
        if not math.isnan(asked):
            delay = max(delay, min(asked, settings.backoff_max))
    retry_at = now + timedelta(seconds=delay)
    if settings.max_age is not None and retry_at - stored_at > timedelta(seconds=settings.max_age):
        return Verdict("parked", attempts, f"older than max_age ({settings.max_age:g}s): {reason}")
    return Verdict("retry", attempts, reason, retry_at)
