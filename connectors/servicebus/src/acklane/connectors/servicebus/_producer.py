"""The Service Bus side of the ack channel: peek-lock receive, renew, settle."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncGenerator, Coroutine, Hashable, Mapping, Sequence
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

from acklane.core.connectors import Action, Reachability, Verdict, verdict
from acklane.core.connectors.deadletter import bounded_text, outcome_reason
from acklane.core.errors import BrokerAuthError, ConnectorError
from acklane.core.producer import AdvanceItem, SharedStreamProducer

from ._check import UNREACHABLE, auth_error
from ._config import ServiceBusConfig
from ._message import ServiceBusMessage, identity_of

__all__ = ["ServiceBusDelivery", "ServiceBusStreamProducer"]

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


class ServiceBusConnectorError(ConnectorError, RuntimeError):
    """The namespace or the entity cannot be used."""


@dataclass(slots=True, eq=False)
class ServiceBusDelivery:
    """The broker payload: the SDK message and the receiver that must settle it."""

    message: Any
    receiver: ServiceBusReceiver
    identity: str
    session_id: str | None
    received_at: float
    settled: bool = False


@dataclass(slots=True, eq=False)
class _Settlement:
    """A settlement the engine decided, waiting for the flusher to send it."""

    delivery: ServiceBusDelivery
    verdict: Verdict
    reason: str = ""


async def _shielded(work: Coroutine[Any, Any, None]) -> None:
    """Run ``work`` to its end even if the caller is cancelled: settlements taken off
    the queue are sent, never dropped half-way (``aclose`` waits for them)."""
    task = asyncio.ensure_future(work)
    task.add_done_callback(_retrieve)
    await asyncio.shield(task)


def _retrieve(task: asyncio.Future[None]) -> None:
    if not task.cancelled():
        task.exception()  # recorded by _fail; not "never retrieved" if nobody awaits it


class ServiceBusStreamProducer(SharedStreamProducer[ServiceBusDelivery]):
    """One group's poll of one queue or subscription, with the async ``azure-servicebus`` SDK.

    Lanes: the session id on session-enabled entities (a failed message holds its
    session), the message itself otherwise. Every outstanding message's lock (or
    its session's lock) is renewed until the engine resolves it.

    Settlements are sent in the background: ``advance`` queues them and a flusher
    task sends them concurrently, each on the receiver that received its message
    (see ``flush``). A settlement that fails otherwise than by a lost lock fails
    the group at the next ``advance`` or receive.
    """

    def __init__(self, config: ServiceBusConfig) -> None:
        self.config = config
        self.completed = 0
        self.abandoned = 0
        self.dead_lettered = 0
        self.renewed = 0
        self.lock_lost = 0
        self.delivered = 0
        self._client: ServiceBusClient | None = None
        self._outstanding: dict[int, ServiceBusDelivery] = {}
        self._receivers: set[ServiceBusReceiver] = set()
        #: Open session receivers, each with the event that lets its session go.
        self._sessions: dict[ServiceBusReceiver, asyncio.Event] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._queue: asyncio.Queue[tuple[ServiceBusMessage, ServiceBusDelivery] | BaseException]
        self._queue = asyncio.Queue()
        #: Settlements the engine decided, not yet sent, by the receiver that must send them.
        self._to_settle: dict[ServiceBusReceiver, deque[_Settlement]] = {}
        #: Settlements sent and not yet answered, by receiver (a session waits for its own).
        self._settling: dict[ServiceBusReceiver, int] = {}
        #: One user of a receiver's connection at a time: its receives and settlements.
        self._io: dict[ServiceBusReceiver, asyncio.Lock] = {}
        #: Receives in a row that returned all they asked for at once (_receive_count).
        self._streak: dict[ServiceBusReceiver, int] = {}
        self._flush_wanted = asyncio.Event()
        self._flusher_task: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None
        self._opened = False
        self._closed = False
        # Whether the namespace answers, told once per change (broker_problem, /readyz).
        self._reachability = Reachability(
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
    ) -> AsyncGenerator[tuple[ServiceBusMessage, ServiceBusDelivery], None]:
        if self._opened:
            raise RuntimeError(f"{self.config.describe()}: open_stream() may be called once")
        self._opened = True
        self._client = self.config.make_client()
        workers = self.config.max_sessions if self.config.sessions else 1
        for n in range(workers):
            self._tasks.append(
                asyncio.create_task(self._receive_loop(), name=f"acklane servicebus receive {n}")
            )
        self._tasks.append(asyncio.create_task(self._renew_loop(), name="acklane servicebus renew"))
        self._flusher_task = asyncio.create_task(
            self._flush_loop(), name="acklane servicebus settle"
        )
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
                    try:
                        await self._one_session()
                    except UNREACHABLE as exc:
                        await self._reachability.wait(exc)
                        continue
                    self._reachability.answered()
            else:
                # Closed by aclose, after its last settlements: not when this task ends.
                receiver = self._receiver(session=False)
                self._receivers.add(receiver)
                while True:
                    try:
                        await receiver.__aenter__()
                        break
                    except UNREACHABLE as exc:
                        await self._reachability.wait(exc)
                while not self._stopping():
                    try:
                        await self._receive_batch(receiver, None)
                    except UNREACHABLE as exc:
                        # not the group's failure: the namespace comes back, the SDK
                        # reconnects on the next receive
                        await self._reachability.wait(exc)
                        continue
                    self._reachability.answered()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            refused = auth_error(exc, f"receiving from {self.config.entity}")
            if refused is not None:
                refused.__cause__ = exc
                exc = refused  # the runner stops on it, with one line
            self._fail(exc)

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
                mine = self._holds(receiver)
                if got or mine:
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
                await self._settle_receiver(receiver)
            self._sessions.pop(receiver, None)
            self._receivers.discard(receiver)
            # Not under a settlement in flight (the flusher's): it would fail half-way.
            async with self._io_lock(receiver):
                with contextlib.suppress(Exception):
                    await receiver.close()
            self._io.pop(receiver, None)
            self._streak.pop(receiver, None)

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
        return (
            bool(self._to_settle.get(receiver))
            or self._settling.get(receiver, 0) > 0
            or any(d.receiver is receiver for d in self._outstanding.values())
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
        # Settlements queued before the receive go first.
        await self._settle_receiver(receiver)
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
        """How many messages the next receive asks for: 1, or ``batch_size`` in a backlog.

        A receive returns once it has the count asked for; short of it, only after a
        pause in the transfers that the SDK notices with a read timing out (its socket
        timeout, 0.2 s) past ``max_wait_time`` or 0.2 s after the first message. So
        receives ask for one message (it returns the moment one arrives) until a
        backlog shows, as ``batch_size`` receives of one in a row that each found their
        message there; then for ``batch_size`` (fewer calls) until a batch comes short.
        """
        batch = self.config.batch_size
        return batch if self._streak.get(receiver, 0) >= batch else 1

    def _wait_time(self, receiver: ServiceBusReceiver) -> float:
        """``max_wait_time``, cut short while this receiver has messages the engine holds:
        their settlements should not wait behind a long empty receive."""
        wait = self.config.max_wait_time
        if self._holds(receiver):
            return min(wait, _BUSY_WAIT)
        return wait

    def _hand_on(
        self, receiver: ServiceBusReceiver, session_id: str | None, messages: list[Any]
    ) -> int:
        now = time.monotonic()
        for message in messages:
            delivery = ServiceBusDelivery(
                message, receiver, self._identity(message), session_id, now
            )
            self._outstanding[id(delivery)] = delivery
            self._queue.put_nowait((self._record(message), delivery))
        return len(messages)

    def _identity(self, message: Any) -> str:
        return identity_of(self.config.namespace, self.config.entity, message)

    def _record(self, message: Any) -> ServiceBusMessage:
        return ServiceBusMessage.from_received(message, self._identity(message), self.config.entity)

    def get_advance_lane(self, delivery: ServiceBusDelivery) -> Hashable:
        if self.config.sessions:
            return ("session", delivery.session_id)
        return delivery.identity

    def message_id(self, delivery: ServiceBusDelivery) -> str | None:
        """``servicebus:<namespace>/<entity>/<sequence number>@<enqueued time>``."""
        return delivery.identity

    @property
    def outstanding(self) -> int:
        return len(self._outstanding)

    def broker_problem(self) -> str | None:
        return self._reachability.problem

    def counters(self) -> Mapping[str, float]:
        return {
            Action.DELIVERED: self.delivered,
            Action.COMPLETED: self.completed,
            Action.REDELIVERED: self.abandoned,
            Action.LEASE_LOST: self.lock_lost,
            Action.DEAD_LETTERED: self.dead_lettered,
            Action.EXTENDED: self.renewed,
        }

    # ----------------------------------------------------------------- advance

    async def advance(self, batch: Sequence[AdvanceItem[ServiceBusDelivery]]) -> None:
        """Queue each resolved message's settlement; the flusher sends them."""
        self._raise_failure()
        for item in batch:
            delivery = item.broker_payload
            self._outstanding.pop(id(delivery), None)
            if delivery.settled:
                continue
            judged = verdict(item.outcome)
            if judged is Verdict.REDELIVER and delivery.session_id is not None:
                self._let_session_go(delivery)
                continue
            delivery.settled = True
            reason = outcome_reason(item.outcome) if judged is Verdict.DEAD_LETTER else ""
            queue = self._to_settle.get(delivery.receiver)
            if queue is None:
                queue = self._to_settle[delivery.receiver] = deque()
            queue.append(_Settlement(delivery, judged, reason))
        queued = sum(len(q) for q in self._to_settle.values())
        if queued >= _BUFFER_LIMIT:
            await self.flush()  # the flusher fell behind: push back on the engine
        elif queued:
            self._flush_wanted.set()

    # ------------------------------------------------------------------ settle

    async def _flush_loop(self) -> None:
        while True:
            await self._flush_wanted.wait()
            self._flush_wanted.clear()
            with contextlib.suppress(Exception):  # recorded by _fail: the group fails
                await self.flush()

    async def flush(self) -> None:
        """Send every queued settlement; return once Service Bus answered them all.

        Raises the first failure other than a lost lock (the group fails).
        """
        await _shielded(self._flush_now())

    async def _flush_now(self) -> None:
        while True:
            # Receivers with settlements queued, or in flight (sent by another task:
            # waiting for the receiver's lock waits for their answers).
            receivers = [r for r, q in self._to_settle.items() if q]
            receivers += [r for r in self._settling if r not in receivers]
            if not receivers:
                return
            results = await asyncio.gather(
                *(self._settle_receiver_now(r) for r in receivers), return_exceptions=True
            )
            for result in results:
                if isinstance(result, BaseException):
                    raise result
            if not any(self._to_settle.values()):
                return

    async def _settle_receiver(self, receiver: ServiceBusReceiver) -> None:
        """Send this receiver's queued settlements now (before it receives or closes);
        return once those in flight were answered too."""
        if self._to_settle.get(receiver) or self._settling.get(receiver):
            await _shielded(self._settle_receiver_now(receiver))

    async def _settle_receiver_now(self, receiver: ServiceBusReceiver) -> None:
        """Send ``receiver``'s queued settlements one after the other, in their order.

        One at a time, each read of the connection waits for the answer just asked
        for: concurrent settlements would make the SDK read past the last answer and
        hold the connection for its socket timeout. Stops at the first failure other
        than a lost lock, which fails the group; the settlements not sent yet stay
        queued (``aclose`` tries them once more).
        """
        async with self._io_lock(receiver):
            queue = self._to_settle.pop(receiver, None)
            if not queue:
                return
            self._settling[receiver] = len(queue)
            try:
                while queue:
                    await self._settle(queue[0])
                    queue.popleft()
                    self._settling[receiver] -= 1
            except Exception as exc:
                queue.popleft()  # not settled: it comes back (its lock lapses)
                if queue:
                    later = self._to_settle.get(receiver)
                    if later:
                        queue.extend(later)
                    self._to_settle[receiver] = queue
                self._fail(exc)
                raise
            finally:
                del self._settling[receiver]

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

    def _fail(self, exc: BaseException) -> None:
        """Fail the group: at the next advance, and at the stream's next receive."""
        if self._failure is None:
            self._failure = exc
            if isinstance(exc, BrokerAuthError):  # the runner tells it, and stops
                log.debug("%s: %r; the group will fail", self.config.describe(), exc)
            else:
                log.error("%s: %r; the group will fail", self.config.describe(), exc)
            self._queue.put_nowait(exc)

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

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

    async def _renew_loop(self) -> None:
        while True:
            interval = self.config.heartbeat.interval or self._default_interval()
            await asyncio.sleep(interval)
            try:
                await self._renew_due(2 * interval)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("%s: lock renewal failed (%r); retrying", self.config.describe(), exc)

    def _default_interval(self) -> float:
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
        if not left:
            return 1.0
        shortest: float = min(left)
        return max(min(max(shortest, 0.4) / 4, 5.0), 0.1)

    async def _renew_due(self, horizon: float) -> None:
        now = datetime.now(UTC)
        overdue: set[int] = set()  # sessions holding a message past max_lock_renewal
        for key, delivery in list(self._outstanding.items()):
            if delivery.settled:
                continue
            if time.monotonic() - delivery.received_at > self.config.max_lock_renewal:
                overdue.add(id(delivery.receiver))
                continue
            if delivery.session_id is not None:
                continue  # its session's lock is its lock: renewed below
            until = delivery.message.locked_until_utc
            if until is not None and (until - now).total_seconds() > horizon:
                continue
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
            session = receiver.session
            until = session.locked_until_utc
            if until is not None and (until - now).total_seconds() > horizon:
                continue
            try:
                await session.renew_lock()
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
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task
        if self._flusher_task is not None:
            # A flush in flight goes on (shielded); the flush below waits for it.
            self._flusher_task.cancel()
            with contextlib.suppress(BaseException):
                await self._flusher_task
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
