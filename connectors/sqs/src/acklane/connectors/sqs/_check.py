"""Refused credentials, and ``acklane validate --connect`` for an SQS stream.

:func:`auth_error` tells an SQS answer that no retry can fix (a key AWS does not
know, a signature that does not match, no permission) from the others; the
producer raises it as a :class:`~acklane.core.errors.BrokerAuthError`, and the
runner stops. The connection check reads the queue's attributes (and its
dead-letter queue's): nothing is received, sent or deleted.
"""

from __future__ import annotations

import json
import re
from typing import Any

import aioboto3
from aiobotocore.config import AioConfig
from botocore.exceptions import (
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
    PartialCredentialsError,
    ReadTimeoutError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError

from acklane.core.connectors import ErrorMap
from acklane.core.errors import BrokerAuthError, BrokerUnreachable, ReceiveError

from ._config import SqsConfig

__all__ = ["ERRORS", "SqsErrors", "auth_error", "check_connection", "error_code", "reveal"]

_CREDENTIALS = (
    "aws_access_key_id",
    "aws_secret_access_key",
    "aws_session_token",
    "profile",
)
#: Error codes of credentials AWS does not accept (authentication).
_UNAUTHENTICATED = frozenset(
    {
        "InvalidClientTokenId",
        "UnrecognizedClientException",
        "SignatureDoesNotMatch",
        "InvalidAccessKeyId",
        "IncompleteSignature",
        "MissingAuthenticationToken",
        "ExpiredToken",
        "ExpiredTokenException",
        "InvalidSecurity",
        "AuthFailure",
    }
)
#: Error codes of credentials without the permission (authorisation).
_DENIED = frozenset({"AccessDenied", "AccessDeniedException", "KMS.AccessDeniedException"})
_NO_QUEUE = frozenset({"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"})
_XML_FIELD = re.compile(r"<(Code|Message)>([^<]*)</\1>")


def _code_and_message(exc: ClientError) -> tuple[str, str, int | None]:
    """The error's code, message and HTTP status; an XML body read as such (an
    endpoint answering the JSON protocol with XML puts it all in the message)."""
    error = exc.response.get("Error", {})
    code, message = str(error.get("Code", "")), str(error.get("Message", ""))
    if "<" in message:
        found = dict(_XML_FIELD.findall(message))
        code = found.get("Code", code)
        message = found.get("Message", message)
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code, message, status if isinstance(status, int) else None


def auth_error(exc: BaseException, where: str) -> BrokerAuthError | None:
    """The :class:`BrokerAuthError` for ``exc``, or None when it is no refusal."""
    if isinstance(exc, NoCredentialsError | PartialCredentialsError):
        return BrokerAuthError(
            f"SQS {where}: no usable AWS credentials ({exc}); set them in the environment, "
            "a shared credentials file, an instance role, or the stream's fields",
            settings=_CREDENTIALS,
        )
    if not isinstance(exc, ClientError):
        return None
    code, message, status = _code_and_message(exc)
    shown = f"{code}: {message}" if code and not code.isdigit() else message or code
    if code in _DENIED or (status == 403 and code not in _UNAUTHENTICATED and "denied" in shown):
        return BrokerAuthError(
            f"SQS authorisation failed ({where}): {shown}",
            settings=("queue_url", "queue_name", *_CREDENTIALS),
        )
    if code in _UNAUTHENTICATED or status in (401, 403):
        return BrokerAuthError(
            f"SQS authentication failed ({where}): {shown}", settings=_CREDENTIALS
        )
    return None


def reveal(secret: Any) -> str | None:
    """A ``SecretStr``'s value, for the SDK only (never for a log line)."""
    return None if secret is None else str(secret.get_secret_value())


def error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


#: The endpoint did not answer (botocore retried already): wait, the stream goes on.
_UNREACHABLE = (BotoConnectionError, ReadTimeoutError)
#: Error codes worth retrying at the next heartbeat; any other ClientError fails the group.
_TRANSIENT = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "RequestThrottled",
        "TooManyRequestsException",
        "ServiceUnavailable",
        "InternalError",
        "InternalFailure",
        "RequestTimeout",
        "RequestTimeoutException",
    }
)


class SqsErrors(ErrorMap):
    """botocore's errors onto acklane's kinds (see :class:`ErrorMap`)."""

    broker = "SQS"

    def refusal(self, exc: BaseException, where: str) -> BrokerAuthError | None:
        return auth_error(exc, where)

    def unreachable(self, exc: BaseException) -> bool:
        return isinstance(exc, _UNREACHABLE)

    def transient(self, exc: BaseException) -> bool:
        # An SQS answer is transient only by its code (AccessDenied is not: leases would
        # lapse under the watchers); anything that is no answer is worth another beat.
        return not isinstance(exc, ClientError) or error_code(exc) in _TRANSIENT


#: The one map of the connector's errors.
ERRORS = SqsErrors()


async def check_connection(config: SqsConfig, call_timeout: float) -> str:
    """Read the queue's attributes and its dead-letter queue's (one try each)."""
    session = aioboto3.Session(
        profile_name=config.profile,
        aws_access_key_id=reveal(config.aws_access_key_id),
        aws_secret_access_key=reveal(config.aws_secret_access_key),
        aws_session_token=reveal(config.aws_session_token),
        region_name=config.region,
    )
    client_config = AioConfig(
        connect_timeout=call_timeout, read_timeout=call_timeout, retries={"max_attempts": 1}
    )
    async with session.client(
        "sqs", region_name=config.region, endpoint_url=config.endpoint_url, config=client_config
    ) as client:
        field = "queue_url" if config.queue_url is not None else "queue_name"
        url = config.queue_url or await _call(
            client.get_queue_url,
            field,
            QueueName=config.queue_name,
            **({"QueueOwnerAWSAccountId": config.account_id} if config.account_id else {}),
        )
        attributes = await _call(
            client.get_queue_attributes,
            field,
            QueueUrl=url,
            AttributeNames=["QueueArn", "RedrivePolicy", "FifoQueue"],
        )
        found = f"queue {attributes.get('QueueArn') or url} readable"
        dlq, dlq_field = config.dead_letter, "dead_letter"
        if dlq is None and attributes.get("RedrivePolicy"):
            try:
                arn = str(json.loads(attributes["RedrivePolicy"])["deadLetterTargetArn"])
                _, _, _, _, account, name = arn.split(":", 5)
            except (ValueError, KeyError, TypeError) as exc:
                raise ReceiveError(f"{found}, but its RedrivePolicy is unreadable: {exc}") from None
            dlq_field = "the queue's RedrivePolicy"
            dlq = await _call(
                client.get_queue_url, dlq_field, QueueName=name, QueueOwnerAWSAccountId=account
            )
        if dlq is None:
            return f"{found}; no dead-letter queue (rejected messages would be dropped)"
        await _call(
            client.get_queue_attributes, dlq_field, QueueUrl=dlq, AttributeNames=["QueueArn"]
        )
        return f"{found}; dead-letter queue {dlq} readable ({dlq_field})"


async def _call(method: Any, field: str, **kwargs: Any) -> Any:
    """One SQS call; its result's ``QueueUrl`` or ``Attributes``; errors as sentences."""
    what = kwargs.get("QueueName") or kwargs.get("QueueUrl")
    try:
        response = await method(**kwargs)
    except EndpointConnectionError as exc:
        raise BrokerUnreachable(
            f"cannot reach the SQS endpoint (endpoint_url, region): {exc}"
        ) from None
    except ClientError as exc:
        refused = auth_error(exc, f"queue {what}")
        if refused is not None:
            raise refused from None
        code, message, _ = _code_and_message(exc)
        if code in _NO_QUEUE:
            raise ReceiveError(f"no such queue {what} ({field})") from None
        raise ReceiveError(f"queue {what} ({field}): {code}: {message}") from None
    except Exception as exc:
        refused = auth_error(exc, f"queue {what}")
        if refused is not None:
            raise refused from None
        raise
    if "QueueUrl" in response:
        return str(response["QueueUrl"])
    return dict(response.get("Attributes", {}))
