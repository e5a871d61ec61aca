"""A changefeed's tick moves at most ``tick_rows`` row changes per phase: a table with a large
backlog (a snapshot's rows resolved at once) moves in slices, the small tables beside it
move whole every tick, and the sink equals the oracle at every checkpoint; on real Spark,
change-log files and Delta."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from changelog_v1 import changelog_reader
from scenario import BASE_MS, Workload, delta_content, ts
from test_backlog_batching import Clock, started

from cdc_dagster.pipeline.executor import SparkTableExecutor
from scheduler_core.messages import Barrier
from scheduler_core.model import Checkpoint, TableState

T = TableState
BUDGET = 60


def make(tmp_path: Path, spark: Any, clock: Clock) -> SparkTableExecutor:
    ex = SparkTableExecutor.load(
        "c1", "cf", changelog_reader(tmp_path / "log"), f"delta://{tmp_path / 'delta'}",
        tmp_path / "staging", spark, batch_behind_s=10.0, clock=clock, tick_rows=BUDGET,
    )  # fmt: skip
    ex.set_barrier(Barrier())
    return ex


def _big_then_small(w: Workload) -> int:
    """Table 1 gets 200 changes in 10 files; then every table 5 in one: the top ts."""
    everyone = w.schemas
    w.schemas = {1: everyone[1]}
    w.write(steps=10, per_step=20)
    w.schemas = everyone
    return w.write(steps=1, per_step=5)


def test_a_large_backlog_moves_in_slices_while_the_small_tables_move_whole(
    tmp_path: Path, spark: Any, writer: Any
) -> None:
    w = Workload(writer, [1, 2, 3])
    clock = Clock((BASE_MS + 12_000) / 1000)  # the newest change is a second old: no backlog
    started(tmp_path, spark, clock, [1, 2, 3])
    top = _big_then_small(w)
    ticks, seen, applied = 0, [], make(tmp_path, spark, clock).rows_applied()
    while True:
        ex = make(tmp_path, spark, clock)
        staged = ex.pull_phase()
        assert sum(staged.values()) <= BUDGET + 20  # the budget, and at most one file past it
        written = ex.sink_phase()
        assert sum(written.values()) <= BUDGET + 20
        # each slice's rows count as it is written (the owner's health judgement sees a
        # table held at one ts move by them), and the count outlives the process
        assert ex.rows_applied() == {t: applied[t] + written.get(t, 0) for t in applied}
        assert written.get(1, 0) > 0
        applied = ex.rows_applied()
        ticks += 1
        cps = {t: ex.status(t).checkpoint.checkpoint_ts for t in (1, 2, 3)}
        assert cps[2] == cps[3] == top, "a small table waited for the large one"
        seen.append(cps[1])
        assert delta_content(tmp_path / "delta", w.schemas[1]) == w.expected(1, cps[1])
        if cps[1] == top:
            break
        assert ticks < 12
    assert ticks >= 4 and seen == sorted(seen) and len(set(seen)) == ticks  # slices, in order
    for t in (1, 2, 3):
        assert delta_content(tmp_path / "delta", w.schemas[t]) == w.expected(t, top)


def test_a_preparing_table_is_prepared_only_once_its_slices_reach_the_resolved_ts(
    tmp_path: Path, spark: Any, writer: Any
) -> None:
    w = Workload(writer, [1])
    w.write(steps=6, per_step=20)
    clock = Clock((BASE_MS + 12_000) / 1000)
    ex = make(tmp_path, spark, clock)
    ex.prepare(1, Checkpoint(ts(1), ts(1)))
    states = []
    for _ in range(4):
        ex.pull_phase()
        states.append(ex.status(1).state)
    assert states[0] == T.PREPARING and T.PREPARED in states


def test_a_backlog_of_a_budget_or_more_commits_each_tick_instead_of_gathering(
    tmp_path: Path, spark: Any, writer: Any
) -> None:
    w = Workload(writer, [1])
    clock = Clock((BASE_MS + 120_000) / 1000)  # two minutes behind: a backlog
    ex = make(tmp_path, spark, clock)
    ex.prepare(1, Checkpoint(ts(1), ts(1)))
    ex.pull_phase()
    ex.commit(1, Checkpoint(ts(1), ts(1)))
    ex.save()
    w.write(steps=10, per_step=20)
    before = ts(1)
    for _ in range(2):  # no time passes: a small backlog would gather batch_behind_s
        ex = make(tmp_path, spark, clock)
        ex.advance()
        now = ex.status(1).checkpoint.checkpoint_ts
        assert now > before
        assert delta_content(tmp_path / "delta", w.schemas[1]) == w.expected(1, now)
        before = now


def test_tables_with_large_batches_count_at_least_a_tables_cost(
    tmp_path: Path, spark: Any, writer: Any, monkeypatch: Any
) -> None:
    """Two tables of 30 changes each (two files), large batches at a table's cost of 60: one
    moves whole and fills the budget, the other moves one file; counted by rows (30 + 30)
    both would move whole."""
    from cdc_dagster.pipeline import executor

    monkeypatch.setattr(executor, "BIG_BATCH_ROWS", 30)
    monkeypatch.setattr(executor, "TABLE_COST_ROWS", BUDGET)
    w = Workload(writer, [1, 2])
    clock = Clock((BASE_MS + 12_000) / 1000)
    ex = make(tmp_path, spark, clock)
    for t in (1, 2):
        ex.prepare(t, Checkpoint(ts(1), ts(1)))
    ex.pull_phase()
    top = w.write(steps=2, per_step=15)
    assert {t: len(w.changes[t]) for t in (1, 2)} == {1: 30, 2: 30}
    ex.pull_phase()
    reached = sorted(ex.status(t).checkpoint.resolved_ts for t in (1, 2))
    assert reached == [top - (ts(3) - ts(2)), top]  # one file, and the whole table


def test_a_table_with_a_bulk_phase_waits_whole_when_deferring(
    tmp_path: Path, spark: Any, writer: Any
) -> None:
    """A run's first tick defers bulk phases (``defer_rows``): the 200-change table neither
    pulls nor sinks there while the small tables move whole; the next tick moves it."""
    w = Workload(writer, [1, 2, 3])
    clock = Clock((BASE_MS + 12_000) / 1000)
    started(tmp_path, spark, clock, [1, 2, 3])
    top = _big_then_small(w)

    def tick(defer: int) -> dict[int, int]:
        ex = make(tmp_path, spark, clock)
        ex.defer_rows = defer
        ex.tick_rows = 0  # no slicing: only the deferral holds the large table back
        ex.pull_phase()
        ex.sink_phase()
        return {t: ex.status(t).checkpoint.checkpoint_ts for t in (1, 2, 3)}

    first = tick(defer=100)
    assert first[2] == first[3] == top and first[1] == ts(1), first
    assert delta_content(tmp_path / "delta", w.schemas[1]) == w.expected(1, ts(1))
    after = tick(defer=0)
    assert after == {1: top, 2: top, 3: top}
    for t in (1, 2, 3):
        assert delta_content(tmp_path / "delta", w.schemas[t]) == w.expected(t, top)
