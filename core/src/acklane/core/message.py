"""The broker-neutral raw event that filters receive."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

import msgspec

from .errors import AcklaneError

# msgspec's JSON decoder (docs/engine.md, "JSON"): about ten times the standard
# library's speed on small bodies, exact on big integers. Anything it refuses goes
# to the standard library, whose verdict (and error text) stands: the result is
# json.loads' in every case.
_fast_loads = msgspec.json.Decoder().decode

__all__ = ["MAX_JSON_DEPTH", "BodyDecodeError", "RawMessage", "check_json_depth"]

#: How deeply a JSON body may nest arrays and objects (docs/configuration.md, "Bodies
#: nested too deep"). Both decoders recurse once a level and give up near the
#: interpreter's recursion limit with a RecursionError, which is not a verdict on the
#: message: the watcher would restart and the message come back until its attempts
#: ran out. Far below that limit, so that what the filters, the schema check and the
#: event store then walk recursively stays well inside it too.
MAX_JSON_DEPTH: Final = 128


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
    #: The body as :meth:`json` decoded it, ``(value, None)``, or why it could not,
    #: ``(None, BodyDecodeError)``; None until a reader that only reads the value
    #: (acklane's declarative filters) asked: the watchers that evaluate one message
    #: in turn decode it once. Not a field of the message: never compared or shown.
    json_memo: tuple[Any, BodyDecodeError | None] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def text(self) -> str:
        """The body decoded as UTF-8."""
        try:
            return self.body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BodyDecodeError(
                f"message {self.message_id or '?'} body is not UTF-8 text: {exc}"
            ) from exc

    def json(self) -> Any:
        """The body decoded as JSON; raises :class:`BodyDecodeError` with the reason
        (not UTF-8, not JSON, nested deeper than :data:`MAX_JSON_DEPTH`)."""
        body = self.body
        try:
            value = _fast_loads(body)
        except (msgspec.DecodeError, TypeError):
            pass  # not strict JSON (NaN, not UTF-8, ...) or not bytes: the stdlib decides
        except RecursionError:
            raise _too_deep(self) from None
        else:
            if len(body) <= MAX_JSON_DEPTH:  # too short to nest deeper (most bodies)
                return value
            return check_json_depth(self, body, value)
        try:
            return check_json_depth(self, body, json.loads(self.text()))
        except json.JSONDecodeError as exc:
            raise BodyDecodeError(
                f"message {self.message_id or '?'} body is not JSON: {exc.msg} "
                f"at line {exc.lineno} column {exc.colno}"
            ) from exc
        except RecursionError:
            raise _too_deep(self) from None


def check_json_depth(message: RawMessage, data: Any, value: Any) -> Any:
    """``value`` (``data`` decoded), or :class:`BodyDecodeError` when it nests deeper
    than :data:`MAX_JSON_DEPTH`.

    Only a body with more than that many ``[`` and ``{`` bytes can, so most bodies cost
    a length test (or two byte counts); the rest are walked, without recursion.
    """
    if type(data) is bytes and (
        len(data) <= MAX_JSON_DEPTH or data.count(b"[") + data.count(b"{") <= MAX_JSON_DEPTH
    ):
        return value
    if (type(value) is list or type(value) is dict) and _depth_over(value, MAX_JSON_DEPTH):
        raise _too_deep(message)
    return value


def _depth_over(value: Any, limit: int) -> bool:
    """Whether the list or dict ``value`` nests more than ``limit`` levels deep."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if type(item) is dict else item
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children if type(c) is dict or type(c) is list)
    return False


def _too_deep(message: RawMessage) -> BodyDecodeError:
    return BodyDecodeError(
        f"message {message.message_id or '?'} body is JSON nested deeper than "
        f"{MAX_JSON_DEPTH} levels"
    )
