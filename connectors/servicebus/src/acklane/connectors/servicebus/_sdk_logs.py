"""The SDK's tracebacks at DEBUG: the connector tells each fault itself, in one line.

azure-servicebus logs a failure it then raises as an ERROR or WARNING record with
its whole traceback ("Unexpected error occurred (...). Handler shutting down."),
each time a receiver, a sender or the backlog reader fails: against a server that
does not speak Service Bus's protocol, several tracebacks a second. The connector
raises the same failure as one line naming the stream and what to check, and the
runner writes its traceback (the SDK's error as its cause) at DEBUG.

:func:`quiet_sdk_tracebacks` makes every ``azure.servicebus.*`` record of WARNING
or above that carries a traceback a DEBUG record; it is then shown only where
``--log-third-party DEBUG`` asks for the SDK's DEBUG records. Records without a
traceback (the SDK's own warnings) pass unchanged. The records still reach every
handler above ``azure.servicebus``, in the order logging calls them.
"""

from __future__ import annotations

import logging

__all__ = ["quiet_sdk_tracebacks"]

#: The logger whose descendants are every module of azure-servicebus.
SDK_LOGGER = "azure.servicebus"


class _TracebacksAtDebug(logging.Handler):
    """Passes the SDK's records on to the handlers above, tracebacks demoted."""

    def __init__(self, sdk: logging.Logger) -> None:
        super().__init__()
        self.sdk = sdk

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and record.levelno >= logging.WARNING:
            record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
            if not self.sdk.isEnabledFor(logging.DEBUG):
                return
        parent = self.sdk.parent
        if parent is not None:
            parent.callHandlers(record)


def quiet_sdk_tracebacks() -> None:
    """Have the SDK's tracebacks logged at DEBUG (idempotent)."""
    sdk = logging.getLogger(SDK_LOGGER)
    if any(isinstance(h, _TracebacksAtDebug) for h in sdk.handlers):
        return
    sdk.addHandler(_TracebacksAtDebug(sdk))
    # the records reach the handlers above through ours only, once
    sdk.propagate = False
