"""``acklane dlq`` on a Pub/Sub stream: a subscription of its dead-letter topic.

A topic keeps nothing by itself: the dead letters are what a subscription of the
dead-letter topic holds (make one with the topic: a copy published before any
subscription existed is gone). The reader pulls from it (``--subscription``, else
the topic's only subscription), keeps what it pulled leased (``ModifyAckDeadline``)
while the command runs, and nacks what it did not remove when it ends (deadline 0:
redelivered at once). Reading is a delivery: on a subscription with a dead-letter
policy of its own, it counts toward ``max_delivery_attempts``.

A redrive publishes each chosen letter to the topic of the stream's subscription
(the data, the original attributes, the ordering key, one more
``acklane.redrive.count``) and acks it on the dead-letter subscription once the
publish returned its message ids.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, ClassVar

from acklane.core.connectors import OutgoingMessage
from acklane.core.connectors.deadletter import ORIGIN_MESSAGE_ID, ORIGIN_QUEUE, REJECT_REASON
from acklane.core.connectors.dlq import (
    DeadLetter,
    DeadLetterReader,
    DeadLettersNotSupported,
    original_attributes,
    redrive_count,
    redriven_attributes,
)
from acklane.core.errors import ConnectorError

from ._client import make_client
from ._config import PubSubConfig
from ._publish import PubSubPublisher

__all__ = ["PubSubDeadLetterReader"]

#: Seconds a pulled letter stays leased (nacked at the end; at most 600).
HOLD = 300
#: Seconds a pull that finds nothing waits, at most.
PULL_TIMEOUT = 5.0


def _key(key: str | bytes | None) -> str | None:
    return key.decode() if isinstance(key, bytes) else key


class PubSubDeadLetterReader(DeadLetterReader):
    """The dead-letter topic's subscription (see the module)."""

    reading_cost: ClassVar[str] = (
        "Pub/Sub: every letter read is pulled from the dead-letter subscription (a "
        "delivery, counted by a dead-letter policy of that subscription) and nacked after."
    )

    def __init__(
        self, config: PubSubConfig, *, subscription: str | None = None, hold: int = HOLD
    ) -> None:
        self.config = config
        self.hold = min(hold, 600)  # Pub/Sub's longest ack deadline
        self.subscription: str | None = None
        if subscription is not None:
            self.subscription = (
                subscription
                if subscription.startswith("projects/")
                else f"projects/{config.project_id}/subscriptions/{subscription}"
            )
        self.topic: str | None = config.dead_letter_topic_path
        self._subscriber: Any = None
        self._publisher: PubSubPublisher | None = None
        self._held: dict[str, str] = {}  # ack id by the letter's id
        self._seen: set[str] = set()
        self._drained = False

    @property
    def destination(self) -> str:
        where = self.subscription or f"the subscription of {self.topic or 'the dead-letter topic'}"
        return f"pubsub subscription {where}"

    @property
    def source(self) -> str:
        return f"pubsub topic of {self.config.subscription_path}"

    async def _connect(self) -> Any:
        if self._subscriber is not None:
            return self._subscriber
        subscriber = make_client(self.config, "subscriber")
        try:
            if self.topic is None:
                own = await subscriber.get_subscription(
                    subscription=self.config.subscription_path, timeout=30
                )
                policy = own.dead_letter_policy
                self.topic = str(policy.dead_letter_topic) if policy else None
                if not self.topic:
                    raise DeadLettersNotSupported(
                        f"{self.config.describe()}: no dead_letter topic and no dead-letter "
                        "policy; its rejects are dropped"
                    )
            if self.subscription is None:
                self.subscription = await self._only_subscription(self.topic)
        except BaseException:
            with contextlib.suppress(Exception):
                await subscriber.transport.close()
            raise
        self._subscriber = subscriber
        return subscriber

    async def _only_subscription(self, topic: str) -> str:
        publisher = make_client(self.config, "publisher")
        try:
            pager = await publisher.list_topic_subscriptions(topic=topic, timeout=30)
            names = [str(name) async for name in pager]
        finally:
            with contextlib.suppress(Exception):
                await publisher.transport.close()
        if len(names) != 1:
            found = ", ".join(names) or "none"
            raise ConnectorError(
                f"pubsub topic {topic} has {len(names)} subscription(s) ({found}): name the "
                "one that reads the dead letters with --subscription"
                + (
                    "; make one with the topic, a topic keeps nothing by itself"
                    if not names
                    else ""
                )
            )
        return names[0]

    def _letter(self, received: Any) -> DeadLetter:
        message = received.message
        attributes = dict(message.attributes)
        stamp = message.publish_time
        when: datetime | None = None
        if stamp is not None:
            with contextlib.suppress(Exception):
                when = datetime.fromtimestamp(stamp.timestamp(), UTC)
        kept = original_attributes(attributes)
        return DeadLetter(
            id=str(message.message_id),
            origin_id=attributes.get(ORIGIN_MESSAGE_ID, ""),
            origin=attributes.get(ORIGIN_QUEUE, ""),
            reason=attributes.get(REJECT_REASON, ""),
            time=when,
            body=bytes(message.data),
            key=str(message.ordering_key) or None,
            attributes=kept,
            redrives=redrive_count(attributes),
            handle=str(received.ack_id),
        )

    async def fetch(self, limit: int) -> list[DeadLetter]:
        subscriber = await self._connect()
        out: list[DeadLetter] = []
        while len(out) < limit and not self._drained:
            try:
                response = await subscriber.pull(
                    subscription=self.subscription,
                    max_messages=min(1000, limit - len(out)),
                    # the first pull waits for letters; once some came, the rest answer at
                    # once (an empty answer ends the read; Pub/Sub may give fewer than it
                    # holds: a command run again finds the rest)
                    return_immediately=bool(self._seen),
                    timeout=PULL_TIMEOUT,
                )
            except Exception as exc:
                if type(exc).__name__ in ("DeadlineExceeded", "RetryError"):
                    self._drained = True  # nothing came within the pull's time
                    break
                raise
            received = list(response.received_messages)
            if not received:
                self._drained = True
                break
            await subscriber.modify_ack_deadline(
                subscription=self.subscription,
                ack_ids=[r.ack_id for r in received],
                ack_deadline_seconds=self.hold,
            )
            fresh = 0
            for item in received:
                letter = self._letter(item)
                self._held[letter.id] = letter.handle
                if letter.id in self._seen:
                    continue
                self._seen.add(letter.id)
                out.append(letter)
                fresh += 1
            if not fresh:
                self._drained = True
                break
        return out

    async def copy_back(self, letters: Sequence[DeadLetter]) -> None:
        if self._publisher is None:
            self._publisher = PubSubPublisher(self.config)
        await self._publisher.send(
            [
                OutgoingMessage(letter.body, _key(letter.key), redriven_attributes(letter))
                for letter in letters
            ]
        )

    async def remove(self, letters: Sequence[DeadLetter]) -> None:
        subscriber = await self._connect()
        ack_ids = [self._held.get(letter.id, letter.handle) for letter in letters]
        for start in range(0, len(ack_ids), 1000):
            await subscriber.acknowledge(
                subscription=self.subscription, ack_ids=ack_ids[start : start + 1000]
            )
        for letter in letters:
            self._held.pop(letter.id, None)

    async def aclose(self) -> None:
        subscriber, self._subscriber = self._subscriber, None
        publisher, self._publisher = self._publisher, None
        held = list(self._held.values())
        self._held.clear()
        try:
            if subscriber is not None and held:
                for start in range(0, len(held), 1000):
                    with contextlib.suppress(Exception):  # they come back after HOLD anyway
                        await subscriber.modify_ack_deadline(
                            subscription=self.subscription,
                            ack_ids=held[start : start + 1000],
                            ack_deadline_seconds=0,
                        )
        finally:
            if publisher is not None:
                await publisher.aclose()
            if subscriber is not None:
                with contextlib.suppress(Exception):
                    await subscriber.transport.close()
