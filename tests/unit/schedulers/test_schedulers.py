"""Scenario tests for each scheduling policy and for CaptureManager, one tick at a time."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from scheduler_core import Checkpoint, TableState, TableStatus
from scheduler_core.captures import CaptureManager, CaptureState, CaptureStatus
from scheduler_core.errors import ConfigError, SchedulerError
from scheduler_core.messages import Header, HeartbeatResponse, Liveness, TableStatusBatch
from scheduler_core.replication_manager import ReplicationManager
from scheduler_core.schedule_tasks import BurstAddTask, BurstTask, MoveTableTask, RemoveTableTask
from scheduler_core.schedulers import (
    BasicScheduler,
    DrainCaptureScheduler,
    MoveTableScheduler,
    RebalanceScheduler,
    ScheduleContext,
)

T = TableState
CP = Checkpoint.at(100)


def cluster(placement: dict[str, list[int]], *, stopping: tuple[str, ...] = ()) -> ScheduleContext:
    """Every listed table replicates on its capture; ``current`` = the listed tables."""
    rm = ReplicationManager()
    reports = {
        c: TableStatusBatch.of([TableStatus(t, T.REPLICATING, CP) for t in tids])
        for c, tids in placement.items()
    }
    rm.rebuild(reports, CP)
    caps = {}
    for c in placement:
        state = CaptureState.STOPPING if c in stopping else CaptureState.INITIALIZED
        caps[c] = CaptureStatus(c, f"{c}-r", state, f"{c}-e")
    current = np.asarray(sorted(t for tids in placement.values() for t in tids), np.int64)
    return ScheduleContext(100, current, {}, caps, rm)


def with_current(ctx: ScheduleContext, current: list[int], start_ts=None) -> ScheduleContext:
    return ScheduleContext(
        ctx.checkpoint_ts,
        np.asarray(current, np.int64),
        start_ts or {},
        ctx.captures,
        ctx.replications,
    )


# --------------------------------------------------------------------------- basic
def test_basic_adds_missing_tables_to_the_least_loaded_captures_at_their_start_ts() -> None:
    ctx = with_current(cluster({"a": [1, 2, 3], "b": [4]}), [1, 2, 3, 4, 5, 6], {6: 150})
    [task] = BasicScheduler().schedule(ctx)
    assert isinstance(task, BurstAddTask)
    assert task.table_ids.tolist() == [5, 6]
    assert [task.captures[i] for i in task.capture_index] == ["b", "b"]
    assert task.checkpoint_ts.tolist() == [100, 150]


def test_basic_adds_in_bounded_bursts() -> None:
    ctx = with_current(cluster({"a": [1]}), list(range(1, 12)))
    [task] = BasicScheduler(add_table_batch_size=4).schedule(ctx)
    assert task.table_ids.tolist() == [2, 3, 4, 5]


def test_basic_removes_tables_the_changefeed_no_longer_has() -> None:
    ctx = with_current(cluster({"a": [1, 2], "b": [3]}), [1])
    [burst] = BasicScheduler().schedule(ctx)
    assert isinstance(burst, BurstTask)
    assert sorted(burst.tasks, key=lambda t: t.table_id) == [
        RemoveTableTask(2, "a"),
        RemoveTableTask(3, "b"),
    ]


def test_basic_waits_when_no_capture_accepts_tables() -> None:
    ctx = with_current(cluster({"a": [1]}, stopping=("a",)), [1, 2])
    assert BasicScheduler().schedule(ctx) == []


def test_basic_adds_no_table_to_a_capture_being_drained() -> None:
    base = with_current(cluster({"a": [1, 2, 3], "b": []}), [1, 2, 3, 4, 5])
    ctx = dataclasses.replace(base, draining="b")
    [task] = BasicScheduler().schedule(ctx)
    assert {task.captures[i] for i in task.capture_index} == {"a"}


def test_basic_batch_size_below_one_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="add_table_batch_size"):
        BasicScheduler(add_table_batch_size=0)


# --------------------------------------------------------------------------- drain
def test_drain_moves_a_batch_of_the_targets_tables_to_the_least_loaded_others() -> None:
    ctx = cluster({"a": [1, 2, 3, 4], "b": [5, 6], "c": []})
    drain = DrainCaptureScheduler(batch_size=3)
    drain.drain("a", sorted(ctx.captures))
    tasks = drain.schedule(ctx)
    assert [t.table_id for t in tasks] == [1, 2, 3]
    assert [t.dest_capture_id for t in tasks] == ["c", "c", "b"]


def test_drain_ends_when_the_target_holds_nothing() -> None:
    ctx = cluster({"a": [], "b": [1]})
    drain = DrainCaptureScheduler()
    drain.drain("a", sorted(ctx.captures))
    assert drain.schedule(ctx) == [] and drain.target is None


def test_drain_ends_when_the_target_capture_is_gone() -> None:
    ctx = cluster({"b": [1]})
    drain = DrainCaptureScheduler()
    drain.drain("a", ["a", "b"])
    assert drain.schedule(ctx) == [] and drain.target is None


def test_drain_refuses_a_second_target_and_an_unknown_capture() -> None:
    drain = DrainCaptureScheduler()
    drain.drain("a", ["a", "b", "c"])
    with pytest.raises(ConfigError, match="already draining"):
        drain.drain("b", ["a", "b", "c"])
    with pytest.raises(ConfigError, match="not an alive capture"):
        DrainCaptureScheduler().drain("z", ["a", "b"])


# --------------------------------------------------------------------------- move
def test_move_hands_over_valid_moves_and_drops_invalid_ones() -> None:
    ctx = cluster({"a": [1, 2], "b": [3]}, stopping=("b",))
    move = MoveTableScheduler()
    move.request(1, "b")  # b is stopping: accepts no tables
    move.request(9, "a")  # not in the changefeed
    move.request(3, "a")
    assert move.schedule(ctx) == [MoveTableTask(3, "a")]
    assert move.pending == ()


def test_move_of_a_table_that_is_not_replicating_is_dropped() -> None:
    ctx = cluster({"a": [1], "b": []})
    ctx.replications.handle_tasks([MoveTableTask(1, "b")])  # now in PREPARE
    move = MoveTableScheduler()
    move.request(1, "b")
    assert move.schedule(ctx) == []


# --------------------------------------------------------------------------- rebalance
# (the balance scheduler has its own module: test_balance.py)
def test_rebalance_runs_once_when_requested_and_everything_replicates() -> None:
    ctx = cluster({"a": [1, 2, 3, 4], "b": []})
    rebalance = RebalanceScheduler(rng=random.Random(0))
    assert rebalance.schedule(ctx) == []  # not requested
    rebalance.request()
    [burst] = rebalance.schedule(ctx)
    assert len(burst.tasks) == 2
    assert rebalance.schedule(ctx) == []  # one-shot


# --------------------------------------------------------------------------- CaptureManager
def response(
    cid: str, epoch: str, seq: int, reg: str, liveness=Liveness.ALIVE
) -> HeartbeatResponse:
    return HeartbeatResponse(
        Header(1, epoch, 1, seq), cid, "owner", TableStatusBatch.of([]), liveness, reg
    )


def test_capture_joins_uninitialized_and_initializes_on_its_first_response() -> None:
    cm = CaptureManager()
    changes = cm.update_alive({"a": "r1", "b": "r2"})
    assert changes.joined == ("a", "b") and not cm.all_initialized()
    assert cm.accept("a", "a-e", 1) and cm.handle_response(response("a", "a-e", 1, "r1"))
    assert cm.captures["a"].state == CaptureState.INITIALIZED and not cm.all_initialized()
    cm.handle_response(response("b", "b-e", 1, "r2"))
    assert cm.all_initialized()


def test_capture_that_re_registers_is_a_leave_plus_a_join_with_its_epoch_forgotten() -> None:
    cm = CaptureManager()
    cm.update_alive({"a": "r1"})
    cm.handle_response(response("a", "a-e1", 1, "r1"))
    changes = cm.update_alive({"a": "r2"})
    assert changes.removed == ("a",) and changes.joined == ("a",)
    assert cm.epoch_of("a") == "" and cm.captures["a"].state == CaptureState.UNINITIALIZED


def test_capture_manager_drops_other_epochs_and_old_seqs() -> None:
    cm = CaptureManager()
    cm.update_alive({"a": "r1"})
    cm.handle_response(response("a", "a-e1", 5, "r1"))
    assert not cm.accept("a", "a-e0", 9)  # a stale epoch
    assert not cm.accept("a", "a-e1", 5)  # a repeat
    assert not cm.accept("zz", "x", 1)  # unknown capture
    assert cm.accept("a", "a-e1", 6)


def test_stopping_capture_accepts_no_new_tables() -> None:
    cm = CaptureManager()
    cm.update_alive({"a": "r1"})
    cm.handle_response(response("a", "a-e", 1, "r1", Liveness.STOPPING))
    assert cm.captures["a"].state == CaptureState.STOPPING
    assert not cm.captures["a"].schedulable and cm.all_initialized()


# --------------------------------------------------------------------------- errors
def test_config_errors_are_scheduler_errors() -> None:
    with pytest.raises(SchedulerError):
        ReplicationManager(max_task_concurrency=0)
    with pytest.raises(SchedulerError):
        BasicScheduler(add_table_batch_size=0)
