"""The broker-agnostic half of ``acklane dlq``: choosing letters, the redrive loop's
order (copy, confirmed, then remove), ``--max``, ``--max-redrives``, ``--dry-run`` and
a copy that fails; on a reader double (the brokers are in tests/test_dlq.py)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import pytest

from acklane.core.connectors.deadletter import (
    ORIGIN_MESSAGE_ID,
    ORIGIN_QUEUE,
    REDRIVE_COUNT,
    REJECT_REASON,
)
from acklane.core.connectors.dlq import (
    DeadLetter,
    DeadLetterReader,
    Selection,
    list_letters,
    original_attributes,
    purge,
    redrive,
    redriven_attributes,
    watchers_of,
)


class FakeReader(DeadLetterReader):
    """Hands out its letters in batches of ``batch``; records every call in order."""

    def __init__(self, letters: list[DeadLetter], *, batch: int = 2, fail_copy: bool = False):
        self.letters = list(letters)
        self.batch = batch
        self.fail_copy = fail_copy
        self.calls: list[tuple[str, list[str]]] = []
        self._next = 0

    @property
    def destination(self) -> str:
        return "fake dlq"

    @property
    def source(self) -> str:
        return "fake source"

    async def fetch(self, limit: int) -> list[DeadLetter]:
        out = self.letters[self._next : self._next + min(limit, self.batch)]
        self._next += len(out)
        return out

    async def copy_back(self, letters: Sequence[DeadLetter]) -> None:
        self.calls.append(("copy", [letter.id for letter in letters]))
        if self.fail_copy:
            raise RuntimeError("the broker refused")

    async def remove(self, letters: Sequence[DeadLetter]) -> None:
        self.calls.append(("remove", [letter.id for letter in letters]))


def letter(n: int, reason: str, redrives: int = 0) -> DeadLetter:
    return DeadLetter(
        id=f"d{n}",
        origin_id=f"o{n}",
        origin="orders",
        reason=reason,
        time=datetime(2026, 1, 1, tzinfo=UTC),
        body=b'{"id": %d}' % n,
        redrives=redrives,
    )


LETTERS = [
    letter(1, "watcher big-orders: reject rule matched: body.amount gt 100"),
    letter(2, "watcher audit: reject rule matched: body.kind eq 'test'", redrives=3),
    letter(3, "watcher big-orders: too big; watcher audit: bad"),
    letter(4, "not JSON"),
]


def test_the_watchers_of_a_reason_are_read_from_its_parts() -> None:
    assert watchers_of(LETTERS[2].reason) == ("big-orders", "audit")
    assert watchers_of("rejected by 1 watcher") == ()


def test_a_selection_takes_reason_watcher_and_ids_together() -> None:
    assert [x.id for x in LETTERS if Selection(reason="BODY.")(x)] == ["d1", "d2"]
    assert [x.id for x in LETTERS if Selection(watcher="audit")(x)] == ["d2", "d3"]
    assert [x.id for x in LETTERS if Selection(ids=frozenset({"o3", "d4"}))(x)] == ["d3", "d4"]
    both = Selection(watcher="audit", ids=frozenset({"d3"}))
    assert [x.id for x in LETTERS if both(x)] == ["d3"]


def test_attributes_lose_acklanes_names_and_gain_one_redrive() -> None:
    copy = {"source": "web", ORIGIN_QUEUE: "q", ORIGIN_MESSAGE_ID: "m", REJECT_REASON: "r"}
    assert original_attributes({**copy, REDRIVE_COUNT: "2"}) == {"source": "web"}
    again = letter(9, "r", redrives=2)
    again.attributes = {"source": "web"}
    assert redriven_attributes(again) == {"source": "web", REDRIVE_COUNT: "3"}


async def test_list_reads_everything_and_removes_nothing() -> None:
    reader = FakeReader(LETTERS)
    assert [x.id for x in await list_letters(reader, Selection(), limit=3)] == ["d1", "d2", "d3"]
    assert reader.calls == []


async def test_redrive_copies_then_removes_each_batch_and_skips_the_redriven_too_often() -> None:
    reader = FakeReader(LETTERS)
    report = await redrive(reader, Selection(), max_redrives=3)
    assert [x.id for x in report.redriven] == ["d1", "d3", "d4"]
    assert [x.id for x in report.skipped] == ["d2"]
    # per batch: the copies are confirmed before anything is removed
    assert reader.calls == [
        ("copy", ["d1"]),
        ("remove", ["d1"]),
        ("copy", ["d3", "d4"]),
        ("remove", ["d3", "d4"]),
    ]


async def test_max_and_dry_run_and_a_choice() -> None:
    reader = FakeReader(LETTERS)
    report = await redrive(reader, Selection(), max_messages=2)
    assert [x.id for x in report.redriven] == ["d1", "d2"] and report.kept == 0
    dry = FakeReader(LETTERS)
    seen = await redrive(dry, Selection(watcher="big-orders"), dry_run=True)
    assert [x.id for x in seen.redriven] == ["d1", "d3"] and seen.kept == 2
    assert dry.calls == []


async def test_a_copy_that_fails_removes_nothing() -> None:
    reader = FakeReader(LETTERS, fail_copy=True)
    with pytest.raises(RuntimeError, match="refused"):
        await redrive(reader, Selection())
    assert reader.calls == [("copy", ["d1", "d2"])]


async def test_purge_removes_only_the_chosen() -> None:
    reader = FakeReader(LETTERS)
    report = await purge(reader, Selection(reason="not json"))
    assert [x.id for x in report.redriven] == ["d4"] and report.kept == 3
    assert reader.calls == [("remove", ["d4"])]
