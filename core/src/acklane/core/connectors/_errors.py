"""One map per connector from its SDK's exceptions to acklane's error kinds.

An SDK raises its own exceptions (botocore's ``ClientError``, google's
``GoogleAPICallError``, azure's ``ServiceBusError``); the engine, the runner and
``/readyz`` want to know only what *kind* of trouble it is, as httpx maps its
transport's exceptions onto its own. Each connector writes one :class:`ErrorMap`
(what is a refusal of credentials, what means "does not answer", what is worth
retrying) and raises through it:

- a refusal -> :class:`~acklane.core.errors.BrokerAuthError` (the runner stops);
- no answer -> :class:`~acklane.core.errors.BrokerUnreachable` (the producer waits
  and tries again, :class:`~acklane.core.connectors.Reachability` tells it once);
- anything else -> the kind of the operation: a
  :class:`~acklane.core.errors.ReceiveError` or an
  :class:`~acklane.core.errors.AdvanceError` (the group fails);
- an acklane error (already mapped) and a cancellation pass through unchanged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import ClassVar

from ..errors import (
    AcklaneError,
    AdvanceError,
    BrokerAuthError,
    BrokerUnreachable,
    ConnectorError,
    ReceiveError,
)

__all__ = ["ErrorMap"]


class ErrorMap:
    """A connector's map of its SDK's exceptions (subclass it, once per connector)."""

    #: The broker's name, at the start of every message (``"SQS"``).
    broker: ClassVar[str] = "broker"

    def refusal(self, exc: BaseException, where: str) -> BrokerAuthError | None:
        """The :class:`BrokerAuthError` for ``exc`` when it refuses the credentials."""
        return None

    def unreachable(self, exc: BaseException) -> bool:
        """Whether ``exc`` says the broker did not answer (it may come back)."""
        return False

    def transient(self, exc: BaseException) -> bool:
        """Whether a lease extension failing with ``exc`` is worth retrying next beat."""
        return isinstance(exc, BrokerUnreachable) or self.unreachable(exc)

    def text(self, exc: BaseException) -> str:
        """``exc``'s message on one line."""
        text = str(getattr(exc, "message", None) or exc)
        return " ".join(text.split()) or type(exc).__name__

    def map(
        self, exc: BaseException, where: str, kind: type[ConnectorError] = ReceiveError
    ) -> BaseException:
        """The acklane error for ``exc`` raised while ``where`` (see the module)."""
        if isinstance(exc, AcklaneError | asyncio.CancelledError):
            return exc
        refused = self.refusal(exc, where)
        if refused is not None:
            return refused
        if self.unreachable(exc):
            return BrokerUnreachable(f"{self.broker} {where}: {self.text(exc)}")
        return kind(f"{self.broker} {where}: {self.text(exc)}")

    @contextmanager
    def mapped(self, where: str, kind: type[ConnectorError] = ReceiveError) -> Iterator[None]:
        """Raise what the body raises as its acklane kind, the SDK's error as the cause."""
        try:
            yield
        except Exception as exc:
            mapped = self.map(exc, where, kind)
            if mapped is exc:
                raise
            raise mapped from exc

    def receiving(self, where: str) -> AbstractContextManager[None]:
        """:meth:`mapped` for a receive."""
        return self.mapped(where, ReceiveError)

    def advancing(self, where: str) -> AbstractContextManager[None]:
        """:meth:`mapped` for a settlement, a commit or a dead-letter copy."""
        return self.mapped(where, AdvanceError)
