"""The SQS side of the ack channel: receive, keep invisible, delete / release / dead-letter."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import math
import time
from collections import Counter, deque
from collections.abc import AsyncGenerator, Hashable, Iterable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, TypeVar

import aioboto3
from aiobotocore.config import AioConfig
from botocore.exceptions import ClientError

from acklane.core.producer import AdvanceItem, AdvanceOutcome, SharedStreamProducer

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
DEAD_LETTER_ATTRIBUTES = (
    "acklane.origin.queue",
    "acklane.origin.message_id",
    "acklane.reject.reason",
)
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


class SqsConnectorError(RuntimeError):
    """The queue, its dead-letter queue or the SQS endpoint cannot be used."""


class SqsAdvanceError(RuntimeError):
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
        size += len(name) + len(value["DataType"])
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


class SqsStreamProducer(SharedStreamProducer):
    """One group's poll of one SQS queue, with aioboto3.

    Lanes: the ``MessageGroupId`` on FIFO queues (order kept per group), the
    message itself on standard queues (no head-of-line blocking). Deletes and
    visibility changes are buffered for ``advance_linger`` seconds so that
    single-message lanes still share ``*Batch`` calls; a crash before a flush
    only means a redelivery, which the event store recognises by ``MessageId``.
    """

    #: SQS's cap on a receipt's total invisibility; a class attribute for tests.
    max_visibility: int = MAX_VISIBILITY_TIMEOUT

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
        self.extended = 0
        self.queue_url: str | None = None
        self.queue_arn: str | None = None
        self.dead_letter_queue_url: str | None = None
        self.is_fifo = config.is_fifo_name
        self.visibility_timeout = (
            30 if config.visibility_timeout is None else config.visibility_timeout
        )

        self._stack = AsyncExitStack()
        self._client: Any = None
        self._outstanding: dict[str, SqsDelivery] = {}  # pulled, not advanced; by receipt
        self._holding_back: set[str] = set()  # FIFO: receipts to release whatever their outcome
        self._to_delete: deque[_Pending] = deque()
        self._to_release: deque[_Pending] = deque()
        self._visibility_lock = asyncio.Lock()  # orders releases after heartbeat extensions
        self._flush_lock = asyncio.Lock()  # one flush at a time: flush() returns when all landed
        self._flush_wanted = asyncio.Event()
        self._batch_full = asyncio.Event()
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._flusher_task: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None
        self._opened = False
        self._closed = False

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
        while True:
            self._raise_failure()
            for delivery in await self._receive():
                yield delivery.message, delivery

    def get_advance_lane(self, broker_payload: Any) -> Hashable:
        delivery: SqsDelivery = broker_payload
        if self.is_fifo:
            return delivery.group_id
        return delivery.message_id

    def message_id(self, broker_payload: Any) -> str | None:
        delivery: SqsDelivery = broker_payload
        return delivery.message_id

    @property
    def outstanding(self) -> int:
        """Messages pulled and not yet advanced (the heartbeat keeps these invisible)."""
        return len(self._outstanding)

    @property
    def total_api_calls(self) -> int:
        return sum(self.api_calls.values())

    def counters(self) -> Mapping[str, float]:
        return {
            "deleted": self.deleted,
            "released": self.released,
            "dead_lettered": self.dead_lettered,
            "dropped": self.dropped,
            "visibility_extended": self.extended,
            "api_calls": self.total_api_calls,
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

        self.queue_url = cfg.queue_url or await self._queue_url(cfg.queue_name, cfg.account_id)
        attributes = await self._queue_attributes(self.queue_url, cfg)
        self.queue_arn = attributes.get("QueueArn")
        self.is_fifo = attributes.get("FifoQueue") == "true" or self.queue_url.endswith(".fifo")
        if cfg.visibility_timeout is not None:
            self.visibility_timeout = cfg.visibility_timeout
        else:
            self.visibility_timeout = int(attributes.get("VisibilityTimeout", "30"))
        self.dead_letter_queue_url = cfg.dead_letter_queue_url or await self._redrive_target(
            attributes.get("RedrivePolicy")
        )
        if self.dead_letter_queue_url is None:
            log.warning(
                "SQS queue %s has no dead-letter queue (none configured, no RedrivePolicy): "
                "rejected messages will be deleted and counted as dropped",
                self.queue_url,
            )
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
        except ClientError as exc:
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
            if denied and cfg.dead_letter_queue_url and cfg.visibility_timeout:
                # Everything the attributes would tell us is configured: go on without.
                log.warning(
                    "SQS queue %s: no permission to read its attributes (%s); using the "
                    "configured visibility_timeout and dead_letter_queue_url",
                    url,
                    _error_code(exc),
                )
                return {}
            hint = (
                " (grant sqs:GetQueueAttributes, or configure both visibility_timeout and "
                "dead_letter_queue_url)"
                if denied
                else ""
            )
            raise SqsConnectorError(
                f"SQS queue {url}: cannot read its attributes{hint}: {exc}"
            ) from exc
        return dict(response.get("Attributes", {}))

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
        cfg = self.config
        request: dict[str, Any] = {
            "QueueUrl": self.queue_url,
            "MaxNumberOfMessages": cfg.max_messages,
            "WaitTimeSeconds": cfg.wait_time_seconds,
            "MessageAttributeNames": ["All"],
            "MessageSystemAttributeNames": _SYSTEM_ATTRIBUTES,
        }
        if cfg.visibility_timeout is not None:
            request["VisibilityTimeout"] = cfg.visibility_timeout
        started = time.monotonic()
        try:
            response = await self._client.receive_message(**request)
        except ClientError as exc:
            raise SqsConnectorError(
                f"SQS queue {self.queue_url}: ReceiveMessage failed: {exc}"
            ) from exc
        received = []
        for raw in response.get("Messages", ()):
            delivery = SqsDelivery(
                message=SqsMessage.from_sqs(self.queue_url or "", raw),
                receipt_handle=raw["ReceiptHandle"],
                received_at=started,
                visible_until=started + self.visibility_timeout,
            )
            self._outstanding[delivery.receipt_handle] = delivery
            received.append(delivery)
        if not received and cfg.wait_time_seconds == 0:
            await asyncio.sleep(_EMPTY_SHORT_POLL_PAUSE)
        return received

    def _count_request(self, event_name: str = "", **_: Any) -> None:
        self.api_calls[event_name.rsplit(".", 1)[-1]] += 1

    # ----------------------------------------------------------------- advance

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        self._raise_failure()
        rejects: list[tuple[SqsDelivery, AdvanceOutcome]] = []
        for item in batch:
            delivery: SqsDelivery = item.broker_payload
            outcome = item.outcome
            held_back = delivery.receipt_handle in self._holding_back
            self._holding_back.discard(delivery.receipt_handle)
            if outcome.failed > 0 or (outcome.rejected == 0 and not outcome.is_clean):
                self._release(
                    delivery, self.config.redelivery_backoff.delay(delivery.receive_count)
                )
            elif held_back:
                self._release(delivery, 0)
            elif outcome.rejected > 0:
                rejects.append((delivery, outcome))
            else:
                self._outstanding.pop(delivery.receipt_handle, None)
                self._to_delete.append(_Pending(delivery))
        if rejects:
            await self._dead_letter(rejects)
        if len(self._to_delete) + len(self._to_release) >= _BUFFER_LIMIT:
            await self.flush()  # the flusher fell behind: push back on the engine
        self._wake_flusher()

    def _release(self, delivery: SqsDelivery, visibility: int) -> None:
        self._outstanding.pop(delivery.receipt_handle, None)
        self._to_release.append(_Pending(delivery, visibility))
        if self.is_fifo and delivery.group_id is not None:
            # SQS redelivers this one only once the group's later messages we hold are
            # gone; deleting them first would reorder the group, so they go back too.
            for other in self._outstanding.values():
                if other.group_id == delivery.group_id:
                    self._holding_back.add(other.receipt_handle)

    async def _dead_letter(self, rejects: list[tuple[SqsDelivery, AdvanceOutcome]]) -> None:
        dlq = self.dead_letter_queue_url
        if dlq is None:
            for delivery, outcome in rejects:
                log.warning(
                    "SQS message %s from %s rejected (%s) and DROPPED: the queue has no "
                    "dead-letter queue",
                    delivery.message_id,
                    self.queue_url,
                    _reason(outcome),
                )
                self.dropped += 1
                self._outstanding.pop(delivery.receipt_handle, None)
                self._to_delete.append(_Pending(delivery))
            return
        fifo = dlq.endswith(".fifo")
        prepared = [(d, o, self._dead_letter_entry(d, o, fifo=fifo)) for d, o in rejects]
        for chunk in _batches_by_size(prepared):
            entries = [{**entry, "Id": str(i)} for i, (_, _, entry) in enumerate(chunk)]
            failures = await self._run_batch("send_message_batch", dlq, entries)
            for i, (delivery, outcome, _) in enumerate(chunk):
                if str(i) in failures:
                    continue  # stays outstanding: released at aclose, redelivered, retried
                log.info(
                    "SQS message %s from %s rejected (%s): sent to dead-letter queue %s",
                    delivery.message_id,
                    self.queue_url,
                    _reason(outcome),
                    dlq,
                )
                self.dead_lettered += 1
                self._outstanding.pop(delivery.receipt_handle, None)
                self._to_delete.append(_Pending(delivery))
            if failures:
                first_id, first = next(iter(failures.items()))
                delivery = chunk[int(first_id)][0]
                raise SqsAdvanceError(
                    f"SQS dead-letter queue {dlq}: {len(failures)} rejected message(s) could "
                    f"not be sent, e.g. message {delivery.message_id} from {self.queue_url}: "
                    f"{first.get('Code')}: {first.get('Message')}"
                )

    def _dead_letter_entry(
        self, delivery: SqsDelivery, outcome: AdvanceOutcome, *, fifo: bool
    ) -> dict[str, Any]:
        original = {
            name: _sendable(value) for name, value in delivery.message.message_attributes.items()
        }
        ours = {
            "acklane.origin.queue": _string(self.queue_url or ""),
            "acklane.origin.message_id": _string(delivery.message_id),
            "acklane.reject.reason": _string(_reason(outcome)),
        }
        if len(original) + len(ours) > _MAX_ATTRIBUTES:
            ours[PACKED_ATTRIBUTES] = _string(json.dumps(_packable(original), sort_keys=True))
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
            for chunk in _chunks(due):
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

    def _cap_left(self, delivery: SqsDelivery, now: float) -> int:
        """Whole seconds the message may still be made invisible, counted from ``now``."""
        return max(math.floor(self.max_visibility - (now - delivery.received_at)) - 1, 0)

    # ------------------------------------------------------------------- close

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._stop_task(self._heartbeat_task)
        async with self._flush_lock:  # let a flush in flight finish: it holds popped entries
            await self._stop_task(self._flusher_task)
        if self._client is not None:
            # What was pulled but never advanced was abandoned: make it visible now
            # rather than when its visibility lapses.
            for delivery in list(self._outstanding.values()):
                self._to_release.append(_Pending(delivery, 0))
            self._outstanding.clear()
            self._holding_back.clear()
            try:
                async with asyncio.timeout(30):
                    await self.flush()
            except Exception as exc:
                log.warning(
                    "SQS queue %s: final flush failed (%s); unsettled messages will be "
                    "redelivered when their visibility lapses",
                    self.queue_url,
                    exc,
                )
        try:
            await self._stack.aclose()
        except Exception as exc:
            log.warning("SQS queue %s: closing the client failed: %s", self.queue_url, exc)
        self._client = None

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


def _reason(outcome: AdvanceOutcome) -> str:
    reasons = "; ".join(r for r in outcome.reject_reasons if r)
    return reasons or f"rejected by {outcome.rejected} watcher(s)"


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
