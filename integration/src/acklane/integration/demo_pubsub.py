"""``acklane demo --broker pubsub``: the demo on acklane's Pub/Sub emulator.

Registered under the entry-point group ``acklane.demos`` (see ``acklane.core.cli.demo``),
for ``--broker pubsub`` only (``auto`` keeps to Kafka). It starts acklane's own
emulator as a local process (relaxed mode, whatever ``ACKLANE_EMULATOR_BACKEND``
says: the demo reads the subscription's backlog with its inspection call), creates
the ``orders`` topic, its subscription and the dead-letter topic (with a
subscription to read the copies back), and publishes the demo's bodies in order.
Pub/Sub has no partitions or offsets: the table's ``partition/offset`` of a message
is ``0/<publish order>``, and "acked" counts the published messages no longer in
the subscription's backlog. When the emulator cannot start (its
:class:`EmulatorError`) it raises :class:`DemoBrokerUnavailable`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from acklane.core.cli.demo import DemoBroker, DemoBrokerUnavailable
from acklane.core.connectors.deadletter import ORIGIN_MESSAGE_ID, REJECT_REASON

from .emulator import EmulatorError, emulator_for

__all__ = ["PubSubDemoBroker"]


class PubSubDemoBroker(DemoBroker):
    """acklane's Pub/Sub emulator started for the demo, with a topic and a subscription."""

    description = "acklane's Pub/Sub emulator"
    partitions = 1
    progress_label = "acked (of published)"
    auto_order = None  # only as --broker pubsub

    def __init__(self) -> None:
        super().__init__()
        self.emulator = self._start_emulator()
        self._channel: Any = None
        #: Pub/Sub message id -> the table's label (``0/<publish order>``).
        self._labels: dict[str, str] = {}
        try:
            self.host = self.emulator.endpoint
            settings = self.emulator.client_settings()
            self.project = str(settings["project"])
            self.label = f"acklane's Pub/Sub emulator ({self.host})"
            self._open_clients()
            self.topic = self._create_topic("orders")
            self.dlq = self._create_topic("orders-dlq")
            self.subscription = self._create_subscription("orders-demo", self.topic)
            self.dlq_subscription = self._create_subscription("orders-dlq-read", self.dlq)
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _start_emulator() -> Any:
        try:
            emulator = emulator_for("pubsub", "local", relaxed=True)
            emulator.start()  # stops what it started when it fails
        except EmulatorError as exc:
            raise DemoBrokerUnavailable(str(exc)) from exc
        return emulator

    def _open_clients(self) -> None:
        import grpc
        from google.pubsub_v1 import PublisherClient, SubscriberClient
        from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport
        from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport

        self._channel = grpc.insecure_channel(self.host)
        self.publisher = PublisherClient(transport=PublisherGrpcTransport(channel=self._channel))
        self.subscriber = SubscriberClient(transport=SubscriberGrpcTransport(channel=self._channel))

    def _create_topic(self, name: str) -> str:
        path = f"projects/{self.project}/topics/{name}"
        self.publisher.create_topic(name=path, timeout=10)
        return path

    def _create_subscription(self, name: str, topic: str) -> str:
        path = f"projects/{self.project}/subscriptions/{name}"
        self.subscriber.create_subscription(
            request={"name": path, "topic": topic, "ack_deadline_seconds": 10}, timeout=10
        )
        return path

    def stream_block(self) -> str:
        return (
            f"{{connector: pubsub, project: {self.project}, emulator_host: '{self.host}', "
            f"subscription: {self.subscription.rsplit('/', 1)[-1]}, "
            f"dead_letter: {self.dlq.rsplit('/', 1)[-1]}, batch_size: 8, "
            "advance_linger: 0.02}"
        )

    def publish(self, bodies: list[bytes]) -> list[tuple[str, int, int]]:
        from google.pubsub_v1 import types

        out: list[tuple[str, int, int]] = []
        for i, body in enumerate(bodies):  # one at a time: message ids in publish order
            response = self.publisher.publish(
                topic=self.topic, messages=[types.PubsubMessage(data=body)], timeout=10
            )
            message_id = str(response.message_ids[0])
            self._labels[message_id] = f"0/{i}"
            out.append((f"{self.topic}/{message_id}", 0, i))
        self.ends[0] = self.ends.get(0, 0) + len(bodies)
        return out

    def message_id_of(self, broker_payload: Any) -> str | None:
        """A ``PubSubDelivery``'s plain Pub/Sub message id."""
        message_id = getattr(broker_payload, "message_id", None)
        return message_id if isinstance(message_id, str) else None

    def row_key(self, message_id: str) -> str:
        """The label of ``pubsub:<project>/<topic>/<id>@<time>``, or of a plain ``<id>``."""
        plain = message_id.split("@", 1)[0].rsplit("/", 1)[-1]
        return self._labels.get(plain, "")

    async def refresh_committed(self) -> None:
        from .pubsub import subscription_stats

        stats = await asyncio.to_thread(subscription_stats, self.host, self.subscription)
        self.last_committed = {0: max(self.ends.get(0, 0) - stats["backlog"], 0)}

    async def dead_letters(self, count: int) -> list[tuple[str, str]]:
        return await asyncio.to_thread(self._read_dead_letters, count)

    def _read_dead_letters(self, count: int, within: float = 5.0) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        deadline = time.monotonic() + within
        while len(out) < count and time.monotonic() < deadline:
            response = self.subscriber.pull(
                subscription=self.dlq_subscription, max_messages=count, timeout=5
            )
            received = list(response.received_messages)
            if not received:
                time.sleep(0.1)
                continue
            self.subscriber.acknowledge(
                subscription=self.dlq_subscription,
                ack_ids=[r.ack_id for r in received],
                timeout=5,
            )
            for r in received:
                attributes = dict(r.message.attributes)
                origin = self._labels.get(attributes.get(ORIGIN_MESSAGE_ID, ""), "?")
                out.append((origin, attributes.get(REJECT_REASON, "?")))
        return out

    def close(self) -> None:
        try:
            if self._channel is not None:
                self._channel.close()
                self._channel = None
        finally:
            self.emulator.stop()
