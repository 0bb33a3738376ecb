"""The SQS side of the ack channel: receive, keep invisible, delete / release / dead-letter."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import math
import re
import time
import uuid
from collections import Counter, deque
from collections.abc import AsyncGenerator, Hashable, Iterable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aioboto3
from aiobotocore.config import AioConfig
from botocore.exceptions import ClientError, ReadTimeoutError
from botocore.exceptions import ConnectionError as BotoConnectionError

from acklane.core.connectors import Action, Reachability, Verdict, verdict
from acklane.core.connectors.deadletter import (
    ORIGIN_MESSAGE_ID,
    ORIGIN_QUEUE,
    REJECT_REASON,
    TRUNCATED_MARK,
    bounded_text,
    outcome_reason,
)
from acklane.core.errors import ConnectorError
from acklane.core.producer import AdvanceItem, AdvanceOutcome, SharedStreamProducer

from ._check import auth_error
from ._config import MAX_VISIBILITY_TIMEOUT, SqsConfig
from ._message import SqsDelivery, SqsMessage

__all__ = [
    "DEAD_LETTER_ATTRIBUTES",
    "PACKED_ATTRIBUTES",
    "SqsAdvanceError",
    "SqsConnectorError",
    "SqsStreamProducer",
]

log = logging.getLogger("acklane.connectors.sqs")

#: Attributes added to a dead-lettered copy: where it came from and why.
DEAD_LETTER_ATTRIBUTES = (ORIGIN_QUEUE, ORIGIN_MESSAGE_ID, REJECT_REASON)
#: When the original attributes and ours exceed SQS's 10, the originals are packed here.
PACKED_ATTRIBUTES = "acklane.original_attributes"

_SYSTEM_ATTRIBUTES = [
    "ApproximateReceiveCount",
    "ApproximateFirstReceiveTimestamp",
    "SentTimestamp",
    "MessageGroupId",
    "MessageDeduplicationId",
    "SequenceNumber",
    "SenderId",
    "AWSTraceHeader",
]
_BATCH = 10  # SQS's limit of entries per *Batch call
_BATCH_BYTES = 256 * 1024  # SQS's limit of a SendMessageBatch payload (the strictest quota)
_MAX_ATTRIBUTES = 10  # SQS's limit of message attributes per message
_BUFFER_LIMIT = 10 * _BATCH  # advance flushes itself past this many pending entries
_EMPTY_SHORT_POLL_PAUSE = 0.5  # with wait_time_seconds 0, don't spin on an empty queue
#: How long SQS honours a FIFO ReceiveRequestAttemptId (5 minutes), less a margin.
_ATTEMPT_ID_LIFETIME = 270.0
#: Beyond its long-poll wait, how long aclose waits for a receive cut off by a stop.
_RECEIVE_GRACE = 5.0
#: SQS's words when a message or batch is too large (the codes vary by endpoint).
#: The endpoint did not answer (botocore retried already): wait, the stream goes on.
_UNREACHABLE = (BotoConnectionError, ReadTimeoutError)
_SIZE_CODES = frozenset({"BatchRequestTooLong", "MessageTooLong", "RequestEntityTooLarge"})
_SIZE_WORDS = re.compile(r"shorter than|longer than|too (?:long|large|big)|exceed", re.IGNORECASE)


class SqsConnectorError(ConnectorError, RuntimeError):
    """The queue, its dead-letter queue or the SQS endpoint cannot be used."""


class SqsAdvanceError(ConnectorError, RuntimeError):
    """SQS refused to delete, release or dead-letter a message; the group must fail."""


@dataclass(slots=True, eq=False)
class _Pending:
    delivery: SqsDelivery
    visibility: int = 0  # for releases: seconds of invisibility before redelivery


def _code(failure: dict[str, Any]) -> str:
    # JSON-protocol SQS prefixes some codes ("AWS.SimpleQueueService.MessageNotInflight").
    return str(failure.get("Code", "")).rsplit(".", 1)[-1]


def _is_vanished(failure: dict[str, Any]) -> bool:
    """The receipt handle no longer names a message we hold (deleted, expired, purged)."""
    code = _code(failure)
    if code in ("ReceiptHandleIsInvalid", "MessageNotInflight", "InvalidReceiptHandle"):
        return True
    # Real SQS answers an expired handle on ChangeMessageVisibility this way.
    return code == "InvalidParameterValue" and "ReceiptHandle" in str(failure.get("Message", ""))


_T = TypeVar("_T")


def _chunks(items: Sequence[_T], size: int = _BATCH) -> Iterable[Sequence[_T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _entry_bytes(entry: dict[str, Any]) -> int:
    size = len(str(entry["MessageBody"]).encode("utf-8"))
    for name, value in entry.get("MessageAttributes", {}).items():
        size += len(name.encode("utf-8")) + len(value["DataType"])
        size += len(value.get("StringValue", "").encode("utf-8")) + len(
            value.get("BinaryValue", b"")
        )
    return size


def _batches_by_size(
    prepared: list[tuple[SqsDelivery, AdvanceOutcome, dict[str, Any]]],
) -> Iterable[list[tuple[SqsDelivery, AdvanceOutcome, dict[str, Any]]]]:
    """At most 10 entries and 256 KiB per SendMessageBatch (a lone big entry goes alone)."""
    batch: list[tuple[SqsDelivery, AdvanceOutcome, dict[str, Any]]] = []
    size = 0
    for item in prepared:
        n = _entry_bytes(item[2])
        if batch and (len(batch) == _BATCH or size + n > _BATCH_BYTES):
            yield batch
            batch, size = [], 0
        batch.append(item)
        size += n
    if batch:
        yield batch


def _is_size_refusal(failure: dict[str, Any]) -> bool:
    """SQS refused a message (or its batch) for its size."""
    code = _code(failure)
    if code in _SIZE_CODES:
        return True
    return code == "InvalidParameterValue" and bool(
        _SIZE_WORDS.search(str(failure.get("Message", "")))
    )


def _limit_in(message: str) -> int | None:
    """The byte limit SQS names in a size refusal ("...shorter than 262144 bytes")."""
    match = re.search(r"(\d+) bytes", message)
    return int(match.group(1)) if match else None


def _failure_of(exc: Exception) -> dict[str, Any]:
    """A whole call's failure in the shape of one ``Failed`` batch entry."""
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        return {"Code": error.get("Code", ""), "Message": error.get("Message", str(exc))}
    return {"Code": type(exc).__name__, "Message": str(exc)}


# ------------------------------------------------------------ leases kept for a restart


@dataclass(slots=True)
class _Lot:
    """What closing producers of one queue left to the next producer of it in this process."""

    #: Messages the engine never resolved, kept invisible for ``restart_lease_hold``
    #: seconds (their ``visible_until``), in the order they were first yielded.
    deliveries: list[SqsDelivery] = field(default_factory=list)
    #: A FIFO receive that failed or was cut off: ``(ReceiveRequestAttemptId, deadline)``.
    #: Retried with the same id, it returns the batch SQS may already have handed out.
    attempt: tuple[str, float] | None = None


#: Process-wide, by ``(*stream_key, queue_url)``. Plain data: no task owns it, and
#: nothing in it needs one. A lot nobody takes only costs memory until the next
#: producer of that queue looks; SQS redelivers its messages when their hold ends.
_PARKED: dict[tuple[Hashable, ...], _Lot] = {}


class SqsStreamProducer(SharedStreamProducer[SqsDelivery]):
    """One group's poll of one SQS queue, with aioboto3.

    Lanes: the ``MessageGroupId`` on FIFO queues (order kept per group), the
    message itself on standard queues (no head-of-line blocking). Deletes and
    visibility changes are buffered for ``advance_linger`` seconds so that
    single-message lanes still share ``*Batch`` calls; a crash before a flush
    only means a redelivery, which the event store recognises by
    :meth:`message_id` (the queue's ARN and the ``MessageId``).

    When it closes, messages the engine never resolved keep their lease for
    ``restart_lease_hold`` seconds and the next producer of the queue in this
    process takes them over without receiving them again (see ``aclose``).
    """

    #: SQS's cap on a receipt's total invisibility; a class attribute for tests.
    max_visibility: int = MAX_VISIBILITY_TIMEOUT
    #: A parked lease is taken over only with at least this many seconds left: the
    #: take-over renews it, and the renewal must land before SQS lets it go.
    takeover_margin: float = 5.0

    def __init__(self, config: SqsConfig, *, session: Any = None) -> None:
        self.config = config
        self._session = session
        #: SQS HTTP requests sent, by operation (retries included): what AWS bills.
        self.api_calls: Counter[str] = Counter()
        #: Rejected messages deleted without a copy, because no dead-letter queue exists.
        self.dropped = 0
        self.deleted = 0
        self.released = 0
        self.dead_lettered = 0
        #: Dead-letter copies refused for their size (the original is kept, the group fails).
        self.dead_letter_refused = 0
        self.extended = 0
        #: Unresolved messages whose lease this producer kept for the next one at close.
        self.parked = 0
        #: Parked messages this producer took over from a previous one.
        self.taken_over = 0
        self.queue_url: str | None = None
        self.queue_arn: str | None = None
        self.dead_letter_queue_url: str | None = None
        #: ``MaximumMessageSize`` of the queue and of its dead-letter queue, when readable.
        self.max_message_size: int | None = None
        self.dead_letter_max_size: int | None = None
        self.is_fifo = config.is_fifo_name
        self.visibility_timeout = (
            30 if config.visibility_timeout is None else config.visibility_timeout
        )

        self._stack = AsyncExitStack()
        self._client: Any = None
        self._identity = ""  # the queue's ARN (else URL): prefixes message_id()
        self._lot_key: tuple[Hashable, ...] = ()
        self._outstanding: dict[str, SqsDelivery] = {}  # pulled, not advanced; by receipt
        self._unyielded: deque[SqsDelivery] = deque()  # received, not yet handed out
        self._holding_back: set[str] = set()  # FIFO: receipts to release whatever their outcome
        self._to_delete: deque[_Pending] = deque()
        self._to_release: deque[_Pending] = deque()
        self._visibility_lock = asyncio.Lock()  # orders releases after heartbeat extensions
        self._flush_lock = asyncio.Lock()  # one flush at a time: flush() returns when all landed
        self._flush_wanted = asyncio.Event()
        self._batch_full = asyncio.Event()
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._flusher_task: asyncio.Task[None] | None = None
        #: The ReceiveMessage call in flight (its own task, so a stop cannot cut it off).
        self._receive_task: asyncio.Task[list[SqsDelivery]] | None = None
        #: A receive whose poll was cancelled: what it returns is released, not yielded.
        self._orphan: asyncio.Task[list[SqsDelivery]] | None = None
        #: FIFO: the ReceiveRequestAttemptId to send, and until when SQS honours it.
        self._attempt: tuple[str, float] | None = None
        self._failure: BaseException | None = None
        self._opened = False
        self._closed = False
        # Whether the endpoint answers, told once per change (broker_problem, /readyz);
        # its address is the client's, once the client exists.
        self._reachability = Reachability(
            config.describe(), "SQS endpoint", config.endpoint_url or "AWS", logger=log
        )

    # ------------------------------------------------------------------ stream

    async def open_stream(self) -> AsyncGenerator[tuple[SqsMessage, SqsDelivery], None]:
        if self._opened:
            raise RuntimeError(f"{self.config.describe()}: open_stream() may be called once")
        self._opened = True
        await self._start()
        self._flusher_task = asyncio.create_task(
            self._flush_loop(), name=f"acklane sqs flush {self.queue_url}"
        )
        if self.config.heartbeat.enabled:
            interval, extension = self.config.heartbeat.timing(self.visibility_timeout)
            self._heartbeat_task = asyncio.create_task(
                self._heartbeat_loop(interval, extension),
                name=f"acklane sqs heartbeat {self.queue_url}",
            )
        # The heartbeat runs until aclose, not until the stream closes: after a stop the
        # watchers may still be finishing what they pulled, and only ack_timeout may
        # decide they failed.
        try:
            while True:
                self._raise_failure()
                # Leases a previous producer of this queue kept come first (FIFO: their
                # groups are in flight, so SQS delivers nothing else of those groups).
                self._unyielded.extend(await self._take_parked())
                if not self._unyielded:
                    self._unyielded.extend(await self._receive())
                while self._unyielded:
                    delivery = self._unyielded.popleft()
                    yield delivery.message, delivery
        finally:
            # Closed or cancelled: what was received but never handed out goes back now.
            self._release_unyielded()

    def get_advance_lane(self, delivery: SqsDelivery) -> Hashable:
        if self.is_fifo:
            return delivery.group_id
        return delivery.message_id

    def message_id(self, delivery: SqsDelivery) -> str | None:
        """``<queue ARN>/<MessageId>``: the message's identity for the event store.

        ``MessageId`` alone is only "unique for an extended period", and SQS's own
        redrive keeps it when it moves a message to the dead-letter queue; the ARN
        (the URL when the attributes cannot be read) makes it one queue's message.
        """
        return delivery.message.message_id

    @property
    def outstanding(self) -> int:
        """Messages pulled and not yet advanced (the heartbeat keeps these invisible)."""
        return len(self._outstanding)

    @property
    def total_api_calls(self) -> int:
        return sum(self.api_calls.values())

    def broker_problem(self) -> str | None:
        return self._reachability.problem

    def counters(self) -> Mapping[str, float]:
        return {
            Action.DELETED: self.deleted,
            Action.REDELIVERED: self.released,
            Action.DEAD_LETTERED: self.dead_lettered,
            Action.DEAD_LETTER_REFUSED: self.dead_letter_refused,
            Action.DROPPED: self.dropped,
            Action.EXTENDED: self.extended,
            Action.PARKED: self.parked,
            Action.TAKEN_OVER: self.taken_over,
            Action.API_CALLS: self.total_api_calls,
        }

    async def _start(self) -> None:
        cfg = self.config
        session = self._session or aioboto3.Session(
            profile_name=cfg.profile,
            aws_access_key_id=_reveal(cfg.aws_access_key_id),
            aws_secret_access_key=_reveal(cfg.aws_secret_access_key),
            aws_session_token=_reveal(cfg.aws_session_token),
            region_name=cfg.region,
        )
        client_config = AioConfig(
            read_timeout=cfg.wait_time_seconds + 15,
            connect_timeout=10,
            retries={"mode": "standard", "max_attempts": 5},
            max_pool_connections=10,
        )
        # Creating a client reads botocore's JSON models (~100 ms of blocking file and
        # parse work): read them on a thread first, so the loop only finds them cached.
        await asyncio.to_thread(_load_models, session)
        try:
            self._client = await self._stack.enter_async_context(
                session.client(
                    "sqs",
                    region_name=cfg.region,
                    endpoint_url=cfg.endpoint_url,
                    config=client_config,
                )
            )
        except Exception as exc:
            raise SqsConnectorError(
                f"{cfg.describe()}: cannot create the SQS client: {exc}"
            ) from exc
        self._client.meta.events.register("before-send.sqs", self._count_request)
        self._reachability.where = str(self._client.meta.endpoint_url)

        while True:
            try:
                self.queue_url = cfg.queue_url or await self._queue_url(
                    cfg.queue_name, cfg.account_id
                )
                attributes = await self._queue_attributes(self.queue_url, cfg)
                break
            except _UNREACHABLE as exc:
                await self._reachability.wait(exc)
        self._reachability.answered()
        self.queue_arn = attributes.get("QueueArn")
        self._identity = self.queue_arn or self.queue_url
        self._lot_key = (*cfg.stream_key(), self.queue_url)
        self.max_message_size = _int_or_none(attributes.get("MaximumMessageSize"))
        self.is_fifo = attributes.get("FifoQueue") == "true" or self.queue_url.endswith(".fifo")
        if cfg.visibility_timeout is not None:
            self.visibility_timeout = cfg.visibility_timeout
        else:
            self.visibility_timeout = int(attributes.get("VisibilityTimeout", "30"))
        self.dead_letter_queue_url = cfg.dead_letter or await self._redrive_target(
            attributes.get("RedrivePolicy")
        )
        if self.dead_letter_queue_url is None:
            log.warning(
                "SQS queue %s has no dead-letter queue (none configured, no RedrivePolicy): "
                "rejected messages will be deleted and counted as dropped",
                self.queue_url,
            )
        else:
            await self._check_dead_letter_size(self.dead_letter_queue_url)
        if (
            cfg.heartbeat.enabled
            and self.visibility_timeout < 2
            and cfg.heartbeat.extension is None
        ):
            log.warning(
                "SQS queue %s: visibility timeout %ss is too short for a heartbeat to "
                "outrun; set heartbeat.extension",
                self.queue_url,
                self.visibility_timeout,
            )
        log.info(
            "SQS stream on %s (fifo=%s, visibility=%ss, dead-letter=%s)",
            self.queue_url,
            self.is_fifo,
            self.visibility_timeout,
            self.dead_letter_queue_url or "none",
        )

    async def _queue_url(self, name: str | None, account_id: str | None) -> str:
        kwargs: dict[str, Any] = {"QueueName": name}
        if account_id:
            kwargs["QueueOwnerAWSAccountId"] = account_id
        try:
            response = await self._client.get_queue_url(**kwargs)
        except Exception as exc:
            refused = auth_error(exc, f"queue {name}")
            if refused is not None:
                raise refused from exc
            if not isinstance(exc, ClientError):
                raise
            owner = f" of account {account_id}" if account_id else ""
            raise SqsConnectorError(
                f"SQS queue {name!r}{owner} not found ({self.config.describe()}): {exc}"
            ) from exc
        return str(response["QueueUrl"])

    async def _queue_attributes(self, url: str, cfg: SqsConfig) -> dict[str, str]:
        try:
            response = await self._client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])
        except ClientError as exc:
            denied = "AccessDenied" in _error_code(exc)
            if denied and cfg.dead_letter and cfg.visibility_timeout:
                # Everything the attributes would tell us is configured: go on without.
                log.warning(
                    "SQS queue %s: no permission to read its attributes (%s); using the "
                    "configured visibility_timeout and dead_letter",
                    url,
                    _error_code(exc),
                )
                return {}
            hint = (
                " (grant sqs:GetQueueAttributes, or configure both visibility_timeout and "
                "dead_letter)"
                if denied
                else ""
            )
            refused = auth_error(exc, f"queue {url}: reading its attributes{hint}")
            if refused is not None:
                raise refused from exc
            raise SqsConnectorError(
                f"SQS queue {url}: cannot read its attributes{hint}: {exc}"
            ) from exc
        return dict(response.get("Attributes", {}))

    async def _check_dead_letter_size(self, dlq: str) -> None:
        """Read the dead-letter queue's ``MaximumMessageSize``; warn if it is the smaller."""
        try:
            response = await self._client.get_queue_attributes(
                QueueUrl=dlq, AttributeNames=["MaximumMessageSize"]
            )
        except ClientError as exc:
            log.warning(
                "SQS dead-letter queue %s: cannot read its MaximumMessageSize (%s); a "
                "dead-letter copy too large for it is found out only when SQS refuses it",
                dlq,
                _error_code(exc) or exc,
            )
            return
        size = _int_or_none(response.get("Attributes", {}).get("MaximumMessageSize"))
        self.dead_letter_max_size = size
        source = self.max_message_size
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
                self.queue_url,
            )

    async def _redrive_target(self, redrive_policy: str | None) -> str | None:
        if not redrive_policy:
            return None
        try:
            arn = str(json.loads(redrive_policy)["deadLetterTargetArn"])
            _, _, _, _region, account, name = arn.split(":", 5)
        except (ValueError, KeyError, TypeError) as exc:
            raise SqsConnectorError(
                f"SQS queue {self.queue_url}: unreadable RedrivePolicy {redrive_policy!r}: {exc}"
            ) from exc
        return await self._queue_url(name, account)

    async def _receive(self) -> list[SqsDelivery]:
        """One ReceiveMessage call; what it returns is outstanding (heartbeat-covered).

        The call runs in a task of its own: if the poll is cancelled meanwhile (a stop,
        a failing group), the call still completes (within its long-poll wait) and what
        SQS handed out is made visible again at once, instead of staying invisible for
        the visibility timeout (on FIFO queues, with its groups blocked meanwhile).
        """
        task = asyncio.create_task(
            self._receive_call(self._receive_request()),
            name=f"acklane sqs receive {self.queue_url}",
        )
        self._receive_task = task
        try:
            received = await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.done() or (not task.cancelled() and task.exception() is None):
                self._orphan = task
                task.add_done_callback(self._settle_orphan)
            raise
        except _UNREACHABLE as exc:
            # Not the group's failure: the endpoint comes back, and nothing is in flight.
            await self._reachability.wait(exc)
            return []
        self._reachability.answered()
        if not received and self.config.wait_time_seconds == 0:
            await asyncio.sleep(_EMPTY_SHORT_POLL_PAUSE)
        return received

    def _receive_request(self) -> dict[str, Any]:
        cfg = self.config
        request: dict[str, Any] = {
            "QueueUrl": self.queue_url,
            "MaxNumberOfMessages": cfg.batch_size,
            "WaitTimeSeconds": cfg.wait_time_seconds,
            "MessageAttributeNames": ["All"],
            "MessageSystemAttributeNames": _SYSTEM_ATTRIBUTES,
        }
        if cfg.visibility_timeout is not None:
            request["VisibilityTimeout"] = cfg.visibility_timeout
        if self.is_fifo:
            # A receive that failed (its answer lost, its producer closed) is retried with
            # the same id: SQS then returns the batch it may already have handed out,
            # instead of leaving it invisible and its groups blocked.
            now = time.monotonic()
            if self._attempt is None or self._attempt[1] <= now:
                self._attempt = (uuid.uuid4().hex, now + _ATTEMPT_ID_LIFETIME)
            request["ReceiveRequestAttemptId"] = self._attempt[0]
        return request

    async def _receive_call(self, request: dict[str, Any]) -> list[SqsDelivery]:
        started = time.monotonic()
        try:
            response = await self._client.receive_message(**request)
        except Exception as exc:
            refused = auth_error(exc, f"queue {self.queue_url}: ReceiveMessage")
            if refused is not None:
                raise refused from exc
            if not isinstance(exc, ClientError):
                raise
            raise SqsConnectorError(
                f"SQS queue {self.queue_url}: ReceiveMessage failed: {exc}"
            ) from exc
        self._attempt = None  # answered: the next receive is a new attempt
        received = []
        for raw in response.get("Messages", ()):
            delivery = SqsDelivery(
                message=SqsMessage.from_sqs(self.queue_url or "", raw, self._identity),
                receipt_handle=raw["ReceiptHandle"],
                received_at=started,
                visible_until=started + self.visibility_timeout,
            )
            self._outstanding[delivery.receipt_handle] = delivery
            received.append(delivery)
        return received

    def _settle_orphan(self, task: asyncio.Task[list[SqsDelivery]]) -> None:
        """Release what a receive cut off by a stop returned (once; also called by aclose)."""
        if self._orphan is not task or not task.done():
            return
        self._orphan = None
        if task.cancelled() or task.exception() is not None:
            return  # nothing was handed to us; a FIFO attempt id stays for a retry
        received = task.result()
        for delivery in received:
            self._release_now(delivery)
        if received:
            log.info(
                "SQS queue %s: released %d message(s) that a receive returned after its "
                "poll was stopped",
                self.queue_url,
                len(received),
            )
            self._wake_flusher()

    def _release_unyielded(self) -> None:
        """Messages received but never handed to the engine go back to the queue now."""
        if not self._unyielded:
            return
        while self._unyielded:
            self._release_now(self._unyielded.popleft())
        self._wake_flusher()

    def _release_now(self, delivery: SqsDelivery) -> None:
        """Make a message the engine never saw visible again.

        Unlike a failed message's release this holds nothing back: on a FIFO queue
        such a message comes after everything of its group we hold, and SQS does not
        deliver it before those are deleted or visible again.
        """
        self._outstanding.pop(delivery.receipt_handle, None)
        self._holding_back.discard(delivery.receipt_handle)
        self._to_release.append(_Pending(delivery, 0))

    async def _take_parked(self) -> list[SqsDelivery]:
        """Take over the leases a closed producer of this queue kept for us, in order."""
        lot = _PARKED.pop(self._lot_key, None)
        if lot is None:
            return []
        now = time.monotonic()
        attempt = lot.attempt
        if attempt is not None and self.is_fifo and self._attempt is None and attempt[1] > now:
            self._attempt = attempt
        taken = [d for d in lot.deliveries if d.visible_until - now > self.takeover_margin]
        if len(taken) < len(lot.deliveries):
            log.info(
                "SQS queue %s: %d parked message(s) were held too long to take over; SQS "
                "delivers them again",
                self.queue_url,
                len(lot.deliveries) - len(taken),
            )
        if not taken:
            return []
        for delivery in taken:
            delivery.extension_stopped = False
            self._outstanding[delivery.receipt_handle] = delivery
        # Renew them as a receive would have: the visibility timeout from now.
        async with self._visibility_lock:
            now = time.monotonic()
            results = await self._set_visibility(
                [(d, max(min(self.visibility_timeout, self._cap_left(d, now)), 1)) for d in taken]
            )
        kept = []
        for delivery, failure in results:
            if failure is None:
                kept.append(delivery)
                continue
            self._outstanding.pop(delivery.receipt_handle, None)
            log.warning(
                "SQS message %s on %s: its parked lease could not be taken over (%s: %s); "
                "SQS delivers it again",
                delivery.message_id,
                self.queue_url,
                failure.get("Code"),
                failure.get("Message"),
            )
        self.taken_over += len(kept)
        if kept:
            log.info(
                "SQS queue %s: took over %d message(s) left unresolved by the previous "
                "producer, without receiving them again",
                self.queue_url,
                len(kept),
            )
        return kept

    def _count_request(self, event_name: str = "", **_: Any) -> None:
        self.api_calls[event_name.rsplit(".", 1)[-1]] += 1

    # ----------------------------------------------------------------- advance

    async def advance(self, batch: Sequence[AdvanceItem[SqsDelivery]]) -> None:
        self._raise_failure()
        rejects: list[tuple[SqsDelivery, AdvanceOutcome]] = []
        after_reject: list[SqsDelivery] = []  # clean, but behind a reject in their lane
        for item in batch:
            delivery = item.broker_payload
            outcome = item.outcome
            held_back = delivery.receipt_handle in self._holding_back
            self._holding_back.discard(delivery.receipt_handle)
            judged = verdict(outcome)
            if judged is Verdict.REDELIVER:
                self._release(
                    delivery, self.config.redelivery_backoff.delay(delivery.receive_count)
                )
            elif held_back:
                self._release(delivery, 0)
            elif judged is Verdict.DEAD_LETTER:
                rejects.append((delivery, outcome))
            elif rejects:
                after_reject.append(delivery)
            else:
                self._outstanding.pop(delivery.receipt_handle, None)
                self._to_delete.append(_Pending(delivery))
        if rejects:
            try:
                await self._dead_letter(rejects)
            except BaseException:
                # A reject of this lane could not be dead-lettered and comes back: on a
                # FIFO queue what follows it in its group must come back after it.
                for delivery in after_reject:
                    self._release(delivery, 0)
                self._wake_flusher()
                raise
            for delivery in after_reject:
                self._outstanding.pop(delivery.receipt_handle, None)
                self._to_delete.append(_Pending(delivery))
        if len(self._to_delete) + len(self._to_release) >= _BUFFER_LIMIT:
            await self.flush()  # the flusher fell behind: push back on the engine
        self._wake_flusher()

    def _release(self, delivery: SqsDelivery, visibility: int) -> None:
        self._outstanding.pop(delivery.receipt_handle, None)
        self._holding_back.discard(delivery.receipt_handle)
        self._to_release.append(_Pending(delivery, visibility))
        if self.is_fifo and delivery.group_id is not None:
            # SQS redelivers this one only once the group's later messages we hold are
            # gone; deleting them first would reorder the group, so they go back too.
            for other in self._outstanding.values():
                if other.group_id == delivery.group_id:
                    self._holding_back.add(other.receipt_handle)

    async def _dead_letter(self, rejects: list[tuple[SqsDelivery, AdvanceOutcome]]) -> None:
        """Copy rejects to the dead-letter queue, then delete them; a reject never copied
        is never deleted: it is released (it comes back) and the group fails."""
        dlq = self.dead_letter_queue_url
        if dlq is None:
            for delivery, outcome in rejects:
                log.warning(
                    "SQS message %s from %s rejected (%s) and DROPPED: the queue has no "
                    "dead-letter queue",
                    delivery.message_id,
                    self.queue_url,
                    outcome_reason(outcome),
                )
                self.dropped += 1
                self._outstanding.pop(delivery.receipt_handle, None)
                self._to_delete.append(_Pending(delivery))
            return
        fifo = dlq.endswith(".fifo")
        errors: list[str] = []
        prepared = []
        for delivery, outcome in rejects:
            if errors and self.is_fifo:
                self._release(delivery, 0)  # behind a reject that comes back: comes back too
                continue
            entry = self._dead_letter_entry(delivery, outcome, fifo=fifo)
            limit = self.dead_letter_max_size
            if limit is not None and _entry_bytes(entry) > limit:
                fitted = _fit_reason(entry, limit)
                if fitted is None:  # too large even with acklane's reason cut short
                    errors.append(self._refused(delivery, dlq, _entry_bytes(entry), limit))
                    continue
                entry = fitted
            prepared.append((delivery, outcome, entry))
        for chunk in _batches_by_size(prepared):
            if errors and self.is_fifo:
                for delivery, _, _ in chunk:
                    self._release(delivery, 0)
                continue
            failures = await self._send_copies(dlq, [entry for _, _, entry in chunk])
            for i, (delivery, outcome, entry) in enumerate(chunk):
                failure = failures.get(str(i))
                if failure is None:
                    log.info(
                        "SQS message %s from %s rejected (%s): sent to dead-letter queue %s",
                        delivery.message_id,
                        self.queue_url,
                        outcome_reason(outcome),
                        dlq,
                    )
                    self.dead_lettered += 1
                    self._outstanding.pop(delivery.receipt_handle, None)
                    self._to_delete.append(_Pending(delivery))
                elif _is_size_refusal(failure):
                    message = str(failure.get("Message", ""))
                    errors.append(
                        self._refused(
                            delivery, dlq, _entry_bytes(entry), _limit_in(message), failure
                        )
                    )
                else:
                    self._keep_undead_lettered(delivery)
                    errors.append(
                        f"SQS dead-letter queue {dlq}: the copy of rejected message "
                        f"{delivery.message_id} from {self.queue_url} was not sent: "
                        f"{failure.get('Code')}: {failure.get('Message')}"
                    )
        if errors:
            more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
            raise SqsAdvanceError(errors[0] + more)

    async def _send_copies(self, dlq: str, entries: list[dict[str, Any]]) -> dict[str, Any]:
        """SendMessageBatch; returns the failed entries by index, whatever went wrong."""
        batch = [{**entry, "Id": str(i)} for i, entry in enumerate(entries)]
        try:
            return await self._run_batch("send_message_batch", dlq, batch)
        except Exception as exc:
            failure = _failure_of(exc)
            if len(entries) > 1 and _is_size_refusal(failure):
                # One entry too large refuses the whole call on some endpoints: send
                # them one by one, so that only the culprits stay behind.
                failures: dict[str, Any] = {}
                for i, entry in enumerate(entries):
                    alone = await self._send_copies(dlq, [entry])
                    if "0" in alone:
                        failures[str(i)] = alone["0"]
                return failures
            return {entry["Id"]: failure for entry in batch}

    def _refused(
        self,
        delivery: SqsDelivery,
        dlq: str,
        size: int,
        limit: int | None,
        failure: dict[str, Any] | None = None,
    ) -> str:
        """Count and log a copy refused for its size; the original stays. Returns the error."""
        self.dead_letter_refused += 1
        self._keep_undead_lettered(delivery)
        most = f"at most {limit} bytes" if limit is not None else "less"
        said = f" (SQS: {failure.get('Code')}: {failure.get('Message')})" if failure else ""
        text = (
            f"SQS dead-letter queue {dlq} cannot take the copy of rejected message "
            f"{delivery.message_id} from {self.queue_url}: the copy is {size} bytes "
            f"(body and attributes) and the dead-letter queue takes {most}{said}. Raise "
            f"the MaximumMessageSize of the dead-letter queue {dlq}. The message is not "
            f"deleted: it goes back to {self.queue_url} and fails its group each time it "
            f"is rejected"
        )
        log.error("%s", text)
        return text

    def _keep_undead_lettered(self, delivery: SqsDelivery) -> None:
        """A reject whose copy did not land: never deleted; released like a failure, so
        that its receive count grows and the queue's own redrive policy still applies."""
        self._release(delivery, self.config.redelivery_backoff.delay(delivery.receive_count))

    def _dead_letter_entry(
        self, delivery: SqsDelivery, outcome: AdvanceOutcome, *, fifo: bool
    ) -> dict[str, Any]:
        original = {
            name: _sendable(value) for name, value in delivery.message.message_attributes.items()
        }
        # Bounded: the origin is a URL and an id; the reason at most REASON_MAX_BYTES.
        ours = {
            ORIGIN_QUEUE: _string(self.queue_url or ""),
            ORIGIN_MESSAGE_ID: _string(delivery.message_id),
            REJECT_REASON: _string(outcome_reason(outcome)),
        }
        if len(original) + len(ours) > _MAX_ATTRIBUTES:
            packed = json.dumps(_packable(original), sort_keys=True, separators=(",", ":"))
            ours[PACKED_ATTRIBUTES] = _string(packed)
            original = {}
        entry: dict[str, Any] = {
            "MessageBody": delivery.message.native["Body"],
            "MessageAttributes": {**original, **ours},
        }
        if fifo:
            entry["MessageGroupId"] = delivery.group_id or "acklane-dead-letters"
            # A retried copy (crash, redelivery) is dropped by SQS's 5-minute dedupe.
            entry["MessageDeduplicationId"] = delivery.message_id
        return entry

    # ------------------------------------------------------------------- flush

    def _wake_flusher(self) -> None:
        if self._to_delete or self._to_release:
            self._flush_wanted.set()
        if len(self._to_delete) >= _BATCH or len(self._to_release) >= _BATCH:
            self._batch_full.set()

    async def _flush_loop(self) -> None:
        while True:
            await self._flush_wanted.wait()
            if not self._batch_full.is_set() and self.config.advance_linger > 0:
                try:
                    async with asyncio.timeout(self._linger()):
                        await self._batch_full.wait()
                except TimeoutError:
                    pass
            self._flush_wanted.clear()
            self._batch_full.clear()
            try:
                await self.flush()
            except Exception as exc:
                self._fail(exc)

    def _linger(self) -> float:
        # Never linger long enough for a message's visibility to lapse before its delete.
        return min(self.config.advance_linger, self.visibility_timeout / 4)

    async def flush(self) -> None:
        """Send every buffered delete and visibility change; return once SQS has them."""
        async with self._flush_lock:
            await self._flush_buffers()

    async def _flush_buffers(self) -> None:
        while self._to_delete:
            await self._delete(
                [self._to_delete.popleft() for _ in range(min(_BATCH, len(self._to_delete)))]
            )
        if self._to_release:
            async with self._visibility_lock:
                while self._to_release:
                    chunk = [
                        self._to_release.popleft()
                        for _ in range(min(_BATCH, len(self._to_release)))
                    ]
                    await self._change_visibility(chunk)

    async def _delete(self, chunk: list[_Pending]) -> None:
        entries = [
            {"Id": str(i), "ReceiptHandle": p.delivery.receipt_handle} for i, p in enumerate(chunk)
        ]
        failures = await self._run_batch("delete_message_batch", self.queue_url, entries)
        self.deleted += len(chunk) - len(failures)
        self._settle_failures("delete", chunk, failures)

    async def _change_visibility(self, chunk: list[_Pending]) -> None:
        entries = [
            {
                "Id": str(i),
                "ReceiptHandle": p.delivery.receipt_handle,
                "VisibilityTimeout": p.visibility,
            }
            for i, p in enumerate(chunk)
        ]
        failures = await self._run_batch("change_message_visibility_batch", self.queue_url, entries)
        self.released += len(chunk) - len(failures)
        self._settle_failures("release", chunk, failures)

    def _settle_failures(
        self, action: str, chunk: list[_Pending], failures: dict[str, dict[str, Any]]
    ) -> None:
        fatal = []
        for entry_id, failure in failures.items():
            delivery = chunk[int(entry_id)].delivery
            if _is_vanished(failure):
                log.warning(
                    "SQS message %s on %s: receipt handle no longer valid on %s (%s); it was "
                    "deleted elsewhere or its visibility lapsed, SQS may deliver it again",
                    delivery.message_id,
                    self.queue_url,
                    action,
                    _code(failure),
                )
            else:
                fatal.append((delivery, failure))
        if fatal:
            delivery, failure = fatal[0]
            raise SqsAdvanceError(
                f"SQS queue {self.queue_url}: {action} failed for {len(fatal)} message(s), "
                f"e.g. {delivery.message_id}: {failure.get('Code')}: {failure.get('Message')}"
            )

    async def _run_batch(
        self, operation: str, queue_url: str | None, entries: list[dict[str, Any]]
    ) -> dict[str, dict[str, Any]]:
        """Call a ``*Batch`` operation, retrying entries SQS says may succeed later.

        Returns the entries that finally failed, by entry id.
        """
        remaining = {entry["Id"]: entry for entry in entries}
        failed: dict[str, dict[str, Any]] = {}
        attempts = self.config.entry_retries
        for attempt in range(1, attempts + 1):
            response = await getattr(self._client, operation)(
                QueueUrl=queue_url, Entries=list(remaining.values())
            )
            retry: dict[str, dict[str, Any]] = {}
            for failure in response.get("Failed", ()):
                entry_id = failure["Id"]
                if failure.get("SenderFault") or _is_vanished(failure) or attempt == attempts:
                    failed[entry_id] = failure
                else:
                    retry[entry_id] = remaining[entry_id]
            if not retry:
                break
            remaining = retry
            await asyncio.sleep(min(0.05 * 2**attempt, 2.0))
        return failed

    # --------------------------------------------------------------- heartbeat

    async def _heartbeat_loop(self, interval: float, extension: int) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self._extend_due(2 * interval, extension)
            except ClientError as exc:
                if _error_code(exc) not in _TRANSIENT:
                    # e.g. AccessDenied: leases would lapse while watchers work and
                    # another consumer would get the messages; fail loudly instead.
                    self._fail(exc)
                    return
                log.warning(
                    "SQS queue %s: visibility heartbeat failed (%s); retrying next beat",
                    self.queue_url,
                    exc,
                )
            except Exception as exc:
                log.warning(
                    "SQS queue %s: visibility heartbeat failed (%s); retrying next beat",
                    self.queue_url,
                    exc,
                )

    async def _extend_due(self, horizon: float, extension: int) -> None:
        """Extend outstanding messages whose visibility ends within ``horizon`` seconds."""
        async with self._visibility_lock:
            now = time.monotonic()
            due: list[tuple[SqsDelivery, int]] = []
            for delivery in self._outstanding.values():
                if delivery.extension_stopped or delivery.visible_until - now > horizon:
                    continue
                timeout = min(extension, self._cap_left(delivery, now))
                if now + timeout <= delivery.visible_until + 0.5:
                    delivery.extension_stopped = True
                    log.warning(
                        "SQS message %s on %s reached SQS's %ss visibility cap: it becomes "
                        "visible again although it was not advanced",
                        delivery.message_id,
                        self.queue_url,
                        self.max_visibility,
                    )
                    continue
                due.append((delivery, timeout))
            for delivery, failure in await self._set_visibility(due):
                if failure is None:
                    self.extended += 1
                    continue
                if _is_vanished(failure):
                    delivery.extension_stopped = True
                log.warning(
                    "SQS message %s on %s: visibility extension refused (%s: %s)",
                    delivery.message_id,
                    self.queue_url,
                    failure.get("Code"),
                    failure.get("Message"),
                )

    async def _set_visibility(
        self, pairs: Sequence[tuple[SqsDelivery, int]]
    ) -> list[tuple[SqsDelivery, dict[str, Any] | None]]:
        """Make each message invisible for its seconds from now; each with its failure."""
        results: list[tuple[SqsDelivery, dict[str, Any] | None]] = []
        for chunk in _chunks(pairs):
            sent_at = time.monotonic()
            entries = [
                {"Id": str(i), "ReceiptHandle": d.receipt_handle, "VisibilityTimeout": t}
                for i, (d, t) in enumerate(chunk)
            ]
            failures = await self._run_batch(
                "change_message_visibility_batch", self.queue_url, entries
            )
            for i, (delivery, timeout) in enumerate(chunk):
                failure = failures.get(str(i))
                if failure is None:
                    delivery.visible_until = sent_at + timeout
                results.append((delivery, failure))
        return results

    def _cap_left(self, delivery: SqsDelivery, now: float) -> int:
        """Whole seconds the message may still be made invisible, counted from ``now``."""
        return max(math.floor(self.max_visibility - (now - delivery.received_at)) - 1, 0)

    # ------------------------------------------------------------------- close

    async def aclose(self) -> None:
        """Settle what can be settled, keep or release the rest, close the client.

        In order: a receive cut off by the stop is awaited (at most its long-poll
        wait) and what it returned is released; buffered deletes and releases are
        sent; messages the engine never resolved keep their lease for
        ``restart_lease_hold`` seconds, parked for the next producer of this queue in
        this process (released at once when the hold is 0).
        """
        if self._closed:
            return
        self._closed = True
        try:
            await self._finish_receive()
        finally:
            await self._stop_task(self._heartbeat_task)
            async with self._flush_lock:  # let a flush in flight finish: it holds popped entries
                await self._stop_task(self._flusher_task)
        if self._client is not None:
            self._release_unyielded()
            # What was pulled but never advanced was abandoned: keep its lease for the
            # next producer, or make it visible now rather than when its lease lapses.
            to_park = []
            hold = self.config.restart_lease_hold
            for delivery in list(self._outstanding.values()):
                if (
                    hold > 0
                    and not delivery.extension_stopped
                    and delivery.receipt_handle not in self._holding_back
                ):
                    to_park.append(delivery)
                else:
                    self._to_release.append(_Pending(delivery, 0))
            self._outstanding.clear()
            self._holding_back.clear()
            try:
                async with asyncio.timeout(30):
                    await self.flush()
                    await self._park(to_park)
            except Exception as exc:
                log.warning(
                    "SQS queue %s: final flush failed (%s); unsettled messages will be "
                    "redelivered when their visibility lapses",
                    self.queue_url,
                    exc,
                )
            if self.is_fifo and self._attempt is not None:
                # A receive that never answered: the next producer retries its attempt id.
                _PARKED.setdefault(self._lot_key, _Lot()).attempt = self._attempt
        try:
            await self._stack.aclose()
        except Exception as exc:
            log.warning("SQS queue %s: closing the client failed: %s", self.queue_url, exc)
        self._client = None

    async def _finish_receive(self) -> None:
        """Let a receive cut off by a stop complete, bounded by its wait, and settle it."""
        task = self._orphan
        if task is None:
            task = self._receive_task
            if task is None or task.done():
                return
            # The poll was not cancelled but the producer closes: nobody will yield it.
            self._orphan = task
        if not task.done():
            try:
                await asyncio.wait([task], timeout=self.config.wait_time_seconds + _RECEIVE_GRACE)
            finally:
                if not task.done():
                    log.warning(
                        "SQS queue %s: a receive cut off by the stop did not answer in time; "
                        "what it may have received comes back when its visibility lapses",
                        self.queue_url,
                    )
                    task.cancel()
                    await asyncio.wait([task])
        self._settle_orphan(task)

    async def _park(self, deliveries: list[SqsDelivery]) -> None:
        """Keep unresolved messages invisible for the hold, for the next producer to take."""
        if not deliveries:
            return
        now = time.monotonic()
        pairs = []
        for delivery in deliveries:
            hold = min(self.config.restart_lease_hold, self._cap_left(delivery, now))
            if hold > self.takeover_margin:
                pairs.append((delivery, hold))
            else:  # nobody could take it over in time (SQS's 12-hour cap): release it
                self._to_release.append(_Pending(delivery, 0))
        await self.flush()
        parked = []
        for delivery, failure in await self._set_visibility(pairs):
            if failure is None:
                parked.append(delivery)
            else:
                log.warning(
                    "SQS message %s on %s: its lease could not be kept for a restart "
                    "(%s: %s); SQS delivers it again when its visibility lapses",
                    delivery.message_id,
                    self.queue_url,
                    failure.get("Code"),
                    failure.get("Message"),
                )
        if not parked:
            return
        _PARKED.setdefault(self._lot_key, _Lot()).deliveries.extend(parked)
        self.parked += len(parked)
        log.info(
            "SQS queue %s: kept the leases of %d unresolved message(s) for %ss "
            "(restart_lease_hold), for the next producer of this queue in this process; "
            "otherwise SQS delivers them again then",
            self.queue_url,
            len(parked),
            self.config.restart_lease_hold,
        )

    # --------------------------------------------------------------- internals

    def _fail(self, exc: BaseException) -> None:
        log.error("SQS queue %s: %s; the group will fail", self.queue_url, exc)
        if self._failure is None:
            self._failure = exc

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    @staticmethod
    async def _stop_task(task: asyncio.Task[None] | None) -> None:
        if task is None or task.done():
            return
        task.cancel()
        await asyncio.wait([task])


#: Errors worth retrying on the next heartbeat; anything else fails the group.
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


def _error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _reveal(secret: Any) -> str | None:
    return None if secret is None else str(secret.get_secret_value())


def _fit_reason(entry: dict[str, Any], limit: int) -> dict[str, Any] | None:
    """``entry`` with its reason cut so that it fits ``limit`` bytes, or None if it can't."""
    attributes = entry["MessageAttributes"]
    reason = str(attributes[REJECT_REASON]["StringValue"])
    room = len(reason.encode("utf-8")) - (_entry_bytes(entry) - limit)
    if room < len(TRUNCATED_MARK.encode("utf-8")):
        return None
    cut = {**attributes, REJECT_REASON: _string(bounded_text(reason, room))}
    fitted = {**entry, "MessageAttributes": cut}
    return fitted if _entry_bytes(fitted) <= limit else None


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _string(value: str) -> dict[str, str]:
    return {"DataType": "String", "StringValue": value or "-"}


def _sendable(value: Any) -> dict[str, Any]:
    """A received message attribute in the shape SendMessage accepts."""
    out: dict[str, Any] = {"DataType": value["DataType"]}
    if "StringValue" in value:
        out["StringValue"] = value["StringValue"]
    elif "BinaryValue" in value:
        out["BinaryValue"] = value["BinaryValue"]
    return out


def _packable(attributes: dict[str, dict[str, Any]]) -> dict[str, dict[str, str]]:
    packed = {}
    for name, value in attributes.items():
        entry = {"DataType": value["DataType"]}
        if "BinaryValue" in value:
            entry["BinaryValue"] = base64.b64encode(bytes(value["BinaryValue"])).decode("ascii")
        else:
            entry["StringValue"] = str(value.get("StringValue", ""))
        packed[name] = entry
    return packed


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
