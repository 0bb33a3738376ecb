"""``acklane demo --broker kafka``: the demo on a Kafka emulator it starts itself.

Registered under the entry-point group ``acklane.demos`` (see ``acklane.core.cli.demo``):
tansu as a local process, or ``apache/kafka`` under Docker (per
``ACKLANE_EMULATOR_BACKEND``, as everywhere in ``acklane.integration``). When no
emulator can start (the emulator's :class:`EmulatorError`, e.g. no tansu binary) it
raises :class:`DemoBrokerUnavailable`, on which ``--broker auto`` falls back to the
in-process broker; any other error is a real one.
"""

from __future__ import annotations

import asyncio
from typing import Any

from acklane.core.cli.demo import DemoBroker, DemoBrokerUnavailable

from .emulator import Emulator, EmulatorError, emulator_for
from .kafka import KafkaKit

__all__ = ["KafkaDemoBroker"]


class KafkaDemoBroker(DemoBroker):
    """A Kafka-protocol emulator started for the demo, with fresh topics and group."""

    description = "a Kafka emulator"

    def __init__(self) -> None:
        super().__init__()
        self.emulator = self._start_emulator()
        try:
            self.label = f"a Kafka emulator ({self.emulator.backend}, {self.emulator.endpoint})"
            self.kit = KafkaKit.of(self.emulator)
            self.topic = self.kit.new_topic("orders", partitions=self.partitions)
            self.dlq = self.kit.new_topic("orders-dlq", partitions=1)
            self.group = KafkaKit.unique("demo")
        except BaseException:
            self.emulator.stop()
            raise

    @staticmethod
    def _start_emulator() -> Emulator:
        """A started emulator, or :class:`DemoBrokerUnavailable` when none can start."""
        try:
            emulator = emulator_for("kafka")
            emulator.start()  # stops what it started when it fails
        except EmulatorError as exc:
            raise DemoBrokerUnavailable(str(exc)) from exc
        return emulator

    def stream_block(self) -> str:
        client = ", ".join(f'"{k}": {v}' for k, v in KafkaKit.FAST_GROUP.items())
        return (
            f"{{connector: kafka, bootstrap_servers: '{self.kit.bootstrap_servers}', "
            f"topics: [{self.topic}], group_id: {self.group}, dead_letter: {self.dlq}, "
            f"poll_timeout: 0.1, batch_size: 8, client: {{{client}}}}}"
        )

    def publish(self, bodies: list[bytes]) -> list[tuple[str, int, int]]:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.kit.bootstrap_servers})
        out: list[tuple[str, int, int]] = []
        errors: list[str] = []

        def delivered(error: Any, msg: Any) -> None:
            if error is not None:
                errors.append(str(error))
                return
            out.append(
                (f"{msg.topic()}/{msg.partition()}/{msg.offset()}", msg.partition(), msg.offset())
            )

        for i, body in enumerate(bodies):
            producer.produce(self.topic, value=body, key=f"customer-{i % 5}", on_delivery=delivered)
            producer.flush(10)  # one at a time: offsets in publish order
        if errors or len(out) != len(bodies):
            raise RuntimeError(
                f"publishing to {self.topic} failed: {errors[0] if errors else 'not delivered'}"
            )
        for _, p, off in out:
            self.ends[p] = max(self.ends.get(p, 0), off + 1)
        return out

    async def refresh_committed(self) -> None:
        got = await asyncio.to_thread(self.kit.committed, self.group, self.topic, self.partitions)
        self.last_committed = {p: off for p, off in got.items() if off is not None}

    async def dead_letters(self, count: int) -> list[tuple[str, str]]:
        records = await asyncio.to_thread(self.kit.read, self.dlq, count, timeout=5.0)
        out = []
        for r in records:
            headers = {
                k: (v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v))
                for k, v in (r.headers() or [])
            }
            out.append(self.dead_letter_origin(headers))
        return out

    def close(self) -> None:
        try:
            self.kit.close()
        finally:
            self.emulator.stop()
