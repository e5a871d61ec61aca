"""Agent scenarios: each steps from a known state and asserts the exact messages out."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np
import pytest

from scheduler_core.agent import Agent
from scheduler_core.errors import ConfigError, ExecutorContractError, ProtocolError
from scheduler_core.messages import (
    AddTableRequest,
    Barrier,
    DispatchTableRequest,
    DispatchTableResponse,
    Header,
    Heartbeat,
    HeartbeatResponse,
    Liveness,
    RemoveTableRequest,
    TableStatusBatch,
)
from scheduler_core.model import Checkpoint, TableState, TableStatus
from scheduler_core.sim.fake_executor import FakeDownstream, FakeExecutor, FakeUpstream, WriteRecord

CAP = "c1"
OWNER = "owner-a"
T = TableState
ZERO = Checkpoint(0, 0)


def epochs() -> Callable[[], str]:
    counter = itertools.count(1)
    return lambda: f"e{next(counter)}"


class Rig:
    """An agent over a fake executor, upstream resolved at 100, downstream committed at 100."""

    def __init__(self, prepare_ticks: int = 1, stop_ticks: int = 1) -> None:
        self.upstream = FakeUpstream(100)
        self.downstream = FakeDownstream(initial_ts=100)
        self.executor = FakeExecutor(CAP, self.downstream, self.upstream, prepare_ticks, stop_ticks)
        self.agent = Agent(CAP, self.executor, epochs())

    def heartbeat(
        self,
        *table_ids: int,
        rev: int = 1,
        sender: str = OWNER,
        to: str = CAP,
        cf: int = 1,
        is_stopping: bool = False,
        barrier: Barrier | None = None,
    ) -> Heartbeat:
        ids = np.array(table_ids, np.int64)
        return Heartbeat(Header(rev, "", cf), sender, to, ids, is_stopping, barrier or Barrier())

    def dispatch(
        self,
        *reqs: AddTableRequest | RemoveTableRequest,
        rev: int = 1,
        epoch: str | None = None,
        cf: int = 1,
        sender: str = OWNER,
    ) -> DispatchTableRequest:
        header = Header(rev, self.agent.epoch if epoch is None else epoch, cf)
        return DispatchTableRequest(header, sender, CAP, reqs)

    def connect(self, rev: int = 1) -> None:
        """Adopt OWNER at ``rev`` and answer its first heartbeat (uses seq 1)."""
        self.agent.handle([self.heartbeat(rev=rev)])
        assert self.agent.tick() == [self.hb_response(seq=1)]

    def header(self, seq: int) -> Header:
        a = self.agent
        return Header(a.owner_rev, a.epoch, a.changefeed_epoch, seq=seq)

    def hb_response(
        self, *statuses: TableStatus, seq: int, liveness: Liveness = Liveness.ALIVE
    ) -> HeartbeatResponse:
        assert self.agent.owner_id is not None
        return HeartbeatResponse(
            self.header(seq), CAP, self.agent.owner_id, TableStatusBatch.of(statuses), liveness
        )

    def dispatch_response(self, *statuses: TableStatus, seq: int) -> DispatchTableResponse:
        assert self.agent.owner_id is not None
        return DispatchTableResponse(self.header(seq), CAP, self.agent.owner_id, statuses)


def add(table_id: int, ts: int, *, secondary: bool) -> AddTableRequest:
    return AddTableRequest(CAP, table_id, secondary, Checkpoint.at(ts))


def status(
    table_id: int, state: TableState, checkpoint_ts: int = 0, resolved_ts: int | None = None
) -> TableStatus:
    resolved = checkpoint_ts if resolved_ts is None else resolved_ts
    return TableStatus(table_id, state, Checkpoint(checkpoint_ts, resolved))


def replicating_rig(table_id: int = 1, **kw: int) -> Rig:
    """A connected rig whose capture replicates ``table_id`` from 100 (seq used: 1, 2)."""
    rig = Rig(**kw)
    rig.connect()
    rig.agent.handle([rig.dispatch(add(table_id, 100, secondary=False))])
    for _ in range(kw.get("prepare_ticks", 1)):
        out = rig.agent.tick()
    assert out == [rig.dispatch_response(status(table_id, T.REPLICATING, 100), seq=2)]
    return rig


# --------------------------------------------------------------------- owner fencing
def test_before_any_owner_tick_returns_nothing() -> None:
    rig = Rig()
    assert (rig.agent.owner_rev, rig.agent.owner_id, rig.agent.epoch) == (0, None, "e1")
    assert rig.agent.tick() == []


def test_adopt_higher_owner_rev_and_rotate_epoch() -> None:
    rig = Rig()
    rig.agent.handle([rig.heartbeat(rev=5)])
    assert (rig.agent.owner_rev, rig.agent.owner_id, rig.agent.epoch) == (5, OWNER, "e2")
    assert rig.agent.tick() == [
        HeartbeatResponse(Header(5, "e2", 1, seq=1), CAP, OWNER, TableStatusBatch.of([]))
    ]
    rig.agent.handle([rig.heartbeat(rev=7, sender="owner-b")])
    assert (rig.agent.owner_rev, rig.agent.owner_id, rig.agent.epoch) == (7, "owner-b", "e3")
    assert rig.agent.tick() == [
        HeartbeatResponse(Header(7, "e3", 1, seq=2), CAP, "owner-b", TableStatusBatch.of([]))
    ]


def test_reject_lower_owner_rev() -> None:
    rig = Rig()
    rig.connect(rev=5)
    rig.agent.handle([rig.heartbeat(rev=4, sender="owner-old")])
    assert rig.agent.tick() == []
    assert (rig.agent.owner_rev, rig.agent.owner_id, rig.agent.epoch) == (5, OWNER, "e2")
    assert rig.agent.stats.rejected_stale_owner == 1


@pytest.mark.parametrize(
    ("scenario", "make", "counter"),
    [
        ("addressed_to_another_capture", lambda r: r.heartbeat(to="c2"), "rejected_wrong_capture"),
        ("owner_rev_zero", lambda r: r.heartbeat(rev=0), "rejected_stale_owner"),
        (
            "same_rev_other_owner",
            lambda r: r.heartbeat(sender="owner-z"),
            "rejected_owner_conflict",
        ),
        ("lower_changefeed_epoch", lambda r: r.heartbeat(cf=0), "rejected_changefeed_epoch"),
        (
            "dispatch_for_empty_epoch",
            lambda r: r.dispatch(add(1, 100, secondary=True), epoch=""),
            "rejected_capture_epoch",
        ),
    ],
)
def test_fenced_message_is_dropped_and_counted(
    scenario: str, make: Callable[[Rig], object], counter: str
) -> None:
    rig = Rig()
    rig.connect()
    rig.agent.handle([make(rig)])  # type: ignore[list-item]
    assert rig.agent.tick() == [], scenario
    assert getattr(rig.agent.stats, counter) == 1
    assert rig.agent.tasks == {}


def test_dispatch_with_stale_capture_epoch_rejected() -> None:
    rig = Rig()
    rig.connect()  # epoch e1 -> e2
    rig.agent.handle([rig.dispatch(add(1, 100, secondary=True), epoch="e1")])
    assert rig.agent.tick() == []
    assert rig.agent.stats.rejected_capture_epoch == 1
    assert rig.executor.status(1).state == T.ABSENT


def test_first_dispatch_of_new_owner_rejected_until_it_learns_the_epoch() -> None:
    rig = Rig()
    rig.connect()
    rig.agent.handle([rig.dispatch(add(1, 100, secondary=True), rev=2, sender="owner-b")])
    assert (rig.agent.owner_id, rig.agent.epoch, rig.agent.tasks) == ("owner-b", "e3", {})
    assert rig.agent.stats.rejected_capture_epoch == 1


def test_new_owner_drops_old_owner_tasks() -> None:
    rig = Rig(prepare_ticks=3)
    rig.connect()
    rig.agent.handle([rig.dispatch(add(1, 100, secondary=True))])
    rig.agent.tick()
    rig.agent.handle([rig.heartbeat(1, rev=2, sender="owner-b")])
    assert rig.agent.tasks == {}
    # The executor keeps preparing; the new owner sees it in the heartbeat response.
    assert rig.agent.tick() == [rig.hb_response(status(1, T.PREPARING, 100), seq=2)]


def test_higher_changefeed_epoch_from_same_owner_adopted() -> None:
    rig = Rig()
    rig.connect()
    rig.agent.handle([rig.heartbeat(cf=3)])
    assert rig.agent.changefeed_epoch == 3
    assert rig.agent.tick() == [rig.hb_response(seq=2)]
    assert rig.agent.tick() == []  # no heartbeat, no response


def test_non_owner_message_raises_and_changes_nothing() -> None:
    rig = Rig()
    with pytest.raises(ProtocolError):
        rig.agent.handle([rig.heartbeat(), "not a message"])  # type: ignore[list-item]
    assert rig.agent.owner_rev == 0


def test_new_epoch_must_be_fresh() -> None:
    with pytest.raises(ConfigError):
        Agent(CAP, Rig().executor, lambda: "")


# --------------------------------------------------------------------- heartbeats
def test_heartbeat_lists_table_we_lack_reports_absent() -> None:
    rig = replicating_rig(1)
    rig.agent.handle([rig.heartbeat(1, 7)])
    assert rig.agent.tick() == [
        rig.hb_response(status(1, T.REPLICATING, 100), status(7, T.ABSENT), seq=3)
    ]


def test_heartbeat_barrier_caps_the_sink() -> None:
    rig = replicating_rig(1)
    rig.upstream.advance(300)
    rig.agent.handle([rig.heartbeat(1, barrier=Barrier(global_barrier_ts=250))])
    assert rig.agent.tick() == [rig.hb_response(status(1, T.REPLICATING, 250, 300), seq=3)]
    assert rig.downstream.committed(1) == 250


def test_stop_reports_liveness_stopping() -> None:
    rig = Rig()
    rig.connect()
    rig.agent.stop()
    rig.agent.handle([rig.heartbeat()])
    assert rig.agent.tick() == [rig.hb_response(seq=2, liveness=Liveness.STOPPING)]


def test_owner_stopping_flag_sets_liveness_stopping() -> None:
    rig = Rig()
    rig.connect()
    rig.agent.handle([rig.heartbeat(is_stopping=True)])
    assert rig.agent.tick() == [rig.hb_response(seq=2, liveness=Liveness.STOPPING)]


def test_stopping_capture_refuses_new_tables_but_removes() -> None:
    rig = replicating_rig(1)
    rig.agent.stop()
    rig.agent.handle([rig.dispatch(add(2, 100, secondary=True), RemoveTableRequest(CAP, 1))])
    assert rig.agent.stats.rejected_while_stopping == 1
    assert rig.agent.tasks == {1: RemoveTableRequest(CAP, 1)}


# --------------------------------------------------------------------- add / remove
def test_add_secondary_reports_preparing_then_prepared() -> None:
    rig = Rig(prepare_ticks=2)
    rig.connect()
    rig.agent.handle([rig.dispatch(add(1, 100, secondary=True)), rig.heartbeat(1)])
    assert rig.agent.tick() == [rig.hb_response(status(1, T.PREPARING, 100), seq=2)]
    rig.upstream.advance(120)
    rig.agent.handle([rig.heartbeat(1)])
    prepared = status(1, T.PREPARED, 100, 120)
    # The heartbeat response carries the finished task's state: no separate dispatch response.
    assert rig.agent.tick() == [rig.hb_response(prepared, seq=3)]
    assert rig.agent.tasks == {}
    assert rig.downstream.log == []  # a secondary never sinks


def test_commit_after_prepare_replicates() -> None:
    rig = Rig()
    rig.connect()
    rig.agent.handle([rig.dispatch(add(1, 100, secondary=True))])
    assert rig.agent.tick() == [rig.dispatch_response(status(1, T.PREPARED, 100), seq=2)]
    rig.upstream.advance(150)
    rig.agent.handle([rig.dispatch(add(1, 100, secondary=False))])
    assert rig.agent.tick() == [rig.dispatch_response(status(1, T.REPLICATING, 150), seq=3)]
    assert rig.downstream.log == [WriteRecord(1, 1, CAP, 150)]


def test_direct_add_prepares_then_commits() -> None:
    rig = Rig(prepare_ticks=2)
    rig.connect()
    rig.agent.handle([rig.dispatch(add(1, 100, secondary=False)), rig.heartbeat(1)])
    assert rig.agent.tick() == [rig.hb_response(status(1, T.PREPARING, 100), seq=2)]
    assert rig.agent.tick() == [rig.dispatch_response(status(1, T.REPLICATING, 100), seq=3)]


@pytest.mark.parametrize(
    ("case", "prepared_from", "commit_at", "downstream_at"),
    [
        ("would skip the changes", 200, 150, 200),  # (a) prepared after the checkpoint
        ("writes are not readable", 150, 150, 100),  # (b) previous primary's writes not in
    ],
)
def test_commit_with_data_not_readable_raises(
    case: str, prepared_from: int, commit_at: int, downstream_at: int
) -> None:
    rig = Rig()
    rig.downstream.create_table(1, downstream_at)
    rig.upstream.advance(300)
    rig.connect()
    rig.agent.handle([rig.dispatch(add(1, prepared_from, secondary=True))])
    rig.agent.tick()
    rig.agent.handle([rig.dispatch(add(1, commit_at, secondary=False))])
    with pytest.raises(ExecutorContractError, match=case):
        rig.agent.tick()
    assert rig.downstream.current_token(1) == 0  # never took the table  # never took the table


def test_remove_reports_stopping_then_stopped_once_then_absent() -> None:
    rig = replicating_rig(1, stop_ticks=2)
    rig.upstream.advance(180)
    rig.agent.handle([rig.dispatch(RemoveTableRequest(CAP, 1)), rig.heartbeat(1)])
    assert rig.agent.tick() == [rig.hb_response(status(1, T.STOPPING, 180), seq=3)]
    rig.upstream.advance(200)
    rig.agent.handle([rig.heartbeat(1)])
    final = status(1, T.STOPPED, 200)
    assert rig.agent.tick() == [rig.hb_response(final, seq=4)]
    rig.agent.handle([rig.heartbeat(1)])
    assert rig.agent.tick() == [rig.hb_response(status(1, T.ABSENT), seq=5)]
    assert rig.downstream.log[-1] == WriteRecord(1, 1, CAP, 200)


def test_remove_of_absent_table_reports_absent() -> None:
    rig = Rig()
    rig.connect()
    rig.agent.handle([rig.dispatch(RemoveTableRequest(CAP, 9))])
    assert rig.agent.tick() == [rig.dispatch_response(status(9, T.ABSENT), seq=2)]


def test_fenced_table_reported_stopped_once_then_absent() -> None:
    rig = replicating_rig(1)
    rig.downstream.acquire(1, "c2")  # another capture took the table over
    rig.upstream.advance(150)
    rig.agent.handle([rig.heartbeat(1)])
    assert rig.agent.tick() == [rig.hb_response(status(1, T.STOPPED, 100, 150), seq=3)]
    assert rig.executor.fenced_writes == 1
    rig.agent.handle([rig.heartbeat(1)])
    assert rig.agent.tick() == [rig.hb_response(status(1, T.ABSENT), seq=4)]


def test_duplicate_add_is_idempotent() -> None:
    rig = Rig(prepare_ticks=3)
    rig.connect()
    request = rig.dispatch(add(1, 100, secondary=True))
    rig.agent.handle([request, request])
    assert rig.agent.tick() == []
    rig.agent.handle([request])
    assert rig.agent.stats.duplicate_tasks == 2
    assert rig.agent.tick() == []
    prepared = status(1, T.PREPARED, 100)
    assert rig.agent.tick() == [rig.dispatch_response(prepared, seq=2)]
    rig.agent.handle([request])  # again once done: the same answer, nothing re-prepared
    assert rig.agent.tick() == [rig.dispatch_response(prepared, seq=3)]


def test_second_different_task_for_table_in_flight_ignored() -> None:
    rig = Rig(prepare_ticks=2)
    rig.connect()
    rig.agent.handle([rig.dispatch(add(1, 100, secondary=True))])
    rig.agent.tick()
    rig.agent.handle([rig.dispatch(RemoveTableRequest(CAP, 1), add(1, 100, secondary=False))])
    assert rig.agent.stats.ignored_conflicting_tasks == 2
    assert rig.agent.tasks == {1: add(1, 100, secondary=True)}
    assert rig.agent.tick() == [rig.dispatch_response(status(1, T.PREPARED, 100), seq=2)]


# --------------------------------------------------------------------- scale
class CountingExecutor(FakeExecutor):
    """Counts per-table status() calls, to show a heartbeat tick makes none."""

    status_calls = 0

    def status(self, table_id: int) -> TableStatus:
        self.status_calls += 1
        return super().status(table_id)


def test_heartbeat_response_for_10k_tables_is_columnar() -> None:
    n = 10_000
    executor = CountingExecutor(CAP, FakeDownstream(100), FakeUpstream(100), prepare_ticks=0)
    for table_id in range(n):
        executor.prepare(table_id, Checkpoint.at(100))
        if table_id % 2 == 0:
            executor.commit(table_id, Checkpoint.at(100))
    agent = Agent(CAP, executor, epochs())
    listed = np.arange(n // 2, n + 500, dtype=np.int64)  # 500 the capture lacks
    agent.handle([Heartbeat(Header(1, "", 1), OWNER, CAP, listed)])
    executor.status_calls = 0
    (response,) = agent.tick()
    assert executor.status_calls == 0
    assert isinstance(response, HeartbeatResponse)
    tables = response.tables
    assert np.array_equal(tables.table_ids, np.arange(n + 500))
    expected_states = np.where(np.arange(n + 500) % 2 == 0, T.REPLICATING, T.PREPARED)
    expected_states[n:] = T.ABSENT
    assert np.array_equal(tables.states, expected_states)
    assert (tables.checkpoint_ts[:n] == 100).all() and (tables.checkpoint_ts[n:] == 0).all()


def test_task_finished_with_a_heartbeat_is_reported_once_in_the_heartbeat_response() -> None:
    rig = Rig(prepare_ticks=0)
    rig.connect()
    # The owner's heartbeat does not list the table yet; the add finishes in the same tick.
    rig.agent.handle([rig.dispatch(add(1, 100, secondary=True)), rig.heartbeat()])
    out = rig.agent.tick()
    prepared = status(1, T.PREPARED, 100)
    assert out == [rig.hb_response(prepared, seq=2)]


def test_registry_owner_rev_fences_a_zombie_owner_heard_first() -> None:
    rig = Rig()
    rig.agent.observe_owner_rev(2)  # read from etcd at registration: owner rev 2 is elected
    rig.agent.handle([rig.heartbeat(rev=1, sender="zombie")])
    assert rig.agent.owner_id is None and rig.agent.tick() == []
    assert rig.agent.stats.rejected_stale_owner == 1
    rig.agent.handle([rig.heartbeat(rev=2)])
    assert (rig.agent.owner_id, rig.agent.owner_rev) == (OWNER, 2)


def test_registry_owner_rev_drops_the_stale_owners_tasks_in_flight() -> None:
    rig = Rig(prepare_ticks=3)
    rig.connect(rev=1)
    rig.agent.handle([rig.dispatch(add(1, 100, secondary=True))])
    assert list(rig.agent.tasks) == [1]
    rig.agent.observe_owner_rev(2)
    assert rig.agent.tasks == {} and rig.agent.owner_id is None
    rig.agent.handle([rig.dispatch(add(2, 100, secondary=True), rev=1)])
    assert rig.agent.tasks == {}


def test_registry_owner_rev_not_above_the_adopted_one_changes_nothing() -> None:
    rig = Rig()
    rig.connect(rev=3)
    epoch = rig.agent.epoch
    rig.agent.observe_owner_rev(3)
    assert (rig.agent.owner_id, rig.agent.epoch) == (OWNER, epoch)


def test_delayed_commit_older_than_a_later_dispatch_is_dropped() -> None:
    # Simulator (quick_restarts seed 67): a commit the owner re-sent was delayed on the
    # wire past the table's move away; arriving after the capture forgot the table, it made
    # the capture prepare and sink it again next to the new primary.
    rig = Rig(stop_ticks=0)
    rig.connect()
    a = rig.agent
    commit = add(1, 100, secondary=False)
    first = DispatchTableRequest(Header(1, a.epoch, 1, seq=10), OWNER, CAP, (commit,))
    a.handle([first])
    a.tick()
    a.handle(
        [
            DispatchTableRequest(
                Header(1, a.epoch, 1, seq=20), OWNER, CAP, (RemoveTableRequest(CAP, 1),)
            )
        ]
    )
    a.tick()  # stopped, reported once, forgotten
    assert rig.executor.status(1).state == T.ABSENT
    a.handle([first])  # the delayed duplicate of the commit
    a.tick()
    assert rig.executor.status(1).state == T.ABSENT
    assert a.stats.rejected_stale_seq == 1
