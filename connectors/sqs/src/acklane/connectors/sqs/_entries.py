"""The entries of SQS's ``*Batch`` calls, what their failures say, and the calls.

The shapes: the limits of a batch (10 entries, 256 KiB), the dead-letter
copy of a rejected message (its body and attributes, acklane's origin and reason,
the originals packed into one attribute past SQS's 10), the reason cut to fit a
dead-letter queue's ``MaximumMessageSize``, and how to read a ``Failed`` entry
(a receipt that vanished, a refusal for size and the limit it names). The
calls: a ``*Batch`` operation with the entries SQS says may succeed later tried
again (:func:`run_batch`), and the dead-letter copies sent one by one when one
too large refuses the whole batch (:func:`send_copies`).
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

from botocore.exceptions import ClientError

from acklane.core.connectors.deadletter import (
    ORIGIN_MESSAGE_ID,
    ORIGIN_QUEUE,
    REJECT_REASON,
    TRUNCATED_MARK,
    bounded_text,
)

__all__ = [
    "BATCH",
    "DEAD_LETTER_ATTRIBUTES",
    "PACKED_ATTRIBUTES",
    "SYSTEM_ATTRIBUTES",
    "batches_by_size",
    "chunks",
    "code_of",
    "dead_letter_entry",
    "entry_bytes",
    "failure_of",
    "fit_reason",
    "int_or_none",
    "is_size_refusal",
    "is_vanished",
    "limit_in",
    "run_batch",
    "send_copies",
]

#: Attributes added to a dead-lettered copy: where it came from and why.
DEAD_LETTER_ATTRIBUTES = (ORIGIN_QUEUE, ORIGIN_MESSAGE_ID, REJECT_REASON)
#: When the original attributes and ours exceed SQS's 10, the originals are packed here.
PACKED_ATTRIBUTES = "acklane.original_attributes"
#: The system attributes a receive asks for.
SYSTEM_ATTRIBUTES = [
    "ApproximateReceiveCount",
    "ApproximateFirstReceiveTimestamp",
    "SentTimestamp",
    "MessageGroupId",
    "MessageDeduplicationId",
    "SequenceNumber",
    "SenderId",
    "AWSTraceHeader",
]
BATCH = 10  # SQS's limit of entries per *Batch call
_BATCH_BYTES = 256 * 1024  # SQS's limit of a SendMessageBatch payload (the strictest quota)
_MAX_ATTRIBUTES = 10  # SQS's limit of message attributes per message
#: SQS's words when a message or batch is too large (the codes vary by endpoint).
_SIZE_CODES = frozenset({"BatchRequestTooLong", "MessageTooLong", "RequestEntityTooLarge"})
_SIZE_WORDS = re.compile(r"shorter than|longer than|too (?:long|large|big)|exceed", re.IGNORECASE)

_T = TypeVar("_T")


def code_of(failure: dict[str, Any]) -> str:
    # JSON-protocol SQS prefixes some codes ("AWS.SimpleQueueService.MessageNotInflight").
    return str(failure.get("Code", "")).rsplit(".", 1)[-1]


def is_vanished(failure: dict[str, Any]) -> bool:
    """The receipt handle no longer names a message we hold (deleted, expired, purged)."""
    code = code_of(failure)
    if code in ("ReceiptHandleIsInvalid", "MessageNotInflight", "InvalidReceiptHandle"):
        return True
    # Real SQS answers an expired handle on ChangeMessageVisibility this way.
    return code == "InvalidParameterValue" and "ReceiptHandle" in str(failure.get("Message", ""))


def chunks(items: Sequence[_T], size: int = BATCH) -> Iterable[Sequence[_T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def entry_bytes(entry: dict[str, Any]) -> int:
    size = len(str(entry["MessageBody"]).encode("utf-8"))
    for name, value in entry.get("MessageAttributes", {}).items():
        size += len(name.encode("utf-8")) + len(value["DataType"])
        size += len(value.get("StringValue", "").encode("utf-8")) + len(
            value.get("BinaryValue", b"")
        )
    return size


def batches_by_size(prepared: list[tuple[Any, Any, dict[str, Any]]]) -> Iterable[list[Any]]:
    """At most 10 entries and 256 KiB per SendMessageBatch (a lone big entry goes alone);
    each item's entry is its third element."""
    batch: list[Any] = []
    size = 0
    for item in prepared:
        n = entry_bytes(item[2])
        if batch and (len(batch) == BATCH or size + n > _BATCH_BYTES):
            yield batch
            batch, size = [], 0
        batch.append(item)
        size += n
    if batch:
        yield batch


def is_size_refusal(failure: dict[str, Any]) -> bool:
    """SQS refused a message (or its batch) for its size."""
    code = code_of(failure)
    if code in _SIZE_CODES:
        return True
    return code == "InvalidParameterValue" and bool(
        _SIZE_WORDS.search(str(failure.get("Message", "")))
    )


def limit_in(message: str) -> int | None:
    """The byte limit SQS names in a size refusal ("...shorter than 262144 bytes")."""
    match = re.search(r"(\d+) bytes", message)
    return int(match.group(1)) if match else None


def failure_of(exc: Exception) -> dict[str, Any]:
    """A whole call's failure in the shape of one ``Failed`` batch entry."""
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        return {"Code": error.get("Code", ""), "Message": error.get("Message", str(exc))}
    return {"Code": type(exc).__name__, "Message": str(exc)}


def fit_reason(entry: dict[str, Any], limit: int) -> dict[str, Any] | None:
    """``entry`` with its reason cut so that it fits ``limit`` bytes, or None if it can't."""
    attributes = entry["MessageAttributes"]
    reason = str(attributes[REJECT_REASON]["StringValue"])
    room = len(reason.encode("utf-8")) - (entry_bytes(entry) - limit)
    if room < len(TRUNCATED_MARK.encode("utf-8")):
        return None
    cut = {**attributes, REJECT_REASON: _string(bounded_text(reason, room))}
    fitted = {**entry, "MessageAttributes": cut}
    return fitted if entry_bytes(fitted) <= limit else None


def dead_letter_entry(
    body: str,
    attributes: Mapping[str, Mapping[str, Any]],
    *,
    queue_url: str,
    message_id: str,
    reason: str,
    group_id: str | None,
    fifo: bool,
) -> dict[str, Any]:
    """The SendMessage entry of a rejected message's copy (its ``Id`` is the caller's)."""
    original = {name: _sendable(value) for name, value in attributes.items()}
    # Bounded: the origin is a URL and an id; the reason at most REASON_MAX_BYTES.
    ours = {
        ORIGIN_QUEUE: _string(queue_url),
        ORIGIN_MESSAGE_ID: _string(message_id),
        REJECT_REASON: _string(reason),
    }
    if len(original) + len(ours) > _MAX_ATTRIBUTES:
        packed = json.dumps(_packable(original), sort_keys=True, separators=(",", ":"))
        ours[PACKED_ATTRIBUTES] = _string(packed)
        original = {}
    entry: dict[str, Any] = {"MessageBody": body, "MessageAttributes": {**original, **ours}}
    if fifo:
        entry["MessageGroupId"] = group_id or "acklane-dead-letters"
        # A retried copy (crash, redelivery) is dropped by SQS's 5-minute dedupe.
        entry["MessageDeduplicationId"] = message_id
    return entry


def int_or_none(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _string(value: str) -> dict[str, str]:
    return {"DataType": "String", "StringValue": value or "-"}


def _sendable(value: Any) -> dict[str, Any]:
    """A received message attribute in the shape SendMessage accepts."""
    out: dict[str, Any] = {"DataType": value["DataType"]}
    if "StringValue" in value:
        out["StringValue"] = value["StringValue"]
    elif "BinaryValue" in value:
        out["BinaryValue"] = value["BinaryValue"]
    return out


def _packable(attributes: dict[str, dict[str, Any]]) -> dict[str, dict[str, str]]:
    packed = {}
    for name, value in attributes.items():
        entry = {"DataType": value["DataType"]}
        if "BinaryValue" in value:
            entry["BinaryValue"] = base64.b64encode(bytes(value["BinaryValue"])).decode("ascii")
        else:
            entry["StringValue"] = str(value.get("StringValue", ""))
        packed[name] = entry
    return packed


async def run_batch(
    client: Any, operation: str, queue_url: str | None, entries: list[dict[str, Any]], attempts: int
) -> dict[str, dict[str, Any]]:
    """Call a ``*Batch`` operation, retrying entries SQS says may succeed later.

    Returns the entries that finally failed, by entry id.
    """
    remaining = {entry["Id"]: entry for entry in entries}
    failed: dict[str, dict[str, Any]] = {}
    for attempt in range(1, attempts + 1):
        response = await getattr(client, operation)(
            QueueUrl=queue_url, Entries=list(remaining.values())
        )
        retry: dict[str, dict[str, Any]] = {}
        for failure in response.get("Failed", ()):
            entry_id = failure["Id"]
            if failure.get("SenderFault") or is_vanished(failure) or attempt == attempts:
                failed[entry_id] = failure
            else:
                retry[entry_id] = remaining[entry_id]
        if not retry:
            break
        remaining = retry
        await asyncio.sleep(min(0.05 * 2**attempt, 2.0))
    return failed


async def send_copies(
    client: Any, dlq: str, entries: list[dict[str, Any]], attempts: int
) -> dict[str, Any]:
    """SendMessageBatch; returns the failed entries by index, whatever went wrong."""
    batch = [{**entry, "Id": str(i)} for i, entry in enumerate(entries)]
    try:
        return await run_batch(client, "send_message_batch", dlq, batch, attempts)
    except Exception as exc:
        failure = failure_of(exc)
        if len(entries) > 1 and is_size_refusal(failure):
            # One entry too large refuses the whole call on some endpoints: send
            # them one by one, so that only the culprits stay behind.
            failures: dict[str, Any] = {}
            for i, entry in enumerate(entries):
                alone = await send_copies(client, dlq, [entry], attempts)
                if "0" in alone:
                    failures[str(i)] = alone["0"]
            return failures
        return {entry["Id"]: failure for entry in batch}
