"""A changefeed's sink writes take at most ``sink_duty`` of its time on a capture: after a sink
phase whose writes took d seconds, the tables it wrote wait d * (1 - duty) / duty (at most
``PACE_MAX_MS``), unless a DDL or syncpoint waits for one. On real Spark, change-log files and Delta, the wall clock set
by the test (the write's own seconds are measured)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from changelog_v1 import changelog_reader
from scenario import BASE_MS, Workload, delta_content, ts
from test_backlog_batching import OPEN, Clock

from cdc_dagster.pipeline.executor import PACE_MAX_MS, SparkTableExecutor
from scheduler_core.messages import Barrier
from scheduler_core.model import Checkpoint

DUTY = 0.25  # a write of d waits 3d


def make(tmp_path: Path, spark: Any, clock: Clock) -> SparkTableExecutor:
    ex = SparkTableExecutor.load(
        "c1", "cf", changelog_reader(tmp_path / "log"), f"delta://{tmp_path / 'delta'}",
        tmp_path / "staging", spark, clock=clock, sink_duty=DUTY,
    )  # fmt: skip
    ex.set_barrier(OPEN)
    return ex


def fresh(w: Workload) -> float:
    """Wall seconds a second after the workload's last write (no backlog)."""
    return (BASE_MS + w.step * 1000 + 1000) / 1000


def test_a_table_waits_after_each_write_in_proportion_to_its_cost(
    tmp_path: Path, spark: Any, writer: Any
) -> None:
    w = Workload(writer, [1, 2])
    clock = Clock(fresh(w))
    ex = make(tmp_path, spark, clock)
    for t in (1, 2):
        ex.prepare(t, Checkpoint(ts(1), ts(1)))
    ex.pull_phase()
    for t in (1, 2):
        ex.commit(t, Checkpoint(ts(1), ts(1)))
    ex.save()
    first = w.write(steps=1)
    clock.now = fresh(w)
    ex = make(tmp_path, spark, clock)
    ex.advance()  # no write measured yet: commits at once
    assert {r.checkpoint_ts for r in ex.tables().values()} == {first}
    rec = ex.tables()[1]
    assert 0 < rec.sink_ms < PACE_MAX_MS, rec.sink_ms
    # the phase's writes count together: both tables wait for both writes' time
    assert ex.tables()[2].sink_ms == rec.sink_ms
    wait_ms = rec.sink_ms * (1 - DUTY) / DUTY
    # Within the wait: the new batch stays staged, nothing is written.
    second = w.write(steps=1)
    clock.now = (rec.sunk_at_ms + wait_ms / 2) / 1000
    ex = make(tmp_path, spark, clock)
    ex.advance()
    assert ex.status(1).checkpoint.checkpoint_ts == first
    assert delta_content(tmp_path / "delta", w.schemas[1]) == w.expected(1, first)
    # ... unless a DDL waits for it (its barrier cuts the batch): table 2 commits now.
    ex.set_barrier(Barrier(table_barriers={2: second}))
    ex.advance()
    assert ex.status(2).checkpoint.checkpoint_ts == second
    assert ex.status(1).checkpoint.checkpoint_ts == first
    # Past the wait: it commits, equal to the oracle.
    ex.set_barrier(OPEN)
    clock.now = (rec.sunk_at_ms + wait_ms + 1) / 1000
    ex = make(tmp_path, spark, clock)
    ex.advance()
    assert ex.status(1).checkpoint.checkpoint_ts == second
    assert delta_content(tmp_path / "delta", w.schemas[1]) == w.expected(1, second)


def test_after_a_large_write_the_next_batch_is_not_paced(
    tmp_path: Path, spark: Any, writer: Any, monkeypatch: Any
) -> None:
    """A write of PACE_ROWS rows or more (a backlog's, a snapshot's batch) cost its rows, not
    a rewrite: the next batch (a drain's tail) commits at once."""
    from cdc_dagster.pipeline import executor

    monkeypatch.setattr(executor, "PACE_ROWS", 1)  # every write here counts as large
    w = Workload(writer, [1])
    clock = Clock(fresh(w))
    ex = make(tmp_path, spark, clock)
    ex.prepare(1, Checkpoint(ts(1), ts(1)))
    ex.pull_phase()
    ex.commit(1, Checkpoint(ts(1), ts(1)))
    ex.save()
    w.write(steps=1)
    clock.now = fresh(w)
    ex = make(tmp_path, spark, clock)
    ex.advance()
    rec = ex.tables()[1]
    assert rec.sink_ms == 0
    second = w.write(steps=1)
    clock.now = (rec.sunk_at_ms + 1) / 1000  # right after the write
    ex = make(tmp_path, spark, clock)
    ex.advance()
    assert ex.status(1).checkpoint.checkpoint_ts == second
