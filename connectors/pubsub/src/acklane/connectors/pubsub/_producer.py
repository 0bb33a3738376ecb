"""The Pub/Sub producer: pull, keep leases, and ack / nack / dead-letter as the engine says.

Unary ``Pull`` / ``Acknowledge`` / ``ModifyAckDeadline`` on ``SubscriberAsyncClient``
(never the streaming client's callback thread); the lease kit of
``acklane.core.connectors`` does the machinery. See ``docs/connectors/pubsub.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Hashable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from acklane.core import connectors as kit
from acklane.core.connectors import Action, LaneEntry, LeaseParking, verdict
from acklane.core.connectors.deadletter import DeadLetterStep, outcome_reason
from acklane.core.errors import BrokerUnreachable, ReceiveError
from acklane.core.producer import AdvanceItem, AdvanceOutcome, SharedStreamProducer

from ._check import ERRORS
from ._client import make_client
from ._config import PubSubConfig
from ._copies import DEAD_LETTER_ATTRIBUTES, ORIGIN_PUBLISH_TIME, dead_letter_copy
from ._message import PubSubDelivery, PubSubMessage, records
from ._subscription import DEFAULT_ACK_DEADLINE, read_subscription

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
#: Where the client connects without an emulator or endpoint setting.
_DEFAULT_ENDPOINT = "pubsub.googleapis.com:443"
#: Seconds a closing producer waits for the pulls that the stop cut off.
_PULL_GRACE = 15.0

#: Leases closing producers kept for the next producer of their subscription in this
#: process, by stream key; what nobody takes before it lapses is forgotten.
PARKING: LeaseParking[PubSubDelivery] = LeaseParking(lambda d: d.lease_until)


class _Pull(NamedTuple):
    """A ``Pull`` in flight."""

    task: asyncio.Future[Any]
    #: Its number for the lanes (``OrderedLanes.stamp``), taken as it was sent.
    number: int
    #: Monotonic time just before it was sent.
    sent_at: float
    #: The messages it asked for.
    asked: int


class PubSubConnectorError(ReceiveError):
    """The subscription cannot be read from (it does not exist, say)."""


class PubSubStreamProducer(SharedStreamProducer[PubSubDelivery]):
    """One group's poll of a Pub/Sub subscription (see the module docstring)."""

    #: A parked lease is taken over only with at least this many seconds left: the
    #: take-over renews it, and the renewal must land before the lease lapses.
    takeover_margin: float = 5.0
    #: Pulls sent ahead, while the engine takes a batch, on a subscription without
    #: message ordering (see ``_send_ahead``); 0: a pull only once the stream is asked.
    pulls_ahead: int = 2

    def __init__(self, config: PubSubConfig, *, parking: LeaseParking[PubSubDelivery] = PARKING):
        self.config = config  # never connect here: open_stream does
        self.subscription = config.subscription_path
        self.topic = ""
        self.subscription_deadline = DEFAULT_ACK_DEADLINE
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
        destination = config.dead_letter_topic_path
        self._dead_letters = DeadLetterStep(
            "Pub/Sub", self.subscription, destination, "dead_letter", logger=log
        )
        #: Pulls sent and not yet taken by ``_receive``, oldest first, and what they
        #: asked for in all.
        self._pulls: deque[_Pull] = deque()
        self._asked = 0
        self.delivered = self.acked = self.nacked = self.held = 0
        # parked: leases kept for the next producer at close; taken_over: from the last
        self.extended = self.paused = self.api_calls = self.parked = self.taken_over = 0
        self._lot = parking.lot(tuple(config.stream_key()), self._what, log)
        #: Ack ids pulled but not yet handed out by ``open_stream`` (the rest of a batch).
        self._unyielded: set[str] = set()
        # Whether the endpoint answers, told once per change (broker_problem, /readyz).
        self._reachability = kit.Reachability(
            config.describe(), "Pub/Sub endpoint", config.where or _DEFAULT_ENDPOINT, logger=log
        )

    dead_lettered = property(lambda self: self._dead_letters.dead_lettered)

    # ------------------------------------------------------------------ start

    async def _start(self) -> None:
        if self._started:
            return
        self._started = True
        self._client = make_client(self.config, "subscriber")
        facts = await read_subscription(
            self._client,
            self.subscription,
            self._reachability,
            called=self._called,
            error=PubSubConnectorError,
        )
        self.topic, self.subscription_deadline = facts.topic, facts.ack_deadline
        self.has_dead_letter_policy, self.ordered = facts.has_dead_letter_policy, facts.ordered
        policy = "nacked for its dead-letter policy to move them after max_delivery_attempts"
        self._dead_letters.announce("acked", policy if self.has_dead_letter_policy else None)
        shortest = min(self.subscription_deadline, self.config.ack_deadline)
        interval = kit.beat_interval(shortest, self.config.heartbeat.interval)
        keeper = kit.LeaseKeeper(
            self._extend_due, interval, transient=ERRORS.transient, describe=self._what
        )
        self._tasks.spawn(keeper.run(), f"pubsub leases {self.subscription}")
        self._tasks.spawn(self._acks.run(), f"pubsub acks {self.subscription}")

    def _called(self) -> None:
        self.api_calls += 1

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
            self._tasks.raise_failure()
            # Leases a closed producer of this subscription kept for us come first (a
            # cohort restart may close the old producer after this one started).
            taken = await self._take_parked()
            if taken:
                empty = 0
                yield taken
                continue
            if not self._pulls:
                room = self._room_left()
                if room <= 0:
                    self.paused += 1
                    while self._room_left() <= 0:
                        self._room.clear()
                        self._tasks.raise_failure()
                        with contextlib.suppress(TimeoutError):
                            async with asyncio.timeout(1.0):
                                await self._room.wait()
                    continue
                self._send_pull(min(self.config.batch_size, room))
            try:
                with ERRORS.receiving(f"pulling from {self.subscription}"):
                    batch = await self._receive()
            except BrokerUnreachable as exc:
                await self._reachability.wait(ERRORS.text(exc.__cause__ or exc))
                continue  # told once; the stream goes on
            self._reachability.answered()
            if not batch:
                if not self._pulls:  # (a pull still in flight waits on the server already)
                    empty += 1
                    await asyncio.sleep(min(0.02 * 2**empty, 0.5))
                continue
            empty = 0
            yield batch

    def _room_left(self) -> int:
        """Messages the next pull may ask for: ``max_outstanding`` less what is pulled
        and not yet advanced, and what the pulls in flight asked for."""
        return self.config.max_outstanding - len(self._outstanding) - self._asked

    def _send_pull(self, max_messages: int) -> None:
        """Send a ``Pull`` (numbered for the lanes as it is sent); :meth:`_receive` takes
        the answers in the order they were sent."""
        number = self._lanes.stamp()
        self.api_calls += 1
        # no client-side retry: an endpoint that does not answer is told (once) and
        # retried by _batches, not silently for a minute
        task = asyncio.ensure_future(
            self._client.pull(subscription=self.subscription, max_messages=max_messages, retry=None)
        )
        self._pulls.append(_Pull(task, number, time.monotonic(), max_messages))
        self._asked += max_messages

    async def _receive(self) -> list[tuple[PubSubMessage, PubSubDelivery]]:
        """The deliveries of the oldest pull in flight, once it answered; the next pulls
        are sent first (:meth:`_send_ahead`), before the records are built."""
        pull = self._pulls[0]
        try:
            # Shielded: a stop that cuts the poll here leaves the pull to finish, and
            # aclose releases what it returned instead of leaving it leased to nobody.
            response = await asyncio.shield(pull.task)
        finally:
            if pull.task.done():
                self._pulls.popleft()
                self._asked -= pull.asked
        raw = getattr(response, "_pb", response)  # the protobuf (see ._message)
        received = raw.received_messages
        if received:
            self._send_ahead(len(received))
        lease_until = pull.sent_at + self.subscription_deadline
        pulled = records(
            self.subscription, self.topic, received, pull.number, pull.sent_at, lease_until
        )
        for delivery in pulled:
            self._outstanding[delivery.ack_id] = delivery
        self.delivered += len(pulled)
        return [(d.message, d) for d in pulled]

    def _send_ahead(self, coming: int) -> None:
        """With a pull answered (``coming`` messages, not yet counted outstanding), keep
        :attr:`pulls_ahead` pulls in flight while the engine takes the batch: the service
        prepares the next answers meanwhile instead of after. Only on a subscription
        without message ordering: two pulls in flight may be answered in either order,
        and a key's messages split between them could be handed out of order."""
        if self.ordered:
            return
        while len(self._pulls) < self.pulls_ahead:
            room = self._room_left() - coming
            if room <= 0:
                return
            self._send_pull(min(self.config.batch_size, room))

    async def _take_parked(self) -> list[tuple[PubSubMessage, PubSubDelivery]]:
        """Take over the leases a closed producer of this subscription kept, in order."""
        taken, _ = await self._lot.take_over(self._renew, self.takeover_margin)
        self.taken_over += len(taken)
        return [(d.message, d) for d in taken]

    async def _renew(self, leases: list[PubSubDelivery], hold: float | None = None) -> list[Any]:
        """Lease them for ``hold`` seconds (none: a take-over, ``ack_deadline`` as a pull)."""
        now, seconds = time.monotonic(), int(self.config.ack_deadline if hold is None else hold)
        await self._modify([d.ack_id for d in leases], seconds)
        for delivery in leases:
            delivery.lease_until = now + seconds
            if hold is None:
                delivery.pull = self._lanes.receives  # pulled before any nack of ours
                self._outstanding[delivery.ack_id] = delivery
        return leases

    def get_advance_lane(self, delivery: PubSubDelivery) -> Hashable:
        key = delivery.ordering_key
        return ("key", key) if key else delivery

    def message_id(self, delivery: PubSubDelivery) -> str | None:
        return delivery.message.message_id  # made when it was pulled (identity_of)

    # --------------------------------------------------------------- advance

    async def advance(self, batch: Sequence[AdvanceItem[PubSubDelivery]]) -> None:
        self._tasks.raise_failure()
        if self._all_plain_acks(batch):
            # The common case, one message at a time (a message without ordering key is
            # a lane of its own): what the plan below would say, without making it.
            for item in batch:
                self._ack(item.broker_payload)
            if self._acks.queued >= self._acks.limit:
                await self._acks.settle_soon()
                self._tasks.raise_failure()
            return
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

    def _all_plain_acks(self, batch: Sequence[AdvanceItem[PubSubDelivery]]) -> bool:
        """Whether every item is clean and in no ordered lane: the plan would ack them all
        (nothing of no lane is ever held) and nothing else."""
        ordered = self.ordered
        for item in batch:
            if not item.outcome.is_clean or (ordered and item.broker_payload.message.key):
                return False
        return True

    def _lane(self, delivery: PubSubDelivery) -> str | None:
        key = delivery.ordering_key
        return key if key and self.ordered else None

    def _settled(self, delivery: PubSubDelivery) -> None:
        self._outstanding.pop(delivery.ack_id, None)
        self._room.set()

    def _ack(self, delivery: PubSubDelivery) -> None:
        self._settled(delivery)
        self._acks.add("ack", delivery.ack_id)  # the flusher lingers for company, then sends

    async def _nack(self, items: list[AdvanceItem[PubSubDelivery]]) -> None:
        """Let Pub/Sub deliver them again (now, or after the backoff); acks of earlier
        messages go first, and the keys stay held until the nacks landed."""
        if not items:
            return
        await self._acks.flush()
        by_delay: dict[int, list[str]] = defaultdict(list)
        backoff = self.config.redelivery_backoff
        for item in items:
            delivery: PubSubDelivery = item.broker_payload
            self._lanes.hold(self._lane(delivery))
            by_delay[backoff.delay(delivery.message.delivery_attempt)].append(delivery.ack_id)
            self._settled(delivery)
        try:
            for seconds, ack_ids in by_delay.items():
                await self._modify(ack_ids, seconds)
                self.nacked += len(ack_ids)
        finally:
            for item in items:
                self._lanes.landed(self._lane(item.broker_payload))

    async def _dead_letter(
        self,
        delivery: PubSubDelivery,
        outcome: AdvanceOutcome,
        nacks: list[AdvanceItem[PubSubDelivery]],
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
            copy = dead_letter_copy(delivery, self.topic, self.subscription, topic, reason)
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
        if leases:
            self.extended += len(await self._renew(leases, self.config.ack_deadline))

    # ---------------------------------------------------------------- close

    async def aclose(self) -> None:
        """Send what is buffered, release what the engine never resolved, close."""
        if self._closed:
            return
        self._closed = True
        await self._tasks.aclose()  # the acks' flusher: a flush in flight goes on, shielded
        if self._client is not None:
            # Handed out, never resolved: parked for the next producer; the rest (never
            # handed out, or behind a nack of their key) released now.
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
            pulls = [pull.task for pull in self._pulls]
            self._pulls.clear()
            if pulls:
                await asyncio.wait(pulls, timeout=_PULL_GRACE)
            for task in pulls:
                cut_off = await kit.finish_within(task, 0)
                if cut_off is not None:
                    raw = getattr(cut_off, "_pb", cut_off)
                    unresolved += [r.ack_id for r in raw.received_messages]
            self._outstanding.clear()
            try:
                async with asyncio.timeout(30):
                    await self.flush()
                    if unresolved:  # delivered again now, not when their lease lapses
                        await self._modify(unresolved, 0)
                        self.nacked += len(unresolved)
                    self.parked += await self._lot.keep(to_park, hold, self._renew)
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

    def broker_problem(self) -> str | None:
        return self._reachability.problem

    def counters(self) -> Mapping[str, float]:
        return {
            Action.DELIVERED: self.delivered,
            Action.ACKED: self.acked,
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
