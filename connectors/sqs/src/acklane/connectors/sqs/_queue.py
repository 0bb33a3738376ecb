"""Reaching an SQS queue and reading what it says of itself, before a stream starts.

The client (botocore's models read off the event loop), the queue's URL (from its
name and account), its attributes (ARN, FIFO, visibility timeout, largest
message), its dead-letter queue (configured, or its ``RedrivePolicy``'s) and
that queue's own largest message: each refusal told in a sentence naming the
setting to check, and an endpoint that does not answer waited for (told once).
"""

from __future__ import annotations

import asyncio
import json
import logging
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import aioboto3
from aiobotocore.config import AioConfig
from botocore.exceptions import ClientError

from acklane.core.connectors import Reachability
from acklane.core.errors import ReceiveError

from ._check import ERRORS, error_code, reveal
from ._config import SqsConfig
from ._entries import int_or_none

__all__ = ["QueueFacts", "open_client", "read_queue"]

log = logging.getLogger("acklane.connectors.sqs")


@dataclass(slots=True)
class QueueFacts:
    """What a stream needs to know of its queue."""

    url: str
    arn: str | None
    fifo: bool
    visibility_timeout: int
    #: ``MaximumMessageSize`` of the queue and of its dead-letter queue, when readable.
    max_message_size: int | None
    dead_letter_url: str | None
    dead_letter_max_size: int | None


async def open_client(
    session: Any,
    cfg: SqsConfig,
    stack: AsyncExitStack,
    *,
    error: type[ReceiveError],
    max_attempts: int = 5,
) -> Any:
    """An aioboto3 SQS client for ``cfg``, entered on ``stack``.

    ``max_attempts`` is botocore's, per call: 5 absorbs a throttle or a dropped
    connection; 1 (the start-up probe of :func:`read_queue`) tells at once that the
    endpoint does not answer, instead of after about 12 s of botocore's backoff."""
    session = session or aioboto3.Session(
        profile_name=cfg.profile,
        aws_access_key_id=reveal(cfg.aws_access_key_id),
        aws_secret_access_key=reveal(cfg.aws_secret_access_key),
        aws_session_token=reveal(cfg.aws_session_token),
        region_name=cfg.region,
    )
    client_config = AioConfig(
        read_timeout=cfg.wait_time_seconds + 15,
        connect_timeout=10,
        retries={"mode": "standard", "max_attempts": max_attempts},
        max_pool_connections=10,
    )
    # Creating a client reads botocore's JSON models (~100 ms of blocking file and
    # parse work): read them on a thread first, so the loop only finds them cached.
    await asyncio.to_thread(_load_models, session)
    try:
        return await stack.enter_async_context(
            session.client(
                "sqs", region_name=cfg.region, endpoint_url=cfg.endpoint_url, config=client_config
            )
        )
    except Exception as exc:
        raise error(f"{cfg.describe()}: cannot create the SQS client: {exc}") from exc


async def read_queue(
    client: Any,
    cfg: SqsConfig,
    reachability: Reachability,
    *,
    error: type[ReceiveError],
    probe: Any = None,
) -> QueueFacts:
    """The queue's facts; waits while the endpoint does not answer.

    With ``probe`` (a client that does not retry), the wait is told as soon as one
    call goes unanswered: the probe asks until the endpoint answers. What it read is
    kept; an answer that was an error is read again by ``client``, with its retries
    and its own errors."""
    reader = _Reader(client, cfg, error)
    attributes: dict[str, str] | None = None
    if probe is not None:
        probing = _Reader(probe, cfg, error)
        attributes = await reachability.until_answered(probing.reach, ERRORS.unreachable)
        reader.url = probing.url
    if attributes is None:
        attributes = await reachability.until_answered(reader.locate, ERRORS.unreachable)
    url = reader.url
    visibility = cfg.visibility_timeout
    if visibility is None:
        visibility = int(attributes.get("VisibilityTimeout", "30"))
    facts = QueueFacts(
        url=url,
        arn=attributes.get("QueueArn"),
        fifo=attributes.get("FifoQueue") == "true" or url.endswith(".fifo"),
        visibility_timeout=visibility,
        max_message_size=int_or_none(attributes.get("MaximumMessageSize")),
        dead_letter_url=cfg.dead_letter
        or await reader.redrive_target(attributes.get("RedrivePolicy")),
        dead_letter_max_size=None,
    )
    if facts.dead_letter_url is not None:
        facts.dead_letter_max_size = await reader.dead_letter_size(
            facts.dead_letter_url, facts.max_message_size
        )
    if cfg.heartbeat.enabled and visibility < 2 and cfg.heartbeat.extension is None:
        log.warning(
            "SQS queue %s: visibility timeout %ss is too short for a heartbeat to "
            "outrun; set heartbeat.extension",
            url,
            visibility,
        )
    log.info(
        "SQS stream on %s (fifo=%s, visibility=%ss, dead-letter=%s)",
        url,
        facts.fifo,
        visibility,
        facts.dead_letter_url or "none",
    )
    return facts


class _Reader:
    def __init__(self, client: Any, cfg: SqsConfig, error: type[ReceiveError]) -> None:
        self.client, self.cfg, self.error = client, cfg, error
        self.url = ""

    async def locate(self) -> dict[str, str]:
        cfg = self.cfg
        self.url = cfg.queue_url or await self.queue_url(cfg.queue_name, cfg.account_id)
        return await self.attributes(self.url)

    async def reach(self) -> dict[str, str] | None:
        """:meth:`locate`'s attributes, or None when the endpoint answered with an
        error (what it means is for a client with retries to tell); raises only while
        the endpoint does not answer."""
        try:
            return await self.locate()
        except Exception as exc:
            if ERRORS.unreachable(exc):
                raise
            return None

    async def queue_url(self, name: str | None, account_id: str | None) -> str:
        kwargs: dict[str, Any] = {"QueueName": name}
        if account_id:
            kwargs["QueueOwnerAWSAccountId"] = account_id
        try:
            response = await self.client.get_queue_url(**kwargs)
        except Exception as exc:
            refused = ERRORS.refusal(exc, f"queue {name}")
            if refused is not None:
                raise refused from exc
            if not isinstance(exc, ClientError):
                raise
            owner = f" of account {account_id}" if account_id else ""
            raise self.error(
                f"SQS queue {name!r}{owner} not found ({self.cfg.describe()}): {exc}"
            ) from exc
        return str(response["QueueUrl"])

    async def attributes(self, url: str) -> dict[str, str]:
        cfg = self.cfg
        try:
            response = await self.client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])
        except ClientError as exc:
            denied = "AccessDenied" in error_code(exc)
            if denied and cfg.dead_letter and cfg.visibility_timeout:
                # Everything the attributes would tell us is configured: go on without.
                log.warning(
                    "SQS queue %s: no permission to read its attributes (%s); using the "
                    "configured visibility_timeout and dead_letter",
                    url,
                    error_code(exc),
                )
                return {}
            hint = (
                " (grant sqs:GetQueueAttributes, or configure both visibility_timeout and "
                "dead_letter)"
                if denied
                else ""
            )
            refused = ERRORS.refusal(exc, f"queue {url}: reading its attributes{hint}")
            if refused is not None:
                raise refused from exc
            raise self.error(f"SQS queue {url}: cannot read its attributes{hint}: {exc}") from exc
        return dict(response.get("Attributes", {}))

    async def dead_letter_size(self, dlq: str, source: int | None) -> int | None:
        """The dead-letter queue's ``MaximumMessageSize``; a warning if it is the smaller."""
        try:
            response = await self.client.get_queue_attributes(
                QueueUrl=dlq, AttributeNames=["MaximumMessageSize"]
            )
        except ClientError as exc:
            log.warning(
                "SQS dead-letter queue %s: cannot read its MaximumMessageSize (%s); a "
                "dead-letter copy too large for it is found out only when SQS refuses it",
                dlq,
                error_code(exc) or exc,
            )
            return None
        size = int_or_none(response.get("Attributes", {}).get("MaximumMessageSize"))
        if size is not None and source is not None and size < source:
            log.warning(
                "SQS dead-letter queue %s takes messages of at most %d bytes, less than the "
                "%d bytes queue %s accepts: a rejected message larger than that cannot be "
                "dead-lettered, stays on the queue and fails its group each time it is "
                "rejected. Raise the MaximumMessageSize of the dead-letter queue to that "
                "of the queue",
                dlq,
                size,
                source,
                self.url,
            )
        return size

    async def redrive_target(self, redrive_policy: str | None) -> str | None:
        if not redrive_policy:
            return None
        try:
            arn = str(json.loads(redrive_policy)["deadLetterTargetArn"])
            _, _, _, _region, account, name = arn.split(":", 5)
        except (ValueError, KeyError, TypeError) as exc:
            raise self.error(
                f"SQS queue {self.url}: unreadable RedrivePolicy {redrive_policy!r}: {exc}"
            ) from exc
        return await self.queue_url(name, account)


def _load_models(session: Any) -> None:
    """Warm the session's botocore loader cache with what creating an SQS client reads.

    Best-effort: if this botocore keeps its models elsewhere, the client loads them itself.
    """
    try:
        loader = session._session.get_component("data_loader")
        loader.load_service_model("sqs", "service-2")
        for name in ("endpoints", "partitions", "sdk-default-configuration", "_retry"):
            loader.load_data(name)
    except Exception as exc:  # only a missed optimization
        log.debug("botocore models not preloaded: %r", exc)
