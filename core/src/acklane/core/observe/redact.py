"""The redaction of every output, under the name docs/configuration.md gives it.

It lives in :mod:`acklane.core.redact`, at the bottom of core's layers: the
configuration, the event store and the sinks mask secrets with it, and all of them
sit below ``observe``. This module names the same functions and state.
"""

from __future__ import annotations

from ..redact import (
    MASK,
    MIN_LENGTH,
    RedactingStream,
    forget_all,
    guard_std_streams,
    is_secret_name,
    known_secrets,
    redact,
    redact_known,
    redact_structure,
    redact_url,
    remember,
    secrets_in,
    url_password,
)

__all__ = [
    "MASK",
    "MIN_LENGTH",
    "RedactingStream",
    "forget_all",
    "guard_std_streams",
    "is_secret_name",
    "known_secrets",
    "redact",
    "redact_known",
    "redact_structure",
    "redact_url",
    "remember",
    "secrets_in",
    "url_password",
]
