"""A table draining a backlog gathers its sink commits (one per ``batch_behind_s``), on real
Spark, change-log files and Delta, with the wall clock set by the test."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from changelog_v1 import changelog_reader
from scenario import BASE_MS, Workload, delta_content, ts

from cdc_dagster.pipeline.executor import SparkTableExecutor
from cdc_dagster.sinks.delta import DeltaSink
from scheduler_core.messages import Barrier
from scheduler_core.model import Checkpoint, TableState

T = TableState
OPEN = Barrier()
BEHIND_S = 10.0


class Clock:
    """Wall seconds the test moves by hand."""

    def __init__(self, seconds: float) -> None:
        self.now = seconds

    def __call__(self) -> float:
        return self.now


def make(tmp_path: Path, spark: Any, clock: Clock) -> SparkTableExecutor:
    """The executor as its manifest left it (every tick loads it anew, as a capture run does)."""
    ex = SparkTableExecutor.load(
        "c1", "cf", changelog_reader(tmp_path / "log"), f"delta://{tmp_path / 'delta'}",
        tmp_path / "staging", spark, batch_behind_s=BEHIND_S, clock=clock,
    )  # fmt: skip
    ex.set_barrier(OPEN)
    return ex


def started(tmp_path: Path, spark: Any, clock: Clock, tables: list[int]) -> SparkTableExecutor:
    ex = make(tmp_path, spark, clock)
    for t in tables:
        ex.prepare(t, Checkpoint(ts(1), ts(1)))
    ex.pull_phase()
    for t in tables:
        ex.commit(t, Checkpoint(ts(1), ts(1)))
    ex.save()
    return ex


def versions(tmp_path: Path, w: Workload, t: int) -> int:
    from deltalake import DeltaTable

    return DeltaTable(DeltaSink(str(tmp_path / "delta")).path(w.schemas[t])).version()


def checkpoints(ex: SparkTableExecutor) -> set[int]:
    return {rec.checkpoint_ts for rec in ex.tables().values()}


def test_a_backlog_commits_once_per_batch_behind_s_then_at_once_when_caught_up(
    tmp_path: Path, spark: Any, writer: Any
) -> None:
    w = Workload(writer, [1, 2])
    clock = Clock((BASE_MS + 120_000) / 1000)  # the data is two minutes old: a backlog
    started(tmp_path, spark, clock, [1, 2])
    first_versions = {t: versions(tmp_path, w, t) for t in (1, 2)}
    for _ in range(3):  # three ticks of a catching-up puller, a second apart
        w.write(steps=2)
        clock.now += 1
        make(tmp_path, spark, clock).advance()
    ex = make(tmp_path, spark, clock)
    assert checkpoints(ex) == {ts(1)}, "a backlog's tick committed before batch_behind_s"
    assert {t: versions(tmp_path, w, t) for t in (1, 2)} == first_versions
    clock.now += BEHIND_S  # batch_behind_s since the tables started sinking
    gathered = w.write(steps=1)
    ex.advance()
    assert checkpoints(ex) == {gathered}
    for t in (1, 2):  # one MERGE for the whole backlog, equal to the oracle
        assert versions(tmp_path, w, t) == first_versions[t] + 1
        assert delta_content(tmp_path / "delta", w.schemas[t]) == w.expected(t, gathered)
    # Caught up (the newest change is a second old): every tick commits at once.
    for _ in range(2):
        top = w.write(steps=1)
        clock.now = (BASE_MS + w.step * 1000 + 1000) / 1000
        ex = make(tmp_path, spark, clock)
        ex.advance()
        assert checkpoints(ex) == {top}
    for t in (1, 2):
        assert delta_content(tmp_path / "delta", w.schemas[t]) == w.expected(t, top)


@pytest.mark.slow
def test_a_backlog_cut_by_a_barrier_commits_at_once_so_its_ddl_can_run(
    tmp_path: Path, spark: Any, writer: Any
) -> None:
    w = Workload(writer, [1, 2])
    clock = Clock((BASE_MS + 120_000) / 1000)
    ex = started(tmp_path, spark, clock, [1, 2])
    held = w.write(steps=2)
    w.write(steps=2)
    ex.set_barrier(Barrier(table_barriers={1: held}))  # table 1 waits at a DDL
    ex.advance()
    assert ex.status(1).checkpoint.checkpoint_ts == held  # cut by its barrier: committed
    assert ex.status(2).checkpoint.checkpoint_ts == ts(1)  # a backlog: gathers
    assert delta_content(tmp_path / "delta", w.schemas[1]) == w.expected(1, held)


def test_a_backlog_gathers_past_an_open_barrier_the_owner_has_not_moved_yet(
    tmp_path: Path, spark: Any, writer: Any
) -> None:
    """The owner's open barrier (how far it read the DDL stream) lags a drain's staged data
    by a tick: that cut is no DDL waiting, so the batch still gathers."""
    w = Workload(writer, [1])
    clock = Clock((BASE_MS + 120_000) / 1000)
    ex = started(tmp_path, spark, clock, [1])
    seen = w.write(steps=2)
    w.write(steps=2)
    ex.set_barrier(Barrier(seen, open_until_ts=seen + 1))  # below the staged data
    ex.advance()
    assert ex.status(1).checkpoint.checkpoint_ts == ts(1)


@pytest.mark.slow
def test_a_stopping_table_flushes_its_backlog_at_once(
    tmp_path: Path, spark: Any, writer: Any
) -> None:
    w = Workload(writer, [1])
    clock = Clock((BASE_MS + 120_000) / 1000)
    ex = started(tmp_path, spark, clock, [1])
    top = w.write(steps=3)
    ex.advance()
    assert ex.status(1).checkpoint.checkpoint_ts == ts(1)
    ex.remove(1)
    ex.advance()
    final = ex.status(1)
    assert final.state == T.STOPPED and final.checkpoint.checkpoint_ts == top
    assert delta_content(tmp_path / "delta", w.schemas[1]) == w.expected(1, top)
