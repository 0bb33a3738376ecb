"""The broker-neutral raw event that filters receive."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import msgspec

from .errors import AcklaneError

# msgspec's JSON decoder (docs/engine.md, "JSON"): about ten times the standard
# library's speed on small bodies, exact on big integers. Anything it refuses goes
# to the standard library, whose verdict (and error text) stands: the result is
# json.loads' in every case.
_fast_loads = msgspec.json.Decoder().decode

__all__ = ["BodyDecodeError", "RawMessage"]


class BodyDecodeError(AcklaneError, ValueError):
    """The message body is not what a filter expected (not UTF-8, not JSON)."""


@dataclass(slots=True)
class RawMessage:
    """One upstream message, as every connector presents it to filters.

    ``message_id`` is the message's identity, the one the event store drops
    duplicates by, on every broker (the producer's ``message_id()``: see
    ``docs/connectors/README.md``); ``None`` when the broker gives no stable one.
    ``broker_message_id`` is the id the broker itself gave the message, where it gives
    one (SQS's and Service Bus's ``MessageId``, Pub/Sub's message id; ``None`` on
    Kafka and the memory broker, whose messages are named by their position).
    ``native`` is the broker SDK's own message object for those who need more.
    Connectors may subclass to add broker fields (Kafka partition/offset, ...).
    """

    body: bytes
    attributes: Mapping[str, str] = field(default_factory=dict)
    key: str | None = None
    message_id: str | None = None
    publish_time: datetime | None = None
    delivery_attempt: int | None = None
    source: str | None = None
    native: Any = field(default=None, repr=False, compare=False)
    broker_message_id: str | None = None

    def text(self) -> str:
        """The body decoded as UTF-8."""
        try:
            return self.body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BodyDecodeError(
                f"message {self.message_id or '?'} body is not UTF-8 text: {exc}"
            ) from exc

    def json(self) -> Any:
        """The body decoded as JSON; raises :class:`BodyDecodeError` with the reason."""
        try:
            return _fast_loads(self.body)
        except (msgspec.DecodeError, TypeError):
            pass  # not strict JSON (NaN, not UTF-8, ...) or not bytes: the stdlib decides
        try:
            return json.loads(self.text())
        except json.JSONDecodeError as exc:
            raise BodyDecodeError(
                f"message {self.message_id or '?'} body is not JSON: {exc.msg} "
                f"at line {exc.lineno} column {exc.colno}"
            ) from exc
