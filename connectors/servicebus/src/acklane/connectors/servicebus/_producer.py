"""The Service Bus side of the ack channel: peek-lock receive, renew, settle.

The lease kit of ``acklane.core.connectors`` does the machinery (tasks, settle
buffer, lock keeper, session holds); ``_pacing`` shares a receiver's connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections import deque
from collections.abc import AsyncGenerator, Hashable, Mapping, Sequence
from typing import Any

from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusReceiveMode
from azure.servicebus.aio import ServiceBusClient, ServiceBusReceiver
from azure.servicebus.exceptions import (
    OperationTimeoutError,
    SessionLockLostError,
)

from acklane.core import connectors as kit
from acklane.core.connectors import Action, LaneEntry, Verdict, verdict
from acklane.core.connectors.deadletter import outcome_reason
from acklane.core.errors import AdvanceError, ReceiveError
from acklane.core.producer import AdvanceItem, SharedStreamProducer

from ._check import ERRORS, UNREACHABLE
from ._config import ServiceBusConfig
from ._locks import abandon, lock_interval, renew_due
from ._message import ServiceBusDelivery, ServiceBusMessage, identity_of
from ._opening import open_promptly
from ._pacing import ReceivePacing, prefetched, top_up_credit
from ._settling import (
    Settlement,
    complete_by_lock,
    complete_range,
    completion_ranges,
    link_of,
    settle,
)

__all__ = ["ServiceBusDelivery", "ServiceBusStreamProducer"]

log = logging.getLogger("acklane.connectors.servicebus")

#: Queued settlements past which ``advance`` waits for a flush (back-pressure).
_BUFFER_LIMIT = 1000
#: Seconds a receive waits at most while the receiver has messages the engine holds.
_BUSY_WAIT = 0.05
#: Seconds ``aclose`` spends at most abandoning the messages the engine left unresolved.
_ABANDON_BUDGET = 5.0


class ServiceBusConnectorError(ReceiveError):
    """The namespace or the entity cannot be used."""


class ServiceBusStreamProducer(SharedStreamProducer[ServiceBusDelivery]):
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
        #: Settlement calls sent (a range of completions counts one), and of them ranges.
        self.dispositions = self.ranged = 0
        self._client: ServiceBusClient | None = None
        self._outstanding: dict[int, ServiceBusDelivery] = {}
        self._receivers: set[ServiceBusReceiver] = set()
        #: Open session receivers, each with the event that lets its session go.
        self._sessions: dict[ServiceBusReceiver, asyncio.Event] = {}
        #: Links whose connection failed under a settlement (``_settling``).
        self._lost_links: weakref.WeakSet[Any] = weakref.WeakSet()
        self._queue: asyncio.Queue[tuple[ServiceBusMessage, ServiceBusDelivery] | BaseException]
        self._queue = asyncio.Queue()
        self._tasks = kit.ProducerTasks(config.describe(), logger=log)
        self._tasks.on_failure(self._queue.put_nowait)  # the stream raises it at once
        #: Settlements by the receiver that must send them, receivers concurrently.
        self._settlements: kit.SettleBuffer[ServiceBusReceiver, Settlement] = kit.SettleBuffer(
            self._send, batch=_BUFFER_LIMIT, limit=_BUFFER_LIMIT, parallel=True
        )
        #: A session receiver behind a failed message is held: none of it is settled.
        self._lanes: kit.OrderedLanes[ServiceBusReceiver] = kit.OrderedLanes()
        #: One user of a receiver's connection at a time, and how much a receive asks for.
        self._pacing = ReceivePacing(config.batch_size, config.max_wait_time, _BUSY_WAIT)
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
            receiver = self._client.get_queue_receiver(cfg.queue, **kwargs)
        else:
            assert cfg.topic is not None and cfg.subscription is not None
            receiver = self._client.get_subscription_receiver(cfg.topic, cfg.subscription, **kwargs)
        open_promptly(receiver)  # no 50 ms pause per frame of its opening
        return receiver

    async def open_stream(
        self,
    ) -> AsyncGenerator[tuple[ServiceBusMessage, ServiceBusDelivery], None]:
        if self._opened:
            raise RuntimeError(f"{self.config.describe()}: open_stream() may be called once")
        self._opened = True
        self._client = self.config.make_client()
        cfg = self.config
        for n in range(cfg.max_sessions if cfg.sessions else cfg.receivers):
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
        except (*UNREACHABLE, OperationTimeoutError) as exc:
            # OperationTimeoutError: the SDK, reconnecting within the receive, could not
            # open the link in time (a cut connection, a namespace slow to answer); the
            # next receive opens it again
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
            async with self._pacing.lock(receiver):
                with contextlib.suppress(Exception):
                    await receiver.close()
            self._pacing.forget(receiver)
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

    async def _receive_messages(self, receiver: ServiceBusReceiver) -> list[Any]:
        pace = self._pacing
        if not prefetched(receiver):  # else returned at once, without a read: the flusher settles
            await self._settlements.flush(receiver)  # settlements queued before go first
        async with pace.lock(receiver):
            # Read under the lock: a settlement's read may have taken some in meanwhile.
            buffered = prefetched(receiver)
            count = pace.count(receiver, buffered)
            busy = self._holds(receiver)
            await top_up_credit(receiver, self.config.prefetch, buffered)
            started = time.monotonic()
            messages: list[Any] = await receiver.receive_messages(
                max_message_count=count, max_wait_time=pace.wait_time(busy)
            )
            pace.received(receiver, len(messages), count, time.monotonic() - started)
        return messages

    def _hand_on(
        self, receiver: ServiceBusReceiver, session_id: str | None, messages: list[Any]
    ) -> int:
        now = time.monotonic()
        entity = self.config.entity
        link = link_of(receiver)  # the link that received them: their delivery ids are its
        for message in messages:
            delivery = ServiceBusDelivery(
                message, receiver, self._identity(message), session_id, now, link=link
            )
            self._outstanding[id(delivery)] = delivery
            record = ServiceBusMessage.from_received(message, delivery.identity, entity)
            self._queue.put_nowait((record, delivery))
        return len(messages)

    def _identity(self, message: Any) -> str:
        return identity_of(self.config.namespace, self.config.entity, message)

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
        """Queue each resolved message's settlement; the settle buffer sends them."""
        self._tasks.raise_failure()
        entries = []
        for item in batch:
            delivery = item.broker_payload
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
                self._settlements.add(delivery.receiver, Settlement(delivery, judged, reason))
        await self._settlements.settle_soon()

    # ------------------------------------------------------------------ settle

    async def flush(self) -> None:
        """Send every queued settlement; return once Service Bus answered them all.

        Raises the first failure other than a lost lock (the group fails).
        """
        await self._settlements.flush()

    async def _send(self, receiver: ServiceBusReceiver, queue: deque[Settlement]) -> None:
        """Send ``receiver``'s settlements in their order, completions in ranges.

        The completions at the front go in as few dispositions as their delivery ids
        allow (``_settling.completion_ranges``: one round trip for a whole run of
        them), the rest one at a time. One call at a time on the connection: each
        read of it waits for the answer just asked for; concurrent settlements would
        make the SDK read past the last answer and hold the connection for its
        socket timeout. A failure other than a lost lock fails the group; the
        settlements not sent yet stay queued (``aclose`` tries them once more).
        """
        describe = self.config.describe()
        async with self._pacing.lock(receiver):
            while queue:
                runs = completion_ranges(queue, self._lost_links)
                if not runs:
                    await self._settle_one(queue)
                    continue
                # the head's completions in delivery id order, taken off as they land
                ordered = [settlement for run in runs for settlement in run]
                for _ in ordered:
                    queue.popleft()
                queue.extendleft(reversed(ordered))
                for run in runs:
                    if len(run) == 1:
                        await self._settle_one(queue)
                        continue
                    self.dispositions += 1
                    if await complete_range(run, describe):
                        for _ in run:
                            queue.popleft()
                        self.completed += len(run)
                        self.ranged += 1
                        continue
                    for _ in run:  # not all accepted: one by one, by lock token
                        await self._settle_one(queue, by_lock=True)

    async def _settle_one(self, queue: deque[Settlement], by_lock: bool = False) -> None:
        """Send the settlement at the front of ``queue``; taken off once answered."""
        describe = self.config.describe()
        try:
            if by_lock:
                done = await complete_by_lock(queue[0], describe, self._lost_links)
            else:
                done = await settle(queue[0], self._receivers, describe, self._lost_links)
        except Exception as exc:
            mapped = ERRORS.map(exc, f"settling {queue[0].delivery.identity}", AdvanceError)
            self._tasks.fail(mapped)
            raise mapped from exc
        self.dispositions += 1
        self._count(done)
        queue.popleft()

    def _count(self, done: str) -> None:
        if done == Action.COMPLETED:
            self.completed += 1
        elif done == Action.DEAD_LETTERED:
            self.dead_lettered += 1
        elif done == Action.REDELIVERED:
            self.abandoned += 1
        else:
            self.lock_lost += 1

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
        """``heartbeat.interval``, else a beat for the shortest lock held (read each beat)."""
        return self.config.heartbeat.interval or lock_interval(
            self._outstanding.values(), self._sessions
        )

    async def _renew_due(self, interval: float) -> None:
        renewal = self.config.max_lock_renewal
        renewed, lost = await renew_due(self._outstanding, self._sessions, interval, renewal)
        self.renewed += renewed
        self.lock_lost += lost

    # ------------------------------------------------------------------- close

    async def aclose(self) -> None:
        """Stop receiving, send the queued settlements, close the receivers and client.

        Messages the engine never resolved come back at once rather than when their
        locks lapse: they are abandoned (``_locks.abandon``), or closing their
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
        else:  # sessionless: abandoned; a session's messages go with its receiver
            held = [
                d
                for d in self._outstanding.values()
                if not d.settled and d.session_id is None and d.receiver in self._receivers
            ]
            self._outstanding.clear()
            if held:
                given, lost = await abandon(held, self.config.describe(), _ABANDON_BUDGET)
                self.abandoned += given
                self.lock_lost += lost
        for receiver in list(self._receivers):
            with contextlib.suppress(Exception):
                await receiver.close()
        self._receivers.clear()
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.close()
        self._client = None
