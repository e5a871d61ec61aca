"""Scenario tests for ReplicationSet, named after TiCDC's replication_set_test.go cases."""

from __future__ import annotations

import random

import pytest

from scheduler_core import (
    AddTableRequest,
    Checkpoint,
    MultiplePrimaryError,
    RemoveTableRequest,
    ReplicationSet,
    ReplicationSetState,
    Role,
    TableState,
    TableStatus,
)

S = ReplicationSetState
T = TableState
TID = 1
CP = Checkpoint(10, 10)


def st(state: TableState, ckpt: int = 10, resolved: int | None = None) -> TableStatus:
    return TableStatus(TID, state, Checkpoint(ckpt, resolved if resolved is not None else ckpt))


def add(to: str, secondary: bool, ckpt: int = 10, resolved: int | None = None) -> AddTableRequest:
    cp = Checkpoint(ckpt, resolved if resolved is not None else ckpt)
    return AddTableRequest(to, TID, secondary, cp)


def rm(to: str) -> RemoveTableRequest:
    return RemoveTableRequest(to, TID)


def replicating_on(capture: str, ckpt: int = 10) -> ReplicationSet:
    cp = Checkpoint(ckpt, ckpt)
    return ReplicationSet.rebuild(TID, cp, {capture: TableStatus(TID, T.REPLICATING, cp)})


def moving(src: str = "a", dest: str = "b") -> ReplicationSet:
    rs = replicating_on(src)
    rs.handle_move_table(dest)
    return rs


# --------------------------------------------------------------------------- rebuild
REBUILD_CASES = {
    "no_reports_is_absent": ({}, S.ABSENT, None, {}),
    "replicating_is_primary": ({"a": T.REPLICATING}, S.REPLICATING, "a", {"a": Role.PRIMARY}),
    "preparing_is_secondary": ({"a": T.PREPARING}, S.PREPARE, None, {"a": Role.SECONDARY}),
    "prepared_is_commit": ({"a": T.PREPARED}, S.COMMIT, None, {"a": Role.SECONDARY}),
    "stopping_is_undetermined": ({"a": T.STOPPING}, S.REMOVING, None, {"a": Role.UNDETERMINED}),
    "stopped_and_absent_ignored": ({"a": T.STOPPED, "b": T.ABSENT}, S.ABSENT, None, {}),
    "move_in_prepare": (
        {"a": T.REPLICATING, "b": T.PREPARING},
        S.PREPARE,
        "a",
        {"a": Role.PRIMARY, "b": Role.SECONDARY},
    ),
    "move_in_commit": (
        {"a": T.REPLICATING, "b": T.PREPARED},
        S.COMMIT,
        "a",
        {"a": Role.PRIMARY, "b": Role.SECONDARY},
    ),
    "replicating_with_stopping": (
        {"a": T.REPLICATING, "b": T.STOPPING},
        S.REPLICATING,
        "a",
        {"a": Role.PRIMARY, "b": Role.UNDETERMINED},
    ),
}


@pytest.mark.parametrize("case", REBUILD_CASES, ids=list(REBUILD_CASES))
def test_rebuild_from_reports(case: str) -> None:
    reports, state, primary, captures = REBUILD_CASES[case]
    rs = ReplicationSet.rebuild(TID, CP, {c: st(s) for c, s in reports.items()})
    assert (rs.state, rs.primary, dict(rs.captures)) == (state, primary, captures)


def test_rebuild_two_replicating_raises_multiple_primary() -> None:
    with pytest.raises(MultiplePrimaryError, match="table 1"):
        ReplicationSet.rebuild(TID, CP, {"a": st(T.REPLICATING), "b": st(T.REPLICATING)})


def test_rebuild_takes_max_checkpoint() -> None:
    rs = ReplicationSet.rebuild(TID, CP, {"a": st(T.REPLICATING, 20, 30)})
    assert rs.checkpoint == Checkpoint(20, 30)


# --------------------------------------------------------------------------- add
def test_add_table_goes_through_prepare_and_commit() -> None:
    rs = ReplicationSet.rebuild(TID, CP, {})
    assert rs.handle_add_table("a") == [add("a", True)]
    assert (rs.state, rs.secondary) == (S.PREPARE, "a")
    assert rs.poll(st(T.PREPARING), "a") == []
    assert rs.poll(st(T.PREPARED), "a") == [add("a", False)]
    assert (rs.state, rs.primary) == (S.COMMIT, "a")
    assert rs.poll(st(T.REPLICATING, 11, 12), "a") == []
    assert (rs.state, rs.primary, rs.checkpoint) == (S.REPLICATING, "a", Checkpoint(11, 12))


def test_add_table_lost_request_is_resent_when_capture_reports_absent() -> None:
    rs = ReplicationSet.rebuild(TID, CP, {})
    rs.handle_add_table("a")
    assert rs.poll(st(T.ABSENT, 0), "a") == [add("a", True)]
    assert rs.state == S.PREPARE


def test_add_table_ignored_unless_absent() -> None:
    rs = replicating_on("a")
    assert rs.handle_add_table("b") == []
    assert rs.state == S.REPLICATING


def test_commit_restart_resends_add_when_promoted_capture_still_prepared() -> None:
    rs = ReplicationSet.rebuild(TID, CP, {})
    rs.handle_add_table("a")
    rs.poll(st(T.PREPARED), "a")
    # The commit request was lost: the capture keeps reporting Prepared.
    assert rs.poll(st(T.PREPARED), "a") == [add("a", False)]
    assert (rs.state, rs.primary) == (S.COMMIT, "a")


def test_add_table_secondary_stops_during_prepare_goes_absent() -> None:
    rs = ReplicationSet.rebuild(TID, CP, {})
    rs.handle_add_table("a")
    assert rs.poll(st(T.STOPPED), "a") == []
    assert (rs.state, dict(rs.captures)) == (S.ABSENT, {})


# --------------------------------------------------------------------------- remove
def test_remove_table_stops_primary_then_removed() -> None:
    rs = replicating_on("a")
    assert rs.handle_remove_table() == [rm("a")]
    assert rs.state == S.REMOVING and not rs.removed
    assert rs.poll(st(T.STOPPING), "a") == []
    assert rs.poll(st(T.STOPPED, 15), "a") == []
    assert rs.removed and rs.checkpoint.checkpoint_ts == 15


def test_remove_restart_resends_remove_while_capture_replicates() -> None:
    rs = replicating_on("a")
    rs.handle_remove_table()
    assert rs.poll(st(T.REPLICATING, 12), "a") == [rm("a")]
    assert rs.state == S.REMOVING


def test_remove_table_ignored_unless_replicating() -> None:
    rs = moving()
    assert rs.handle_remove_table() == []
    assert rs.state == S.PREPARE


def test_remove_table_twice_is_ignored() -> None:
    rs = replicating_on("a")
    rs.handle_remove_table()
    rs.poll(st(T.STOPPED), "a")
    assert rs.handle_remove_table() == []


# --------------------------------------------------------------------------- move
def test_move_table_two_phase_destination_starts_at_source_final_checkpoint() -> None:
    rs = replicating_on("a")
    assert rs.handle_move_table("b") == [add("b", True)]
    assert (rs.state, rs.primary, rs.secondary) == (S.PREPARE, "a", "b")
    assert rs.poll(st(T.REPLICATING, 12), "a") == []
    assert rs.poll(st(T.PREPARED), "b") == [rm("a")]
    assert rs.state == S.COMMIT
    assert rs.poll(st(T.STOPPING, 13), "a") == []
    assert rs.poll(st(T.STOPPED, 14), "a") == [add("b", False, 14, 14)]
    assert (rs.primary, dict(rs.captures)) == ("b", {"b": Role.PRIMARY})
    assert rs.poll(st(T.REPLICATING, 14, 20), "b") == []
    assert (rs.state, rs.checkpoint) == (S.REPLICATING, Checkpoint(14, 20))


def test_move_table_to_same_capture_is_ignored() -> None:
    rs = replicating_on("a")
    assert rs.handle_move_table("a") == []
    assert rs.state == S.REPLICATING


def test_move_table_when_not_replicating_is_ignored() -> None:
    rs = moving("a", "b")
    assert rs.handle_move_table("c") == []
    assert rs.secondary == "b"


def test_move_table_source_keeps_replicating_in_commit_gets_remove_again() -> None:
    rs = moving()
    rs.poll(st(T.PREPARED), "b")
    assert rs.poll(st(T.REPLICATING, 12), "a") == [rm("a")]
    assert rs.state == S.COMMIT


def test_stale_heartbeat_after_move_from_old_primary_is_ignored() -> None:
    rs = moving()
    rs.poll(st(T.PREPARED), "b")
    rs.poll(st(T.STOPPED, 14), "a")
    rs.poll(st(T.REPLICATING, 14), "b")
    assert rs.poll(st(T.REPLICATING, 12), "a") == []  # "a" is no longer in the set
    assert (rs.state, rs.primary) == (S.REPLICATING, "b")


def test_report_from_unknown_capture_is_ignored() -> None:
    rs = replicating_on("a")
    assert rs.poll(st(T.REPLICATING, 50), "zz") == []
    assert rs.checkpoint == CP


# --------------------------------------------------------------------------- capture shutdown
def test_capture_shutdown_primary_while_replicating_goes_absent() -> None:
    rs = replicating_on("a")
    assert rs.handle_capture_shutdown("a") == ([], True)
    assert (rs.state, rs.primary) == (S.ABSENT, None)


def test_capture_shutdown_unrelated_capture_not_affected() -> None:
    rs = replicating_on("a")
    assert rs.handle_capture_shutdown("b") == ([], False)


def test_capture_shutdown_secondary_during_prepare_keeps_primary() -> None:
    rs = moving()
    assert rs.handle_capture_shutdown("b") == ([], True)
    assert (rs.state, rs.primary, rs.secondary) == (S.REPLICATING, "a", None)


def test_capture_shutdown_primary_during_prepare_promotes_secondary_once_prepared() -> None:
    rs = moving()
    assert rs.handle_capture_shutdown("a") == ([], True)
    assert (rs.state, rs.primary, rs.secondary) == (S.PREPARE, None, "b")
    assert rs.poll(st(T.PREPARED), "b") == [add("b", False)]
    assert (rs.state, rs.primary) == (S.COMMIT, "b")


def test_capture_shutdown_primary_during_commit_promotes_secondary() -> None:
    rs = moving()
    rs.poll(st(T.PREPARED), "b")
    msgs, affected = rs.handle_capture_shutdown("a")
    assert affected and msgs == [add("b", False)]
    assert (rs.state, rs.primary) == (S.COMMIT, "b")


def test_capture_shutdown_secondary_during_commit_keeps_primary_replicating() -> None:
    rs = moving()
    rs.poll(st(T.PREPARED), "b")
    assert rs.handle_capture_shutdown("b") == ([], True)
    assert (rs.state, rs.primary, rs.secondary) == (S.COMMIT, "a", None)
    assert rs.poll(st(T.REPLICATING), "a") == []
    assert rs.state == S.REPLICATING


def test_capture_shutdown_promoted_primary_during_commit_goes_absent() -> None:
    rs = moving()
    rs.poll(st(T.PREPARED), "b")
    rs.poll(st(T.STOPPED), "a")
    assert rs.handle_capture_shutdown("b") == ([], True)
    assert (rs.state, dict(rs.captures)) == (S.ABSENT, {})


def test_capture_shutdown_during_removing_completes_removal() -> None:
    rs = replicating_on("a")
    rs.handle_remove_table()
    assert rs.handle_capture_shutdown("a") == ([], True)
    assert rs.removed


# --------------------------------------------------------------------------- undetermined
def test_no_promotion_while_undetermined_capture_may_still_write() -> None:
    reports = {"b": st(T.PREPARED), "c": st(T.STOPPING)}
    rs = ReplicationSet.rebuild(TID, CP, reports)
    assert rs.state == S.COMMIT
    assert rs.poll(st(T.PREPARED), "b") == []  # "c" might still be writing
    assert rs.primary is None
    assert rs.poll(st(T.STOPPED, 16), "c") == []
    assert rs.poll(st(T.PREPARED), "b") == [add("b", False, 16, 16)]


def test_primary_stopping_during_prepare_becomes_undetermined_not_cleared() -> None:
    rs = moving()
    assert rs.poll(st(T.STOPPING, 12), "a") == []
    assert dict(rs.captures) == {"a": Role.UNDETERMINED, "b": Role.SECONDARY}
    rs.poll(st(T.PREPARED), "b")
    assert rs.primary is None  # not promoted while "a" may still write
    rs.poll(st(T.STOPPED, 13), "a")
    assert rs.poll(st(T.PREPARED), "b") == [add("b", False, 13, 13)]


def test_undetermined_in_replicating_is_cleared_when_it_stops() -> None:
    rs = ReplicationSet.rebuild(TID, CP, {"a": st(T.REPLICATING), "b": st(T.STOPPING)})
    rs.poll(st(T.STOPPED), "b")
    assert dict(rs.captures) == {"a": Role.PRIMARY}


def test_only_undetermined_after_rebuild_goes_absent_when_it_stops() -> None:
    rs = ReplicationSet.rebuild(TID, CP, {"a": st(T.STOPPING)})
    assert rs.state == S.REMOVING
    rs.poll(st(T.STOPPED), "a")
    assert rs.state == S.ABSENT and not rs.removed  # re-added, not dropped


# --------------------------------------------------------------------------- progress
def test_checkpoint_never_regresses() -> None:
    rs = replicating_on("a", 20)
    rs.poll(st(T.REPLICATING, 15, 18), "a")
    assert rs.checkpoint == Checkpoint(20, 20)
    rs.poll(st(T.REPLICATING, 19, 30), "a")
    assert rs.checkpoint == Checkpoint(20, 30)


def test_second_replicating_capture_raises_multiple_primary() -> None:
    rs = moving()
    rs.poll(st(T.PREPARED), "b")
    with pytest.raises(MultiplePrimaryError):
        rs.poll(st(T.REPLICATING), "b")


# --------------------------------------------------------------------------- random walk
@pytest.mark.parametrize("seed", range(20))
def test_random_walk_keeps_invariants(seed: int) -> None:
    """Fixed seeds over every (state, capture) input; invariants are checked inside poll."""
    rng = random.Random(seed)
    rs = ReplicationSet.rebuild(TID, CP, {})
    captures = ["a", "b", "c"]
    last = rs.checkpoint
    for step in range(300):
        op = rng.random()
        cid = rng.choice(captures)
        if op < 0.1:
            rs.handle_add_table(cid)
        elif op < 0.2:
            rs.handle_move_table(cid)
        elif op < 0.25:
            rs.handle_remove_table()
        elif op < 0.35:
            rs.handle_capture_shutdown(cid)
        else:
            state = rng.choice(list(T))
            if state == T.REPLICATING and rs.primary not in (None, cid):
                continue  # two writers is a MultiplePrimaryError, tested above
            ck = last.checkpoint_ts + rng.randrange(3)
            try:
                msgs = rs.poll(TableStatus(TID, state, Checkpoint(ck, ck + 1)), cid)
            except MultiplePrimaryError:
                continue
            assert len(msgs) <= 1, f"step {step}: {msgs}"
        assert rs.checkpoint.checkpoint_ts >= last.checkpoint_ts
        assert rs.checkpoint.resolved_ts >= last.resolved_ts
        last = rs.checkpoint
        if rs.removed:
            rs = ReplicationSet.rebuild(TID, last, {})


# --------------------------------------------------------------------------- issue 10: stall
def test_secondary_stops_in_prepare_while_undetermined_remains_and_no_primary() -> None:
    # Rebuilt after an owner switch mid-move: the old primary is stopping, the destination
    # prepares. The destination then stops (or restarts): it leaves the set exactly once.
    rs = ReplicationSet.rebuild(TID, CP, {"a": st(T.STOPPING, 12), "b": st(T.PREPARING)})
    assert rs.state == S.PREPARE
    assert rs.poll(st(T.STOPPED, 10), "b") == []  # raised KeyError: "b" deleted twice
    assert dict(rs.captures) == {"a": Role.UNDETERMINED}
    assert rs.state == S.REMOVING and not rs.removed
    rs.poll(st(T.STOPPED, 14), "a")
    # Not a table removal: the table goes Absent at a's final checkpoint, to be re-added.
    assert rs.state == S.ABSENT and not rs.removed
    assert rs.checkpoint == Checkpoint(14, 14)


def test_secondary_absent_in_prepare_with_undetermined_gets_the_add_again() -> None:
    rs = ReplicationSet.rebuild(TID, CP, {"a": st(T.STOPPING, 12), "b": st(T.PREPARING)})
    assert rs.poll(st(T.ABSENT), "b") == [add("b", True, 12)]  # the add was lost: re-send


@pytest.mark.parametrize("report", [T.STOPPED, T.ABSENT])
def test_secondary_stops_in_commit_while_undetermined_remains_and_no_primary(report) -> None:
    rs = ReplicationSet.rebuild(TID, CP, {"a": st(T.STOPPING, 12), "b": st(T.PREPARED)})
    assert rs.state == S.COMMIT
    assert rs.poll(st(report, 10), "b") == []
    assert dict(rs.captures) == {"a": Role.UNDETERMINED}


def test_destination_capture_gone_while_undetermined_remains_and_no_primary() -> None:
    rs = ReplicationSet.rebuild(TID, CP, {"a": st(T.STOPPING, 12), "b": st(T.PREPARED)})
    assert rs.handle_capture_shutdown("b") == ([], True)
    assert dict(rs.captures) == {"a": Role.UNDETERMINED}
    assert rs.handle_capture_shutdown("a") == ([], True)
    assert rs.state == S.ABSENT


def test_removed_table_whose_last_undetermined_capture_stops_is_removed() -> None:
    rs = ReplicationSet.rebuild(TID, CP, {"a": st(T.REPLICATING), "b": st(T.STOPPING)})
    assert rs.handle_remove_table() == [rm("a")]
    rs.poll(st(T.STOPPED), "a")
    assert not rs.removed
    rs.poll(st(T.STOPPED), "b")
    assert rs.removed


# --------------------------------------------------------------------------- issue 10: checkpoint
def test_stopped_report_of_undetermined_capture_does_not_raise_checkpoint_past_primary() -> None:
    rs = ReplicationSet.rebuild(TID, CP, {"b": st(T.REPLICATING, 100), "a": st(T.STOPPING, 90)})
    assert rs.checkpoint == Checkpoint(100, 100)
    rs.poll(st(T.STOPPED, 150), "a")  # "b" sinks the table and is only at 100
    assert rs.checkpoint == Checkpoint(100, 100)


def test_rebuild_takes_checkpoint_only_from_primary_when_there_is_one() -> None:
    rs = ReplicationSet.rebuild(TID, CP, {"b": st(T.REPLICATING, 100), "a": st(T.STOPPING, 150)})
    assert rs.checkpoint == Checkpoint(100, 100)


def test_undetermined_final_checkpoint_is_where_the_next_primary_starts() -> None:
    rs = ReplicationSet.rebuild(TID, CP, {"a": st(T.STOPPING, 12), "b": st(T.PREPARED)})
    assert rs.poll(st(T.STOPPED, 16), "a") == []
    assert rs.checkpoint == Checkpoint(16, 16)
    assert rs.poll(st(T.PREPARED), "b") == [add("b", False, 16, 16)]


def test_absent_report_carries_no_progress() -> None:
    rs = ReplicationSet.rebuild(TID, CP, {"a": st(T.STOPPING, 12)})
    rs.poll(st(T.ABSENT, 50), "a")
    assert rs.checkpoint == Checkpoint(12, 12)


def test_replicating_report_of_non_primary_while_removing_carries_no_progress() -> None:
    rs = ReplicationSet.rebuild(TID, CP, {"a": st(T.REPLICATING), "b": st(T.STOPPING)})
    rs.handle_remove_table()
    assert rs.poll(st(T.REPLICATING, 50), "b") == [rm("b")]
    assert rs.checkpoint == CP


@pytest.mark.parametrize("order", ["prepared_first", "preparing_first"])
def test_rebuild_keeps_the_more_advanced_of_two_secondaries(order: str) -> None:
    reports = {"a": st(T.PREPARING, 10), "b": st(T.PREPARED, 10)}
    if order == "prepared_first":
        reports = dict(reversed(reports.items()))
    rs = ReplicationSet.rebuild(TID, CP, reports)
    assert dict(rs.captures) == {"a": Role.UNDETERMINED, "b": Role.SECONDARY}
    assert rs.state == S.COMMIT


def test_rebuild_keeps_the_higher_checkpoint_of_two_preparing_secondaries() -> None:
    rs = ReplicationSet.rebuild(TID, CP, {"a": st(T.PREPARING, 10), "b": st(T.PREPARING, 12)})
    assert dict(rs.captures) == {"a": Role.UNDETERMINED, "b": Role.SECONDARY}


def test_rebuild_with_no_primary_starts_the_next_primary_at_a_stopped_final_checkpoint() -> None:
    # The old primary stopped (its one Stopped report reached the new owner) and the
    # destination is prepared: the destination must sink from the final checkpoint.
    rs = ReplicationSet.rebuild(TID, CP, {"a": st(T.STOPPED, 150), "b": st(T.PREPARED, 100)})
    assert rs.checkpoint == Checkpoint(150, 150)
    assert rs.poll(st(T.PREPARED, 100), "b") == [add("b", False, 150)]


def test_rebuild_with_a_primary_ignores_a_stopped_report() -> None:
    rs = ReplicationSet.rebuild(TID, CP, {"a": st(T.STOPPED, 150), "b": st(T.REPLICATING, 100)})
    assert rs.checkpoint == Checkpoint(100, 100)
