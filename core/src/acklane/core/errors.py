"""acklane's exceptions: one root, :class:`AcklaneError`, and a branch per area.

::

    AcklaneError
    ├── ConfigError         (also ValueError)  the YAML configuration is invalid
    ├── ConnectorError                         a connector, its registry or its broker
    │   ├── ReceiveError      (also RuntimeError) the source cannot be read from
    │   ├── AdvanceError      (also RuntimeError) a settle, commit or dead-letter copy failed
    │   │   └── DeadLetterRefused                 the destination refused a copy (too large)
    │   ├── BrokerUnreachable                     the broker does not answer (it may come back)
    │   └── BrokerAuthError                       the broker refused the credentials
    ├── StateStoreError                        the task store and the asset store
    └── SharedStreamError                      a subscriber's filter iterator was failed

Each distribution defines its own errors beneath a branch, next to the code that
raises them (``KafkaAdvanceError`` in ``acklane.connectors.kafka``, ``AckTimeout`` in
``acklane.core.trigger``...), and keeps the built-in base its callers caught before
(``ConfigError`` is still a ``ValueError``, ``KafkaReceiveError`` a ``RuntimeError``).
The errors of acklane's tooling (the demo, the emulators) sit directly beneath the
root. ``except AcklaneError`` catches every one of them.

This module imports nothing of acklane's, so every other module can import it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

__all__ = [
    "AcklaneError",
    "AdvanceError",
    "BrokerAuthError",
    "BrokerUnreachable",
    "ConfigError",
    "ConnectorError",
    "DeadLetterRefused",
    "ReceiveError",
    "SharedStreamError",
    "StateStoreError",
]


class AcklaneError(Exception):
    """The root of every error acklane's distributions raise on purpose."""


class ConfigProblem(NamedTuple):
    """One problem in a configuration: where (file, line, field path) and what.

    Defined here, beside the :class:`ConfigError` that carries it, so that this module
    needs nothing of acklane's (:mod:`acklane.core.config` re-exports it).
    """

    source: str
    line: int | None
    path: str
    message: str

    def __str__(self) -> str:
        where = f"{self.source}:{self.line}" if self.line is not None else self.source
        return f"{where}: {self.path}: {self.message}" if self.path else f"{where}: {self.message}"


class ConfigError(AcklaneError, ValueError):
    """The configuration is invalid; ``problems`` lists every problem found, by line."""

    def __init__(self, problems: Sequence[ConfigProblem]) -> None:
        self.problems = sorted(problems, key=lambda p: (p.line is None, p.line or 0))
        if len(self.problems) == 1:
            text = str(self.problems[0])
        else:
            source = self.problems[0].source if self.problems else "configuration"
            text = f"{len(self.problems)} problems in {source}:\n" + "\n".join(
                f"  {p}" for p in self.problems
            )
        super().__init__(text)


class ConnectorError(AcklaneError):
    """A connector cannot be found, or it cannot use its broker (receive, commit, delete...)."""


class ReceiveError(ConnectorError, RuntimeError):
    """The stream's source cannot be read: it does not exist, or a receive failed for
    a reason no retry fixes. The group fails (the runner restarts it)."""


class AdvanceError(ConnectorError, RuntimeError):
    """The broker refused to settle, commit or dead-letter a resolved message.

    Nothing past that message was acted on; the group fails and, once restarted,
    the message comes again.
    """


class DeadLetterRefused(AdvanceError):
    """The dead-letter destination refused a copy as too large: the original is kept.

    ``settings`` names what to raise (the destination's size limit, a client's).
    """

    def __init__(self, message: str, *, settings: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.settings = tuple(settings)


class BrokerUnreachable(ConnectorError):
    """The broker did not answer (a connection refused, a timeout): not the group's
    failure, the connector keeps trying (see ``Reachability``)."""


class BrokerAuthError(ConnectorError):
    """The broker refused the stream's credentials or their permissions.

    Authentication (a wrong password or key) and authorisation (no right to read the
    topic, queue or subscription) do not heal by retrying: the runner stops and
    ``acklane run`` exits with code 1, with one line naming the stream and the
    settings to check (``settings``, the field names of the stream's block).
    """

    def __init__(self, message: str, *, settings: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.settings = tuple(settings)


class StateStoreError(AcklaneError):
    """Base class of the errors raised by the task store and the asset store."""


class SharedStreamError(AcklaneError):
    """Base of the errors a subscriber's filter iterator raises when it is failed."""
