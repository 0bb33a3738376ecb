"""The Service Bus side of the ack channel: peek-lock receive, renew, settle.

The lease kit of ``acklane.core.connectors`` does the machinery (the tasks and
their failure latch, the settle buffer, the lock keeper, the session holds); what
is here is Service Bus's I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncGenerator, Hashable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusReceiveMode
from azure.servicebus.aio import ServiceBusClient, ServiceBusReceiver
from azure.servicebus.exceptions import (
    MessageLockLostError,
    OperationTimeoutError,
    ServiceBusError,
    SessionLockLostError,
)

from acklane.core import connectors as kit
from acklane.core.connectors import Action, LaneEntry, Verdict, verdict
from acklane.core.connectors.deadletter import bounded_text, outcome_reason
from acklane.core.errors import AdvanceError, ReceiveError
from acklane.core.producer import AdvanceItem, SharedStreamProducer

from ._check import ERRORS, UNREACHABLE
from ._config import ServiceBusConfig
from ._message import ServiceBusDelivery, ServiceBusRecord

__all__ = ["ServiceBusDelivery", "ServiceBusRecord", "ServiceBusStreamProducer"]

log = logging.getLogger("acklane.connectors.servicebus")

#: Service Bus limits a DeadLetterErrorDescription to 4096 characters; keep well under.
_DESCRIPTION_MAX_BYTES = 1024
_LOCK_LOST = (MessageLockLostError, SessionLockLostError)
#: Queued settlements past which ``advance`` waits for a flush (back-pressure).
_BUFFER_LIMIT = 1000
#: Seconds a receive waits at most while the receiver has messages the engine holds.
_BUSY_WAIT = 0.05
#: A receive of one message that took less found it there (no wait): a backlog sign.
_QUICK = 0.001
#: Seconds ``aclose`` spends at most abandoning the messages the engine left unresolved.
_ABANDON_BUDGET = 5.0


class ServiceBusConnectorError(ReceiveError):
    """The namespace or the entity cannot be used."""


@dataclass(slots=True, eq=False)
class _Settlement:
    """A settlement the engine decided, waiting for the flusher to send it."""

    delivery: ServiceBusDelivery
    verdict: Verdict
    reason: str = ""


class ServiceBusStreamProducer(SharedStreamProducer):
    """One group's poll of one queue or subscription, with the async ``azure-servicebus`` SDK.

    Lanes: the session id on session-enabled entities (a failed message holds its
    session), the message itself otherwise. Every outstanding message's lock (or
    its session's lock) is renewed until the engine resolves it.

    Settlements are sent in the background: ``advance`` queues them and the settle
    buffer sends them, each on the receiver that received its message, receivers
    concurrently. A settlement that fails otherwise than by a lost lock fails the
    group at the next ``advance`` or receive.
    """

    def __init__(self, config: ServiceBusConfig) -> None:
        self.config = config
        self.completed = self.abandoned = self.dead_lettered = 0
        self.renewed = self.lock_lost = self.delivered = 0
        self._client: ServiceBusClient | None = None
        self._outstanding: dict[int, ServiceBusDelivery] = {}
        self._receivers: set[ServiceBusReceiver] = set()
        #: Open session receivers, each with the event that lets its session go.
        self._sessions: dict[ServiceBusReceiver, asyncio.Event] = {}
        self._queue: asyncio.Queue[tuple[ServiceBusRecord, ServiceBusDelivery] | BaseException]
        self._queue = asyncio.Queue()
        self._tasks = kit.ProducerTasks(config.describe(), logger=log)
        self._tasks.on_failure(self._queue.put_nowait)  # the stream raises it at once
        #: Settlements by the receiver that must send them, receivers concurrently.
        self._settlements: kit.SettleBuffer[ServiceBusReceiver, _Settlement] = kit.SettleBuffer(
            self._send, batch=_BUFFER_LIMIT, limit=_BUFFER_LIMIT, parallel=True
        )
        #: A session receiver behind a failed message is held: none of it is settled.
        self._lanes: kit.OrderedLanes[ServiceBusReceiver] = kit.OrderedLanes()
        #: One user of a receiver's connection at a time: its receives and settlements.
        self._io: dict[ServiceBusReceiver, asyncio.Lock] = {}
        #: Receives in a row that returned all they asked for at once (_receive_count).
        self._streak: dict[ServiceBusReceiver, int] = {}
        self._opened = False
        self._closed = False
        # Whether the namespace answers, told once per change (broker_problem, /readyz).
        self._reachability = kit.Reachability(
            config.describe(), "Service Bus namespace", config.namespace, logger=log
        )

    # ------------------------------------------------------------------ stream

    def _receiver(self, session: bool) -> ServiceBusReceiver:
        cfg = self.config
        assert self._client is not None
        kwargs: dict[str, Any] = {
            "receive_mode": ServiceBusReceiveMode.PEEK_LOCK,
            "prefetch_count": cfg.prefetch,
        }
        if session:
            kwargs["session_id"] = NEXT_AVAILABLE_SESSION
            kwargs["max_wait_time"] = cfg.max_wait_time
        if cfg.queue is not None:
            return self._client.get_queue_receiver(cfg.queue, **kwargs)
        assert cfg.topic is not None and cfg.subscription is not None
        return self._client.get_subscription_receiver(cfg.topic, cfg.subscription, **kwargs)

    async def open_stream(
        self,
    ) -> AsyncGenerator[tuple[ServiceBusRecord, ServiceBusDelivery], None]:
        if self._opened:
            raise RuntimeError(f"{self.config.describe()}: open_stream() may be called once")
        self._opened = True
        self._client = self.config.make_client()
        for n in range(self.config.max_sessions if self.config.sessions else 1):
            self._tasks.spawn(self._receive_loop(), f"servicebus receive {n}")
        keeper = kit.LeaseKeeper(
            self._renew_due,
            self._interval,
            transient=ERRORS.transient,
            describe=self._tasks.describe,
        )
        self._tasks.spawn(keeper.run(), "servicebus renew")
        self._tasks.spawn(self._settlements.run(), "servicebus settle")
        while True:
            item = await self._queue.get()
            if isinstance(item, BaseException):
                raise item
            self.delivered += 1
            yield item

    async def _receive_loop(self) -> None:
        try:
            if self.config.sessions:
                while not self._stopping():
                    await self._until_reachable(self._one_session)
                return
            # Closed by aclose, after its last settlements: not when this task ends.
            receiver = self._receiver(session=False)
            self._receivers.add(receiver)
            await self._reachability.until_answered(receiver.__aenter__, ERRORS.unreachable)
            while not self._stopping():
                # not the group's failure: the namespace comes back, the SDK reconnects
                await self._until_reachable(lambda: self._receive_batch(receiver, None))
        except Exception as exc:
            raise ERRORS.map(exc, f"receiving from {self.config.entity}") from exc

    async def _until_reachable(self, call: Any) -> None:
        try:
            await call()
        except UNREACHABLE as exc:
            await self._reachability.wait(exc)
            return
        self._reachability.answered()

    def _stopping(self) -> bool:
        """Whether a receive loop must end: ``aclose`` began, or its task was cancelled.

        Python 3.11's ``asyncio.wait_for`` (which the SDK reads through) loses a
        cancellation that arrives as its read completes: the receive then returns
        normally, and a loop relying on ``CancelledError`` alone would go on for ever.
        """
        task = asyncio.current_task()
        return self._closed or (task is not None and task.cancelling() > 0)

    async def _one_session(self) -> None:
        receiver = self._receiver(session=True)
        try:
            await receiver.__aenter__()
        except OperationTimeoutError:
            return  # no session available within max_wait_time: ask again
        self._receivers.add(receiver)
        release = self._sessions[receiver] = asyncio.Event()
        session_id = receiver.session.session_id
        idle_since = time.monotonic()
        try:
            while not release.is_set() and not self._stopping():
                got = await self._receive_or_release(receiver, session_id, release)
                if got or self._holds(receiver):
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since >= self.config.session_idle_timeout:
                    return  # idle and nothing outstanding: let the session go
        except SessionLockLostError:
            self.lock_lost += 1
            log.warning("session %s: its lock was lost; Service Bus redelivers it", session_id)
        except OperationTimeoutError:
            # No session came with the link after all (the SDK reports it on the first
            # receive, not on opening): ask again.
            if self._holds(receiver):
                raise
        finally:
            # What the engine resolved of this session is settled before the session goes
            # (closing the receiver would release it): a session let go behind a failed
            # message keeps its earlier messages completed, in order.
            with contextlib.suppress(Exception):
                await self._settlements.flush(receiver)
            self._sessions.pop(receiver, None)
            self._receivers.discard(receiver)
            # Not under a settlement in flight (the flusher's): it would fail half-way.
            async with self._io_lock(receiver):
                with contextlib.suppress(Exception):
                    await receiver.close()
            self._io.pop(receiver, None)
            self._streak.pop(receiver, None)
            self._lanes.forget(receiver)

    async def _receive_or_release(
        self, receiver: ServiceBusReceiver, session_id: str | None, release: asyncio.Event
    ) -> int:
        """One receive on a session receiver, cut short when its session must be let go
        (what it received then is not handed on: closing the receiver releases it)."""
        receiving = asyncio.ensure_future(self._receive_messages(receiver))
        releasing = asyncio.ensure_future(release.wait())
        try:
            await asyncio.wait((receiving, releasing), return_when=asyncio.FIRST_COMPLETED)
        finally:
            releasing.cancel()
            if not receiving.done():
                receiving.cancel()
                with contextlib.suppress(BaseException):
                    await receiving
        if release.is_set():
            return 0
        return self._hand_on(receiver, session_id, receiving.result())

    async def _receive_batch(self, receiver: ServiceBusReceiver, session_id: str | None) -> int:
        return self._hand_on(receiver, session_id, await self._receive_messages(receiver))

    def _holds(self, receiver: ServiceBusReceiver) -> bool:
        """Whether messages of this receiver are outstanding or wait for settlement."""
        return self._settlements.holds(receiver) or any(
            d.receiver is receiver for d in self._outstanding.values()
        )

    def _io_lock(self, receiver: ServiceBusReceiver) -> asyncio.Lock:
        """The lock taken by whoever uses ``receiver``'s connection to receive or settle.

        The SDK reads and writes a connection under one lock, and a read that finds
        nothing holds it up to the socket timeout (0.2 s): a settlement waiting for its
        answer while another task reads, or a receive reading while settlements wait
        to be written, stalls them all that long. One user at a time never does: each
        read then waits for an answer that is on its way.
        """
        lock = self._io.get(receiver)
        if lock is None:
            lock = self._io[receiver] = asyncio.Lock()
        return lock

    async def _receive_messages(self, receiver: ServiceBusReceiver) -> list[Any]:
        await self._settlements.flush(receiver)  # settlements queued before go first
        count = self._receive_count(receiver)
        async with self._io_lock(receiver):
            started = time.monotonic()
            messages: list[Any] = await receiver.receive_messages(
                max_message_count=count, max_wait_time=self._wait_time(receiver)
            )
            took = time.monotonic() - started
        full = len(messages) == count and (count > 1 or took < _QUICK)
        self._streak[receiver] = self._streak.get(receiver, 0) + 1 if full else 0
        return messages

    def _receive_count(self, receiver: ServiceBusReceiver) -> int:
        """How many messages the next receive asks for: 1, or ``max_batch`` in a backlog.

        A receive returns once it has the count asked for; short of it, only after a
        pause in the transfers that the SDK notices with a read timing out (its socket
        timeout, 0.2 s) past ``max_wait_time`` or 0.2 s after the first message. So
        receives ask for one message (it returns the moment one arrives) until a
        backlog shows, as ``max_batch`` receives of one in a row that each found their
        message there; then for ``max_batch`` (fewer calls) until a batch comes short.
        """
        batch = self.config.max_batch
        return batch if self._streak.get(receiver, 0) >= batch else 1

    def _wait_time(self, receiver: ServiceBusReceiver) -> float:
        """``max_wait_time``, cut short while this receiver has messages the engine holds:
        their settlements should not wait behind a long empty receive."""
        wait = self.config.max_wait_time
        return min(wait, _BUSY_WAIT) if self._holds(receiver) else wait

    def _hand_on(
        self, receiver: ServiceBusReceiver, session_id: str | None, messages: list[Any]
    ) -> int:
        now = time.monotonic()
        entity = self.config.entity
        for message in messages:
            delivery = ServiceBusDelivery(
                message, receiver, self._identity(message), session_id, now
            )
            self._outstanding[id(delivery)] = delivery
            self._queue.put_nowait((ServiceBusRecord.from_received(entity, message), delivery))
        return len(messages)

    def _identity(self, message: Any) -> str:
        enqueued = message.enqueued_time_utc
        stamp = enqueued.isoformat(timespec="milliseconds") if enqueued is not None else "-"
        return (
            f"servicebus:{self.config.namespace}/{self.config.entity.lower()}/"
            f"{message.sequence_number}@{stamp}"
        )

    def get_advance_lane(self, broker_payload: Any) -> Hashable:
        delivery: ServiceBusDelivery = broker_payload
        if self.config.sessions:
            return ("session", delivery.session_id)
        return delivery.identity

    def message_id(self, broker_payload: Any) -> str | None:
        """``servicebus:<namespace>/<entity>/<sequence number>@<enqueued time>``."""
        delivery: ServiceBusDelivery = broker_payload
        return delivery.identity

    @property
    def outstanding(self) -> int:
        return len(self._outstanding)

    def broker_problem(self) -> str | None:
        return self._reachability.problem

    def counters(self) -> Mapping[str, float]:
        return {
            Action.DELIVERED: self.delivered,
            Action.DELETED: self.completed,
            Action.REDELIVERED: self.abandoned + self.lock_lost,
            Action.DEAD_LETTERED: self.dead_lettered,
            Action.EXTENDED: self.renewed,
        }

    # ----------------------------------------------------------------- advance

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        """Queue each resolved message's settlement; the settle buffer sends them."""
        self._tasks.raise_failure()
        entries = []
        for item in batch:
            delivery: ServiceBusDelivery = item.broker_payload
            self._outstanding.pop(id(delivery), None)
            if not delivery.settled:  # else let go with its session, or abandoned at close
                lane = delivery.receiver if delivery.session_id is not None else None
                entries.append(LaneEntry(lane, 0, verdict(item.outcome), item))
        held = {id(item) for item in self._lanes.plan(entries).held}
        for _, _, judged, item in entries:  # in their order: one receiver settles in order
            delivery = item.broker_payload
            if id(item) in held:  # behind a failed message of its session: released with it
                delivery.settled = True
                self.abandoned += 1
            elif judged is Verdict.REDELIVER and delivery.session_id is not None:
                self._let_session_go(delivery)
            else:
                delivery.settled = True
                reason = outcome_reason(item.outcome) if judged is Verdict.DEAD_LETTER else ""
                self._settlements.add(delivery.receiver, _Settlement(delivery, judged, reason))
        await self._settlements.settle_soon()

    # ------------------------------------------------------------------ settle

    async def flush(self) -> None:
        """Send every queued settlement; return once Service Bus answered them all.

        Raises the first failure other than a lost lock (the group fails).
        """
        await self._settlements.flush()

    async def _send(self, receiver: ServiceBusReceiver, queue: deque[_Settlement]) -> None:
        """Send ``receiver``'s settlements one after the other, in their order.

        One at a time, each read of the connection waits for the answer just asked
        for: concurrent settlements would make the SDK read past the last answer and
        hold the connection for its socket timeout. A failure other than a lost lock
        fails the group; the settlements not sent yet stay queued (``aclose`` tries
        them once more).
        """
        async with self._io_lock(receiver):
            while queue:
                try:
                    await self._settle(queue[0])
                except Exception as exc:
                    mapped = ERRORS.map(exc, f"settling {queue[0].delivery.identity}", AdvanceError)
                    self._tasks.fail(mapped)
                    raise mapped from exc
                queue.popleft()

    async def _settle(self, settlement: _Settlement) -> None:
        delivery = settlement.delivery
        receiver, message = delivery.receiver, delivery.message
        try:
            match settlement.verdict:
                case Verdict.COMMIT:
                    await receiver.complete_message(message)
                    self.completed += 1
                case Verdict.DEAD_LETTER:
                    reason = settlement.reason
                    await receiver.dead_letter_message(
                        message,
                        reason=bounded_text(reason, 256),
                        error_description=bounded_text(reason, _DESCRIPTION_MAX_BYTES),
                    )
                    self.dead_lettered += 1
                case Verdict.REDELIVER:
                    await receiver.abandon_message(message)
                    self.abandoned += 1
        except _LOCK_LOST as exc:
            # The lock lapsed or the session went: Service Bus delivers it again.
            self._lost_before_settlement(delivery, type(exc).__name__)
        except ServiceBusError as exc:
            if "lock" in str(exc).lower() and "lost" in str(exc).lower():
                self._lost_before_settlement(delivery, type(exc).__name__)
                return
            raise
        except ValueError:
            if receiver in self._receivers:
                raise
            # Its receiver was closed already (its session let go, or lost): closing
            # released the message, and Service Bus delivers it again.
            self._lost_before_settlement(delivery, "receiver closed")

    def _lost_before_settlement(self, delivery: ServiceBusDelivery, why: str) -> None:
        self.lock_lost += 1
        log.warning(
            "%s: message %s: lock lost before settlement (%s); it will be redelivered",
            self.config.describe(),
            delivery.identity,
            why,
        )

    def _let_session_go(self, failed: ServiceBusDelivery) -> None:
        """A session's message must come again: its session receiver lets the session go.

        Abandoning it alone would let the session's later messages (outstanding here,
        or already prefetched) be completed before it comes back: the session would be
        reordered. Instead nothing more of this receiver is settled or handed on, and
        closing it releases the session with every message it holds; Service Bus
        delivers them again in order, the failed one first, to whichever receiver
        accepts the session next. Each of them counts one more delivery.
        """
        receiver = failed.receiver
        held = [d for d in self._outstanding.values() if d.receiver is receiver]
        for delivery in (failed, *held):
            self._outstanding.pop(id(delivery), None)
            if not delivery.settled:
                delivery.settled = True
                self.abandoned += 1
        release = self._sessions.get(receiver)
        if release is not None:
            release.set()
        log.info(
            "%s: session %s let go behind a failed message (%d released); it comes again in order",
            self.config.describe(),
            failed.session_id,
            len(held) + 1,
        )

    # ------------------------------------------------------------------- renew

    def _interval(self) -> float:
        """``renew_interval``, else a beat for the shortest lock held (read each beat)."""
        if self.config.renew_interval:
            return self.config.renew_interval
        now = datetime.now(UTC)
        left: list[float] = [
            (d.message.locked_until_utc - now).total_seconds()
            for d in self._outstanding.values()
            if d.message.locked_until_utc is not None
        ]
        left += [
            (r.session.locked_until_utc - now).total_seconds()
            for r in list(self._sessions)
            if r.session is not None and r.session.locked_until_utc is not None
        ]
        return min(kit.beat_interval(max(min(left), 0.4)), 5.0) if left else 1.0

    async def _renew_due(self, interval: float) -> None:
        now = datetime.now(UTC)
        overdue: set[int] = set()  # sessions holding a message past max_lock_renewal
        for key, delivery in list(self._outstanding.items()):
            if delivery.settled:
                continue
            if time.monotonic() - delivery.received_at > self.config.max_lock_renewal:
                overdue.add(id(delivery.receiver))
                continue
            if delivery.session_id is not None or not _due(delivery.message, now, interval):
                continue  # a session's lock is its messages' lock: renewed below
            try:
                await delivery.receiver.renew_message_lock(delivery.message)
                self.renewed += 1
            except _LOCK_LOST:
                self.lock_lost += 1
                self._outstanding.pop(key, None)
                log.warning("message %s: lock lost; it will be redelivered", delivery.identity)
        for receiver, release in list(self._sessions.items()):  # every session held
            if release.is_set() or id(receiver) in overdue:
                continue  # being let go, or renewed long enough
            if not _due(receiver.session, now, interval):
                continue
            try:
                await receiver.session.renew_lock()
                self.renewed += 1
            except _LOCK_LOST:
                self.lock_lost += 1

    # ------------------------------------------------------------------- close

    async def _abandon_unresolved(self) -> None:
        """Abandon the messages of open (sessionless) receivers the engine never resolved.

        The group is going (a cohort restart, a failure, a stop): nobody will resolve
        them. Left alone they would come back only when their locks lapse (the
        entity's lock duration, a minute by default), which counts a delivery too;
        abandoned, they come back now. Best effort, within a few seconds: what is not
        abandoned lapses as before. A session's messages are released by closing its
        receiver instead.
        """
        held = [
            d
            for d in self._outstanding.values()
            if not d.settled and d.session_id is None and d.receiver in self._receivers
        ]
        self._outstanding.clear()
        if not held:
            return
        given = 0
        try:
            async with asyncio.timeout(_ABANDON_BUDGET):
                for delivery in held:
                    delivery.settled = True
                    try:
                        await delivery.receiver.abandon_message(delivery.message)
                    except _LOCK_LOST:
                        self.lock_lost += 1  # it comes back anyway
                        continue
                    self.abandoned += 1
                    given += 1
        except Exception as exc:
            log.warning(
                "%s: giving back unresolved messages on close failed (%r); Service Bus "
                "redelivers them when their locks lapse",
                self.config.describe(),
                exc,
            )
        log.info(
            "%s: %d of %d unresolved messages abandoned on close (redelivered now)",
            self.config.describe(),
            given,
            len(held),
        )

    async def aclose(self) -> None:
        """Stop receiving, send the queued settlements, close the receivers and client.

        Messages the engine never resolved come back at once rather than when their
        locks lapse: they are abandoned (``_abandon_unresolved``), or closing their
        session's receiver releases them; the SDK releases what it prefetched.
        """
        if self._closed:
            return
        self._closed = True
        # The flusher first (a flush in flight goes on, shielded), then the renewal,
        # then the receive loops; the flush below waits for what is in flight.
        await self._tasks.aclose()
        try:
            async with asyncio.timeout(30):
                await self.flush()
        except Exception as exc:
            log.warning(
                "%s: final settlements failed (%r); Service Bus redelivers those messages "
                "when their locks lapse",
                self.config.describe(),
                exc,
            )
        else:
            await self._abandon_unresolved()
        for receiver in list(self._receivers):
            with contextlib.suppress(Exception):
                await receiver.close()
        self._receivers.clear()
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.close()
        self._client = None


def _due(locked: Any, now: datetime, interval: float) -> bool:
    """Whether a message's or a session's lock lapses within two beats (or is unknown)."""
    until = locked.locked_until_utc
    return until is None or (until - now).total_seconds() <= 2 * interval
