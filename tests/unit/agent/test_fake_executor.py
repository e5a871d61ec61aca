"""FakeDownstream / FakeExecutor scenarios: fencing, idempotent replay, the commit contract."""

from __future__ import annotations

import pytest

from scheduler_core.errors import ExecutorContractError, InvalidMessageError
from scheduler_core.executor import TableExecutor
from scheduler_core.messages import Barrier, TableStatusBatch
from scheduler_core.model import Checkpoint, TableState, TableStatus
from scheduler_core.sim.fake_executor import (
    KEYS,
    FakeDownstream,
    FakeExecutor,
    FakeUpstream,
    WriteRecord,
    change_ts,
)

T = TableState


def rig(**kw: int) -> tuple[FakeExecutor, FakeDownstream, FakeUpstream]:
    upstream = FakeUpstream(100)
    downstream = FakeDownstream(initial_ts=100)
    executor = FakeExecutor("c1", downstream, upstream, **kw)
    executor.set_barrier(Barrier())  # no barrier: the agent passes the owner's each tick
    return executor, downstream, upstream


def replicating(executor: FakeExecutor, table_id: int, ts: int = 100) -> None:
    executor.prepare(table_id, Checkpoint.at(ts))
    while executor.status(table_id).state == T.PREPARING:
        executor.advance()
    executor.commit(table_id, Checkpoint.at(ts))


# --------------------------------------------------------------------- downstream
def test_fake_downstream_fencing_refuses_old_token_write() -> None:
    down = FakeDownstream(100)
    old = down.acquire(1, "c1")
    new = down.acquire(1, "c2")
    assert new > old
    assert down.write(1, old, 150, "c1") is False
    assert down.write(1, new, 160, "c2") is True
    assert (down.committed(1), down.refused_writes) == (160, 1)
    assert down.log == [WriteRecord(1, new, "c2", 160)]


def test_replay_of_same_batch_end_is_noop() -> None:
    down = FakeDownstream(100)
    token = down.acquire(1, "c1")
    assert down.write(1, token, 150, "c1") is True
    assert down.write(1, token, 150, "c1") is True
    assert down.write(1, token, 120, "c1") is True  # an older batch: already in
    assert down.committed(1) == 150
    assert down.log == [WriteRecord(1, token, "c1", 150)]


def test_token_used_by_another_holder_raises() -> None:
    down = FakeDownstream(100)
    token = down.acquire(1, "c1")
    with pytest.raises(ExecutorContractError, match="not transferable"):
        down.write(1, token, 150, "c2")


def test_created_table_is_readable_at_its_ts_and_only_created_once() -> None:
    down = FakeDownstream(100)
    down.create_table(7, 500)
    assert (down.committed(7), down.committed(8)) == (500, 100)
    with pytest.raises(InvalidMessageError):
        down.create_table(7, 600)


def test_upstream_resolved_never_goes_back() -> None:
    up = FakeUpstream(100)
    up.advance(200)
    with pytest.raises(InvalidMessageError):
        up.advance(150)
    assert up.resolved_ts(3) == 200


# --------------------------------------------------------------------- executor
def test_fake_executor_is_a_table_executor() -> None:
    assert isinstance(rig()[0], TableExecutor)


def test_prepare_reaches_prepared_after_prepare_ticks() -> None:
    ex, _, up = rig(prepare_ticks=2)
    ex.prepare(1, Checkpoint.at(100))
    up.advance(130)
    states = []
    for _ in range(2):
        ex.advance()
        states.append(ex.status(1))
    assert states == [
        TableStatus(1, T.PREPARING, Checkpoint(100, 130)),
        TableStatus(1, T.PREPARED, Checkpoint(100, 130)),
    ]


@pytest.mark.parametrize(
    ("case", "prepared_from", "commit_at", "downstream_at"),
    [
        ("would skip the changes", 200, 150, 200),  # (a)
        ("writes are not readable", 150, 150, 100),  # (b)
        ("commit only a PREPARED table", None, 150, 150),
    ],
)
def test_commit_contract_violation_raises(
    case: str, prepared_from: int | None, commit_at: int, downstream_at: int
) -> None:
    ex, down, _ = rig(prepare_ticks=0)
    down.create_table(1, downstream_at)
    if prepared_from is not None:
        ex.prepare(1, Checkpoint.at(prepared_from))
    with pytest.raises(ExecutorContractError, match=case):
        ex.commit(1, Checkpoint.at(commit_at))
    assert down.current_token(1) == 0


def test_commit_at_previous_primary_final_checkpoint_then_sinks() -> None:
    ex, down, up = rig(prepare_ticks=0)
    down.create_table(1, 150)  # the previous primary stopped at 150
    ex.prepare(1, Checkpoint.at(120))
    ex.commit(1, Checkpoint.at(150))
    up.advance(170)
    ex.advance()
    assert ex.status(1) == TableStatus(1, T.REPLICATING, Checkpoint(170, 170))
    assert down.log == [WriteRecord(1, 1, "c1", 170)]


def test_sink_never_passes_barrier() -> None:
    ex, down, up = rig()
    replicating(ex, 1)
    replicating(ex, 2)
    ex.set_barrier(Barrier(global_barrier_ts=300, table_barriers={2: 200}))
    up.advance(400)
    ex.advance()
    assert (down.committed(1), down.committed(2)) == (300, 200)
    assert ex.status(2) == TableStatus(2, T.REPLICATING, Checkpoint(200, 400))


def test_zombie_primary_write_fenced_after_takeover() -> None:
    up = FakeUpstream(100)
    down = FakeDownstream(100)
    old = FakeExecutor("c1", down, up)
    new = FakeExecutor("c2", down, up, prepare_ticks=0)
    old.set_barrier(Barrier())
    new.set_barrier(Barrier())
    replicating(old, 1)
    up.advance(150)
    old.advance()
    new.prepare(1, Checkpoint.at(150))
    new.commit(1, Checkpoint.at(150))  # c1 lost its lease; c2 takes the table at 150
    up.advance(200)
    old.advance()
    new.advance()
    assert old.status(1) == TableStatus(1, T.STOPPED, Checkpoint(150, 200))
    assert old.fenced_writes == 1
    assert down.log == [WriteRecord(1, 1, "c1", 150), WriteRecord(1, 2, "c2", 200)]


def test_remove_flushes_then_stops_with_final_checkpoint() -> None:
    ex, down, up = rig(stop_ticks=2)
    replicating(ex, 1)
    ex.remove(1)
    ex.remove(1)  # idempotent
    up.advance(150)
    ex.advance()
    assert ex.status(1) == TableStatus(1, T.STOPPING, Checkpoint(150, 150))
    up.advance(160)
    ex.advance()
    assert ex.status(1) == TableStatus(1, T.STOPPED, Checkpoint(160, 160))
    up.advance(170)
    ex.advance()  # stopped: no more writes
    assert down.committed(1) == 160
    ex.forget(1)
    assert ex.status(1) == TableStatus(1, T.ABSENT, Checkpoint(0, 0))


def test_forget_requires_stopped() -> None:
    ex, _, _ = rig()
    replicating(ex, 1)
    with pytest.raises(ExecutorContractError, match="only a STOPPED table"):
        ex.forget(1)
    ex.forget(2)  # absent: nothing to do


def test_prepare_of_held_table_raises() -> None:
    ex, _, _ = rig()
    ex.prepare(1, Checkpoint.at(100))
    with pytest.raises(ExecutorContractError, match="prepare only an ABSENT table"):
        ex.prepare(1, Checkpoint.at(100))


def test_statuses_cover_every_held_table_with_checkpoint_at_most_resolved() -> None:
    ex, _, up = rig(prepare_ticks=2)
    replicating(ex, 1)
    ex.prepare(2, Checkpoint.at(100))
    ex.prepare(3, Checkpoint.at(100))
    ex.remove(3)
    up.advance(500)
    ex.set_barrier(Barrier(global_barrier_ts=300))
    ex.advance()
    batch = ex.statuses()
    assert batch == TableStatusBatch.of(
        [
            TableStatus(1, T.REPLICATING, Checkpoint(300, 500)),
            TableStatus(2, T.PREPARING, Checkpoint(100, 500)),
            TableStatus(3, T.STOPPED, Checkpoint(100, 500)),
        ]
    )
    assert (batch.checkpoint_ts <= batch.resolved_ts).all()


# --------------------------------------------------------------------- content (issue 10)
START_MS = 1_000_000
T0 = START_MS << 18


def content_rig() -> FakeDownstream:
    return FakeDownstream(T0)


def test_downstream_keeps_each_keys_version() -> None:
    down = content_rig()
    token = down.acquire(1, "c1")
    assert down.write(1, token, change_ts(6, START_MS), "c1")
    for n in range(3, 7):
        assert down.version(1, n % KEYS) == change_ts(n, START_MS)


def test_replay_from_below_committed_writing_older_versions_is_a_violation() -> None:
    down = content_rig()
    token = down.acquire(1, "c1")
    down.write(1, token, change_ts(8, START_MS), "c1")
    assert down.violations == []
    # A sink that started below what is downstream rewrites keys 2..5 with older versions.
    down.write(1, token, change_ts(9, START_MS), "c1", from_ts=change_ts(1, START_MS))
    assert down.violations and "over the newer" in down.violations[0]


def test_write_after_the_table_was_dropped_is_a_violation() -> None:
    down = content_rig()
    token = down.acquire(1, "c1")
    down.write(1, token, change_ts(2, START_MS), "c1")
    down.drop_table(1, change_ts(2, START_MS) + 1)
    down.write(1, token, change_ts(2, START_MS), "c1")  # nothing new: fine
    assert down.violations == []
    down.write(1, token, change_ts(3, START_MS), "c1")
    assert down.violations and "after a DDL dropped it" in down.violations[0]


def test_commit_below_committed_starts_at_committed_and_is_noted() -> None:
    upstream = FakeUpstream(change_ts(10, START_MS))
    down = content_rig()
    old = FakeExecutor("c0", down, upstream)
    replicating(old, 1, T0)
    old.set_barrier(Barrier())
    old.advance()  # c0 sinks to change 10, then is lost without reporting it
    ex = FakeExecutor("c1", down, upstream)
    ex.set_barrier(Barrier())
    replicating(ex, 1, T0)  # told the last checkpoint the owner heard of
    assert ex.status(1).checkpoint.checkpoint_ts == change_ts(10, START_MS)
    assert down.handoffs_below_committed == [(1, "c1", T0, change_ts(10, START_MS))]
    upstream.advance(change_ts(12, START_MS))
    ex.advance()
    assert down.violations == []  # it skipped what is already there


def test_stopping_table_that_still_holds_its_token_counts_as_sinking() -> None:
    ex, _, _ = rig(stop_ticks=3)
    replicating(ex, 1)
    ex.remove(1)
    assert ex.status(1).state == T.STOPPING and ex.sinking() == [1]
    for _ in range(3):
        ex.advance()
    assert ex.status(1).state == T.STOPPED and ex.sinking() == []
