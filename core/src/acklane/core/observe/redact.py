"""The redaction of every output, under the name docs/configuration.md gives it.

It lives in :mod:`acklane.core.redact`, at the bottom of core's layers: the
configuration, the event store and the sinks mask secrets with it, and all of them
sit below ``observe``. This module names the same functions and state.
"""

from __future__ import annotations

from .. import redact as _redact
from ..redact import *  # noqa: F403 - every public name, as before

__all__ = _redact.__all__
