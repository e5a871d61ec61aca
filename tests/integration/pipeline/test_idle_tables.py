"""An idle table (its resolved ts moves, no row change) moves its checkpoint without a sink
commit: a changefeed of many quiet tables cost one Delta commit per table per tick. The
sink's record stays behind (``sink_ts``) until the next row change, a syncpoint, a DDL or
barrier, the table's stop, or ``IDLE_SINK_MS``; the next write starts where the sink is,
and a new primary accepts a downstream behind its checkpoint only when the change log has
nothing of the table in between. On real Spark, change-log files and Delta."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from changelog_v1 import changelog_reader
from helpers import rows
from scenario import BASE_MS, Workload, delta_content, ts
from test_backlog_batching import OPEN, Clock

from cdc_dagster.pipeline.executor import IDLE_SINK_MS, SparkTableExecutor
from cdc_dagster.pipeline.staging import TableState
from cdc_dagster.sinks.delta import DeltaSink, app_id, version_at
from scheduler_core.errors import ExecutorContractError
from scheduler_core.model import Checkpoint


def make(
    tmp_path: Path, spark: Any, clock: Clock, capture: str = "c1", interval_ms: int | None = None,
    behind_s: float = 0.0,
) -> SparkTableExecutor:  # fmt: skip
    ex = SparkTableExecutor.load(
        capture, "cf", changelog_reader(tmp_path / "log"), f"delta://{tmp_path / 'delta'}",
        tmp_path / f"staging-{capture}", spark, clock=clock, sync_point_interval_ms=interval_ms,
        batch_behind_s=behind_s,
    )  # fmt: skip
    ex.set_barrier(OPEN)
    return ex


def start(ex: SparkTableExecutor, tables: list[int], at: int) -> None:
    for t in tables:
        ex.prepare(t, Checkpoint(at, at))
    ex.pull_phase()
    for t in tables:
        ex.commit(t, Checkpoint(at, at))
    ex.save()


def write_only(w: Workload, tables: list[int]) -> int:
    """One commit ts of changes to ``tables`` only (the others idle); resolve all; the ts."""
    w.step += 1
    commit_ts = ts(w.step)
    for t in tables:
        batch = [w._change(t, commit_ts, seq) for seq in range(20)]
        w.changes[t] += batch
        w.writer.write_rows(t, 0, ts(1), rows(w.schemas[t], batch))
    w.resolve(commit_ts)
    return commit_ts


def idle(w: Workload, seconds: int = 3) -> int:
    """Resolved moves ``seconds`` on, no row change; the new resolved ts."""
    w.step += seconds
    w.resolve(ts(w.step))
    return ts(w.step)


def sink_state(tmp_path: Path, w: Workload, t: int) -> tuple[int, int]:
    """(Delta version, committed ts) of table ``t``."""
    from deltalake import DeltaTable

    sink = DeltaSink(str(tmp_path / "delta"))
    return (
        DeltaTable(sink.path(w.schemas[t])).version(),
        sink.committed("cf", w.schemas[t]).committed_ts,
    )


def written_once(
    tmp_path: Path, spark: Any, writer: Any
) -> tuple[Workload, Clock, SparkTableExecutor, int]:
    """Tables 1 and 2 replicating, one batch of changes each written; that batch's ts."""
    w = Workload(writer, [1, 2])
    clock = Clock(BASE_MS / 1000 + 10)
    ex = make(tmp_path, spark, clock)
    start(ex, [1, 2], ts(1))
    first = write_only(w, [1, 2])
    ex.advance()
    return w, clock, ex, first


def test_an_idle_table_moves_its_checkpoint_without_a_commit_and_writes_on_from_the_sink(
    tmp_path: Path, spark: Any, writer: Any
) -> None:
    w, clock, ex, first = written_once(tmp_path, spark, writer)
    assert {r.checkpoint_ts for r in ex.tables().values()} == {first}
    before = {t: sink_state(tmp_path, w, t) for t in (1, 2)}
    assert before[2][1] == first
    # Table 2 idles while table 1 changes: both checkpoints move, only table 1 commits.
    for _ in range(3):
        second = write_only(w, [1])
        clock.now += 1
        ex.advance()
        ex.save()
        ex = make(tmp_path, spark, clock)  # as a capture run's next tick: from the manifest
    assert ex.status(1).checkpoint.checkpoint_ts == second
    assert ex.status(2).checkpoint.checkpoint_ts == second
    assert sink_state(tmp_path, w, 2) == before[2]  # no commit: same version, same record
    assert ex.tables()[2].sink_ts == first
    assert sink_state(tmp_path, w, 1)[1] == second
    # All idle: the checkpoints follow resolved, nothing is written.
    quiet = idle(w)
    clock.now += 1
    ex.advance()
    assert {r.checkpoint_ts for r in ex.tables().values()} == {quiet}
    assert sink_state(tmp_path, w, 2) == before[2]
    # Table 2 changes again: one write from where its sink is, equal to the oracle.
    third = write_only(w, [2])
    clock.now += 1
    ex.advance()
    assert ex.status(2).checkpoint.checkpoint_ts == third
    assert ex.tables()[2].sink_ts == 0
    assert sink_state(tmp_path, w, 2) == (before[2][0] + 1, third)
    assert delta_content(tmp_path / "delta", w.schemas[2]) == w.expected(2, third)
    assert delta_content(tmp_path / "delta", w.schemas[1]) == w.expected(1, third)
    # Idle: the sink's record falls behind, up to IDLE_SINK_MS of commit ts; then written.
    version = sink_state(tmp_path, w, 1)[0]
    idle(w, IDLE_SINK_MS // 1000 - 5)
    clock.now += 1
    ex.advance()
    assert sink_state(tmp_path, w, 1)[0] == version
    later = idle(w, 6)
    clock.now += 1
    ex.advance()
    assert sink_state(tmp_path, w, 1) == (version + 1, later)
    assert ex.tables()[1].sink_ts == 0


def test_an_idle_stretch_still_commits_at_each_syncpoint(
    tmp_path: Path, spark: Any, writer: Any
) -> None:
    """A syncpoint needs each table's version exactly at its ts (``version_at``)."""
    w = Workload(writer, [1])
    clock = Clock(BASE_MS / 1000 + 10)
    ex = make(tmp_path, spark, clock, interval_ms=5000)  # ts(5), ts(10): syncpoints
    start(ex, [1], ts(1))
    first = write_only(w, [1])  # ts(2)
    ex.advance()
    assert ex.status(1).checkpoint.checkpoint_ts == first
    quiet = idle(w, 5)  # ts(7): (ts(2), ts(7)] holds the syncpoint ts(5)
    clock.now += 1
    ex.advance()
    assert ex.status(1).checkpoint.checkpoint_ts == quiet
    from deltalake import DeltaTable

    sink = DeltaSink(str(tmp_path / "delta"))
    path = sink.path(w.schemas[1])
    assert version_at(DeltaTable(path), path, app_id("cf", "checkpoint"), ts(5)) is not None
    # ... and an idle batch with none in it is not written.
    assert sink.committed("cf", w.schemas[1]).committed_ts == quiet
    version = DeltaTable(path).version()
    idle(w, 2)  # ts(9)
    clock.now += 1
    ex.advance()
    assert DeltaTable(path).version() == version


def test_a_new_primary_takes_a_table_whose_sink_is_behind_only_if_nothing_changed_since(
    tmp_path: Path, spark: Any, writer: Any
) -> None:
    w, clock, old, first = written_once(tmp_path, spark, writer)
    quiet = idle(w)
    clock.now += 1
    old.advance()
    old.save()
    assert old.status(1).checkpoint.checkpoint_ts == quiet
    assert sink_state(tmp_path, w, 1)[1] == first  # the old primary reported quiet, wrote none
    # The old primary dies; the owner moves table 1 at the checkpoint it reported.
    new = make(tmp_path, spark, clock, capture="c2")
    start(new, [1], quiet)
    assert new.tables()[1].state == TableState.REPLICATING
    assert new.tables()[1].sink_ts == first  # the first write starts where the sink is
    after = write_only(w, [1, 2])
    clock.now += 1
    new.advance()
    assert new.status(1).checkpoint.checkpoint_ts == after
    assert delta_content(tmp_path / "delta", w.schemas[1]) == w.expected(1, after)
    # Table 2: changes the old primary never wrote lie between its sink and the checkpoint
    # the owner gives (a checkpoint it could not have reported): refused, loudly.
    later = write_only(w, [2])
    new.prepare(2, Checkpoint(later, later))
    new.pull_phase()
    with pytest.raises(ExecutorContractError, match="previous primary's writes"):
        new.commit(2, Checkpoint(later, later))


def test_a_backlog_after_an_idle_stretch_gathers_as_after_a_write(
    tmp_path: Path, spark: Any, writer: Any
) -> None:
    """A backlog's batches gather for ``batch_behind_s`` from the table's last commit; an
    idle batch counts as one (it was an empty commit), else a backlog arriving after a
    pause committed at its first tick, a MERGE more per table."""
    w = Workload(writer, [1])
    clock = Clock(BASE_MS / 1000 + 2)
    ex = make(tmp_path, spark, clock, behind_s=10)
    start(ex, [1], ts(1))  # its last commit: at 2 s
    idle(w, 20)  # ts(21): less than IDLE_SINK_MS behind, no write
    clock.now = BASE_MS / 1000 + 25
    ex.advance()
    assert ex.status(1).checkpoint.checkpoint_ts == ts(21)
    version = sink_state(tmp_path, w, 1)[0]
    backlog = write_only(w, [1])  # ts(22), read 11 s after it was written: a backlog
    clock.now = BASE_MS / 1000 + 33
    ex.advance()
    assert ex.status(1).checkpoint.checkpoint_ts == ts(21)  # gathers: 8 s since the idle one
    assert sink_state(tmp_path, w, 1)[0] == version
    clock.now += 10
    ex.advance()
    assert ex.status(1).checkpoint.checkpoint_ts == backlog
    assert delta_content(tmp_path / "delta", w.schemas[1]) == w.expected(1, backlog)
