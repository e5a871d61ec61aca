"""ReplicationManager: the vectorised column paths behave exactly like ReplicationSet objects."""

from __future__ import annotations

import random

import numpy as np
import pytest

from scheduler_core import Checkpoint, ReplicationSet, TableState, TableStatus
from scheduler_core.messages import AddTableRequest, TableStatusBatch
from scheduler_core.model import ReplicationSetState
from scheduler_core.replication_manager import ReplicationManager
from scheduler_core.schedule_tasks import BurstAddTask, MoveTableTask
from scheduler_core.schedulers.basic import fill_evenly

T = TableState
CAPS = ("a", "b")


def burst_add(tid: int, capture: str, ts: int) -> BurstAddTask:
    return BurstAddTask(
        np.asarray([tid], np.int64), (capture,), np.zeros(1, np.int64), np.asarray([ts], np.int64)
    )


def manager_out(rm: ReplicationManager, msgs: list) -> list:
    """Dispatches from a call plus the columnar adds it queued, as request objects."""
    out = list(msgs)
    for cid, batch in sorted(rm.take_add_batches().items()):
        out.extend(batch.requests(cid))
    return out


def snapshot(view_or_rs) -> tuple:
    return (
        view_or_rs.state,
        view_or_rs.primary,
        dict(view_or_rs.captures),
        view_or_rs.checkpoint,
    )


@pytest.mark.parametrize("seed", range(40))
def test_columnar_add_path_matches_replication_set_step_by_step(seed: int) -> None:
    rng = random.Random(seed)
    tid, start = 7, 100
    rs = ReplicationSet(tid, Checkpoint.at(start))
    rm = ReplicationManager()
    assert manager_out(rm, rm.handle_tasks([burst_add(tid, "a", start)])) == rs.handle_add_table(
        "a"
    )
    ck = start
    for step in range(25):
        cid = rng.choice(CAPS)
        state = rng.choice([T.ABSENT, T.PREPARING, T.PREPARED, T.REPLICATING, T.STOPPED])
        if state == T.REPLICATING and rs.primary not in (None, cid):
            continue  # a second writer raises MultiplePrimaryError in both, tested elsewhere
        ck += rng.randrange(3)
        status = TableStatus(tid, state, Checkpoint(ck, ck + 5))
        expected = rs.poll(status, cid)
        got = manager_out(rm, rm.handle_batch(cid, TableStatusBatch.of([status])))
        assert got == expected, f"step {step}: {status} from {cid}"
        assert snapshot(rm.view(tid)) == snapshot(rs), f"step {step}"
        if rs.state == ReplicationSetState.ABSENT:
            break


def test_burst_add_of_many_tables_emits_one_columnar_batch_per_capture() -> None:
    rm = ReplicationManager()
    ids = np.arange(1, 1001, dtype=np.int64)
    task = BurstAddTask(ids, ("a", "b"), ids % 2, np.full(1000, 50, np.int64))
    assert rm.handle_tasks([task]) == []
    batches = rm.take_add_batches()
    assert sorted(batches) == ["a", "b"]
    assert len(batches["a"]) == len(batches["b"]) == 500
    assert set(batches["a"].is_secondary.tolist()) == {1}
    assert rm.table_counts(["a", "b"]) == {"a": 500, "b": 500}
    assert rm.owned_tables("a").tolist() == ids[ids % 2 == 0].tolist()


def test_steady_table_materialises_for_a_move_and_folds_back() -> None:
    rm = ReplicationManager()
    rm.handle_tasks([burst_add(1, "a", 10)])
    rm.take_add_batches()
    rm.handle_batch("a", TableStatusBatch.of([TableStatus(1, T.PREPARED, Checkpoint.at(10))]))
    rm.take_add_batches()
    rm.handle_batch("a", TableStatusBatch.of([TableStatus(1, T.REPLICATING, Checkpoint(12, 15))]))
    assert rm.active() == {} and rm.view(1).state == ReplicationSetState.REPLICATING
    msgs = rm.handle_tasks([MoveTableTask(1, "b")])
    assert msgs == [AddTableRequest("b", 1, True, Checkpoint(12, 15))]
    assert 1 in rm.active()


@pytest.mark.parametrize(
    ("counts", "k", "quota"),
    [
        ([0, 0, 0], 7, [3, 2, 2]),
        ([5, 0, 2], 4, [0, 3, 1]),
        ([5, 0, 2], 0, [0, 0, 0]),
        ([1, 1], 1, [1, 0]),
        ([10, 0], 3, [0, 3]),
    ],
)
def test_fill_evenly_levels_the_load(counts: list[int], k: int, quota: list[int]) -> None:
    assert fill_evenly(np.asarray(counts, np.int64), k).tolist() == quota


def batch(*rows: tuple[int, TableState, int]) -> TableStatusBatch:
    return TableStatusBatch.of([TableStatus(t, s, Checkpoint.at(c)) for t, s, c in rows])


def test_destination_crash_mid_move_after_owner_switch_frees_every_table_it_held() -> None:
    # Issue 10's stall: move of table 1 from a to b in flight, owner crash, then b crashes.
    # Rebuilt: table 1 {a Stopping, b Prepared}, table 2 Replicating on b. Removing b used
    # to raise KeyError on table 1 and leave table 2 Replicating on the dead capture.
    rm = ReplicationManager()
    reports = {
        "a": batch((1, T.STOPPING, 100)),
        "b": batch((1, T.PREPARED, 100), (2, T.REPLICATING, 100)),
    }
    rm.rebuild(reports, Checkpoint.at(90))
    assert rm.handle_capture_removed("b") == []
    assert rm.view(2).state == ReplicationSetState.ABSENT
    assert rm.view(1).state == ReplicationSetState.REMOVING  # waits for a to stop
    assert rm.handle_statuses("a", [TableStatus(1, T.STOPPED, Checkpoint.at(110))]) == []
    assert rm.view(1).state == ReplicationSetState.ABSENT
    assert rm.view(1).checkpoint == Checkpoint.at(110)
    assert sorted(rm.absent_tables().tolist()) == [1, 2]


def test_burst_add_listing_a_table_twice_raises_before_any_state_changes() -> None:
    from scheduler_core.errors import InvalidMessageError

    rm = ReplicationManager()
    rm.rebuild({"a": batch((1, T.REPLICATING, 100))}, Checkpoint.at(90))
    task = BurstAddTask(
        np.asarray([5, 1, 5], np.int64),
        ("a", "zz"),
        np.asarray([0, 1, 1], np.int64),
        np.full(3, 100, np.int64),
    )
    with pytest.raises(InvalidMessageError, match=r"\[5\]"):
        rm.handle_tasks([task])
    assert rm.table_ids.tolist() == [1]
    assert rm.take_add_batches() == {} and not rm.running_tasks
    assert "zz" not in rm.table_counts(["zz"]) or rm.table_counts(["zz"]) == {"zz": 0}
    assert "zz" not in rm._cap_index


@pytest.mark.parametrize("seed", range(30))
def test_columnar_paths_match_replication_sets_on_random_mixed_multi_table_batches(
    seed: int,
) -> None:
    """Many tables at once: burst adds, moves, and reports of every state for several tables
    in one batch; each table's view must equal a ReplicationSet fed the same inputs."""
    from scheduler_core.errors import SchedulerError

    rng = random.Random(seed)
    caps = ("a", "b", "c")
    tids = list(range(1, 13))
    rm = ReplicationManager(max_task_concurrency=100)
    ref = {t: ReplicationSet(t, Checkpoint.at(100)) for t in tids}
    placement = [rng.randrange(3) for _ in tids]
    task = BurstAddTask(
        np.asarray(tids, np.int64),
        caps,
        np.asarray(placement, np.int64),
        np.full(12, 100, np.int64),
    )
    got = manager_out(rm, rm.handle_tasks([task]))
    want = [
        m for t, c in zip(tids, placement, strict=True) for m in ref[t].handle_add_table(caps[c])
    ]
    assert sorted(map(repr, got)) == sorted(map(repr, want))
    failed: set[int] = set()
    ck = 100
    for step in range(60):
        if rng.random() < 0.15:
            tid, dest = rng.choice(tids), rng.choice(caps)
            if tid in failed or tid in rm.running_tasks:
                continue
            if rm.view(tid).state != ReplicationSetState.REPLICATING:
                continue
            got = manager_out(rm, rm.handle_tasks([MoveTableTask(tid, dest)]))
            assert got == ref[tid].handle_move_table(dest), f"step {step}: move {tid}"
            continue
        cid = rng.choice(caps)
        ck += rng.randrange(3)
        statuses = [
            TableStatus(t, rng.choice(list(T)), Checkpoint(ck, ck + 5))
            for t in rng.sample(tids, rng.randint(1, len(tids)))
        ]
        want = []
        for s in statuses:
            if s.table_id in failed:
                continue
            try:
                want.extend(ref[s.table_id].poll(s, cid))
            except SchedulerError:
                failed.add(s.table_id)
        got = manager_out(rm, rm.handle_batch(cid, TableStatusBatch.of(statuses)))
        assert sorted(map(repr, got)) == sorted(map(repr, want)), f"step {step}"
        assert set(rm.failures) == failed
        for t in tids:
            if t not in failed:
                assert snapshot(rm.view(t)) == snapshot(ref[t]), f"step {step}: table {t}"


def test_rebuild_keeps_a_stopped_final_checkpoint_for_the_next_primary() -> None:
    rm = ReplicationManager()
    reports = {
        "a": batch((1, T.STOPPED, 150), (2, T.STOPPED, 160)),
        "b": batch((1, T.PREPARED, 100), (3, T.REPLICATING, 120)),
        "c": batch((3, T.STOPPED, 170)),
    }
    rm.rebuild(reports, Checkpoint.at(90))
    assert rm.view(1).checkpoint == Checkpoint.at(150)
    assert rm.view(1).state == ReplicationSetState.COMMIT
    assert rm.view(2).state == ReplicationSetState.ABSENT  # re-added from its final checkpoint
    assert rm.view(2).checkpoint == Checkpoint.at(160)
    assert rm.view(3).checkpoint == Checkpoint.at(120)  # the primary's, not c's Stopped
    assert rm.view(3).primary == "b" and 3 not in rm.active()
