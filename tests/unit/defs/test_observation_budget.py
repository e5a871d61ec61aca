"""The owner sensor's asset observations: a bounded number a tick, changed assets first."""

from __future__ import annotations

import dagster as dg

from cdc_dagster.defs.catalog import Catalog, TableRef
from cdc_dagster.defs.tables.assets import ObservationBudget, progress_observations
from cdc_dagster.runtime import TableProgress
from scheduler_core.ts import compose

NOW_MS = 1_700_000_000_000
CATALOG = Catalog.of(TableRef(t, f"db{t % 4}", f"t{t}") for t in range(1, 101))  # 100 assets


def reports(state: str = "replicating", capture: str = "c1") -> list[TableProgress]:
    ts = compose(NOW_MS - 1000)
    return [TableProgress("cf", t.table_id, state, capture, ts, ts, ts, 0) for t in CATALOG.tables]


def test_without_a_budget_every_asset_is_observed_every_tick() -> None:
    for _ in range(2):
        assert len(progress_observations(CATALOG, reports(), NOW_MS)) == 100


def test_a_budget_caps_the_observations_of_a_tick_and_observes_the_rest_on_later_ticks() -> None:
    budget = ObservationBudget(per_tick=30, refresh_s=60)
    seen = []
    for tick in range(4):
        events = progress_observations(CATALOG, reports(), NOW_MS + tick * 5000, budget)
        assert len(events) == min(30, 100 - len(seen))
        seen += [e.asset_key for e in events]
    assert len(set(seen)) == 100  # each once, none twice
    assert progress_observations(CATALOG, reports(), NOW_MS + 20_000, budget) == []


def test_an_asset_whose_state_changed_goes_before_stale_ones() -> None:
    budget = ObservationBudget(per_tick=10, refresh_s=60)
    for tick in range(10):
        progress_observations(CATALOG, reports(), NOW_MS + tick * 1000, budget)
    moved = reports()
    r = moved[0]
    moved[0] = TableProgress(
        "cf", 1, "commit", "c2", r.checkpoint_ts, r.resolved_ts, r.barrier_ts, 0
    )
    later = NOW_MS + 120_000  # every asset is stale by now
    (first, *rest) = progress_observations(CATALOG, moved, later, budget)
    assert first.asset_key == CATALOG.replica_key(CATALOG.tables[0])
    assert first.metadata["state"].value == "commit"
    assert len(rest) == 9  # then the stalest, up to the budget


def test_grouped_tables_make_one_observation_per_schema() -> None:
    grouped = Catalog.of(CATALOG.tables, max_table_assets=10)
    events = progress_observations(grouped, reports(), NOW_MS, ObservationBudget(per_tick=50))
    assert sorted(e.asset_key.path[-1] for e in events) == ["db0", "db1", "db2", "db3"]
    assert {e.metadata["tables"].value for e in events} == {25}


def test_follow_ticks_log_every_materialization_of_a_small_capture_and_throttle_a_large_one() -> (
    None
):
    from cdc_dagster.defs.tables.assets import MaterializationThrottle

    def events(n: int, state: str = "replicating") -> list[dg.AssetMaterialization]:
        return [
            dg.AssetMaterialization(
                asset_key=dg.AssetKey(["replica", "db", f"t{i}"]),
                metadata={"state": state if i else "preparing", "capture": "c1"},
            )
            for i in range(n)
        ]

    small = MaterializationThrottle(free=10, every_s=15)
    for t in range(3):
        assert len(small.select(events(10), float(t))) == 10  # every tick, all of them
    big = MaterializationThrottle(free=10, every_s=15)
    assert len(big.select(events(50), 0.0)) == 50  # first sight: all
    assert big.select(events(50), 5.0) == []  # nothing changed, not due
    changed = events(50)
    changed[0] = dg.AssetMaterialization(
        asset_key=changed[0].asset_key, metadata={"state": "replicating", "capture": "c1"}
    )
    assert [e.asset_key for e in big.select(changed, 6.0)] == [changed[0].asset_key]
    assert len(big.select(changed, 15.0)) == 49  # due again (the changed one logged at 6 s)


def test_follow_ticks_log_an_idle_tables_materialization_every_idle_every_s_unless_it_waits_at_a_barrier() -> (
    None
):
    """An idle table's checkpoint only follows its resolved ts: logged every ``idle_every_s``
    (an event-log write each, most of an idle capture's CPU). A table with rows applied
    since it was logged is logged each tick; one that stopped at its barrier (a DDL's gate
    reads its checkpoint) at once."""
    from cdc_dagster.defs.tables.assets import MaterializationThrottle

    def event(i: int, rows: int, checkpoint: int, barrier: int) -> dg.AssetMaterialization:
        return dg.AssetMaterialization(
            asset_key=dg.AssetKey(["replica", "db", f"t{i}"]),
            metadata={"state": "replicating", "capture": "c1", "rows_applied": rows,
                      "checkpoint_ts_raw": checkpoint, "barrier_ts_raw": barrier,
                      "resolved_ts_raw": max(checkpoint, 500)},
        )  # fmt: skip

    throttle = MaterializationThrottle(free=10, every_s=15, idle_every_s=10)
    keys = lambda out: sorted(e.asset_key.path[-1] for e in out)  # noqa: E731
    assert keys(throttle.select([event(i, 5, 100, 90) for i in range(3)], 0.0)) == [
        "t0",
        "t1",
        "t2",
    ]
    # t0 applied rows, t1 idle, t2 stopped at its barrier (a DDL waits for it)
    tick = [event(0, 9, 200, 90), event(1, 5, 200, 90), event(2, 5, 150, 150)]
    assert keys(throttle.select(tick, 2.0)) == ["t0", "t2"]
    # still held at the same checkpoint: not again; the idle one not yet due
    tick = [event(0, 9, 300, 90), event(1, 5, 300, 90), event(2, 5, 150, 150)]
    assert keys(throttle.select(tick, 4.0)) == []
    tick = [event(0, 9, 400, 90), event(1, 5, 400, 90), event(2, 5, 150, 150)]
    assert keys(throttle.select(tick, 10.0)) == ["t1"]  # due: 10 s since it was logged
    assert keys(throttle.select(tick, 12.5)) == ["t0"]  # its at 2.0 s
    # caught up, its checkpoint at an owner's barrier that is its resolved ts: not held
    idle_at_barrier = [event(1, 5, 500 + k, 500 + k) for k in (1, 2, 3)]
    assert keys(throttle.select(idle_at_barrier[:1], 13.0)) == []
    assert keys(throttle.select(idle_at_barrier[1:2], 14.0)) == []
    # t2, held at the same checkpoint since 2.0 s: only its lag changes, so it is logged
    # again every still_every_s (30 s), not every idle_every_s
    held = [event(2, 5, 150, 150)]
    assert keys(throttle.select(held, 31.0)) == []
    assert keys(throttle.select(held, 32.5)) == ["t2"]


def test_a_table_whose_checkpoint_does_not_move_is_logged_every_still_every_s() -> None:
    """A snapshot's released tables wait tens of seconds for their turn to be sunk (their
    checkpoint still): only their lag changes, logged every ``still_every_s``; an idle
    table whose checkpoint follows its resolved ts, every ``idle_every_s``."""
    from cdc_dagster.defs.tables.assets import MaterializationThrottle

    def event(i: int, checkpoint: int) -> dg.AssetMaterialization:
        return dg.AssetMaterialization(
            asset_key=dg.AssetKey(["replica", "db", f"t{i}"]),
            metadata={"state": "replicating", "capture": "c1", "rows_applied": 0,
                      "checkpoint_ts_raw": checkpoint, "barrier_ts_raw": 1 << 40,
                      "resolved_ts_raw": checkpoint + 1000},
        )  # fmt: skip

    throttle = MaterializationThrottle(free=10, every_s=15, idle_every_s=10, still_every_s=30)
    keys = lambda out: sorted(e.asset_key.path[-1] for e in out)  # noqa: E731
    assert keys(throttle.select([event(0, 100), event(1, 100)], 0.0)) == ["t0", "t1"]
    # t0's checkpoint follows its resolved ts (idle), t1's stays (waiting or stalled)
    assert keys(throttle.select([event(0, 200), event(1, 100)], 10.0)) == ["t0"]
    assert keys(throttle.select([event(0, 300), event(1, 100)], 20.0)) == ["t0"]
    assert keys(throttle.select([event(0, 300), event(1, 100)], 29.0)) == []
    assert keys(throttle.select([event(0, 400), event(1, 100)], 30.0)) == ["t0", "t1"]
    # once t1 moves again it is an idle table like t0
    assert keys(throttle.select([event(0, 500), event(1, 900)], 40.0)) == ["t0", "t1"]
