"""The commit ledger of cumulative-commit brokers (Kafka, memory), without a broker."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from acklane.core.connectors import CommitLedger, LedgerEntry, Verdict

C, D, R = Verdict.COMMIT, Verdict.DEAD_LETTER, Verdict.REDELIVER
LANE = ("t", 0)
OTHER = ("t", 1)


def ledger(*lanes: tuple[str, int], generation: int = 1) -> CommitLedger[tuple[str, int], str]:
    books: CommitLedger[tuple[str, int], str] = CommitLedger()
    for lane in lanes or (LANE,):
        books.assign(lane, generation)
    return books


def entries(
    *verdicts: Verdict, start: int = 0, lane: tuple[str, int] = LANE, generation: int = 1
) -> list[LedgerEntry[tuple[str, int], str]]:
    return [
        LedgerEntry(lane, start + i, generation, v, f"{lane[1]}@{start + i}")
        for i, v in enumerate(verdicts)
    ]


def test_a_clean_batch_commits_past_its_last_message() -> None:
    books = ledger()
    plan = books.plan(entries(C, C, C))
    assert plan.commits == {LANE: (3, "0@2")}
    assert (plan.dead_letter, plan.held, plan.seeks) == ([], [], {})


def test_a_rejected_message_is_dead_lettered_before_the_commit_passes_it() -> None:
    plan = ledger().plan(entries(C, D, C))
    assert plan.dead_letter == ["0@1"]
    assert plan.commits == {LANE: (3, "0@2")}


def test_a_redelivered_message_holds_its_lane_and_what_follows_is_left_alone() -> None:
    books = ledger()
    plan = books.plan(entries(C, R, D, C))
    assert plan.commits == {LANE: (1, "0@0")}
    assert plan.held == ["0@1"] and plan.seeks == {LANE: 1}
    assert plan.dead_letter == []  # the reject past the floor is judged when it comes again
    assert books.floors == {LANE: 1}


def test_the_floor_holds_across_batches_until_its_message_comes_back_committable() -> None:
    books = ledger()
    books.plan(entries(R))
    later = books.plan(entries(C, C, start=1))
    assert later.commits == {} and books.floors == {LANE: 0}
    again = books.plan(entries(C, C, C))
    assert again.commits == {LANE: (3, "0@2")} and books.floors == {}


def test_a_held_message_held_again_is_sought_back_again() -> None:
    books = ledger()
    books.plan(entries(R))
    plan = books.plan(entries(R))
    assert plan.seeks == {LANE: 0} and books.floors == {LANE: 0}


def test_lanes_are_independent() -> None:
    books = ledger(LANE, OTHER)
    plan = books.plan([*entries(R, C), *entries(C, D, lane=OTHER)])
    assert plan.commits == {OTHER: (2, "1@1")}
    assert plan.dead_letter == ["1@1"]
    assert plan.seeks == {LANE: 0}


def test_messages_of_a_reassigned_lane_are_skipped_and_counted() -> None:
    books = ledger()
    books.assign(LANE, 2)  # revoked and assigned again since the batch was delivered
    plan = books.plan(entries(C, D, R, generation=1))
    assert plan.skipped_revoked == 3
    assert (plan.commits, plan.dead_letter, plan.seeks) == ({}, [], {})


def test_a_revoked_lane_forgets_its_books() -> None:
    books = ledger()
    books.plan(entries(R))
    books.committed_to(LANE, 0)
    books.sought(LANE, 0)
    books.revoke(LANE)
    assert (books.owned, books.floors, books.committed, books.awaiting) == ({}, {}, {}, {})
    assert books.plan(entries(C)).skipped_revoked == 1


def test_a_stale_copy_below_the_committed_offset_changes_nothing() -> None:
    books = ledger()
    books.committed_to(LANE, 2)
    plan = books.plan(entries(R, D))
    assert (plan.commits, plan.dead_letter, plan.seeks, books.floors) == ({}, [], {}, {})


def test_a_commit_never_passes_the_offset_a_lane_already_committed() -> None:
    books = ledger()
    books.committed_to(LANE, 5)
    assert books.plan(entries(C, start=4)).commits == {}
    assert books.plan(entries(C, start=5)).commits == {LANE: (6, "0@5")}


def test_a_rejection_replaced_by_a_committable_copy_is_not_dead_lettered() -> None:
    plan = ledger().plan([*entries(D), *entries(C)])
    assert plan.dead_letter == []
    assert plan.commits == {LANE: (1, "0@0")}


def test_is_clear_only_for_an_owned_lane_with_no_floor_past_its_commit() -> None:
    books = ledger()
    assert books.is_clear(LANE, 1, 0)
    assert not books.is_clear(LANE, 2, 0)  # another generation
    assert not books.is_clear(OTHER, 1, 0)  # not owned
    books.committed_to(LANE, 4)
    assert not books.is_clear(LANE, 1, 2) and books.is_clear(LANE, 1, 4)
    books.plan(entries(R, start=4))
    assert not books.is_clear(LANE, 1, 9)


def test_a_floor_gone_from_the_log_is_dropped_when_the_consumer_resumes_past_it() -> None:
    books = ledger()
    books.plan(entries(R, start=3))
    books.sought(LANE, 3)
    assert books.came_back(LANE, 5) == 3  # 3 and 4 are gone (retention)
    assert books.floors == {} and books.awaiting == {}


def test_a_floor_that_comes_back_stays_until_resolved() -> None:
    books = ledger()
    books.plan(entries(R, start=3))
    books.sought(LANE, 3)
    assert books.came_back(LANE, 3) is None
    assert books.floors == {LANE: 3}
    assert books.came_back(LANE, 9) is None  # only the first message after a seek counts


def test_assign_with_a_known_committed_offset_makes_older_copies_stale() -> None:
    books: CommitLedger[tuple[str, int], str] = CommitLedger()
    books.assign(LANE, 0, committed=3)
    assert books.plan(entries(C, C, C, generation=0)).commits == {}
    assert books.plan(entries(C, start=3, generation=0)).commits == {LANE: (4, "0@3")}


@given(st.lists(st.lists(st.sampled_from([C, D, R]), min_size=1, max_size=6), max_size=8))
def test_random_batches_never_commit_past_an_unresolved_message(
    batches: list[list[Verdict]],
) -> None:
    """Replays a partition the way a consumer does: after a hold, it reads again from
    the floor; every plan's commit passes only messages judged committable."""
    books = ledger()
    committable: set[int] = set()
    dead: list[int] = []
    position = committed = 0
    for verdicts in batches:
        batch = entries(*verdicts, start=position)
        plan = books.plan(batch)
        for e in batch:
            if e.verdict is not R and e.offset < plan.commits.get(LANE, (0, ""))[0]:
                committable.add(e.offset)
        dead += [int(item.split("@")[1]) for item in plan.dead_letter]
        if LANE in plan.commits:
            target = plan.commits[LANE][0]
            assert target > committed
            assert set(range(committed, target)) <= committable
            committed = target
            books.committed_to(LANE, target)
        position = plan.seeks.get(LANE, position + len(verdicts))
        assert all(offset < committed for offset in dead)
    assert len(dead) == len(set(dead))
