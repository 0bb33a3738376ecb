"""``acklane demo --broker servicebus``: the demo on acklane's Service Bus emulator.

Registered under the entry-point group ``acklane.demos`` (see ``acklane.core.cli.demo``),
for ``--broker servicebus`` only (``auto`` keeps to Kafka). It starts acklane's own
emulator as a local process (whatever ``ACKLANE_EMULATOR_BACKEND`` says: the demo
reads the queue's counts through its admin endpoint), creates the ``orders`` queue
and sends the demo's bodies in order. A queue has no partitions: the table's
``partition/offset`` of a message is ``0/<publish order>`` (its sequence number
less one, on a fresh queue), "settled" counts the messages no longer in the queue
(completed, or moved to its dead-letter queue), and the dead letters are peeked
from ``orders/$DeadLetterQueue`` with their ``DeadLetterErrorDescription``. When
the emulator cannot start (its :class:`EmulatorError`) it raises
:class:`DemoBrokerUnavailable`.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from acklane.core.cli.demo import DemoBroker, DemoBrokerUnavailable

from .emulator import EmulatorError, emulator_for

if TYPE_CHECKING:
    from .servicebus import ServiceBusEmulator

# (the emulator's module imports python-qpid-proton: only once it is known installed,
# so that `acklane demo` loads this class without the servicebus extra)

__all__ = ["ServiceBusDemoBroker"]


class ServiceBusDemoBroker(DemoBroker):
    """acklane's Service Bus emulator started for the demo, with a fresh queue."""

    description = "acklane's Service Bus emulator"
    partitions = 1
    progress_label = "settled (of sent)"
    auto_order = None  # only as --broker servicebus

    def __init__(self) -> None:
        super().__init__()
        self.emulator = self._start_emulator()
        try:
            self.label = f"acklane's Service Bus emulator ({self.emulator.endpoint})"
            # A short lock: what a closing receiver leaves locked comes back soon.
            self.queue = self.emulator.create_queue(
                "orders", lock_duration=5, max_delivery_count=10
            )
            from .servicebus import ServiceBusKit

            self.kit = ServiceBusKit(self.emulator.connection_string)
        except BaseException:
            self.emulator.stop()
            raise

    @staticmethod
    def _start_emulator() -> ServiceBusEmulator:
        try:
            emulator = emulator_for("servicebus", "local")
            from .servicebus import ServiceBusEmulator

            assert isinstance(emulator, ServiceBusEmulator)
            emulator.start()  # stops what it started when it fails
        except EmulatorError as exc:
            raise DemoBrokerUnavailable(str(exc)) from exc
        return emulator

    def stream_block(self) -> str:
        return (
            f"{{connector: servicebus, connection_string: '{self.emulator.connection_string}', "
            f"queue: {self.queue}, prefetch: 0, batch_size: 8, max_wait_time: 0.5}}"
        )

    def publish(self, bodies: list[bytes]) -> list[tuple[str, int, int]]:
        self.kit.send(self.queue, bodies)  # one at a time: sequence numbers 1, 2, ...
        self.ends[0] = self.ends.get(0, 0) + len(bodies)
        return [(f"{self.queue}/{i + 1}", 0, i) for i in range(len(bodies))]

    def message_id_of(self, broker_payload: Any) -> str | None:
        """A ``ServiceBusDelivery``'s identity (the producer's ``message_id()``)."""
        identity = getattr(broker_payload, "identity", None)
        return identity if isinstance(identity, str) else None

    def row_key(self, message_id: str) -> str:
        """``0/<sequence number - 1>`` of ``servicebus:<ns>/<entity>/<seq>@<time>``."""
        seq = message_id.split("@", 1)[0].rsplit("/", 1)[-1]
        return f"0/{int(seq) - 1}" if seq.isdigit() else ""

    async def refresh_committed(self) -> None:
        counts = await asyncio.to_thread(self.emulator.counts, self.queue)
        self.last_committed = {0: max(self.ends.get(0, 0) - counts["messages"], 0)}

    async def dead_letters(self, count: int) -> list[tuple[str, str]]:
        return await asyncio.to_thread(self._peek_dead_letters, count)

    def _peek_dead_letters(self, count: int, within: float = 5.0) -> list[tuple[str, str]]:
        deadline = time.monotonic() + within
        while True:
            messages = self.kit.peek_dead_letters(self.queue, max(count, 1))
            if len(messages) >= count or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        out = []
        for m in messages[: max(count, 0)]:
            reason = m.dead_letter_error_description or m.dead_letter_reason or "?"
            out.append((f"0/{int(m.sequence_number) - 1}", str(reason)))
        return out

    def close(self) -> None:
        self.emulator.stop()
