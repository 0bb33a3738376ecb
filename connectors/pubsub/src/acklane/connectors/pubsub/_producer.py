"""The Pub/Sub producer: pull, keep leases, and ack / nack / dead-letter as the engine says.

Unary ``Pull`` / ``Acknowledge`` / ``ModifyAckDeadline`` on ``SubscriberAsyncClient``
(never the streaming client's callback thread): the producer decides every lease.

- Pulled messages are *outstanding* until the engine advances them; a heartbeat
  extends their ack deadline (``ack_deadline`` seconds per beat), so only the
  engine's ``ack_timeout`` decides that a watcher failed. ``max_outstanding``
  bounds them: the poll waits while it is reached.
- Clean: ``Acknowledge``, batched (``advance_linger``).
- Rejected: a copy to ``dead_letter`` (origin and reason attributes), the
  publish awaited, then the ack; without one, when the subscription has a
  dead-letter policy, a nack (Pub/Sub dead-letters it after
  ``max_delivery_attempts``); with neither, an ack counted as dropped.
- Failed or unclaimed: ``ModifyAckDeadline`` 0 (or the ``redelivery_backoff``).
- Ordering keys: a message nacked in an ordered subscription *holds* its key: any
  message of that key pulled before the nack landed is nacked too, whatever its
  outcome, so nothing of the key is acked past the failed one (the service would
  redeliver them after it anyway).
- Close: messages handed to the engine and never resolved keep their lease for
  ``restart_lease_hold`` seconds, *parked* by stream key; the next producer of the
  subscription in this process takes them over and yields them first, so a quick
  cohort restart costs no redelivery (nor, with a dead-letter policy, an attempt).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Hashable,
    Iterable,
    Mapping,
    Sequence,
)
from typing import Any, TypeVar

from acklane.core.connectors import Action, Reachability, Verdict, verdict
from acklane.core.connectors.deadletter import (
    ORIGIN_MESSAGE_ID,
    ORIGIN_PREFIX,
    ORIGIN_QUEUE,
    ORIGIN_TOPIC,
    REJECT_REASON,
    outcome_reason,
)
from acklane.core.errors import ConnectorError
from acklane.core.producer import AdvanceItem, AdvanceOutcome, SharedStreamProducer

from ._check import auth_error, is_unreachable
from ._client import make_client
from ._config import PubSubConfig
from ._message import PubSubDelivery, PubSubMessage, publish_stamp_of

__all__ = [
    "DEAD_LETTER_ATTRIBUTES",
    "ORIGIN_PUBLISH_TIME",
    "PubSubConnectorError",
    "PubSubStreamProducer",
]

log = logging.getLogger(__name__)

#: The publish time of the original message (RFC 3339), on a dead-letter copy.
ORIGIN_PUBLISH_TIME = ORIGIN_PREFIX + "publish_time"
#: The attributes acklane adds to a dead-letter copy.
DEAD_LETTER_ATTRIBUTES = (
    ORIGIN_TOPIC,
    ORIGIN_QUEUE,
    ORIGIN_MESSAGE_ID,
    ORIGIN_PUBLISH_TIME,
    REJECT_REASON,
)
#: Ack ids per Acknowledge / ModifyAckDeadline request.
_ACK_CHUNK = 1000
_T = TypeVar("_T")
#: Seconds the subscription read at start waits for one answer (then tried again).
_START_TIMEOUT = 30.0
#: Where the client connects without an emulator or endpoint setting.
_DEFAULT_ENDPOINT = "pubsub.googleapis.com:443"
#: Pub/Sub's limit of attributes per message.
_MAX_ATTRIBUTES = 100
#: Assumed when the subscription cannot be read: the service's shortest ack deadline.
_DEFAULT_SUBSCRIPTION_DEADLINE = 10
#: Seconds a closing producer waits for a pull that the stop cut off.
_PULL_GRACE = 15.0
_TRANSIENT = frozenset(
    {"UNAVAILABLE", "DEADLINE_EXCEEDED", "INTERNAL", "RESOURCE_EXHAUSTED", "ABORTED", "UNKNOWN"}
)


class PubSubConnectorError(ConnectorError):
    """Pub/Sub refused something the connector cannot work around."""


#: Leases closing producers kept for the next producer of their subscription in this
#: process, by stream key, in the order they were first yielded. Plain data: a lot
#: nobody takes only costs memory until the next producer of that stream looks;
#: Pub/Sub delivers its messages again when their hold ends.
_PARKED: dict[tuple[Hashable, ...], list[PubSubDelivery]] = {}


class PubSubStreamProducer(SharedStreamProducer[PubSubDelivery]):
    """One group's poll of a Pub/Sub subscription (see the module docstring)."""

    #: A parked lease is taken over only with at least this many seconds left: the
    #: take-over renews it, and the renewal must land before the lease lapses.
    takeover_margin: float = 5.0

    def __init__(self, config: PubSubConfig) -> None:
        self.config = config  # never connect here: open_stream does
        self.subscription = config.subscription_path
        self.topic = ""
        self.subscription_deadline = _DEFAULT_SUBSCRIPTION_DEADLINE
        self.has_dead_letter_policy = False
        self.ordered = True  # until the subscription says otherwise: hold keys
        self._client: Any = None
        self._publisher: Any = None
        self._started = False
        self._closed = False
        self._failure: BaseException | None = None
        self._outstanding: dict[str, PubSubDelivery] = {}
        self._room = asyncio.Event()
        self._pulls = 0
        #: ordering key -> the last pull whose messages of that key must be nacked.
        self._holds: dict[str, float] = {}
        self._acks: list[str] = []
        self._ack_ready = asyncio.Event()
        self._ack_lock = asyncio.Lock()
        self._pull_task: asyncio.Future[Any] | None = None
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._flusher_task: asyncio.Task[None] | None = None
        self.delivered = self.acked = self.nacked = self.held = 0
        self.dead_lettered = self.dropped = self.extended = self.paused = 0
        self.api_calls = 0
        #: Unresolved messages whose lease this producer kept for the next one at close.
        self.parked = 0
        #: Parked messages this producer took over from a previous one.
        self.taken_over = 0
        self._lot_key: tuple[Hashable, ...] = tuple(config.stream_key())
        #: Ack ids pulled but not yet handed out by ``open_stream`` (the rest of a batch).
        self._unyielded: set[str] = set()
        # Whether the endpoint answers, told once per change (broker_problem, /readyz).
        self._reachability = Reachability(
            config.describe(), "Pub/Sub endpoint", config.where or _DEFAULT_ENDPOINT, logger=log
        )

    # ------------------------------------------------------------------ start

    async def _start(self) -> None:
        if self._started:
            return
        self._started = True
        self._client = self._make_client("subscriber")
        try:
            sub = await self._until_reachable(
                lambda: self._client.get_subscription(
                    subscription=self.subscription, retry=None, timeout=_START_TIMEOUT
                )
            )
        except Exception as exc:
            refused = auth_error(exc, f"reading subscription {self.subscription}")
            if refused is not None and _code(exc) != "PERMISSION_DENIED":
                raise refused from exc
            if _code(exc) == "NOT_FOUND":
                raise PubSubConnectorError(
                    f"Pub/Sub subscription {self.subscription} does not exist"
                ) from exc
            if _code(exc) != "PERMISSION_DENIED":
                raise
            log.warning(
                "Pub/Sub subscription %s: cannot read it (%s); assuming a %ss ack deadline, "
                "no dead-letter policy and ordered delivery (grant "
                "pubsub.subscriptions.get to read them)",
                self.subscription,
                exc,
                _DEFAULT_SUBSCRIPTION_DEADLINE,
            )
        else:
            self.topic = str(sub.topic)
            self.subscription_deadline = int(sub.ack_deadline_seconds) or 10
            policy = sub.dead_letter_policy
            self.has_dead_letter_policy = bool(policy and policy.dead_letter_topic)
            self.ordered = bool(sub.enable_message_ordering)
        if self.config.dead_letter is None:
            if self.has_dead_letter_policy:
                log.info(
                    "Pub/Sub subscription %s: rejected messages are nacked, for its dead-letter "
                    "policy to move them after max_delivery_attempts (no dead_letter set)",
                    self.subscription,
                )
            else:
                log.warning(
                    "Pub/Sub subscription %s has no dead-letter policy and no dead_letter "
                    "is configured: rejected messages will be acked and DROPPED",
                    self.subscription,
                )
        interval = self._heartbeat_interval()
        self._heartbeat_task = asyncio.create_task(self._heartbeat_loop(interval))
        self._flusher_task = asyncio.create_task(self._flusher())

    def _make_client(self, kind: str) -> Any:
        return make_client(self.config, "subscriber" if kind == "subscriber" else "publisher")

    def _heartbeat_interval(self) -> float:
        shortest = min(self.subscription_deadline, self.config.ack_deadline)
        interval = min(self.config.heartbeat.interval or shortest / 4, shortest / 4)
        return max(interval, 0.05)

    # ------------------------------------------------------------------ poll

    async def open_stream(self) -> AsyncIterator[tuple[PubSubMessage, PubSubDelivery]]:
        async for batch in self._batches():
            self._unyielded = {delivery.ack_id for _, delivery in batch}
            for pair in batch:
                self._unyielded.discard(pair[1].ack_id)
                yield pair

    def open_batches(self) -> AsyncIterator[Iterable[tuple[PubSubMessage, PubSubDelivery]]] | None:
        return self._batches()

    async def _batches(self) -> AsyncIterator[list[tuple[PubSubMessage, PubSubDelivery]]]:
        await self._start()
        empty = 0
        while True:
            self._raise_failure()
            # Leases a closed producer of this subscription kept for us come first (a
            # cohort restart may close the old producer after this one started).
            taken = await self._take_parked()
            if taken:
                empty = 0
                yield taken
                continue
            room = self.config.max_outstanding - len(self._outstanding)
            if room <= 0:
                self.paused += 1
                self._room.clear()
                while self.config.max_outstanding - len(self._outstanding) <= 0:
                    self._raise_failure()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(1.0):
                            await self._room.wait()
                    self._room.clear()
                continue
            try:
                batch = await self._pull(min(self.config.batch_size, room))
            except Exception as exc:
                refused = auth_error(exc, f"pulling from {self.subscription}")
                if refused is not None:
                    raise refused from exc
                if not is_unreachable(exc):
                    raise
                # told once; the stream goes on
                await self._reachability.wait(_unreachable_reason(exc))
                continue
            self._reachability.answered()
            if not batch:
                empty += 1
                await asyncio.sleep(min(0.02 * 2**empty, 0.5))
                continue
            empty = 0
            yield batch

    async def _pull(self, max_messages: int) -> list[tuple[PubSubMessage, PubSubDelivery]]:
        self._pulls += 1
        number = self._pulls
        sent_at = time.monotonic()
        self.api_calls += 1
        task = asyncio.ensure_future(
            # no client-side retry: an endpoint that does not answer is told (once) and
            # retried by _batches, not silently for a minute
            self._client.pull(subscription=self.subscription, max_messages=max_messages, retry=None)
        )
        self._pull_task = task
        # Shielded: a stop that cuts the poll here leaves the pull to finish, and aclose
        # releases what it returned instead of leaving it leased to nobody.
        response = await asyncio.shield(task)
        self._pull_task = None
        lease_until = sent_at + self.subscription_deadline
        pairs: list[tuple[PubSubMessage, PubSubDelivery]] = []
        for received in response.received_messages:
            message = PubSubMessage.from_received(self.subscription, self.topic, received)
            delivery = PubSubDelivery(
                message=message,
                ack_id=str(received.ack_id),
                pull=number,
                received_at=sent_at,
                lease_until=lease_until,
                publish_stamp=publish_stamp_of(received),
            )
            self._outstanding[delivery.ack_id] = delivery
            pairs.append((message, delivery))
        self.delivered += len(pairs)
        return pairs

    async def _take_parked(self) -> list[tuple[PubSubMessage, PubSubDelivery]]:
        """Take over the leases a closed producer of this subscription kept, in order."""
        lot = _PARKED.pop(self._lot_key, None)
        if not lot:
            return []
        now = time.monotonic()
        taken = [d for d in lot if d.lease_until - now > self.takeover_margin]
        if len(taken) < len(lot):
            log.info(
                "Pub/Sub subscription %s: %d parked message(s) were held too long to take "
                "over; Pub/Sub delivers them again",
                self.subscription,
                len(lot) - len(taken),
            )
        if not taken:
            return []
        seconds = self.config.ack_deadline
        try:  # renewed as a pull would have, then the heartbeat keeps them
            await self._modify([d.ack_id for d in taken], seconds)
        except Exception as exc:
            log.warning(
                "Pub/Sub subscription %s: %d parked lease(s) could not be taken over (%s); "
                "Pub/Sub delivers them again",
                self.subscription,
                len(taken),
                exc,
            )
            return []
        for delivery in taken:
            delivery.lease_until = now + seconds
            delivery.pull = self._pulls  # pulled before any nack of this producer
            self._outstanding[delivery.ack_id] = delivery
        self.taken_over += len(taken)
        log.info(
            "Pub/Sub subscription %s: took over %d message(s) left unresolved by the "
            "previous producer, without a redelivery",
            self.subscription,
            len(taken),
        )
        return [(d.message, d) for d in taken]

    def get_advance_lane(self, delivery: PubSubDelivery) -> Hashable:
        key = delivery.ordering_key
        return ("key", key) if key else delivery

    def message_id(self, delivery: PubSubDelivery) -> str | None:
        return delivery.message.message_id  # made when it was pulled (identity_of)

    # --------------------------------------------------------------- advance

    async def advance(self, batch: Sequence[AdvanceItem[PubSubDelivery]]) -> None:
        self._raise_failure()
        for item in batch:
            delivery = item.broker_payload
            if self._held(delivery):
                self.held += 1
                await self._nack(delivery, item.outcome)
                continue
            match verdict(item.outcome):
                case Verdict.COMMIT:
                    self._ack(delivery)
                case Verdict.REDELIVER:
                    await self._nack(delivery, item.outcome)
                case Verdict.DEAD_LETTER:
                    await self._dead_letter(delivery, item.outcome)
        self._raise_failure()

    def _held(self, delivery: PubSubDelivery) -> bool:
        key = delivery.ordering_key
        if not key or key not in self._holds:
            return False
        if delivery.pull <= self._holds[key]:
            return True
        del self._holds[key]  # pulled after the nack landed: the service ordered it
        return False

    def _settled(self, delivery: PubSubDelivery) -> None:
        self._outstanding.pop(delivery.ack_id, None)
        self._room.set()

    def _ack(self, delivery: PubSubDelivery) -> None:
        self._settled(delivery)
        self._acks.append(delivery.ack_id)
        self._ack_ready.set()  # the flusher lingers for company, then sends

    async def _nack(self, delivery: PubSubDelivery, outcome: AdvanceOutcome) -> None:
        """Let Pub/Sub deliver it again (now, or after the backoff); hold its key."""
        key = delivery.ordering_key
        if key and self.ordered:
            self._holds[key] = float("inf")  # until the nack has landed
        await self.flush()  # acks of earlier messages first
        seconds = self.config.redelivery_backoff.delay(delivery.message.delivery_attempt)
        self._settled(delivery)
        try:
            await self._modify([delivery.ack_id], seconds)
        finally:
            if key and self.ordered:
                self._holds[key] = self._pulls
        self.nacked += 1

    async def _dead_letter(self, delivery: PubSubDelivery, outcome: AdvanceOutcome) -> None:
        topic = self.config.dead_letter_topic_path
        if topic is None:
            if self.has_dead_letter_policy:
                await self._nack(delivery, outcome)  # the subscription's policy moves it
                return
            log.warning(
                "Pub/Sub message %s on %s rejected (%s) with no dead-letter destination: "
                "acked and dropped",
                delivery.message_id,
                self.subscription,
                outcome_reason(outcome),
            )
            self.dropped += 1
            self._ack(delivery)
            return
        if self._publisher is None:
            self._publisher = self._make_client("publisher")
        from google.pubsub_v1 import types

        message = delivery.message
        ours = {
            ORIGIN_TOPIC: self.topic or "-",
            ORIGIN_QUEUE: self.subscription,
            ORIGIN_MESSAGE_ID: delivery.message_id,
            ORIGIN_PUBLISH_TIME: delivery.publish_stamp or "-",
            REJECT_REASON: outcome_reason(outcome),
        }
        attributes = {k: v for k, v in message.attributes.items() if k not in ours}
        if len(attributes) + len(ours) > _MAX_ATTRIBUTES:
            raise PubSubConnectorError(
                f"Pub/Sub message {delivery.message_id} on {self.subscription}: its "
                f"{len(attributes)} attributes and acklane's {len(ours)} exceed Pub/Sub's "
                f"{_MAX_ATTRIBUTES}; it cannot be dead-lettered to {topic} (it is not acked "
                "and comes again)"
            )
        copy = types.PubsubMessage(
            data=message.body,
            attributes={**attributes, **ours},
            ordering_key=message.key or "",
        )
        self.api_calls += 1
        try:
            await self._publisher.publish(topic=topic, messages=[copy])
        except Exception:
            await self._nack(delivery, outcome)
            raise
        self.dead_lettered += 1
        self._ack(delivery)

    async def _modify(self, ack_ids: list[str], seconds: int) -> None:
        for start in range(0, len(ack_ids), _ACK_CHUNK):
            self.api_calls += 1
            await self._client.modify_ack_deadline(
                subscription=self.subscription,
                ack_ids=ack_ids[start : start + _ACK_CHUNK],
                ack_deadline_seconds=seconds,
            )

    # ----------------------------------------------------------------- acks

    async def _flusher(self) -> None:
        while True:
            await self._ack_ready.wait()
            if len(self._acks) < _ACK_CHUNK and self.config.advance_linger > 0:
                await asyncio.sleep(self.config.advance_linger)
            self._ack_ready.clear()
            try:
                await self.flush()
            except Exception as exc:
                self._fail(exc)
                return

    async def flush(self) -> None:
        """Send the buffered acks now."""
        async with self._ack_lock:
            while self._acks:
                chunk = self._acks[:_ACK_CHUNK]
                self.api_calls += 1
                await self._client.acknowledge(subscription=self.subscription, ack_ids=chunk)
                del self._acks[: len(chunk)]  # only once sent: a cancelled flush loses none
                self.acked += len(chunk)

    # ------------------------------------------------------------ heartbeat

    async def _heartbeat_loop(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self._extend_due(2 * interval)
            except Exception as exc:
                if _code(exc) not in _TRANSIENT:
                    # Leases would lapse while watchers work and the messages would go to
                    # another consumer: fail loudly instead.
                    self._fail(exc)
                    return
                log.warning(
                    "Pub/Sub subscription %s: lease extension failed (%s); retrying next beat",
                    self.subscription,
                    exc,
                )

    async def _extend_due(self, horizon: float) -> None:
        now = time.monotonic()
        due = [d for d in self._outstanding.values() if d.lease_until - now <= horizon]
        if not due:
            return
        seconds = self.config.ack_deadline
        await self._modify([d.ack_id for d in due], seconds)
        for delivery in due:
            delivery.lease_until = now + seconds
        self.extended += len(due)

    # ---------------------------------------------------------------- close

    async def aclose(self) -> None:
        """Send what is buffered, release what the engine never resolved, close."""
        if self._closed:
            return
        self._closed = True
        for task in (self._heartbeat_task, self._flusher_task):
            if task is not None and not task.done():
                async with self._ack_lock:  # let a flush in flight finish first
                    task.cancel()
                await asyncio.wait([task])
        if self._client is not None:
            # Handed to the engine and never resolved: abandoned by a stop or a cohort
            # restart. Keep their lease for the next producer; release the rest now
            # (never handed out, or behind a nack of their ordering key).
            hold = int(self.config.restart_lease_hold)
            to_park = [
                d
                for d in self._outstanding.values()
                if hold > self.takeover_margin
                and d.ack_id not in self._unyielded
                and not self._held(d)
            ]
            parking = {d.ack_id for d in to_park}
            unresolved = [a for a in self._outstanding if a not in parking]
            unresolved += await self._orphaned_pull()
            self._outstanding.clear()
            try:
                async with asyncio.timeout(30):
                    await self.flush()
                    if unresolved:  # delivered again now, not when their lease lapses
                        await self._modify(unresolved, 0)
                        self.nacked += len(unresolved)
                    if to_park:
                        await self._park(to_park, hold)
            except Exception as exc:
                log.warning(
                    "Pub/Sub subscription %s: final acks/nacks failed (%s); unsettled "
                    "messages are delivered again when their lease lapses",
                    self.subscription,
                    exc,
                )
        for client in (self._client, self._publisher):
            if client is not None:
                with contextlib.suppress(Exception):
                    await client.transport.close()
        self._client = self._publisher = None

    async def _park(self, deliveries: list[PubSubDelivery], hold: int) -> None:
        """Keep unresolved messages leased for ``hold`` seconds, for the next producer."""
        now = time.monotonic()
        await self._modify([d.ack_id for d in deliveries], hold)
        for delivery in deliveries:
            delivery.lease_until = now + hold
        _PARKED.setdefault(self._lot_key, []).extend(deliveries)
        self.parked += len(deliveries)
        log.info(
            "Pub/Sub subscription %s: kept the leases of %d unresolved message(s) for %ss "
            "(restart_lease_hold), for the next producer of this subscription in this "
            "process; otherwise Pub/Sub delivers them again then",
            self.subscription,
            len(deliveries),
            hold,
        )

    async def _orphaned_pull(self) -> list[str]:
        """The ack ids a pull cut off by the stop returned (it may finish, briefly)."""
        task, self._pull_task = self._pull_task, None
        if task is None:
            return []
        if not task.done():
            await asyncio.wait([task], timeout=_PULL_GRACE)
        if not task.done():
            task.cancel()
            await asyncio.wait([task])
            return []
        if task.cancelled() or task.exception() is not None:
            return []
        return [str(r.ack_id) for r in task.result().received_messages]

    # ------------------------------------------------------------- counters

    def broker_problem(self) -> str | None:
        return self._reachability.problem

    def counters(self) -> Mapping[str, float]:
        return {
            Action.DELIVERED: self.delivered,
            Action.ACKED: self.acked,
            Action.REDELIVERED: self.nacked,
            Action.HELD: self.held,
            Action.DEAD_LETTERED: self.dead_lettered,
            Action.DROPPED: self.dropped,
            Action.EXTENDED: self.extended,
            Action.PAUSED: self.paused,
            Action.PARKED: self.parked,
            Action.TAKEN_OVER: self.taken_over,
            Action.API_CALLS: self.api_calls,
        }

    @property
    def outstanding(self) -> int:
        """Pulled messages not yet advanced."""
        return len(self._outstanding)

    # ------------------------------------------------------------- internals

    def _fail(self, exc: BaseException) -> None:
        log.error("Pub/Sub subscription %s: %s; the group will fail", self.subscription, exc)
        if self._failure is None:
            self._failure = exc
        self._room.set()

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    async def _until_reachable(self, call: Callable[[], Awaitable[_T]]) -> _T:
        """``call()`` again and again while the endpoint does not answer (told once)."""
        while True:
            self.api_calls += 1
            try:
                result = await call()
            except Exception as exc:
                if not is_unreachable(exc):
                    raise
                await self._reachability.wait(_unreachable_reason(exc))
                continue
            self._reachability.answered()
            return result


def _unreachable_reason(exc: BaseException) -> str:
    """``"UNAVAILABLE: <the message>"``: why the endpoint did not answer, one line."""
    message = " ".join(str(getattr(exc, "message", None) or exc).split())
    return f"{_code(exc)}: {message}"


def _code(exc: BaseException) -> str:
    """The gRPC status name of a google.api_core exception (``""`` for others)."""
    code = getattr(exc, "grpc_status_code", None)
    return str(getattr(code, "name", "")) if code is not None else ""
