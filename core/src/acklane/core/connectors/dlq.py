"""Reading a stream's dead letters, and sending them back: the broker-agnostic half.

``acklane dlq list / redrive / purge`` work on every broker through one small
interface, :class:`DeadLetterReader`, that a connector returns from
:meth:`~acklane.core.connectors.Connector.dead_letter_reader`:

- :meth:`DeadLetterReader.fetch` hands out the next dead letters, *held* (locked,
  invisible, read by offset without a commit): nothing is consumed yet;
- :meth:`DeadLetterReader.copy_back` sends copies to the stream's source and returns
  once the broker confirmed every one of them;
- :meth:`DeadLetterReader.remove` takes letters out of the dead-letter destination;
- closing the reader gives back whatever it holds and did not remove.

:func:`redrive` is the loop on top of it: copy, confirm, *then* remove, batch by
batch. A crash between the copy and the removal leaves the letter where it was
and its copy in the source: the next redrive sends it again (at least once, never
lost). Each copy keeps the original's body, key and attributes (acklane's origin
and reason names are taken off, they are the dead-letter step's) and carries
:data:`~acklane.core.connectors.deadletter.REDRIVE_COUNT`, one more than the
letter had: a letter that already went back ``max_redrives`` times is not sent
again, it stays (and is counted ``skipped``).
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Self

from ..errors import ConnectorError
from .deadletter import ORIGIN_PREFIX, REDRIVE_COUNT, REJECT_REASON

__all__ = [
    "DeadLetter",
    "DeadLetterReader",
    "DeadLettersNotSupported",
    "RedriveReport",
    "Selection",
    "list_letters",
    "original_attributes",
    "purge",
    "redrive",
    "redrive_count",
    "redriven_attributes",
    "watchers_of",
]

#: A reason a watcher gave starts so (see ``compile_filter``'s label): ``watcher NAME: ...``.
_WATCHER = re.compile(r"(?:^|;\s*)watcher ([^:;]+):")


class DeadLettersNotSupported(ConnectorError):
    """The stream's connector cannot read its dead-letter destination (or has none)."""


def watchers_of(reason: str) -> tuple[str, ...]:
    """The watchers a reason text names (``watcher W: ...``, joined with ``"; "``)."""
    seen: dict[str, None] = {}
    for match in _WATCHER.finditer(reason):
        seen.setdefault(match.group(1).strip(), None)
    return tuple(seen)


def redrive_count(attributes: Mapping[str, Any]) -> int:
    """How many times a letter was redriven already (0 without the attribute)."""
    try:
        return max(0, int(str(attributes.get(REDRIVE_COUNT, 0))))
    except ValueError:
        return 0


def original_attributes(attributes: Mapping[str, str]) -> dict[str, str]:
    """A dead-letter copy's attributes without acklane's origin, reason and redrive count."""
    return {
        name: value
        for name, value in attributes.items()
        if not name.startswith(ORIGIN_PREFIX) and name not in (REJECT_REASON, REDRIVE_COUNT)
    }


@dataclass(slots=True)
class DeadLetter:
    """One message of a dead-letter destination, as acklane reads it.

    ``id`` is the destination's own name of the copy (Kafka ``topic:partition:offset``,
    SQS and Pub/Sub message id, Service Bus sequence number); ``origin_id`` acklane's
    message id of the original (what the event store and the logs call it);
    ``attributes`` the original's (headers, message attributes, application
    properties), acklane's origin and reason names taken off; ``redrives`` how many
    times it was sent back already. ``handle`` is the reader's own (a receipt, an
    ack id, a locked message).
    """

    id: str
    origin_id: str
    origin: str
    reason: str
    time: datetime | None
    body: bytes
    key: str | bytes | None = None
    attributes: dict[str, str] = field(default_factory=dict)
    redrives: int = 0
    handle: Any = field(default=None, repr=False, compare=False)

    @property
    def watchers(self) -> tuple[str, ...]:
        return watchers_of(self.reason)

    def document(self, *, body: bool = True) -> dict[str, Any]:
        """The letter as JSON (``--format json``): the body as text, else base64."""
        out: dict[str, Any] = {
            "id": self.id,
            "origin_id": self.origin_id,
            "origin": self.origin,
            "time": self.time.isoformat() if self.time is not None else None,
            "watchers": list(self.watchers),
            "reason": self.reason,
            "redrives": self.redrives,
        }
        if body:
            import base64

            try:
                out["body"] = self.body.decode("utf-8")
            except UnicodeDecodeError:
                out["body_base64"] = base64.b64encode(self.body).decode("ascii")
            key = self.key
            out["key"] = key.decode("utf-8", "replace") if isinstance(key, bytes) else key
            out["attributes"] = dict(self.attributes)
        return out


@dataclass(frozen=True, slots=True)
class Selection:
    """Which letters a command takes: all by default; each given test must hold.

    ``reason``: a case-insensitive substring of the reason; ``watcher``: one of the
    watchers it names; ``ids``: its ``id`` or its ``origin_id``.
    """

    reason: str | None = None
    watcher: str | None = None
    ids: frozenset[str] = frozenset()

    def __call__(self, letter: DeadLetter) -> bool:
        if self.reason is not None and self.reason.lower() not in letter.reason.lower():
            return False
        if self.watcher is not None and self.watcher not in letter.watchers:
            return False
        return not self.ids or letter.id in self.ids or letter.origin_id in self.ids


class DeadLetterReader(ABC):
    """One stream's dead-letter destination, read and emptied (see the module).

    An async context manager: leaving it gives back every letter held and not
    removed (released, abandoned, its lock or deadline dropped).
    """

    #: What reading costs on this broker, in a sentence (``acklane dlq list`` says it).
    reading_cost: ClassVar[str] = ""
    #: Letters asked for at a time: one copy, one confirmation, one removal per batch.
    batch_size: ClassVar[int] = 100

    @property
    @abstractmethod
    def destination(self) -> str:
        """The dead-letter destination, secret-free (``kafka topic orders.dlq at host``)."""

    @property
    @abstractmethod
    def source(self) -> str:
        """Where redriven copies go, secret-free."""

    @abstractmethod
    async def fetch(self, limit: int) -> list[DeadLetter]:
        """The next at most ``limit`` letters, held; ``[]`` when none is left to hand out
        (each letter is handed out once per reader)."""

    async def browse(self, limit: int) -> list[DeadLetter]:
        """Like :meth:`fetch`, for ``acklane dlq list``: a broker that can read without
        holding (Service Bus's peek) does so; the default is :meth:`fetch`."""
        return await self.fetch(limit)

    @abstractmethod
    async def copy_back(self, letters: Sequence[DeadLetter]) -> None:
        """Send a copy of each letter to the source (with ``redrives + 1`` as
        :data:`REDRIVE_COUNT`) and return once the broker has every one of them."""

    @abstractmethod
    async def remove(self, letters: Sequence[DeadLetter]) -> None:
        """Take the letters out of the destination for good."""

    async def aclose(self) -> None:
        """Give back what is held and not removed; release the clients."""
        return None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


@dataclass(slots=True)
class RedriveReport:
    """What a redrive (or a purge) did."""

    #: Letters sent back (or, with ``dry_run``, that would be), removed from the destination.
    redriven: list[DeadLetter] = field(default_factory=list)
    #: Letters chosen but not sent: they went back ``max_redrives`` times already.
    skipped: list[DeadLetter] = field(default_factory=list)
    #: Letters read that the selection did not take (left where they are).
    kept: int = 0

    def document(self) -> dict[str, Any]:
        return {
            "redriven": len(self.redriven),
            "skipped": len(self.skipped),
            "kept": self.kept,
            "ids": [letter.id for letter in self.redriven],
            "skipped_ids": [letter.id for letter in self.skipped],
        }


async def list_letters(
    reader: DeadLetterReader, selection: Selection, *, limit: int | None = None
) -> list[DeadLetter]:
    """The letters the selection takes, at most ``limit``; nothing is removed."""
    out: list[DeadLetter] = []
    while limit is None or len(out) < limit:
        batch = await reader.browse(reader.batch_size)
        if not batch:
            break
        out.extend(letter for letter in batch if selection(letter))
    return out if limit is None else out[:limit]


async def redrive(
    reader: DeadLetterReader,
    selection: Selection,
    *,
    max_messages: int | None = None,
    max_redrives: int | None = None,
    dry_run: bool = False,
    on_progress: Callable[[RedriveReport], None] | None = None,
) -> RedriveReport:
    """Send the chosen letters back to the source: copy, confirm, remove (see the module).

    ``max_messages`` bounds how many are sent; a letter with ``max_redrives`` or
    more redrives is skipped; ``dry_run`` reads and chooses, sends and removes nothing.
    """
    report = RedriveReport()
    while max_messages is None or len(report.redriven) < max_messages:
        batch = await reader.fetch(reader.batch_size)
        if not batch:
            break
        chosen: list[DeadLetter] = []
        for letter in batch:
            if not selection(letter):
                report.kept += 1
            elif max_redrives is not None and letter.redrives >= max_redrives:
                report.skipped.append(letter)
            elif max_messages is not None and len(report.redriven) + len(chosen) >= max_messages:
                report.kept += 1
            else:
                chosen.append(letter)
        if chosen and not dry_run:
            await reader.copy_back(chosen)  # confirmed by the broker ...
            await reader.remove(chosen)  # ... before anything leaves the destination
        report.redriven.extend(chosen)
        if on_progress is not None:
            on_progress(report)
    return report


async def purge(
    reader: DeadLetterReader,
    selection: Selection,
    *,
    on_progress: Callable[[RedriveReport], None] | None = None,
) -> RedriveReport:
    """Remove the chosen letters for good (``redriven`` lists them; nothing is sent)."""
    report = RedriveReport()
    while True:
        batch = await reader.fetch(reader.batch_size)
        if not batch:
            break
        chosen = [letter for letter in batch if selection(letter)]
        report.kept += len(batch) - len(chosen)
        if chosen:
            await reader.remove(chosen)
        report.redriven.extend(chosen)
        if on_progress is not None:
            on_progress(report)
    return report


def redriven_attributes(letter: DeadLetter) -> dict[str, str]:
    """The attributes of a letter's copy to the source: the original's, one more redrive."""
    return {**letter.attributes, REDRIVE_COUNT: str(letter.redrives + 1)}


def by_ids(letters: Iterable[DeadLetter]) -> dict[str, DeadLetter]:
    return {letter.id: letter for letter in letters}
