"""Refused credentials, an unreachable endpoint, and ``validate --connect`` for Pub/Sub.

:func:`auth_error` turns ``UNAUTHENTICATED`` / ``PERMISSION_DENIED`` answers (and
credentials that cannot be found) into a :class:`~acklane.core.errors.BrokerAuthError`:
the runner stops rather than retry them. :func:`is_unreachable` tells an endpoint
that does not answer (``UNAVAILABLE``, ``DEADLINE_EXCEEDED``). The connection check
reads the subscription (and the ``dead_letter`` topic): nothing is pulled or acked.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from acklane.core.connectors import ErrorMap
from acklane.core.errors import BrokerAuthError, BrokerUnreachable, ReceiveError

from ._client import make_client
from ._config import PubSubConfig

__all__ = [
    "ERRORS",
    "PubSubErrors",
    "auth_error",
    "check_connection",
    "grpc_code",
    "is_unreachable",
    "offline_problems",
]

_CREDENTIALS = ("credentials_file", "endpoint", "emulator_host")
_AUTH_CODES = {
    "UNAUTHENTICATED": ("authentication", _CREDENTIALS),
    "PERMISSION_DENIED": (
        "authorisation",
        ("subscription", "dead_letter", "credentials_file"),
    ),
}
_UNREACHABLE_CODES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED"})
#: Worth retrying at the next lease beat; anything else fails the group.
_TRANSIENT_CODES = _UNREACHABLE_CODES | {"INTERNAL", "RESOURCE_EXHAUSTED", "ABORTED", "UNKNOWN"}


def grpc_code(exc: BaseException) -> str:
    """The gRPC status name of a google.api_core exception (``""`` for others)."""
    code = getattr(exc, "grpc_status_code", None)
    if code is None and hasattr(exc, "code") and callable(exc.code):
        try:
            code = exc.code()  # a bare grpc.aio.AioRpcError
        except Exception:
            code = None
    return str(getattr(code, "name", "")) if code is not None else ""


def _message(exc: BaseException) -> str:
    text = getattr(exc, "message", None) or str(exc)
    return " ".join(str(text).split())


def auth_error(exc: BaseException, where: str) -> BrokerAuthError | None:
    """The :class:`BrokerAuthError` for ``exc``, or None when it is no refusal."""
    if type(exc).__name__ == "DefaultCredentialsError":  # google.auth, imported lazily
        return BrokerAuthError(
            f"Pub/Sub {where}: no Google credentials found ({_message(exc)}); set "
            "credentials_file, GOOGLE_APPLICATION_CREDENTIALS, or emulator_host",
            settings=("credentials_file", "emulator_host"),
        )
    found = _AUTH_CODES.get(grpc_code(exc))
    if found is None:
        return None
    kind, settings = found
    return BrokerAuthError(
        f"Pub/Sub {kind} failed ({where}): {grpc_code(exc)}: {_message(exc)}", settings=settings
    )


def is_unreachable(exc: BaseException) -> bool:
    return grpc_code(exc) in _UNREACHABLE_CODES


def offline_problems(config: PubSubConfig) -> list[tuple[str, str]]:
    """A ``credentials_file`` that does not exist."""
    if config.credentials_file is not None:
        path = Path(config.credentials_file).expanduser()
        if not path.is_file():
            return [("credentials_file", f"{config.credentials_file}: no such file")]
    return []


class PubSubErrors(ErrorMap):
    """google.api_core's errors onto acklane's kinds (see :class:`ErrorMap`)."""

    broker = "Pub/Sub"

    def refusal(self, exc: BaseException, where: str) -> BrokerAuthError | None:
        return auth_error(exc, where)

    def unreachable(self, exc: BaseException) -> bool:
        return is_unreachable(exc)

    def transient(self, exc: BaseException) -> bool:
        return grpc_code(exc) in _TRANSIENT_CODES or super().transient(exc)

    def text(self, exc: BaseException) -> str:
        code = grpc_code(exc)
        return f"{code}: {_message(exc)}" if code else _message(exc)


#: The one map of the connector's errors.
ERRORS = PubSubErrors()


async def check_connection(config: PubSubConfig, call_timeout: float) -> str:
    """Read the subscription, then the dead-letter topic; one try each."""
    endpoint = "emulator_host" if config.emulator_host else "endpoint"
    subscriber = make_client(config, "subscriber")
    try:
        sub = await _call(
            subscriber.get_subscription,
            "subscription",
            endpoint,
            call_timeout,
            subscription=config.subscription_path,
        )
    finally:
        await _close(subscriber)
    found = f"subscription {config.subscription_path} (topic {sub.topic}) readable"
    policy = sub.dead_letter_policy
    dlq = config.dead_letter_topic_path
    if dlq is None:
        if policy and policy.dead_letter_topic:
            return f"{found}; its dead-letter policy sends to {policy.dead_letter_topic}"
        return f"{found}; no dead_letter, no dead-letter policy (rejects are dropped)"
    publisher = make_client(config, "publisher")
    try:
        await _call(publisher.get_topic, "dead_letter", endpoint, call_timeout, topic=dlq)
    finally:
        await _close(publisher)
    return f"{found}; dead-letter topic {dlq} exists"


async def _call(method: Any, field: str, endpoint: str, call_timeout: float, **kwargs: Any) -> Any:
    what = next(iter(kwargs.values()))
    try:
        return await method(**kwargs, retry=None, timeout=call_timeout)
    except Exception as exc:
        refused = auth_error(exc, f"reading {what}")
        if refused is not None:
            raise refused from None
        code = grpc_code(exc)
        if code == "NOT_FOUND":
            kind = "dead-letter topic" if field == "dead_letter" else field.replace("_", " ")
            raise ReceiveError(f"no such {kind}: {what} ({field})") from None
        if code in _UNREACHABLE_CODES:
            raise BrokerUnreachable(
                f"no answer from the Pub/Sub endpoint ({endpoint}) within {call_timeout:g}s: "
                f"{code}: {_message(exc)}"
            ) from None
        raise


async def _close(client: Any) -> None:
    transport = getattr(client, "transport", None)
    close = getattr(transport, "close", None)
    if close is not None:
        with contextlib.suppress(Exception):  # closing a check's client is best effort
            await close()
