"""The Pub/Sub producer: pull, keep leases, and ack / nack / dead-letter as the engine says.

Unary ``Pull`` / ``Acknowledge`` / ``ModifyAckDeadline`` on ``SubscriberAsyncClient``
(never the streaming client's callback thread). The lease kit of
``acklane.core.connectors`` does the rest: pulled messages are outstanding until
advanced, their ack deadline extended (``ack_deadline`` a beat) and bounded by
``max_outstanding``; acks buffered (``advance_linger``); a reject copied to
``dead_letter_topic`` then acked (none: nacked for the subscription's dead-letter
policy, else acked and dropped); a failure nacked (``redelivery_backoff``); an
ordering key an ordered lane, held by a nack; at close, leases of what was handed
out and never resolved parked for ``restart_lease_hold`` seconds for the next
producer of the subscription in this process. See ``docs/connectors/pubsub.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Awaitable, Hashable, Iterable, Mapping, Sequence
from typing import Any

from acklane.core import connectors as kit
from acklane.core.connectors import Action, LaneEntry, LeaseParking, verdict
from acklane.core.connectors.deadletter import DeadLetterStep, outcome_reason
from acklane.core.errors import BrokerUnreachable, ReceiveError
from acklane.core.producer import AdvanceItem, AdvanceOutcome, SharedStreamProducer

from ._check import ERRORS, grpc_code
from ._client import make_client
from ._config import PubSubConfig
from ._copies import DEAD_LETTER_ATTRIBUTES, ORIGIN_PUBLISH_TIME, dead_letter_copy
from ._message import PubSubDelivery, PubSubMessage

__all__ = [
    "DEAD_LETTER_ATTRIBUTES",
    "ORIGIN_PUBLISH_TIME",
    "PARKING",
    "PubSubConnectorError",
    "PubSubStreamProducer",
]

log = logging.getLogger(__name__)

#: Ack ids per Acknowledge / ModifyAckDeadline request.
_ACK_CHUNK = 1000
#: Seconds the subscription read at start waits for one answer (then tried again).
_START_TIMEOUT = 30.0
#: Where the client connects without an emulator or endpoint setting.
_DEFAULT_ENDPOINT = "pubsub.googleapis.com:443"
#: Assumed when the subscription cannot be read: the service's shortest ack deadline.
_DEFAULT_SUBSCRIPTION_DEADLINE = 10
#: Seconds a closing producer waits for a pull that the stop cut off.
_PULL_GRACE = 15.0

#: Leases closing producers kept for the next producer of their subscription in this
#: process, by stream key; what nobody takes before it lapses is forgotten.
PARKING: LeaseParking[PubSubDelivery] = LeaseParking(lambda d: d.lease_until)


class PubSubConnectorError(ReceiveError):
    """The subscription cannot be read from (it does not exist, say)."""


class PubSubStreamProducer(SharedStreamProducer):
    """One group's poll of a Pub/Sub subscription (see the module docstring)."""

    #: A parked lease is taken over only with at least this many seconds left: the
    #: take-over renews it, and the renewal must land before the lease lapses.
    takeover_margin: float = 5.0

    def __init__(self, config: PubSubConfig, *, parking: LeaseParking[PubSubDelivery] = PARKING):
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
        self._outstanding: dict[str, PubSubDelivery] = {}
        self._room = asyncio.Event()
        self._lanes: kit.OrderedLanes[str] = kit.OrderedLanes()
        self._what = f"Pub/Sub subscription {self.subscription}"
        self._tasks = kit.ProducerTasks(self._what, logger=log)
        self._tasks.on_failure(lambda _: self._room.set())
        self._acks: kit.SettleBuffer[str, str] = kit.SettleBuffer(
            self._acknowledge, batch=_ACK_CHUNK, limit=10 * _ACK_CHUNK, linger=config.advance_linger
        )
        self._dead_letters = DeadLetterStep(
            "Pub/Sub",
            self.subscription,
            config.dead_letter_topic_path,
            "dead_letter_topic",
            logger=log,
        )
        self._pull_task: asyncio.Future[Any] | None = None
        self.delivered = self.acked = self.nacked = self.held = 0
        self.extended = self.paused = self.api_calls = 0
        #: Unresolved messages whose lease this producer kept for the next one at close.
        self.parked = 0
        #: Parked messages this producer took over from a previous one.
        self.taken_over = 0
        self._parking = parking
        self._lot_key: tuple[Hashable, ...] = tuple(config.stream_key())
        #: Ack ids pulled but not yet handed out by ``open_stream`` (the rest of a batch).
        self._unyielded: set[str] = set()
        # Whether the endpoint answers, told once per change (broker_problem, /readyz).
        self._reachability = kit.Reachability(
            config.describe(), "Pub/Sub endpoint", config.where or _DEFAULT_ENDPOINT, logger=log
        )

    @property
    def dead_lettered(self) -> int:
        return self._dead_letters.dead_lettered

    # ------------------------------------------------------------------ start

    async def _start(self) -> None:
        if self._started:
            return
        self._started = True
        self._client = make_client(self.config, "subscriber")
        try:
            sub = await self._reachability.until_answered(
                self._read_subscription, ERRORS.unreachable, ERRORS.text
            )
        except Exception as exc:
            code = grpc_code(exc)
            if code == "NOT_FOUND":
                raise PubSubConnectorError(
                    f"Pub/Sub subscription {self.subscription} does not exist"
                ) from exc
            if code != "PERMISSION_DENIED":
                raise ERRORS.map(exc, f"reading subscription {self.subscription}") from exc
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
        policy = "nacked for its dead-letter policy to move them after max_delivery_attempts"
        self._dead_letters.announce("acked", policy if self.has_dead_letter_policy else None)
        shortest = min(self.subscription_deadline, self.config.ack_deadline)
        interval = kit.beat_interval(shortest, self.config.heartbeat_interval)
        keeper = kit.LeaseKeeper(
            self._extend_due, interval, transient=ERRORS.transient, describe=self._what
        )
        self._tasks.spawn(keeper.run(), f"pubsub leases {self.subscription}")
        self._tasks.spawn(self._acks.run(), f"pubsub acks {self.subscription}")

    def _read_subscription(self) -> Awaitable[Any]:
        self.api_calls += 1
        return self._client.get_subscription(  # type: ignore[no-any-return]
            subscription=self.subscription, retry=None, timeout=_START_TIMEOUT
        )

    # ------------------------------------------------------------------ poll

    async def open_stream(self) -> AsyncIterator[tuple[Any, Any]]:
        async for batch in self._batches():
            self._unyielded = {delivery.ack_id for _, delivery in batch}
            for pair in batch:
                self._unyielded.discard(pair[1].ack_id)
                yield pair

    def open_batches(self) -> AsyncIterator[Iterable[tuple[Any, Any]]] | None:
        return self._batches()

    async def _batches(self) -> AsyncIterator[list[tuple[Any, Any]]]:
        await self._start()
        empty = 0
        while True:
            self._tasks.raise_failure()
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
                while self.config.max_outstanding - len(self._outstanding) <= 0:
                    self._room.clear()
                    self._tasks.raise_failure()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(1.0):
                            await self._room.wait()
                continue
            try:
                with ERRORS.receiving(f"pulling from {self.subscription}"):
                    batch = await self._pull(min(self.config.max_messages, room))
            except BrokerUnreachable as exc:
                await self._reachability.wait(ERRORS.text(exc.__cause__ or exc))
                continue  # told once; the stream goes on
            self._reachability.answered()
            if not batch:
                empty += 1
                await asyncio.sleep(min(0.02 * 2**empty, 0.5))
                continue
            empty = 0
            yield batch

    async def _pull(self, max_messages: int) -> list[tuple[Any, Any]]:
        number = self._lanes.stamp()
        sent_at = time.monotonic()
        self.api_calls += 1
        # no client-side retry: an endpoint that does not answer is told (once) and
        # retried by _batches, not silently for a minute
        task = asyncio.ensure_future(
            self._client.pull(subscription=self.subscription, max_messages=max_messages, retry=None)
        )
        self._pull_task = task
        # Shielded: a stop that cuts the poll here leaves the pull to finish, and aclose
        # releases what it returned instead of leaving it leased to nobody.
        response = await asyncio.shield(task)
        self._pull_task = None
        lease_until = sent_at + self.subscription_deadline
        pairs: list[tuple[Any, Any]] = []
        for received in response.received_messages:
            message = PubSubMessage.from_received(self.subscription, self.topic, received)
            stamp = received.message.publish_time
            delivery = PubSubDelivery(
                message=message,
                ack_id=str(received.ack_id),
                pull=number,
                received_at=sent_at,
                lease_until=lease_until,
                publish_stamp=stamp.rfc3339() if hasattr(stamp, "rfc3339") else str(stamp),
            )
            self._outstanding[delivery.ack_id] = delivery
            pairs.append((message, delivery))
        self.delivered += len(pairs)
        return pairs

    async def _take_parked(self) -> list[tuple[Any, Any]]:
        """Take over the leases a closed producer of this subscription kept, in order."""
        taken, _ = await self._parking.take_over(
            self._lot_key, self._renew, margin=self.takeover_margin, what=self._what, logger=log
        )
        self.taken_over += len(taken)
        return [(d.message, d) for d in taken]

    async def _renew(self, taken: list[PubSubDelivery], hold: int | None = None) -> list[Any]:
        """Lease ``taken`` for ``hold`` seconds (a take-over: ``ack_deadline``, as a pull)."""
        now, seconds = time.monotonic(), self.config.ack_deadline if hold is None else hold
        await self._modify([d.ack_id for d in taken], seconds)
        for delivery in taken:
            delivery.lease_until = now + seconds
            if hold is None:
                delivery.pull = self._lanes.receives  # pulled before any nack of ours
                self._outstanding[delivery.ack_id] = delivery
        return taken

    def get_advance_lane(self, broker_payload: Any) -> Hashable:
        delivery: PubSubDelivery = broker_payload
        key = delivery.ordering_key
        return ("key", key) if key else delivery

    def message_id(self, broker_payload: Any) -> str | None:
        delivery: PubSubDelivery = broker_payload
        if self.topic.startswith("projects/"):
            _, project, _, topic = self.topic.split("/", 3)
            where = f"{project}/{topic}"
        else:  # the topic is unknown (or deleted): the subscription names the stream
            where = f"subscription:{self.subscription.removeprefix('projects/')}"
        return f"pubsub:{where}/{delivery.message_id}@{delivery.publish_stamp}"

    # --------------------------------------------------------------- advance

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        self._tasks.raise_failure()
        plan = self._lanes.plan(
            LaneEntry(self._lane(item.broker_payload), item.broker_payload.pull, verdict(o), item)
            for item in batch
            for o in (item.outcome,)
        )
        for item in plan.commit:
            self._ack(item.broker_payload)
        nacks = [*plan.redeliver, *plan.held]
        self.held += len(plan.held)
        try:
            for item in plan.dead_letter:
                await self._dead_letter(item.broker_payload, item.outcome, nacks)
        except BaseException:
            nacks += plan.after_dead_letter  # behind a reject that comes back: they come too
            await self._nack(nacks)
            raise
        for item in plan.after_dead_letter:
            self._ack(item.broker_payload)
        await self._nack(nacks)
        await self._acks.settle_soon()
        self._tasks.raise_failure()

    def _lane(self, delivery: PubSubDelivery) -> str | None:
        key = delivery.ordering_key
        return key if key and self.ordered else None

    def _settled(self, delivery: PubSubDelivery) -> None:
        self._outstanding.pop(delivery.ack_id, None)
        self._room.set()

    def _ack(self, delivery: PubSubDelivery) -> None:
        self._settled(delivery)
        self._acks.add("ack", delivery.ack_id)  # the flusher lingers for company, then sends

    async def _nack(self, items: list[AdvanceItem]) -> None:
        """Let Pub/Sub deliver them again (now, or after the backoff); acks of earlier
        messages go first, and the keys stay held until the nacks landed."""
        if not items:
            return
        await self._acks.flush()
        by_delay: dict[int, list[PubSubDelivery]] = defaultdict(list)
        for item in items:
            delivery: PubSubDelivery = item.broker_payload
            self._lanes.hold(self._lane(delivery))
            backoff = self.config.redelivery_backoff
            by_delay[backoff.delay(delivery.message.delivery_attempt)].append(delivery)
            self._settled(delivery)
        try:
            for seconds, deliveries in by_delay.items():
                await self._modify([d.ack_id for d in deliveries], seconds)
                self.nacked += len(deliveries)
        finally:
            for item in items:
                self._lanes.landed(self._lane(item.broker_payload))

    async def _dead_letter(
        self, delivery: PubSubDelivery, outcome: AdvanceOutcome, nacks: list[AdvanceItem]
    ) -> None:
        topic, reason = self.config.dead_letter_topic_path, outcome_reason(outcome)
        if topic is None:
            if self.has_dead_letter_policy:  # the subscription's policy moves it
                nacks.append(AdvanceItem(delivery, outcome))
            else:
                self._dead_letters.drop(delivery.message_id, reason, why="acked, no destination")
                self._ack(delivery)
            return
        if self._publisher is None:
            self._publisher = make_client(self.config, "publisher")
        try:
            copy = dead_letter_copy(
                delivery,
                topic=self.topic,
                subscription=self.subscription,
                destination=topic,
                reason=reason,
            )
            self.api_calls += 1
            with ERRORS.advancing(f"dead-lettering {delivery.message_id} to {topic}"):
                await self._publisher.publish(topic=topic, messages=[copy])
        except BaseException:
            nacks.append(AdvanceItem(delivery, outcome))
            raise
        self._dead_letters.copied(delivery.message_id, reason)
        self._ack(delivery)

    async def _modify(self, ack_ids: list[str], seconds: int) -> None:
        for start in range(0, len(ack_ids), _ACK_CHUNK):
            self.api_calls += 1
            await self._client.modify_ack_deadline(
                subscription=self.subscription,
                ack_ids=ack_ids[start : start + _ACK_CHUNK],
                ack_deadline_seconds=seconds,
            )

    async def _acknowledge(self, _: str, ack_ids: deque[str]) -> None:
        self.api_calls += 1
        await self._client.acknowledge(subscription=self.subscription, ack_ids=list(ack_ids))
        self.acked += len(ack_ids)
        ack_ids.clear()

    async def flush(self) -> None:
        """Send the buffered acks now."""
        await self._acks.flush()

    async def _extend_due(self, interval: float) -> None:
        now = time.monotonic()
        leases = kit.due(self._outstanding.values(), lambda d: d.lease_until, now, interval)
        if not leases:
            return
        seconds = self.config.ack_deadline
        await self._modify([d.ack_id for d in leases], seconds)
        for delivery in leases:
            delivery.lease_until = now + seconds
        self.extended += len(leases)

    # ---------------------------------------------------------------- close

    async def aclose(self) -> None:
        """Send what is buffered, release what the engine never resolved, close."""
        if self._closed:
            return
        self._closed = True
        await self._tasks.aclose()  # the acks' flusher: a flush in flight goes on, shielded
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
                and not self._lanes.is_held(self._lane(d), d.pull)
            ]
            parking = {d.ack_id for d in to_park}
            unresolved = [a for a in self._outstanding if a not in parking]
            cut_off = await kit.finish_within(self._pull_task, _PULL_GRACE)
            unresolved += [str(r.ack_id) for r in cut_off.received_messages] if cut_off else []
            self._outstanding.clear()
            try:
                async with asyncio.timeout(30):
                    await self.flush()
                    if unresolved:  # delivered again now, not when their lease lapses
                        await self._modify(unresolved, 0)
                        self.nacked += len(unresolved)
                    self.parked += await self._parking.keep(
                        self._lot_key,
                        to_park,
                        hold,
                        lambda leases: self._renew(leases, hold),
                        what=self._what,
                        logger=log,
                    )
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

    # ------------------------------------------------------------- counters

    def broker_problem(self) -> str | None:
        return self._reachability.problem

    def counters(self) -> Mapping[str, float]:
        return {
            Action.DELIVERED: self.delivered,
            Action.DELETED: self.acked,
            Action.REDELIVERED: self.nacked,
            Action.HELD: self.held,
            **self._dead_letters.counters(),
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
