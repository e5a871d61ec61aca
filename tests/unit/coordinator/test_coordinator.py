"""Coordinator scenarios: one owner tick at a time, with hand-written capture reports."""

from __future__ import annotations

import random

import numpy as np
import pytest

from scheduler_core import Checkpoint, ConfigError, Coordinator, DDLEvent, DDLKind, TableState
from scheduler_core.coordinator import CoordinatorConfig
from scheduler_core.messages import (
    Barrier,
    DispatchTableRequest,
    DispatchTableResponse,
    Header,
    Heartbeat,
    HeartbeatResponse,
    TableStatusBatch,
)
from scheduler_core.model import ReplicationSetState, Role, TableStatus
from scheduler_core.ts import MAX_TS

OWNER = "owner-1"
CP = Checkpoint.at(1000)


def coordinator(tables=(1, 2, 3, 4), **cfg) -> Coordinator:
    return Coordinator(
        owner_id=OWNER,
        owner_rev=5,
        changefeed_epoch=1,
        checkpoint=CP,
        tables=tables,
        rng=random.Random(0),
        config=CoordinatorConfig(**cfg),
    )


class Capture:
    """A hand-driven capture: reports exactly the statuses a test gives it."""

    def __init__(self, cid: str) -> None:
        self.cid, self.epoch, self.reg, self.seq = cid, f"{cid}-e", f"{cid}-r", 0

    def report(self, *statuses: TableStatus, rev: int = 5, cf: int = 1) -> HeartbeatResponse:
        self.seq += 1
        header = Header(rev, self.epoch, cf, self.seq)
        batch = TableStatusBatch.of(statuses)
        return HeartbeatResponse(header, self.cid, OWNER, batch, registration=self.reg)


def st(tid: int, state: TableState, ck: int = 1000, rs: int | None = None) -> TableStatus:
    return TableStatus(tid, state, Checkpoint(ck, ck if rs is None else rs))


def dispatched(result, cid: str) -> list:
    out = []
    for m in result.messages:
        if isinstance(m, DispatchTableRequest) and m.to == cid:
            out.extend(m.all_requests())
    return out


def replicate_all(co: Coordinator, caps: list[Capture], ck: int = 1000) -> dict[int, str]:
    """Drive adds until every table replicates; returns table -> capture."""
    alive = {c.cid: c.reg for c in caps}
    held: dict[str, dict[int, TableState]] = {c.cid: {} for c in caps}
    result = co.tick(alive, [c.report() for c in caps])
    for _ in range(4):
        for c in caps:
            for req in dispatched(result, c.cid):
                held[c.cid][req.table_id] = (
                    TableState.PREPARED if req.is_secondary else TableState.REPLICATING
                )
        reports = [c.report(*(st(t, s, ck) for t, s in held[c.cid].items())) for c in caps]
        result = co.tick(alive, reports)
    return {t: cid for cid, tables in held.items() for t in tables}


def test_no_scheduling_until_every_alive_capture_has_reported() -> None:
    co = coordinator()
    a, b = Capture("a"), Capture("b")
    result = co.tick({"a": a.reg, "b": b.reg}, [a.report()])
    assert result.dispatches == 0 and not dispatched(result, "a")
    result = co.tick({"a": a.reg, "b": b.reg}, [b.report()])
    assert result.scheduler == "basic"
    assert len(dispatched(result, "a")) + len(dispatched(result, "b")) == 4


@pytest.mark.parametrize(
    ("rev", "cf", "to", "counter"),
    [
        (4, 1, OWNER, "dropped_stale_owner"),
        (5, 2, OWNER, "dropped_wrong_changefeed"),
        (5, 1, "owner-0", "dropped_wrong_addressee"),
    ],
)
def test_reports_with_wrong_fencing_fields_are_dropped(
    rev: int, cf: int, to: str, counter: str
) -> None:
    co = coordinator()
    a = Capture("a")
    header = Header(rev, a.epoch, cf, 1)
    msg = HeartbeatResponse(header, "a", to, TableStatusBatch.of([]), registration=a.reg)
    result = co.tick({"a": a.reg}, [msg])
    assert getattr(co.stats, counter) == 1
    assert result.dispatches == 0  # "a" never counted as initialized


def test_report_from_a_previous_registration_does_not_pin_the_epoch() -> None:
    co = coordinator()
    old = Capture("a")
    new = Capture("a")
    new.epoch, new.reg = "a-e2", "a-r2"
    co.tick({"a": new.reg}, [old.report()])  # late report of the dead incarnation
    assert co.captures.epoch_of("a") == ""
    co.tick({"a": new.reg}, [new.report()])
    assert co.captures.epoch_of("a") == "a-e2"


def test_initial_adds_spread_evenly_and_checkpoint_follows_tables() -> None:
    co = coordinator(tables=range(1, 9))
    a, b = Capture("a"), Capture("b")
    placement = replicate_all(co, [a, b])
    assert sorted(placement) == list(range(1, 9))
    assert sorted(placement.values()).count("a") == 4
    assert co.checkpoint == Checkpoint.at(1000)


def test_drain_refuses_the_last_capture() -> None:
    co = coordinator()
    a = Capture("a")
    co.tick({"a": a.reg}, [a.report()])
    with pytest.raises(ConfigError, match="last capture"):
        co.drain_capture("a")


def test_heartbeat_lists_the_tables_the_owner_thinks_a_capture_holds() -> None:
    co = coordinator(tables=(1, 2))
    a = Capture("a")
    replicate_all(co, [a])
    result = co.tick(
        {"a": a.reg}, [a.report(st(1, TableState.REPLICATING), st(2, TableState.REPLICATING))]
    )
    hb = next(m for m in result.messages if isinstance(m, Heartbeat))
    assert hb.table_ids.tolist() == [1, 2] and hb.header.capture_epoch == a.epoch


def test_table_change_holds_every_table_at_the_barrier_then_adds_at_it() -> None:
    co = coordinator(tables=(1,))
    a = Capture("a")
    replicate_all(co, [a])
    co.change_tables(add=[9], barrier_ts=1500)
    result = co.tick({"a": a.reg}, [a.report(st(1, TableState.REPLICATING, 1200, 2000))])
    assert result.barrier.global_barrier_ts == 1500
    assert 9 not in co.current_tables
    result = co.tick({"a": a.reg}, [a.report(st(1, TableState.REPLICATING, 1500, 2000))])
    assert co.checkpoint.checkpoint_ts == 1500
    result = co.tick({"a": a.reg}, [a.report(st(1, TableState.REPLICATING, 1500, 2000))])
    adds = [r for r in dispatched(result, "a") if r.table_id == 9]
    assert adds and adds[0].checkpoint == Checkpoint.at(1500)
    assert result.barrier.global_barrier_ts == MAX_TS


def test_table_ddl_blocks_only_its_table() -> None:
    co = coordinator(tables=(1, 2))
    a = Capture("a")
    replicate_all(co, [a])
    co.add_ddl(DDLEvent(1300, DDLKind.ALTER_TABLE, "ALTER TABLE t1", table_ids=(1,)))
    result = co.tick(
        {"a": a.reg}, [a.report(st(1, TableState.REPLICATING), st(2, TableState.REPLICATING))]
    )
    assert dict(result.barrier.table_barriers) == {1: 1300}
    assert result.barrier.global_barrier_ts == MAX_TS
    reports = [
        a.report(
            st(1, TableState.REPLICATING, 1300, 2000), st(2, TableState.REPLICATING, 1900, 2000)
        )
    ]
    result = co.tick({"a": a.reg}, reports)
    assert [e.query for e in result.ready_ddls] == ["ALTER TABLE t1"]
    assert co.checkpoint.checkpoint_ts == 1300  # held by table 1 only
    co.ddl_done(result.ready_ddls[0])
    result = co.tick(
        {"a": a.reg},
        [
            a.report(
                st(1, TableState.REPLICATING, 1900, 2000), st(2, TableState.REPLICATING, 1900, 2000)
            )
        ],
    )
    assert dict(result.barrier.table_barriers) == {}
    assert co.checkpoint.checkpoint_ts == 1900


def test_capture_leaving_makes_its_tables_absent_and_they_are_re_added() -> None:
    co = coordinator(tables=(1, 2))
    a, b = Capture("a"), Capture("b")
    placement = replicate_all(co, [a, b])
    gone = placement[1]
    stay = next(c for c in (a, b) if c.cid != gone)
    result = co.tick({stay.cid: stay.reg}, [])
    readded = [r.table_id for r in dispatched(result, stay.cid)]
    assert 1 in readded
    assert np.isin(readded, [t for t, c in placement.items() if c == gone]).all()


# --------------------------------------------------------------------------- issue 10
def late(cap: Capture, epoch: str, *statuses: TableStatus, seq: int = 10_000):
    """A message of another incarnation of ``cap`` (same id and registration, other epoch)."""
    header = Header(5, epoch, 1, seq)
    return HeartbeatResponse(
        header, cap.cid, OWNER, TableStatusBatch.of(statuses), registration=cap.reg
    )


def test_report_from_a_stale_capture_epoch_does_not_move_a_table_checkpoint() -> None:
    co = coordinator(tables=(1,))
    a = Capture("a")
    replicate_all(co, [a])
    msg = late(a, "a-old", st(1, TableState.REPLICATING, 5000, 6000))
    co.tick({"a": a.reg}, [msg])
    assert co.stats.dropped_wrong_epoch == 1
    assert co.replications.table_checkpoint(1) == 1000
    assert co.checkpoint == Checkpoint.at(1000)


def test_stopped_report_from_a_stale_capture_epoch_does_not_free_the_table() -> None:
    co = coordinator(tables=(1,))
    a = Capture("a")
    replicate_all(co, [a])
    msg = DispatchTableResponse(
        Header(5, "a-old", 1, 10_000), "a", OWNER, (st(1, TableState.STOPPED),)
    )
    result = co.tick({"a": a.reg}, [msg])
    assert co.stats.dropped_wrong_epoch == 1
    view = co.replications.view(1)
    assert view.state == ReplicationSetState.REPLICATING and view.primary == "a"
    assert not dispatched(result, "a")  # no re-add: a still sinks it


def test_stale_epoch_report_is_not_used_by_the_owner_switch_rebuild() -> None:
    # A new owner hears a's current incarnation first; a late report of its previous
    # incarnation (still claiming table 1 Replicating) must not make a second primary.
    co = coordinator(tables=(1,))
    a, b = Capture("a"), Capture("b")
    alive = {"a": a.reg, "b": b.reg}
    co.tick(alive, [a.report(), b.report(st(1, TableState.REPLICATING, 1200))])
    co.tick(alive, [late(a, "a-old", st(1, TableState.REPLICATING, 1500))])
    view = co.replications.view(1)
    assert view.primary == "b" and dict(view.captures) == {"b": Role.PRIMARY}
    assert co.replications.table_checkpoint(1) == 1200


def test_older_seq_of_the_current_epoch_is_dropped() -> None:
    co = coordinator(tables=(1,))
    a = Capture("a")
    replicate_all(co, [a])
    old = a.report(st(1, TableState.STOPPED, 1000))
    new = a.report(st(1, TableState.REPLICATING, 1400))
    co.tick({"a": a.reg}, [new, old])
    assert co.replications.view(1).state == ReplicationSetState.REPLICATING
    assert co.stats.dropped_wrong_epoch == 1


def test_table_ddl_waits_while_its_table_moves_even_if_the_primary_reached_it() -> None:
    co = coordinator(tables=(1, 2))
    a, b = Capture("a"), Capture("b")
    placement = replicate_all(co, [a, b])
    src = placement[1]
    dst = "b" if src == "a" else "a"
    caps = {"a": a, "b": b}
    co.add_ddl(DDLEvent(1300, DDLKind.ALTER_TABLE, "ALTER TABLE t1", table_ids=(1,)))
    co.move_table(1, dst)
    alive = {"a": a.reg, "b": b.reg}

    def reports(t1_src: TableState, t1_dst: TableState | None) -> list:
        out = []
        for cid, cap in caps.items():
            rows = [
                st(t, TableState.REPLICATING, 1300, 2000)
                for t, c in placement.items()
                if c == cid and t != 1
            ]
            if cid == src:
                rows.append(st(1, t1_src, 1300, 2000))
            elif t1_dst is not None:
                rows.append(st(1, t1_dst, 1000, 2000))
            out.append(cap.report(*rows))
        return out

    co.tick(alive, reports(TableState.REPLICATING, None))
    assert co.replications.view(1).state != ReplicationSetState.REPLICATING
    result = co.tick(alive, reports(TableState.REPLICATING, TableState.PREPARING))
    assert co.replications.table_checkpoint(1) == 1300
    assert result.ready_ddls == ()  # the table is in a move: its checkpoint does not count


def test_rebuilt_move_ddl_not_released_by_a_stopping_capture_ahead_of_the_primary() -> None:
    # Issue 10: rebuilt {b Replicating at 1100, a Stopping}; a reports Stopped at 1500.
    co = coordinator(tables=(1,))
    a, b = Capture("a"), Capture("b")
    alive = {"a": a.reg, "b": b.reg}
    co.add_ddl(DDLEvent(1400, DDLKind.ALTER_TABLE, "ALTER TABLE t1", table_ids=(1,)))
    co.tick(
        alive,
        [
            a.report(st(1, TableState.STOPPING, 1050)),
            b.report(st(1, TableState.REPLICATING, 1100, 2000)),
        ],
    )
    result = co.tick(
        alive,
        [
            a.report(st(1, TableState.STOPPED, 1500, 2000)),
            b.report(st(1, TableState.REPLICATING, 1100, 2000)),
        ],
    )
    assert co.replications.table_checkpoint(1) == 1100
    assert result.ready_ddls == ()


def test_one_tables_multiple_primary_error_puts_the_changefeed_in_error_not_the_tick() -> None:
    # A new owner hears two captures sink table 1 (rebuild raised for every table).
    co = coordinator(tables=(1, 2))
    a, b = Capture("a"), Capture("b")
    alive = {"a": a.reg, "b": b.reg}
    r1 = st(1, TableState.REPLICATING, 1500, 2000)
    r2 = st(2, TableState.REPLICATING, 1500, 2000)
    result = co.tick(alive, [a.report(r1, r2), b.report(r1)])
    assert result.error is not None and result.error.table_id == 1
    assert "MultiplePrimaryError" in str(result.error) and "several captures" in str(result.error)
    assert co.replications.table_checkpoint(2) == 1500  # the other table kept going
    assert co.checkpoint == Checkpoint.at(1000)  # never past the failed table
    r2 = st(2, TableState.REPLICATING, 1700, 2000)
    result = co.tick(alive, [a.report(r1, r2), b.report(r1)])
    assert result.error is not None and result.scheduler is None and result.dispatches == 0
    assert co.replications.table_checkpoint(2) == 1700
    assert co.checkpoint == Checkpoint.at(1000)


def test_secondary_sinking_before_commit_fails_its_table_only() -> None:
    co = coordinator(tables=(1, 2))
    a, b = Capture("a"), Capture("b")
    alive = {"a": a.reg, "b": b.reg}
    r2 = st(2, TableState.REPLICATING, 1500, 2000)
    co.tick(
        alive, [a.report(st(1, TableState.REPLICATING), r2), b.report(st(1, TableState.PREPARED))]
    )
    result = co.tick(
        alive,
        [a.report(st(1, TableState.REPLICATING), r2), b.report(st(1, TableState.REPLICATING))],
    )
    assert result.error is not None and result.error.table_id == 1
    assert co.replications.table_checkpoint(2) == 1500


def test_one_tables_error_while_a_capture_leaves_does_not_keep_other_tables_on_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from scheduler_core.replication import ReplicationSet, ReplicationSetInvariantError

    co = coordinator(tables=(1, 2, 3))
    a, b = Capture("a"), Capture("b")
    replicate_all(co, [a])
    co.tick(
        {"a": a.reg, "b": b.reg},
        [a.report(*(st(t, TableState.REPLICATING) for t in (1, 2, 3))), b.report()],
    )
    real = ReplicationSet.handle_capture_shutdown

    def broken(self, capture_id):
        if self.table_id == 1:
            raise ReplicationSetInvariantError("invariant broken: planted")
        return real(self, capture_id)

    monkeypatch.setattr(ReplicationSet, "handle_capture_shutdown", broken)
    result = co.tick({"b": b.reg}, [])
    assert result.error is not None and result.error.table_id == 1
    for tid in (2, 3):
        assert co.replications.view(tid).state == ReplicationSetState.ABSENT


def test_empty_changefeed_with_a_tracked_ddl_stream_moves_to_its_first_create() -> None:
    """A changefeed started before any table exists: the checkpoint follows the DDL stream to
    the first CREATE, which then becomes ready and adds its table (it stalled before)."""
    from scheduler_core.ddl import DDLManager

    co = Coordinator(
        owner_id=OWNER,
        owner_rev=5,
        changefeed_epoch=1,
        checkpoint=CP,
        tables=(),
        rng=random.Random(0),
        ddl=DDLManager(1000, ddl_resolved_ts=1000),
    )
    a = Capture("a")
    create = DDLEvent(1500, DDLKind.CREATE_TABLE, "CREATE TABLE t7", creates=(7,))
    co.add_ddl(create)
    co.advance_ddl_resolved(1800)
    result = co.tick({"a": a.reg}, [a.report()])
    result = co.tick({"a": a.reg}, [a.report()])
    assert co.checkpoint.checkpoint_ts == 1500
    assert create in result.ready_ddls
    co.ddl_done(create)
    result = co.tick({"a": a.reg}, [a.report()])
    assert [r.table_id for r in dispatched(result, "a")] == [7]


def test_empty_changefeed_without_ddl_tracking_holds_its_checkpoint() -> None:
    """No tracked DDL stream: nothing says a CREATE below the next syncpoint was not missed."""
    co = coordinator(tables=())
    a = Capture("a")
    co.tick({"a": a.reg}, [a.report()])
    co.tick({"a": a.reg}, [a.report()])
    assert co.checkpoint == CP


def test_changefeed_without_tables_follows_the_ddl_stream_to_its_first_create() -> None:
    from scheduler_core.ddl import DDLManager

    co = Coordinator(
        owner_id=OWNER,
        owner_rev=5,
        changefeed_epoch=1,
        checkpoint=CP,
        tables=(),
        rng=random.Random(0),
        ddl=DDLManager(1000, ddl_resolved_ts=1000),
    )
    a = Capture("a")
    co.tick({"a": a.reg}, [a.report()])
    co.advance_ddl_resolved(1500)  # nothing yet: the checkpoint follows the DDL stream
    assert co.tick({"a": a.reg}, [a.report()]).checkpoint == Checkpoint.at(1500)
    create = DDLEvent(1800, DDLKind.CREATE_TABLE, "CREATE TABLE t7", creates=(7,))
    co.add_ddl(create)
    co.advance_ddl_resolved(3000)
    r = co.tick({"a": a.reg}, [a.report()])
    assert r.checkpoint == Checkpoint.at(1800)  # held at the CREATE's barrier, which is ready
    assert r.ready_ddls == (create,)
    co.ddl_done(create)
    assert co.current_tables.tolist() == [7]
    assert co.start_ts[7] == 1800


# ------------------------------------------------------------------- open barriers, syncpoints
def tracked(tables=(1, 2), **ddl_kw) -> Coordinator:
    """A coordinator whose DDL manager tracks the DDL stream (as the runtime's does)."""
    from scheduler_core.ddl import DDLManager

    return Coordinator(
        owner_id=OWNER,
        owner_rev=5,
        changefeed_epoch=1,
        checkpoint=CP,
        tables=tables,
        rng=random.Random(0),
        ddl=DDLManager(1000, ddl_resolved_ts=1000, **ddl_kw),
    )


def test_barrier_is_open_past_the_ddl_stream_when_nothing_else_holds_the_changefeed() -> None:
    co = tracked()
    a = Capture("a")
    replicate_all(co, [a])
    co.advance_ddl_resolved(1800)
    result = co.tick({"a": a.reg}, [a.report(st(1, TableState.REPLICATING))])
    assert result.barrier == Barrier(1800, {}, MAX_TS)
    # A sink that read the stream to 2500 with no DDL there may go to 2500.
    assert result.barrier.open_barrier_ts(1, 2500) == 2500


def test_table_change_above_the_stream_caps_the_opening_and_one_below_closes_it() -> None:
    co = tracked()
    a = Capture("a")
    replicate_all(co, [a])
    co.advance_ddl_resolved(1800)
    co.change_tables(add=[9], barrier_ts=2000)
    result = co.tick({"a": a.reg}, [a.report(st(1, TableState.REPLICATING))])
    assert result.barrier == Barrier(1800, {}, 2000)
    assert result.barrier.open_barrier_ts(1, 2500) == 2000
    co.change_tables(remove=[2], barrier_ts=1500)
    result = co.tick({"a": a.reg}, [a.report(st(1, TableState.REPLICATING))])
    assert result.barrier == Barrier(1500)


def test_barrier_is_closed_at_the_checkpoint_until_every_capture_reported() -> None:
    co = tracked()
    co.advance_ddl_resolved(1800)
    result = co.tick({"a": "a-r"}, [])
    assert result.barrier == Barrier(1000)
    assert result.barrier.open_barrier_ts(1, 2500) == 1000


def test_table_barrier_is_never_opened() -> None:
    co = tracked()
    a = Capture("a")
    replicate_all(co, [a])
    co.add_ddl(DDLEvent(1300, DDLKind.ALTER_TABLE, "ALTER TABLE t1", table_ids=(1,)))
    co.advance_ddl_resolved(1800)
    result = co.tick({"a": a.reg}, [a.report(st(1, TableState.REPLICATING))])
    assert result.barrier == Barrier(1800, {1: 1300}, MAX_TS)
    assert result.barrier.open_barrier_ts(1, 2500) == 1300
    assert result.barrier.open_barrier_ts(2, 2500) == 2500


def test_checkpoint_passes_a_syncpoint_which_is_then_recorded() -> None:
    """No stall: the tables went past the syncpoint TS (their sinks split there)."""
    from scheduler_core.ddl import DDLManager
    from scheduler_core.ts import compose

    start = compose(1_500)
    co = Coordinator(
        owner_id=OWNER,
        owner_rev=5,
        changefeed_epoch=1,
        checkpoint=Checkpoint.at(start),
        tables=(1,),
        rng=random.Random(0),
        ddl=DDLManager(start, sync_point_interval_ms=1_000, ddl_resolved_ts=start),
    )
    a = Capture("a")
    replicate_all(co, [a], ck=start)
    co.advance_ddl_resolved(compose(2_600))
    result = co.tick({"a": a.reg}, [a.report(st(1, TableState.REPLICATING, compose(2_500)))])
    assert co.checkpoint.checkpoint_ts == compose(2_500)
    assert result.syncpoint_ts == compose(2_000)


def test_table_change_above_an_unrecorded_syncpoint_waits_for_its_record() -> None:
    from scheduler_core.ddl import DDLManager
    from scheduler_core.ts import compose

    start = compose(1_500)
    co = Coordinator(
        owner_id=OWNER,
        owner_rev=5,
        changefeed_epoch=1,
        checkpoint=Checkpoint.at(start),
        tables=(1,),
        rng=random.Random(0),
        ddl=DDLManager(start, sync_point_interval_ms=1_000),
    )
    a = Capture("a")
    replicate_all(co, [a], ck=start)
    co.change_tables(add=[9], barrier_ts=compose(2_500))
    report = a.report(st(1, TableState.REPLICATING, compose(2_500)))
    result = co.tick({"a": a.reg}, [report])
    assert result.syncpoint_ts == compose(2_000)
    result = co.tick({"a": a.reg}, [a.report(st(1, TableState.REPLICATING, compose(2_500)))])
    assert 9 not in co.current_tables  # the syncpoint at 2_000 lists table 1 alone
    co.syncpoint_done(compose(2_000))
    co.tick({"a": a.reg}, [a.report(st(1, TableState.REPLICATING, compose(2_500)))])
    assert 9 in co.current_tables
