"""DDL manager scenarios: which barrier each DDL makes, when it is ready, what done returns."""

from __future__ import annotations

import pytest

from scheduler_core.ddl import (
    DDLEvent,
    DDLKind,
    DDLManager,
    TableSetChange,
    is_syncpoint,
    syncpoints_between,
)
from scheduler_core.errors import ConfigError, InvalidMessageError, ProtocolError
from scheduler_core.messages import Barrier
from scheduler_core.ts import MAX_TS, compose

K = DDLKind
TABLES = frozenset({1, 2, 3})


def alter(ts: int, table_id: int) -> DDLEvent:
    return DDLEvent(ts, K.ALTER_TABLE, f"ALTER TABLE t{table_id} ADD c{ts} INT", (table_id,))


def create(ts: int, *table_ids: int) -> DDLEvent:
    return DDLEvent(ts, K.CREATE_TABLE, f"CREATE TABLE n{ts}", creates=table_ids)


def drop(ts: int, *table_ids: int) -> DDLEvent:
    return DDLEvent(ts, K.DROP_TABLE, f"DROP TABLE d{ts}", table_ids)


def rename(ts: int, *table_ids: int) -> DDLEvent:
    return DDLEvent(ts, K.RENAME_TABLES, f"RENAME TABLE r{ts}", table_ids)


def manager_with(*events: DDLEvent, checkpoint_ts: int = 10, **kwargs: int) -> DDLManager:
    m = DDLManager(checkpoint_ts, **kwargs)
    for event in events:
        assert m.add_ddl(event)
    return m


def at(ts: int):
    """A table_checkpoint callable with every table at ``ts``."""
    return lambda _table_id: ts


# ----------------------------------------------------------------------------- barriers
@pytest.mark.parametrize(
    ("event", "expected"),
    [
        pytest.param(alter(100, 1), Barrier(MAX_TS, {1: 100}), id="alter_one_table_blocks_only_it"),
        pytest.param(
            DDLEvent(100, K.TRUNCATE_TABLE, "TRUNCATE t2", (2,)),
            Barrier(MAX_TS, {2: 100}),
            id="truncate_one_table_blocks_only_it",
        ),
        pytest.param(drop(100, 3), Barrier(MAX_TS, {3: 100}), id="drop_one_table_blocks_only_it"),
        pytest.param(create(100, 7), Barrier(100), id="create_table_is_global"),
        pytest.param(rename(100, 1, 2), Barrier(100), id="rename_tables_is_global"),
        pytest.param(rename(100, 1), Barrier(100), id="rename_one_table_is_global"),
        pytest.param(
            DDLEvent(100, K.MULTI_TABLE, "ALTER TABLE t1 EXCHANGE PARTITION p WITH t2", (1, 2)),
            Barrier(100),
            id="multi_table_is_global",
        ),
        pytest.param(drop(100, 1, 2), Barrier(100), id="drop_two_tables_is_global"),
        pytest.param(alter(100, 9), Barrier(100), id="table_not_in_current_set_is_global"),
        pytest.param(
            DDLEvent(100, K.CREATE_SCHEMA, "CREATE DATABASE s", schema="s"),
            Barrier(100),
            id="create_schema_is_global",
        ),
        pytest.param(
            DDLEvent(100, K.DROP_SCHEMA, "DROP DATABASE s", (1, 2), schema="s"),
            Barrier(100),
            id="drop_schema_is_global",
        ),
    ],
)
def test_barrier_for_one_pending_ddl(event: DDLEvent, expected: Barrier) -> None:
    assert manager_with(event).barrier(TABLES) == expected


def test_single_table_ddl_leaves_other_tables_unblocked() -> None:
    barrier = manager_with(alter(100, 1)).barrier(TABLES)
    assert [barrier.barrier_ts(t) for t in (1, 2, 3)] == [100, MAX_TS, MAX_TS]


def test_no_pending_ddl_no_barrier() -> None:
    assert DDLManager(10).barrier(TABLES) == Barrier(MAX_TS, {})


def test_table_barriers_only_below_the_global_barrier() -> None:
    m = manager_with(alter(100, 1), create(200, 7), alter(300, 2))
    assert m.barrier(TABLES) == Barrier(200, {1: 100})


def test_table_ddl_at_global_barrier_ts_is_held_by_the_global_barrier() -> None:
    m = manager_with(create(200, 7), alter(200, 1))
    assert m.barrier(TABLES) == Barrier(200, {})
    assert m.ready(at(200), 200) == [create(200, 7), alter(200, 1)]


def test_second_ddl_on_a_table_becomes_its_barrier_only_after_the_first_is_done() -> None:
    m = manager_with(alter(100, 1), alter(150, 1))
    assert m.barrier(TABLES) == Barrier(MAX_TS, {1: 100})
    assert m.ready(at(100), 50) == [alter(100, 1)]
    assert m.barrier(TABLES) == Barrier(MAX_TS, {1: 100})  # not done yet: still held at 100
    m.ddl_done(alter(100, 1))
    assert m.ready(at(150), 50) == []  # not announced by a barrier yet
    assert m.barrier(TABLES) == Barrier(MAX_TS, {1: 150})
    assert m.ready(at(150), 50) == [alter(150, 1)]


def test_table_ddls_on_different_tables_are_independent() -> None:
    m = manager_with(alter(100, 1), alter(120, 2))
    assert m.barrier(TABLES) == Barrier(MAX_TS, {1: 100, 2: 120})
    checkpoints = {1: 90, 2: 120, 3: 500}
    assert m.ready(checkpoints.__getitem__, 90) == [alter(120, 2)]


def test_global_ddl_waits_for_earlier_table_ddls() -> None:
    m = manager_with(alter(100, 1), create(200, 7))
    assert m.barrier(TABLES) == Barrier(200, {1: 100})
    # Even with every checkpoint at 200, the create waits for the alter at 100 to run.
    assert m.ready(at(200), 200) == [alter(100, 1)]
    m.ddl_done(alter(100, 1))
    assert m.ready(at(200), 200) == [create(200, 7)]


def test_barrier_asks_membership_only_for_tables_of_pending_ddls() -> None:
    class CountingSet(frozenset):
        asked: list[int] = []

        def __contains__(self, table_id: object) -> bool:
            self.asked.append(table_id)  # type: ignore[arg-type]
            return super().__contains__(table_id)

    tables = CountingSet(range(100_000))
    m = manager_with(alter(100, 5), alter(110, 6), alter(500, 7), create(300, 100_001))
    assert m.barrier(tables) == Barrier(300, {5: 100, 6: 110})
    assert tables.asked == [5, 6]  # the create is global without asking; 500 is past it


# ----------------------------------------------------------------------------- ready / done
@pytest.mark.parametrize(
    ("table_checkpoint", "expected"),
    [
        pytest.param(99, [], id="below_commit_ts_not_ready"),
        pytest.param(100, [alter(100, 1)], id="at_commit_ts_ready"),
    ],
)
def test_table_ddl_ready_only_when_its_table_checkpoint_reached_commit_ts(
    table_checkpoint: int, expected: list[DDLEvent]
) -> None:
    m = manager_with(alter(100, 1))
    m.barrier(TABLES)
    assert m.ready(lambda t: table_checkpoint if t == 1 else 10, 10) == expected


@pytest.mark.parametrize(
    ("changefeed_checkpoint", "expected"),
    [
        pytest.param(199, [], id="below_commit_ts_not_ready"),
        pytest.param(200, [create(200, 7)], id="at_commit_ts_ready"),
    ],
)
def test_global_ddl_ready_only_when_changefeed_checkpoint_reached_commit_ts(
    changefeed_checkpoint: int, expected: list[DDLEvent]
) -> None:
    m = manager_with(create(200, 7))
    m.barrier(TABLES)
    assert m.ready(at(MAX_TS), changefeed_checkpoint) == expected


def test_ddl_not_ready_until_a_barrier_held_it_back() -> None:
    m = manager_with(alter(100, 1))
    assert m.ready(at(100), 100) == []
    m.barrier(TABLES)
    assert m.ready(at(100), 100) == [alter(100, 1)]


def test_ddl_done_before_ready_raises() -> None:
    m = manager_with(alter(100, 1))
    m.barrier(TABLES)
    assert m.ready(at(99), 10) == []
    with pytest.raises(ProtocolError, match="not ready"):
        m.ddl_done(alter(100, 1))
    assert m.pending == (alter(100, 1),)  # refused without a half-written state


def test_ddl_done_twice_raises() -> None:
    m = manager_with(alter(100, 1))
    m.barrier(TABLES)
    m.ready(at(100), 10)
    m.ddl_done(alter(100, 1))
    with pytest.raises(ProtocolError, match="not pending"):
        m.ddl_done(alter(100, 1))


def test_ddl_done_for_unknown_ddl_raises() -> None:
    with pytest.raises(ProtocolError, match="not pending"):
        DDLManager(10).ddl_done(alter(100, 1))


def test_create_table_done_returns_new_tables_starting_at_its_commit_ts() -> None:
    m = manager_with(create(200, 7, 8))
    assert m.barrier(TABLES) == Barrier(200)
    assert m.ready(at(200), 200) == [create(200, 7, 8)]
    assert m.ddl_done(create(200, 7, 8)) == TableSetChange(200, added=(7, 8), removed=())
    assert m.barrier(TABLES | {7, 8}) == Barrier(MAX_TS, {})


def test_drop_table_done_returns_the_dropped_table() -> None:
    m = manager_with(drop(150, 2))
    assert m.barrier(TABLES) == Barrier(MAX_TS, {2: 150})
    assert m.ready({1: 10, 2: 150, 3: 10}.__getitem__, 10) == [drop(150, 2)]
    assert m.ddl_done(drop(150, 2)) == TableSetChange(150, added=(), removed=(2,))


def test_rename_done_changes_nothing_in_the_table_set() -> None:
    m = manager_with(rename(100, 1, 2))
    m.barrier(TABLES)
    assert m.ready(at(100), 100) == [rename(100, 1, 2)]
    assert m.ddl_done(rename(100, 1, 2)) == TableSetChange(100)


# ----------------------------------------------------------------------------- arrival
def test_ddl_at_or_below_checkpoint_raises() -> None:
    with pytest.raises(ProtocolError, match="at or below the changefeed checkpoint 100"):
        DDLManager(100).add_ddl(alter(100, 1))


def test_ddl_at_or_below_a_later_observed_checkpoint_raises() -> None:
    m = DDLManager(10)
    m.ready(at(300), 300)
    with pytest.raises(ProtocolError, match="checkpoint 300"):
        m.add_ddl(alter(250, 1))


@pytest.mark.parametrize(
    ("first", "second"),
    [
        pytest.param(alter(200, 1), alter(100, 1), id="older_ddl_on_same_table"),
        pytest.param(alter(200, 1), drop(200, 1), id="second_ddl_same_ts_same_table"),
        pytest.param(create(200, 7), alter(150, 7), id="older_ddl_on_a_created_table"),
        pytest.param(rename(200, 1, 2), alter(150, 2), id="older_ddl_on_a_renamed_table"),
    ],
)
def test_out_of_order_ddl_for_a_table_raises(first: DDLEvent, second: DDLEvent) -> None:
    m = manager_with(first)
    with pytest.raises(ProtocolError, match="out of order for table"):
        m.add_ddl(second)
    assert m.pending == (first,)


def test_out_of_order_ddl_after_the_first_ran_still_raises() -> None:
    m = manager_with(alter(200, 1))
    m.barrier(TABLES)
    m.ready(at(200), 10)
    m.ddl_done(alter(200, 1))
    with pytest.raises(ProtocolError, match="out of order for table 1"):
        m.add_ddl(alter(150, 1))


def test_older_ddl_on_another_table_is_queued_in_commit_ts_order() -> None:
    m = manager_with(alter(200, 1), alter(100, 2))
    assert m.pending == (alter(100, 2), alter(200, 1))


def test_duplicate_ddl_is_ignored() -> None:
    m = manager_with(alter(100, 1))
    assert m.add_ddl(alter(100, 1)) is False
    assert m.pending == (alter(100, 1),)


def test_duplicate_of_a_done_ddl_is_ignored() -> None:
    m = manager_with(alter(100, 1))
    m.barrier(TABLES)
    m.ready(at(100), 10)
    m.ddl_done(alter(100, 1))
    assert m.add_ddl(alter(100, 1)) is False
    assert m.pending == ()


def test_conflicting_duplicate_raises() -> None:
    m = manager_with(alter(100, 1))
    with pytest.raises(ProtocolError, match="conflicts"):
        m.add_ddl(DDLEvent(100, K.ALTER_TABLE, alter(100, 1).query, (2,)))


# ----------------------------------------------------------------------------- syncpoints
SP_CHECKPOINT = compose(1_500, 7)


def test_first_syncpoint_is_the_next_aligned_multiple_of_the_interval() -> None:
    m = DDLManager(SP_CHECKPOINT, sync_point_interval_ms=1_000)
    assert m.next_syncpoint_ts == compose(2_000)


def test_syncpoints_are_no_barrier() -> None:
    """Tables split their commits at syncpoint TSs and go on: nothing holds them there."""
    m = DDLManager(SP_CHECKPOINT, sync_point_interval_ms=1_000)
    assert m.barrier(TABLES) == Barrier(MAX_TS)
    tracked = DDLManager(SP_CHECKPOINT, sync_point_interval_ms=1_000, ddl_resolved_ts=SP_CHECKPOINT)
    tracked.advance_ddl_resolved(compose(5_000))
    assert tracked.barrier(TABLES) == Barrier(compose(5_000), {}, MAX_TS)


def test_checkpoint_on_a_multiple_takes_the_next_multiple() -> None:
    m = DDLManager(compose(2_000), sync_point_interval_ms=1_000)
    assert m.next_syncpoint_ts == compose(3_000)


def test_syncpoint_ready_when_reached_and_recorded_once() -> None:
    m = DDLManager(SP_CHECKPOINT, sync_point_interval_ms=1_000)
    assert m.ready_syncpoint(compose(1_999, 5)) is None
    assert m.ready_syncpoint(compose(2_000)) == compose(2_000)
    assert m.ready_syncpoint(compose(2_000)) == compose(2_000)  # a query: same until recorded
    m.syncpoint_done(compose(2_000))
    assert m.ready_syncpoint(compose(2_000)) is None
    assert m.next_syncpoint_ts == compose(3_000)
    with pytest.raises(ProtocolError, match="syncpoint_done"):
        m.syncpoint_done(compose(2_000))


def test_checkpoint_past_several_syncpoints_records_each_in_order() -> None:
    m = DDLManager(SP_CHECKPOINT, sync_point_interval_ms=1_000)
    ckpt = compose(4_200)  # the tables went on past 2_000, 3_000 and 4_000
    recorded = []
    while (sp := m.ready_syncpoint(ckpt)) is not None:
        m.syncpoint_done(sp)
        recorded.append(sp)
    assert recorded == [compose(2_000), compose(3_000), compose(4_000)]


def test_syncpoint_done_before_reached_raises() -> None:
    m = DDLManager(SP_CHECKPOINT, sync_point_interval_ms=1_000)
    with pytest.raises(ProtocolError, match="syncpoint_done"):
        m.syncpoint_done(compose(2_000))


def test_ddl_at_syncpoint_ts_runs_before_the_syncpoint() -> None:
    sp = compose(2_000)
    m = manager_with(alter(sp, 1), checkpoint_ts=SP_CHECKPOINT, sync_point_interval_ms=1_000)
    assert m.barrier(TABLES) == Barrier(MAX_TS, {1: sp})
    assert m.ready_syncpoint(sp) is None
    assert m.ready(at(sp), sp) == [alter(sp, 1)]
    m.ddl_done(alter(sp, 1))
    assert m.ready_syncpoint(sp) == sp


def test_ddl_after_an_unrecorded_syncpoint_waits_for_its_record() -> None:
    """The syncpoint lists the tables as they were at its TS: a CREATE above it goes after."""
    sp, later = compose(2_000), compose(2_500)
    m = manager_with(create(later, 7), checkpoint_ts=SP_CHECKPOINT, sync_point_interval_ms=1_000)
    assert m.barrier(TABLES) == Barrier(later)  # the CREATE holds; the syncpoint does not
    assert m.ready(at(later), later) == []
    assert m.ready_syncpoint(later) == sp
    m.syncpoint_done(sp)
    assert m.ready(at(later), later) == [create(later, 7)]


def test_table_ddl_after_an_unrecorded_syncpoint_waits_for_its_record() -> None:
    sp, later = compose(2_000), compose(2_500)
    m = manager_with(drop(later, 3), checkpoint_ts=SP_CHECKPOINT, sync_point_interval_ms=1_000)
    assert m.barrier(TABLES) == Barrier(MAX_TS, {3: later})
    assert m.ready(at(later), compose(2_100)) == []  # the dropped table is still in its record
    assert m.ready_syncpoint(compose(2_100)) == sp
    m.syncpoint_done(sp)
    assert m.ready(at(later), compose(2_100)) == [drop(later, 3)]


def test_rebuilt_manager_records_the_syncpoints_its_predecessor_left() -> None:
    """The checkpoint does not wait for syncpoints: an owner that died before recording one
    leaves it below the checkpoint, and its successor starts from the last one recorded."""
    m = DDLManager(compose(3_500), sync_point_interval_ms=1_000, last_syncpoint_ts=compose(1_000))
    assert m.next_syncpoint_ts == compose(2_000)
    assert m.ready_syncpoint(compose(3_500)) == compose(2_000)


def test_syncpoints_between_cuts_a_batch_at_each_aligned_ts() -> None:
    assert syncpoints_between(compose(1_500), compose(4_000), 1_000) == [
        compose(2_000),
        compose(3_000),
    ]  # 4_000 is the batch's end: no cut needed there
    assert syncpoints_between(compose(2_000), compose(2_999, 9), 1_000) == []
    assert syncpoints_between(compose(1_999, 3), compose(2_000, 1), 1_000) == [compose(2_000)]
    assert syncpoints_between(compose(1_500), compose(4_000), None) == []


def test_is_syncpoint_is_an_aligned_ts_with_no_logical_part() -> None:
    assert is_syncpoint(compose(2_000), 1_000)
    assert not is_syncpoint(compose(2_000, 1), 1_000)
    assert not is_syncpoint(compose(2_500), 1_000)
    assert not is_syncpoint(compose(2_000), None)


# ----------------------------------------------------------------------------- target ts
def test_target_ts_is_a_global_barrier_and_ends_the_changefeed() -> None:
    m = DDLManager(10, target_ts=500)
    assert m.barrier(TABLES) == Barrier(500)
    assert m.finished(499) is False
    assert m.finished(500) is True


def test_ddl_after_target_ts_is_ignored() -> None:
    m = DDLManager(10, target_ts=500)
    assert m.add_ddl(alter(600, 1)) is False
    assert m.pending == ()


def test_not_finished_while_a_ddl_at_target_ts_is_pending() -> None:
    m = manager_with(alter(500, 1), target_ts=500)
    assert m.barrier(TABLES) == Barrier(500, {})
    assert m.finished(500) is False
    assert m.ready(at(500), 500) == [alter(500, 1)]
    m.ddl_done(alter(500, 1))
    assert m.finished(500) is True


def test_not_finished_while_a_syncpoint_at_target_ts_is_unrecorded() -> None:
    m = DDLManager(SP_CHECKPOINT, target_ts=compose(2_000), sync_point_interval_ms=1_000)
    assert m.barrier(TABLES) == Barrier(compose(2_000))  # the target, not the syncpoint
    assert m.finished(compose(2_000)) is False
    m.syncpoint_done(compose(2_000))
    assert m.finished(compose(2_000)) is True


def test_without_target_ts_never_finished() -> None:
    assert DDLManager(10).finished(MAX_TS) is False


# ----------------------------------------------------------------------------- DDL stream resolved
def test_global_barrier_never_passes_the_ddl_stream_resolved_ts() -> None:
    """...for a sink that does not read the stream; one that does may go on to the first DDL
    it finds above it (the barrier is open up to what else holds the changefeed)."""
    m = DDLManager(10, ddl_resolved_ts=50)
    assert m.barrier(TABLES) == Barrier(50, {}, MAX_TS)
    m.advance_ddl_resolved(80)
    m.advance_ddl_resolved(60)  # a replayed lower mark says nothing new
    assert m.add_ddl(alter(90, 1))
    assert m.barrier(TABLES) == Barrier(80, {}, MAX_TS)
    m.advance_ddl_resolved(200)
    assert m.barrier(TABLES) == Barrier(200, {1: 90}, MAX_TS)


def test_open_barrier_stops_at_the_target_ts() -> None:
    m = DDLManager(10, ddl_resolved_ts=50, target_ts=500)
    assert m.barrier(TABLES) == Barrier(50, {}, 500)
    m.advance_ddl_resolved(600)
    assert m.barrier(TABLES) == Barrier(500)  # the target holds: closed


def test_global_ddl_at_the_ddl_stream_resolved_ts_closes_the_barrier() -> None:
    m = DDLManager(10, ddl_resolved_ts=50)
    assert m.add_ddl(create(80, 7))
    m.advance_ddl_resolved(80)
    assert m.barrier(TABLES) == Barrier(80)
    m.advance_ddl_resolved(120)
    assert m.barrier(TABLES) == Barrier(80)  # held at the CREATE until it ran


def test_ddl_at_or_below_the_ddl_stream_resolved_ts_raises() -> None:
    m = DDLManager(10, ddl_resolved_ts=50)
    with pytest.raises(ProtocolError, match="resolved past it"):
        m.add_ddl(alter(50, 1))


def test_advance_ddl_resolved_without_tracking_raises() -> None:
    with pytest.raises(ConfigError, match="ddl_resolved_ts"):
        DDLManager(10).advance_ddl_resolved(50)


# ----------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        pytest.param({"sync_point_interval_ms": 0}, "sync_point_interval_ms", id="zero_interval"),
        pytest.param({"target_ts": 5}, "target_ts 5 is below", id="target_below_checkpoint"),
        pytest.param({"ddl_resolved_ts": -1}, "ddl_resolved_ts", id="negative_ddl_resolved"),
    ],
)
def test_bad_config_raises(kwargs: dict[str, int], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        DDLManager(10, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        pytest.param({"commit_ts": -1}, "commit_ts", id="negative_commit_ts"),
        pytest.param({"commit_ts": 1 << 63}, "commit_ts", id="commit_ts_overflows"),
        pytest.param({"kind": "alter_table"}, "DDLKind", id="kind_not_enum"),
        pytest.param({"query": " "}, "query", id="blank_query"),
        pytest.param(
            {"table_ids": ()}, "ALTER_TABLE DDL needs exactly 1 table_ids", id="alter_no_table"
        ),
        pytest.param({"table_ids": (1, 2)}, "exactly 1 table_ids, got 2", id="alter_two_tables"),
        pytest.param({"table_ids": (-1,)}, "table ids >= 0", id="negative_table_id"),
        pytest.param({"table_ids": (True,)}, "table ids >= 0", id="bool_table_id"),
        pytest.param({"creates": (5,)}, "needs exactly 0 creates", id="alter_creates"),
        pytest.param({"drops": (1,)}, "drops no table", id="alter_drops"),
        pytest.param({"schema": ""}, "schema", id="empty_schema"),
        pytest.param(
            {"kind": K.CREATE_TABLE, "table_ids": ()}, "at least 1 creates", id="create_nothing"
        ),
        pytest.param(
            {"kind": K.DROP_TABLE, "drops": (2,)}, "must equal table_ids", id="drop_other_table"
        ),
        pytest.param({"kind": K.MULTI_TABLE}, "at least 2 table_ids", id="multi_table_one_table"),
        pytest.param(
            {"kind": K.RENAME_TABLES, "creates": (1,)}, "both created", id="rename_creates_existing"
        ),
        pytest.param(
            {"kind": K.RENAME_TABLES, "table_ids": (1, 1)}, "twice", id="duplicate_table_id"
        ),
        pytest.param(
            {"kind": K.RENAME_TABLES, "drops": (9,)}, "must be among", id="drops_untouched_table"
        ),
        pytest.param(
            {"kind": K.CREATE_SCHEMA, "table_ids": ()}, "needs schema", id="schema_unnamed"
        ),
    ],
)
def test_invalid_ddl_event_raises(kwargs: dict[str, object], match: str) -> None:
    fields: dict[str, object] = {
        "commit_ts": 100,
        "kind": K.ALTER_TABLE,
        "query": "ALTER TABLE t1 ADD c INT",
        "table_ids": (1,),
    }
    with pytest.raises(InvalidMessageError, match=match):
        DDLEvent(**{**fields, **kwargs})  # type: ignore[arg-type]


def test_drop_table_drops_default_to_its_tables() -> None:
    assert drop(100, 1, 2).drops == (1, 2)
    assert DDLEvent(100, K.DROP_SCHEMA, "DROP DATABASE s", [4, 5], schema="s").drops == (4, 5)


def test_ddl_event_is_frozen() -> None:
    with pytest.raises(AttributeError):
        alter(100, 1).commit_ts = 5  # type: ignore[misc]
