"""SparkTableExecutor on a real local Spark session, real change-log files and real Delta."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from changelog_v1 import changelog_reader
from scenario import Workload, delta_content, ts

from cdc_dagster.pipeline.executor import SparkTableExecutor
from scheduler_core.errors import ExecutorContractError
from scheduler_core.messages import Barrier
from scheduler_core.model import Checkpoint, TableState

T = TableState
OPEN = Barrier()  # no barrier: sink up to resolved


def make(tmp_path: Path, spark: Any, capture: str = "c1") -> SparkTableExecutor:
    return SparkTableExecutor.load(
        capture,
        "cf",
        changelog_reader(tmp_path / "log"),
        f"delta://{tmp_path / 'delta'}",
        tmp_path / "staging",
        spark,
    )


def start(ex: SparkTableExecutor, tables: list[int], at: int) -> None:
    """Prepare, pull until PREPARED, commit: the Agent's add path for a new primary."""
    for t in tables:
        ex.prepare(t, Checkpoint(at, at))
    ex.pull_phase()
    for t in tables:
        assert ex.status(t).state == T.PREPARED
        ex.commit(t, Checkpoint(at, at))
        assert ex.status(t).state == T.REPLICATING


def assert_replicated(tmp_path: Path, w: Workload, upto: int) -> None:
    for t, schema in w.schemas.items():
        want = w.expected(t, upto)
        assert want  # the comparison means something
        assert delta_content(tmp_path / "delta", schema) == want, t


def test_prepare_commit_replicate_several_tables_equals_the_expected_content(
    tmp_path: Path, spark: Any, writer: Any
) -> None:
    w = Workload(writer, [1, 2, 3])
    first = w.write(steps=3)
    ex = make(tmp_path, spark)
    ex.set_barrier(OPEN)
    start(ex, [1, 2, 3], ts(1))
    ex.sink_phase()
    assert {ex.status(t).checkpoint.checkpoint_ts for t in (1, 2, 3)} == {first}
    assert_replicated(tmp_path, w, first)
    second = w.write(steps=2)
    ex.advance()
    assert_replicated(tmp_path, w, second)
    assert ex.status(2).checkpoint == Checkpoint(second, second)
    assert not ex.errors()
    # Staged data at or below the checkpoint is pruned.
    assert all(not rec.files for rec in ex.tables().values())


@pytest.mark.slow
def test_sinks_stop_at_the_barrier_and_a_table_barrier_holds_only_its_table(
    tmp_path: Path, spark: Any, writer: Any
) -> None:
    w = Workload(writer, [1, 2])
    w.write(steps=1)
    held = ts(2)
    top = w.write(steps=2)
    ex = make(tmp_path, spark)
    ex.set_barrier(Barrier(top, {1: held}))
    start(ex, [1, 2], ts(1))
    ex.sink_phase()
    assert ex.status(1).checkpoint.checkpoint_ts == held
    assert ex.status(2).checkpoint.checkpoint_ts == top
    assert delta_content(tmp_path / "delta", w.schemas[1]) == w.expected(1, held)
    ex.set_barrier(OPEN)
    ex.sink_phase()
    assert_replicated(tmp_path, w, top)


@pytest.mark.slow
def test_move_second_capture_commits_at_the_first_ones_final_checkpoint_without_gap_or_duplicate(
    tmp_path: Path, spark: Any, writer: Any
) -> None:
    w = Workload(writer, [1, 2])
    w.write(steps=2)
    src = make(tmp_path, spark, "src")
    src.set_barrier(OPEN)
    start(src, [1, 2], ts(1))
    src.sink_phase()
    moved_from = src.status(1).checkpoint.checkpoint_ts
    # The destination prepares from the source's checkpoint while the source replicates on.
    dst = make(tmp_path, spark, "dst")
    dst.set_barrier(OPEN)
    dst.prepare(1, Checkpoint(moved_from, moved_from))
    w.write(steps=2)
    src.advance()
    dst.pull_phase()
    assert dst.status(1).state == T.PREPARED
    w.write(steps=1)
    src.remove(1)
    src.advance()
    final = src.status(1)
    assert final.state == T.STOPPED and final.checkpoint.checkpoint_ts > moved_from
    src.forget(1)
    dst.commit(1, Checkpoint(final.checkpoint.checkpoint_ts, final.checkpoint.checkpoint_ts))
    top = w.write(steps=2)
    dst.advance()
    src.advance()
    assert dst.status(1).checkpoint.checkpoint_ts == top
    assert_replicated(tmp_path, w, top)


@pytest.mark.slow
def test_commit_refuses_when_prepared_above_the_checkpoint_or_the_downstream_is_behind(
    tmp_path: Path, spark: Any, writer: Any
) -> None:
    w = Workload(writer, [1])
    w.write(steps=2)
    ex = make(tmp_path, spark)
    ex.set_barrier(Barrier(ts(2)))
    start(ex, [1], ts(1))
    ex.sink_phase()  # downstream committed ts(2)
    other = make(tmp_path, spark, "c2")
    other.prepare(1, Checkpoint(ts(3), ts(3)))
    other.pull_phase()
    with pytest.raises(ExecutorContractError, match="prepared from"):
        other.commit(1, Checkpoint(ts(2), ts(2)))
    with pytest.raises(ExecutorContractError, match="downstream committed"):
        other.commit(1, Checkpoint(ts(3), ts(3)))
    with pytest.raises(ExecutorContractError, match="ABSENT"):
        other.commit(9, Checkpoint(ts(3), ts(3)))


@pytest.mark.slow
def test_a_new_primary_starts_at_the_downstream_committed_ts_not_below(
    tmp_path: Path, spark: Any, writer: Any
) -> None:
    w = Workload(writer, [1])
    top = w.write(steps=3)
    ex = make(tmp_path, spark)
    ex.set_barrier(OPEN)
    start(ex, [1], ts(1))
    ex.sink_phase()
    again = make(tmp_path, spark, "c2")
    again.set_barrier(OPEN)
    start(again, [1], ts(1))  # an older checkpoint: downstream is ahead
    assert again.status(1).checkpoint.checkpoint_ts == top
    again.sink_phase()
    assert_replicated(tmp_path, w, top)


@pytest.mark.slow
def test_a_stale_token_writer_is_refused_and_stops_at_its_last_accepted_checkpoint(
    tmp_path: Path, spark: Any, writer: Any
) -> None:
    w = Workload(writer, [1])
    w.write(steps=2)
    zombie = make(tmp_path, spark, "zombie")
    zombie.set_barrier(OPEN)
    start(zombie, [1], ts(1))
    zombie.sink_phase()
    accepted = zombie.status(1).checkpoint.checkpoint_ts
    new = make(tmp_path, spark, "new")
    new.set_barrier(OPEN)
    start(new, [1], accepted)  # takes a newer token
    top = w.write(steps=2)
    zombie.advance()
    assert zombie.status(1).state == T.STOPPED
    assert zombie.status(1).checkpoint.checkpoint_ts == accepted
    new.advance()
    assert new.status(1).checkpoint.checkpoint_ts == top
    assert_replicated(tmp_path, w, top)


@pytest.mark.slow
def test_save_and_load_continue_in_a_fresh_executor(
    tmp_path: Path, spark: Any, writer: Any
) -> None:
    w = Workload(writer, [1, 2])
    w.write(steps=2)
    ex = make(tmp_path, spark)
    ex.set_barrier(OPEN)
    start(ex, [1], ts(1))
    ex.prepare(2, Checkpoint(ts(1), ts(1)))
    ex.save()  # the runtime saves after the Agent's commands
    del ex
    again = make(tmp_path, spark)
    assert again.status(1).state == T.REPLICATING and again.status(2).state == T.PREPARING
    top = w.write(steps=1)
    again.advance()
    again.commit(2, Checkpoint(ts(1), ts(1)))
    again.save()
    make(tmp_path, spark).advance()
    assert_replicated(tmp_path, w, top)


@pytest.mark.slow
def test_a_batch_never_spans_a_ddl_of_its_table_and_rows_after_it_carry_the_new_schema(
    tmp_path: Path, spark: Any, writer: Any
) -> None:
    from decimal import Decimal

    from helpers import INSERT, alter, rows

    from cdc_dagster.schema import ColumnSchema
    from cdc_dagster.sinks.delta import read_table_at
    from cdc_dagster.sinks.uri import open_sink

    w = Workload(writer, [1])
    before_ddl = w.write(steps=2)
    old = w.schemas[1]
    new = type(old)(
        old.table_id,
        old.database,
        old.table,
        (*old.columns, ColumnSchema(4, "note", "string", True, "x")),
        old.primary_key,
    )
    ddl_ts = before_ddl + 1
    record = alter(ddl_ts, new)
    writer.write_ddl(record)
    after = [
        (ddl_ts + 1, 0, INSERT, {"id": 5, "owner": "n", "balance": Decimal(2), "note": "y"}, None)
    ]
    writer.write_rows(1, 0, ddl_ts, rows(new, after))
    w.resolve(ddl_ts + 2)
    ex = make(tmp_path, spark)
    ex.set_barrier(OPEN)  # no barrier from an owner: the executor still cuts at the DDL
    start(ex, [1], ts(1))
    ex.sink_phase()
    assert ex.status(1).checkpoint.checkpoint_ts == ddl_ts
    assert delta_content(tmp_path / "delta", old) == w.expected(1, ddl_ts)
    open_sink(f"delta://{tmp_path / 'delta'}").apply_ddl("cf", record, {1: old})
    ex.sink_phase()
    assert ex.status(1).checkpoint.checkpoint_ts == ddl_ts + 2
    notes = {r["id"]: r["note"] for r in read_table_at(str(tmp_path / "delta"), new).to_pylist()}
    assert notes[5] == "y" and set(notes.values()) == {"x", "y"}


def make_sp(tmp_path: Path, spark: Any, interval_ms: int) -> SparkTableExecutor:
    return SparkTableExecutor.load(
        "c1",
        "cf",
        changelog_reader(tmp_path / "log"),
        f"delta://{tmp_path / 'delta'}",
        tmp_path / "staging",
        spark,
        interval_ms,
    )


def test_a_batch_is_split_at_each_syncpoint_and_the_table_has_a_version_at_each(
    tmp_path: Path, spark: Any, writer: Any
) -> None:
    """Syncpoints hold nothing back: one tick sinks past two of them (every 2 s of commit
    ts here), and Delta keeps the table's content at each, ready to be recorded later."""
    from deltalake import DeltaTable

    from cdc_dagster.sinks.delta import app_id, read_table_at, version_at

    w = Workload(writer, [1])
    top = w.write(steps=5)  # commit ts at ts(2) .. ts(6)
    ex = make_sp(tmp_path, spark, 2_000)
    ex.set_barrier(OPEN)
    start(ex, [1], ts(1))
    ex.sink_phase()
    assert ex.status(1).checkpoint.checkpoint_ts == top
    path = str(tmp_path / "delta" / "bank" / "accounts_1")
    dt = DeltaTable(path)
    for sp in [s for s in (ts(2), ts(4), ts(6)) if ts(1) < s < top]:
        version = version_at(dt, path, app_id("cf", "checkpoint"), sp)
        assert version is not None, sp
        got = read_table_at(str(tmp_path / "delta"), w.schemas[1], version).to_pylist()
        assert {r["id"]: (r["owner"], r["balance"]) for r in got} == w.expected(1, sp)
    assert version_at(dt, path, app_id("cf", "checkpoint"), ts(3)) is None  # no cut there


def test_an_open_barrier_is_sunk_past_up_to_the_first_ddl_of_the_stream(
    tmp_path: Path, spark: Any, writer: Any
) -> None:
    """The owner last read the DDL stream to ts(2): the capture reads on itself and sinks
    every table to the first DDL it finds (one the owner has not seen, of another table:
    it may hold any), not past it; a closed barrier keeps it at ts(2)."""
    from helpers import alter

    w = Workload(writer, [1, 2])
    w.write(steps=4)  # ts(2) .. ts(5)
    ddl_ts = ts(4) + 1
    writer.write_ddl(alter(ddl_ts, w.schemas[2]))
    writer.advance_ddl_resolved(ts(5))
    ex = make(tmp_path, spark)
    ex.set_barrier(Barrier(ts(2)))  # closed
    start(ex, [1, 2], ts(1))
    ex.sink_phase()
    assert {ex.status(t).checkpoint.checkpoint_ts for t in (1, 2)} == {ts(2)}
    ex.set_barrier(Barrier(ts(2), {}, ts(5) + 1000))  # open up to a target past the data
    ex.sink_phase()
    assert {ex.status(t).checkpoint.checkpoint_ts for t in (1, 2)} == {ddl_ts}
    assert delta_content(tmp_path / "delta", w.schemas[1]) == w.expected(1, ddl_ts)
    ex.set_barrier(Barrier(ts(2), {}, ts(3)))  # open, but something holds at ts(3)
    ex.sink_phase()
    assert {ex.status(t).checkpoint.checkpoint_ts for t in (1, 2)} == {ddl_ts}  # never back


def test_small_ticks_run_in_the_driver_without_a_spark_job(tmp_path: Path, writer: Any) -> None:
    """Below ``local_max_bytes`` both phases run their specs in this process: no session is
    needed (None here), and the content is the same as through Spark."""
    w = Workload(writer, [1, 2])
    first = w.write(steps=3)
    ex = SparkTableExecutor.load(
        "c1",
        "cf",
        changelog_reader(tmp_path / "log"),
        f"delta://{tmp_path / 'delta'}",
        tmp_path / "staging",
        None,
        local_max_bytes=1 << 30,
    )
    ex.set_barrier(OPEN)
    start(ex, [1, 2], ts(1))
    ex.sink_phase()
    assert_replicated(tmp_path, w, first)
    second = w.write(steps=2)
    ex.advance()
    assert_replicated(tmp_path, w, second)
    assert not ex.errors()
