"""Where a rebuilt owner takes a changefeed's tables and DDLs from (TiCDC's ddlStartTs rule)."""

from __future__ import annotations

from cdc_dagster.metastore import DdlState
from cdc_dagster.runtime.owner import ddls_done_upto, rebuild_ts
from scheduler_core.messages import Barrier
from scheduler_core.ts import compose

CP = compose(1_700_000_000_123) + 4


def test_new_changefeed_sees_the_schema_at_its_start_ts() -> None:
    assert ddls_done_upto(CP, None) == CP
    assert rebuild_ts(CP, CP, None, None) == CP


def test_barrier_at_the_checkpoint_may_hold_a_ddl_not_yet_run() -> None:
    state = DdlState(Barrier(CP))
    assert ddls_done_upto(CP, state) == CP - 1
    assert rebuild_ts(CP, CP - 1, state, None) == CP - 1


def test_table_barrier_at_the_checkpoint_also_sends_the_rebuild_back_one() -> None:
    state = DdlState(Barrier(CP + 100, {7: CP}))
    assert ddls_done_upto(CP, state) == CP - 1


def test_barrier_above_the_checkpoint_means_every_ddl_at_it_ran() -> None:
    state = DdlState(Barrier(CP + 100))
    assert ddls_done_upto(CP, state) == CP + 99
    assert rebuild_ts(CP, CP + 99, state, None) == CP


def test_persisted_finished_ddl_ts_counts() -> None:
    state = DdlState(Barrier(CP), finished_ddl_ts=CP)  # the first tick of a new changefeed
    assert ddls_done_upto(CP, state) == CP


def test_syncpoint_exactly_at_the_checkpoint_not_recorded_yet_is_queued_again() -> None:
    aligned = compose(1_700_000_010_000)
    state = DdlState(Barrier(aligned + 5), finished_ddl_ts=aligned, last_syncpoint_ts=0)
    assert rebuild_ts(aligned, aligned, state, 10_000) == aligned - 1
    recorded = DdlState(Barrier(aligned + 5), finished_ddl_ts=aligned, last_syncpoint_ts=aligned)
    assert rebuild_ts(aligned, aligned, recorded, 10_000) == aligned
    assert rebuild_ts(aligned + 1, aligned + 1, state, 10_000) == aligned + 1
