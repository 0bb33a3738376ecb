"""Lease beats, the interval rule, and lease parking (no broker)."""

from __future__ import annotations

import asyncio

import pytest

from acklane.core.connectors import LeaseKeeper, LeaseParking, beat_interval, due


def test_the_beat_is_a_quarter_of_the_lease_or_the_shorter_configured_interval() -> None:
    assert beat_interval(60) == 15
    assert beat_interval(60, configured=5) == 5
    assert beat_interval(60, configured=30) == 15  # never so slow a lease lapses first
    assert beat_interval(0.01) == 0.05  # never a busy loop


def test_a_lease_is_due_when_it_lapses_within_two_beats() -> None:
    leases = {"soon": 104.0, "later": 200.0, "gone": 90.0}
    assert due(leases, leases.__getitem__, now=100.0, interval=5.0) == ["soon", "gone"]


async def test_a_transient_error_is_told_and_the_next_beat_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    beats: list[float] = []

    async def extend(interval: float) -> None:
        beats.append(interval)
        if len(beats) == 1:
            raise TimeoutError("busy")

    keeper = LeaseKeeper(extend, 0.01, transient=lambda e: True, describe="stream s")
    await keeper.beat(0.01)
    await keeper.beat(0.01)
    assert keeper.missed == 1 and len(beats) == 2
    assert "lease extension failed" in caplog.text


async def test_an_error_that_is_not_transient_ends_the_keeper_with_it() -> None:
    async def extend(interval: float) -> None:
        raise PermissionError("denied")

    keeper = LeaseKeeper(extend, 0.01, transient=lambda e: False, describe="stream s")
    with pytest.raises(PermissionError):
        async with asyncio.timeout(5):
            await keeper.run()


async def test_the_interval_may_be_read_before_every_beat() -> None:
    intervals = iter([0.01, 0.02])
    seen: list[float] = []

    async def extend(interval: float) -> None:
        seen.append(interval)
        if len(seen) == 2:
            raise asyncio.CancelledError

    keeper = LeaseKeeper(extend, lambda: next(intervals), transient=lambda e: True, describe="s")
    with pytest.raises(asyncio.CancelledError):
        await keeper.run()
    assert seen == [0.01, 0.02]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def parking(clock: Clock) -> LeaseParking[tuple[str, float]]:
    return LeaseParking(lambda lease: lease[1], clock=clock)


def test_parked_leases_are_taken_once_in_order_by_the_next_producer_of_the_stream() -> None:
    lot = parking(Clock())
    lot.park(("q",), [("a", 160.0), ("b", 160.0)])
    assert lot.take(("q",)) == ([("a", 160.0), ("b", 160.0)], 0, None)
    assert lot.take(("q",)) == ([], 0, None)


def test_a_lease_too_close_to_lapsing_is_not_taken_over() -> None:
    clock = Clock()
    lot = parking(clock)
    lot.park(("q",), [("a", 103.0), ("b", 160.0)])
    taken, too_late, _ = lot.take(("q",), margin=5.0)
    assert taken == [("b", 160.0)] and too_late == 1


def test_a_lot_nobody_took_before_its_leases_lapsed_is_forgotten() -> None:
    clock = Clock()
    lot = parking(clock)
    lot.park(("q",), [("a", 110.0)])
    clock.now = 111.0
    lot.park(("other",), [("b", 200.0)])  # any use of the parking expires old lots
    assert ("q",) not in lot and ("other",) in lot


def test_a_note_is_kept_beside_the_leases_until_its_own_deadline() -> None:
    clock = Clock()
    lot = parking(clock)
    lot.park(("q",), note="attempt-1", note_until=150.0)
    clock.now = 120.0
    assert lot.take(("q",)) == ([], 0, "attempt-1")
    lot.park(("q",), note="attempt-2", note_until=130.0)
    clock.now = 131.0
    assert lot.take(("q",)) == ([], 0, None)


async def test_a_bound_lot_takes_over_and_keeps_in_its_streams_lot_only() -> None:
    clock = Clock()
    lots = parking(clock)
    mine, other = lots.lot(("q",), "queue q"), lots.lot(("r",), "queue r")

    async def extend(leases: list[tuple[str, float]], hold: float) -> list[tuple[str, float]]:
        return [(name, clock.now + hold) for name, _ in leases]

    async def renew(leases: list[tuple[str, float]]) -> list[tuple[str, float]]:
        return leases

    assert await mine.keep([("a", 0.0)], 60, extend) == 1
    assert await other.take_over(renew, margin=5) == ([], None)
    assert await mine.take_over(renew, margin=5) == ([("a", 160.0)], None)


async def test_a_take_over_whose_renewal_fails_takes_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    lots = parking(Clock())
    lots.park(("q",), [("a", 160.0)])

    async def renew(leases: list[tuple[str, float]]) -> list[tuple[str, float]]:
        raise TimeoutError("no answer")

    assert await lots.lot(("q",), "queue q").take_over(renew, margin=5) == ([], None)
    assert "could not be taken over" in caplog.text
