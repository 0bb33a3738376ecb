"""The SQS side of the ack channel: receive, keep invisible, delete / release / dead-letter.

The lease kit of ``acklane.core.connectors`` does the machinery (the tasks and
their failure latch, the settle buffer, the visibility heartbeat, parking, the
FIFO groups' holds, the dead-letter step); what is here is SQS's I/O, and
``_entries`` holds the shapes of its ``*Batch`` calls.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections import Counter, deque
from collections.abc import AsyncGenerator, Hashable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

from acklane.core import connectors as kit
from acklane.core.connectors import Action, LaneEntry, LeaseParking, Verdict, verdict
from acklane.core.connectors.deadletter import DeadLetterStep, outcome_reason
from acklane.core.errors import AdvanceError, BrokerUnreachable, DeadLetterRefused, ReceiveError
from acklane.core.producer import AdvanceItem, SharedStreamProducer

from ._check import ERRORS
from ._config import MAX_VISIBILITY_TIMEOUT, SqsConfig
from ._entries import (
    BATCH,
    DEAD_LETTER_ATTRIBUTES,
    PACKED_ATTRIBUTES,
    SYSTEM_ATTRIBUTES,
    batches_by_size,
    chunks,
    code_of,
    dead_letter_entry,
    entry_bytes,
    fit_reason,
    is_size_refusal,
    is_vanished,
    limit_in,
    run_batch,
    send_copies,
)
from ._message import SqsDelivery, SqsMessage
from ._queue import open_client, read_queue

__all__ = [
    "DEAD_LETTER_ATTRIBUTES",
    "PACKED_ATTRIBUTES",
    "PARKING",
    "SqsAdvanceError",
    "SqsConnectorError",
    "SqsStreamProducer",
]

log = logging.getLogger("acklane.connectors.sqs")

_BUFFER_LIMIT = 10 * BATCH  # advance flushes itself past this many pending entries
_EMPTY_SHORT_POLL_PAUSE = 0.5  # with wait_time_seconds 0, don't spin on an empty queue
#: How long SQS honours a FIFO ReceiveRequestAttemptId (5 minutes), less a margin.
_ATTEMPT_ID_LIFETIME = 270.0
#: Beyond its long-poll wait, how long aclose waits for a receive cut off by a stop.
_RECEIVE_GRACE = 5.0

#: Leases closing producers kept for the next producer of their queue in this process,
#: by ``(*stream_key, queue_url)``, with a FIFO receive attempt to retry as the note.
PARKING: LeaseParking[SqsDelivery] = LeaseParking(lambda d: d.visible_until)


class SqsConnectorError(ReceiveError):
    """The queue, its dead-letter queue or the SQS endpoint cannot be used."""


class SqsAdvanceError(AdvanceError):
    """SQS refused to delete, release or dead-letter a message; the group must fail."""


class _Refused(SqsAdvanceError, DeadLetterRefused):
    """The dead-letter queue refused a copy for its size (the original is kept)."""


@dataclass(slots=True, eq=False)
class _Pending:
    delivery: SqsDelivery
    visibility: int = 0  # for releases: seconds of invisibility before redelivery


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

    def __init__(
        self,
        config: SqsConfig,
        *,
        session: Any = None,
        parking: LeaseParking[SqsDelivery] = PARKING,
    ) -> None:
        self.config = config
        self._session = session
        #: SQS HTTP requests sent, by operation (retries included): what AWS bills.
        self.api_calls: Counter[str] = Counter()
        # parked: leases kept for the next producer at close; taken_over: from the last
        self.deleted = self.released = self.extended = self.parked = self.taken_over = 0
        self.queue_url: str | None = None
        self.queue_arn: str | None = None
        self.dead_letter_queue_url: str | None = None
        #: ``MaximumMessageSize`` of the queue and of its dead-letter queue, when readable.
        self.max_message_size: int | None = None
        self.dead_letter_max_size: int | None = None
        self.is_fifo = config.is_fifo_name
        self.visibility_timeout = config.visibility_timeout or 30
        self._stack = AsyncExitStack()
        self._client: Any = None
        self._identity = ""  # the queue's ARN (else URL): prefixes message_id()
        self._parking = parking
        self._what = f"SQS {config.describe()}"
        self._lot = parking.lot((), self._what, log)  # its queue's, once known
        self._tasks = kit.ProducerTasks(config.describe(), logger=log)
        self._outstanding: dict[str, SqsDelivery] = {}  # pulled, not advanced; by receipt
        self._unyielded: deque[SqsDelivery] = deque()  # received, not yet handed out
        self._lanes: kit.OrderedLanes[str] = kit.OrderedLanes()  # FIFO groups' holds
        self._settle: kit.SettleBuffer[str, _Pending] = kit.SettleBuffer(
            self._send, batch=BATCH, limit=_BUFFER_LIMIT, linger=self._linger, order=_ACTIONS
        )
        self._dead_letters = DeadLetterStep(
            "SQS", config.describe(), None, "dead_letter", logger=log,
            refused_error=_Refused, failed_error=SqsAdvanceError,
        )  # fmt: skip
        self._visibility_lock = asyncio.Lock()  # orders releases after heartbeat extensions
        #: The ReceiveMessage call in flight (its own task, so a stop cannot cut it off).
        self._receive_task: asyncio.Task[list[SqsDelivery]] | None = None
        #: Standard queues: the next receive, sent as soon as the last one answered.
        self._ahead: asyncio.Task[list[SqsDelivery]] | None = None
        #: A receive whose poll was cancelled: what it returns is released, not yielded.
        self._orphan: asyncio.Task[list[SqsDelivery]] | None = None
        #: FIFO: the ReceiveRequestAttemptId to send, and until when SQS honours it.
        self._attempt: tuple[str, float] | None = None
        self._opened = False
        self._closed = False
        # Whether the endpoint answers, told once per change (broker_problem, /readyz);
        # its address is the client's, once the client exists.
        self._reachability = kit.Reachability(
            config.describe(), "SQS endpoint", config.endpoint_url or "AWS", logger=log
        )

    # The dead-letter step's counts: rejects deleted without a copy (no dead-letter
    # queue), copied, and copies refused for their size (the original kept).
    dropped = property(lambda self: self._dead_letters.dropped)
    dead_lettered = property(lambda self: self._dead_letters.dead_lettered)
    dead_letter_refused = property(lambda self: self._dead_letters.refused)

    # ------------------------------------------------------------------ stream

    async def open_stream(self) -> AsyncGenerator[tuple[SqsMessage, SqsDelivery], None]:
        if self._opened:
            raise RuntimeError(f"{self.config.describe()}: open_stream() may be called once")
        self._opened = True
        await self._start()
        self._tasks.spawn(self._settle.run(), f"sqs flush {self.queue_url}")
        if self.config.heartbeat.enabled:
            interval, extension = self.config.heartbeat.timing(self.visibility_timeout)
            keeper = kit.LeaseKeeper(
                lambda beat: self._extend_due(2 * beat, extension),
                interval,
                transient=ERRORS.transient,
                describe=self._what,
                logger=log,
            )
            self._tasks.spawn(keeper.run(), f"sqs heartbeat {self.queue_url}")
        # The heartbeat runs until aclose, not until the stream closes: after a stop the
        # watchers may still be finishing what they pulled, and only ack_timeout may
        # decide they failed.
        try:
            while True:
                self._tasks.raise_failure()
                # Leases a previous producer of this queue kept come first (FIFO: their
                # groups are in flight, so SQS delivers nothing else of those groups).
                self._unyielded.extend(await self._take_parked())
                if not self._unyielded:
                    self._unyielded.extend(await self._receive())
                while self._unyielded:
                    delivery = self._unyielded.popleft()
                    yield delivery.message, delivery
        finally:
            # Closed or cancelled: what was received but never handed out goes back now,
            # and so does what the receive sent ahead gets.
            self._release_unyielded()
            ahead, self._ahead = self._ahead, None
            if ahead is not None:
                self._orphan = ahead
                ahead.add_done_callback(self._settle_orphan)

    async def _start(self) -> None:
        cfg = self.config
        self._client = await open_client(self._session, cfg, self._stack, error=SqsConnectorError)
        self._client.meta.events.register("before-send.sqs", self._count_request)
        self._reachability.where = str(self._client.meta.endpoint_url)
        async with AsyncExitStack() as probing:
            probe = await open_client(
                self._session, cfg, probing, error=SqsConnectorError, max_attempts=1
            )
            queue = await read_queue(
                self._client, cfg, self._reachability, error=SqsConnectorError, probe=probe
            )
        self.queue_url, self.queue_arn, self.is_fifo = queue.url, queue.arn, queue.fifo
        self.visibility_timeout = queue.visibility_timeout
        self.max_message_size = queue.max_message_size
        self.dead_letter_queue_url = queue.dead_letter_url
        self.dead_letter_max_size = queue.dead_letter_max_size
        self._identity = self.queue_arn or self.queue_url
        self._what = f"SQS queue {self.queue_url}"
        self._lot = self._parking.lot((*cfg.stream_key(), self.queue_url), self._what, log)
        self._dead_letters.source = self.queue_url
        self._dead_letters.destination = self.dead_letter_queue_url
        self._dead_letters.announce("deleted")

    async def _receive(self) -> list[SqsDelivery]:
        """One ReceiveMessage call; what it returns is outstanding (heartbeat-covered).

        The call runs in a task of its own: if the poll is cancelled meanwhile (a stop,
        a failing group), the call still completes (within its long-poll wait) and what
        SQS handed out is made visible again at once, instead of staying invisible for
        the visibility timeout (on FIFO queues, with its groups blocked meanwhile).

        On a standard queue, a receive that returned a full batch sends the next one
        at once, before the engine has taken them: SQS answers it while the engine
        works (still one receive in flight at a time). After a smaller batch the queue
        is about drained, and the next receive waits for the engine as before (a stop
        then has no long poll to wait out). A FIFO queue always waits (a second
        receive could not return the groups the first one holds, and its attempt id
        must belong to one request at a time).
        """
        task, self._ahead = self._ahead or self._receive_sent(), None
        try:
            received = await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.done() or (not task.cancelled() and task.exception() is None):
                self._orphan = task
                task.add_done_callback(self._settle_orphan)
            raise
        except BrokerUnreachable as exc:
            # Not the group's failure: the endpoint comes back, and nothing is in flight.
            await self._reachability.wait(exc.__cause__ or exc)
            return []
        self._reachability.answered()
        if len(received) >= self.config.batch_size and not self.is_fifo:
            self._ahead = self._receive_sent()  # a full batch: more is likely waiting
        elif not received and self.config.wait_time_seconds == 0:
            await asyncio.sleep(_EMPTY_SHORT_POLL_PAUSE)
        return received

    def _receive_sent(self) -> asyncio.Task[list[SqsDelivery]]:
        task = asyncio.create_task(
            self._receive_call(self._receive_request()),
            name=f"acklane sqs receive {self.queue_url}",
        )
        self._receive_task = task
        return task

    def _receive_request(self) -> dict[str, Any]:
        cfg = self.config
        request: dict[str, Any] = {
            "QueueUrl": self.queue_url,
            "MaxNumberOfMessages": cfg.batch_size,
            "WaitTimeSeconds": cfg.wait_time_seconds,
            "MessageAttributeNames": ["All"],
            "MessageSystemAttributeNames": SYSTEM_ATTRIBUTES,
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
        where = f"queue {self.queue_url}: ReceiveMessage failed"
        try:
            response = await self._client.receive_message(**request)
        except Exception as exc:
            raise ERRORS.map(exc, where, SqsConnectorError) from exc
        self._attempt = None  # answered: the next receive is a new attempt
        stamp = self._lanes.stamp()  # after the answer: only what came before is held
        received = []
        for raw in response.get("Messages", ()):
            delivery = SqsDelivery(
                message=SqsMessage.from_sqs(self.queue_url or "", raw, self._identity),
                receipt_handle=raw["ReceiptHandle"],
                received_at=started,
                visible_until=started + self.visibility_timeout,
                stamp=stamp,
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

    def _release_unyielded(self) -> None:
        """Messages received but never handed to the engine go back to the queue now."""
        while self._unyielded:
            self._release_now(self._unyielded.popleft())

    def _release_now(self, delivery: SqsDelivery) -> None:
        """Make a message the engine never saw visible again.

        Unlike a failed message's release this holds nothing back: on a FIFO queue
        such a message comes after everything of its group we hold, and SQS does not
        deliver it before those are deleted or visible again.
        """
        self._outstanding.pop(delivery.receipt_handle, None)
        self._settle.add("release", _Pending(delivery, 0))

    async def _take_parked(self) -> list[SqsDelivery]:
        """Take over the leases a closed producer of this queue kept for us, in order."""
        taken, attempt = await self._lot.take_over(self._renew_taken, self.takeover_margin)
        fresh = isinstance(attempt, tuple) and attempt[1] > time.monotonic()
        if fresh and self.is_fifo and self._attempt is None:
            self._attempt = attempt  # type: ignore[assignment]
        self.taken_over += len(taken)
        return taken

    async def _renew_taken(self, taken: list[SqsDelivery]) -> list[SqsDelivery]:
        """Renew taken-over leases as a receive would have: the visibility timeout from now."""
        for delivery in taken:
            delivery.extension_stopped = False
            delivery.stamp = self._lanes.receives
            self._outstanding[delivery.receipt_handle] = delivery
        async with self._visibility_lock:
            now = time.monotonic()
            timeout = self.visibility_timeout
            pairs = [(d, max(min(timeout, self._cap_left(d, now)), 1)) for d in taken]
            return self._kept(await self._set_visibility(pairs), "taken over")

    def _kept(
        self, results: list[tuple[SqsDelivery, dict[str, Any] | None]], what: str
    ) -> list[SqsDelivery]:
        """The deliveries whose visibility change landed; the others told and let go."""
        kept = []
        for delivery, failure in results:
            if failure is None:
                kept.append(delivery)
                continue
            self._outstanding.pop(delivery.receipt_handle, None)
            log.warning(
                "SQS message %s on %s: its lease could not be %s (%s: %s); SQS delivers it "
                "again when its visibility lapses",
                delivery.message_id,
                self.queue_url,
                what,
                failure.get("Code"),
                failure.get("Message"),
            )
        return kept

    def _count_request(self, event_name: str = "", **_: Any) -> None:
        self.api_calls[event_name.rsplit(".", 1)[-1]] += 1

    # ----------------------------------------------------------------- advance

    async def advance(self, batch: Sequence[AdvanceItem[SqsDelivery]]) -> None:
        self._tasks.raise_failure()
        plan = self._lanes.plan(
            LaneEntry(self._lane(d), d.stamp, verdict(item.outcome), item)
            for item in batch
            for d in (item.broker_payload,)
        )
        for item in plan.redeliver:
            self._release(item.broker_payload, self._backoff(item.broker_payload))
        for item in plan.held:  # behind a release of its FIFO group: comes back after it
            failed = verdict(item.outcome) is Verdict.REDELIVER
            self._release(item.broker_payload, self._backoff(item.broker_payload) if failed else 0)
        for item in plan.commit:
            self._delete(item.broker_payload)
        if plan.dead_letter:
            try:
                await self._dead_letter(plan.dead_letter)
            except BaseException:
                # A reject of this lane could not be dead-lettered and comes back: on a
                # FIFO queue what follows it in its group must come back after it.
                for item in plan.after_dead_letter:
                    self._release(item.broker_payload, 0)
                raise
            for item in plan.after_dead_letter:
                self._delete(item.broker_payload)
        await self._settle.settle_soon()  # the flusher fell behind: push back on the engine

    def _lane(self, delivery: SqsDelivery) -> str | None:
        return delivery.group_id if self.is_fifo else None

    def _backoff(self, delivery: SqsDelivery) -> int:
        return self.config.redelivery_backoff.delay(delivery.receive_count)

    def _delete(self, delivery: SqsDelivery) -> None:
        self._outstanding.pop(delivery.receipt_handle, None)
        self._settle.add("delete", _Pending(delivery))

    def _release(self, delivery: SqsDelivery, visibility: int) -> None:
        self._outstanding.pop(delivery.receipt_handle, None)
        self._settle.add("release", _Pending(delivery, visibility))
        # SQS redelivers this one only once the group's later messages we hold are gone;
        # deleting them first would reorder the group, so what we hold now goes back too.
        self._lanes.hold(self._lane(delivery))
        self._lanes.landed(self._lane(delivery))

    async def _dead_letter(self, rejects: list[AdvanceItem[SqsDelivery]]) -> None:
        """Copy rejects to the dead-letter queue, then delete them; a reject never copied
        is never deleted: it is released (it comes back) and the group fails."""
        dlq = self.dead_letter_queue_url
        if dlq is None:
            for delivery, outcome in rejects:
                self._dead_letters.drop(delivery.message_id, outcome_reason(outcome))
                self._delete(delivery)
            return
        fifo = dlq.endswith(".fifo")
        errors: list[AdvanceError] = []
        prepared = []
        for delivery, outcome in rejects:
            if errors and self.is_fifo:
                self._release(delivery, 0)  # behind a reject that comes back: comes back too
                continue
            entry = dead_letter_entry(
                delivery.message.native["Body"],
                delivery.message.message_attributes,
                queue_url=self.queue_url or "",
                message_id=delivery.message_id,
                reason=outcome_reason(outcome),
                group_id=delivery.group_id,
                fifo=fifo,
            )
            limit = self.dead_letter_max_size
            if limit is not None and entry_bytes(entry) > limit:
                fitted = fit_reason(entry, limit)
                if fitted is None:  # too large even with acklane's reason cut short
                    errors.append(self._refused(delivery, entry_bytes(entry), limit))
                    continue
                entry = fitted
            prepared.append((delivery, outcome, entry))
        for chunk in batches_by_size(prepared):
            if errors and self.is_fifo:
                for delivery, _, _ in chunk:
                    self._release(delivery, 0)
                continue
            failures = await send_copies(
                self._client, dlq, [entry for _, _, entry in chunk], self.config.entry_retries
            )
            for i, (delivery, outcome, entry) in enumerate(chunk):
                failure = failures.get(str(i))
                if failure is None:
                    self._dead_letters.copied(delivery.message_id, outcome_reason(outcome))
                    self._delete(delivery)
                elif is_size_refusal(failure):
                    limit = limit_in(str(failure.get("Message", "")))
                    errors.append(self._refused(delivery, entry_bytes(entry), limit, failure))
                else:
                    self._keep_undead_lettered(delivery)
                    said = f"{failure.get('Code')}: {failure.get('Message')}"
                    errors.append(self._dead_letters.failed(delivery.message_id, said))
        if errors:
            more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
            errors[0].args = (f"{errors[0]}{more}",)
            raise errors[0]

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
            **self._dead_letters.counters(),
            Action.EXTENDED: self.extended,
            Action.PARKED: self.parked,
            Action.TAKEN_OVER: self.taken_over,
            Action.API_CALLS: self.total_api_calls,
        }

    def _refused(
        self,
        delivery: SqsDelivery,
        size: int,
        limit: int | None,
        failure: dict[str, Any] | None = None,
    ) -> AdvanceError:
        """Count and log a copy refused for its size; the original stays. Returns the error."""
        self._keep_undead_lettered(delivery)
        return self._dead_letters.too_large(
            delivery.message_id,
            size,
            limit,
            raise_=[
                f"the MaximumMessageSize of the dead-letter queue {self.dead_letter_queue_url}"
            ],
            said=f"SQS: {failure.get('Code')}: {failure.get('Message')}" if failure else "",
            kept=f"it goes back to {self.queue_url}",
        )

    def _keep_undead_lettered(self, delivery: SqsDelivery) -> None:
        """A reject whose copy did not land: never deleted; released like a failure, so
        that its receive count grows and the queue's own redrive policy still applies."""
        self._release(delivery, self._backoff(delivery))

    # ------------------------------------------------------------------- flush

    def _linger(self) -> float:
        # Never linger long enough for a message's visibility to lapse before its delete.
        return min(self.config.advance_linger, self.visibility_timeout / 4)

    async def flush(self) -> None:
        """Send every buffered delete and visibility change; return once SQS has them."""
        await self._settle.flush()

    async def _send(self, action: str, chunk: deque[_Pending]) -> None:
        """One ``*Batch`` call for a chunk of deletes or releases (releases after any
        heartbeat extension in flight)."""
        pending = list(chunk)
        chunk.clear()  # the call answers for each of them, whatever it says
        entries: list[dict[str, Any]]
        if action == "delete":
            entries = [
                {"Id": str(i), "ReceiptHandle": p.delivery.receipt_handle}
                for i, p in enumerate(pending)
            ]
            failures = await self._run_batch("delete_message_batch", self.queue_url, entries)
            self.deleted += len(pending) - len(failures)
        else:
            entries = [
                {
                    "Id": str(i),
                    "ReceiptHandle": p.delivery.receipt_handle,
                    "VisibilityTimeout": p.visibility,
                }
                for i, p in enumerate(pending)
            ]
            async with self._visibility_lock:
                failures = await self._run_batch(
                    "change_message_visibility_batch", self.queue_url, entries
                )
            self.released += len(pending) - len(failures)
        self._settle_failures(action, pending, failures)

    def _settle_failures(
        self, action: str, chunk: Sequence[_Pending], failures: dict[str, dict[str, Any]]
    ) -> None:
        fatal = []
        for entry_id, failure in failures.items():
            delivery = chunk[int(entry_id)].delivery
            if is_vanished(failure):
                log.warning(
                    "SQS message %s on %s: receipt handle no longer valid on %s (%s); it was "
                    "deleted elsewhere or its visibility lapsed, SQS may deliver it again",
                    delivery.message_id,
                    self.queue_url,
                    action,
                    code_of(failure),
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
        return await run_batch(
            self._client, operation, queue_url, entries, self.config.entry_retries
        )

    # --------------------------------------------------------------- heartbeat

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
                if is_vanished(failure):
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
        for chunk in chunks(pairs):
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
        wait) and what it returned is released; the heartbeat, then the flusher, are
        stopped (a flush in flight goes on); buffered deletes and releases are sent;
        messages the engine never resolved keep their lease for ``restart_lease_hold``
        seconds, parked for the next producer of this queue in this process
        (released at once when the hold is 0).
        """
        if self._closed:
            return
        self._closed = True
        # A receive sent ahead (in flight or answered) was never handed out: what it
        # gets is released at once, below, and the stream's close leaves it alone.
        ahead, self._ahead = self._ahead, None
        if ahead is not None and self._orphan is None:
            self._orphan = ahead
        try:
            await self._finish_receive()
        finally:
            await self._tasks.aclose()
        if self._client is not None:
            self._release_unyielded()
            # What was pulled but never advanced was abandoned: keep its lease for the
            # next producer, or make it visible now rather than when its lease lapses.
            to_park = []
            hold = self.config.restart_lease_hold
            for delivery in list(self._outstanding.values()):
                held = self._lanes.is_held(self._lane(delivery), delivery.stamp)
                if hold > 0 and not delivery.extension_stopped and not held:
                    to_park.append(delivery)
                else:
                    self._settle.add("release", _Pending(delivery, 0))
            self._outstanding.clear()
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
                self._lot.note(self._attempt, self._attempt[1])
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
        await kit.finish_within(task, self.config.wait_time_seconds + _RECEIVE_GRACE)
        if task.cancelled():
            log.warning(
                "SQS queue %s: a receive cut off by the stop did not answer in time; "
                "what it may have received comes back when its visibility lapses",
                self.queue_url,
            )
        self._settle_orphan(task)

    async def _park(self, deliveries: list[SqsDelivery]) -> None:
        """Keep unresolved messages invisible for the hold, for the next producer to take."""
        now, hold = time.monotonic(), self.config.restart_lease_hold
        keep = []
        for delivery in deliveries:
            if min(hold, self._cap_left(delivery, now)) > self.takeover_margin:
                keep.append(delivery)
            else:  # nobody could take it over in time (SQS's 12-hour cap): release it
                self._settle.add("release", _Pending(delivery, 0))
        await self.flush()
        self.parked += await self._lot.keep(keep, hold, self._hold)

    async def _hold(self, deliveries: list[SqsDelivery], hold: float) -> list[SqsDelivery]:
        now = time.monotonic()
        pairs = [(d, min(int(hold), self._cap_left(d, now))) for d in deliveries]
        return self._kept(await self._set_visibility(pairs), "kept for a restart")


_ACTIONS = ("delete", "release")  # the settle buffer's keys, in the order they are sent
