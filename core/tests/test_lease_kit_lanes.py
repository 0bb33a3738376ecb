"""The ordered-lanes plan of message-by-message brokers, without a broker."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from acklane.core.connectors import LaneEntry, OrderedLanes, Verdict

C, D, R = Verdict.COMMIT, Verdict.DEAD_LETTER, Verdict.REDELIVER


def batch(
    *verdicts: Verdict, lane: str | None = "g", stamp: int = 1, start: int = 0
) -> list[LaneEntry[str, str]]:
    return [LaneEntry(lane, stamp, v, f"m{start + i}") for i, v in enumerate(verdicts)]


def test_a_clean_batch_is_settled() -> None:
    plan = OrderedLanes[str]().plan(batch(C, C))
    assert plan.commit == ["m0", "m1"] and plan.held == [] and plan.redeliver == []


def test_a_redelivered_message_holds_what_follows_it_in_its_lane() -> None:
    lanes = OrderedLanes[str]()
    plan = lanes.plan(batch(C, R, C, D))
    assert plan.commit == ["m0"]
    assert plan.redeliver == ["m1"]
    assert plan.held == ["m2", "m3"]  # whatever their outcome
    assert plan.dead_letter == []


def test_the_hold_covers_later_batches_of_messages_received_before_the_release_landed() -> None:
    lanes = OrderedLanes[str]()
    received = lanes.stamp()
    lanes.plan(batch(R, stamp=received))
    lanes.landed("g")
    later = lanes.plan(batch(C, stamp=received, start=1))
    assert later.held == ["m1"]


def test_while_the_release_is_in_flight_even_a_newer_receive_is_held() -> None:
    lanes = OrderedLanes[str]()
    lanes.plan(batch(R, stamp=lanes.stamp()))
    newer = lanes.stamp()
    assert lanes.plan(batch(C, stamp=newer, start=1)).held == ["m1"]


def test_a_message_received_after_the_release_landed_lifts_the_hold() -> None:
    lanes = OrderedLanes[str]()
    lanes.plan(batch(R, stamp=lanes.stamp()))
    lanes.landed("g")
    again = lanes.stamp()
    plan = lanes.plan(batch(C, C, stamp=again))
    assert plan.commit == ["m0", "m1"] and "g" not in lanes.holds


def test_messages_without_a_lane_are_never_held() -> None:
    lanes = OrderedLanes[str]()
    plan = lanes.plan(batch(R, C, lane=None))
    assert plan.redeliver == ["m0"] and plan.commit == ["m1"] and lanes.holds == {}


def test_another_lane_is_not_held() -> None:
    lanes = OrderedLanes[str]()
    plan = lanes.plan([*batch(R, lane="a"), *batch(C, lane="b", start=1)])
    assert plan.commit == ["m1"]


def test_what_follows_a_reject_in_its_lane_waits_for_the_dead_letter_copy() -> None:
    plan = OrderedLanes[str]().plan([*batch(D, C), *batch(C, lane="other", start=2)])
    assert plan.dead_letter == ["m0"]
    assert plan.after_dead_letter == ["m1"]
    assert plan.commit == ["m2"]


def test_a_forgotten_lane_is_free_again() -> None:
    lanes = OrderedLanes[str]()
    lanes.plan(batch(R))
    lanes.forget("g")
    assert lanes.plan(batch(C, start=1)).commit == ["m1"]


@given(st.lists(st.sampled_from([C, D, R]), max_size=30))
def test_nothing_of_a_lane_is_settled_after_a_redelivery_of_it(verdicts: list[Verdict]) -> None:
    plan = OrderedLanes[str]().plan(batch(*verdicts))
    settled = set(plan.commit) | set(plan.dead_letter) | set(plan.after_dead_letter)
    if R in verdicts:
        first = verdicts.index(R)
        assert all(int(m[1:]) < first for m in settled)
    every = settled | set(plan.redeliver) | set(plan.held)
    assert len(every) == len(verdicts)  # each message has exactly one fate
