"""A snapshot's chunk files as its readers (Spark tasks) and the puller share them: a chunk
the puller places while a reader lists them is never lost nor read as missing."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from cdc_dagster.mysql import snapshots
from cdc_dagster.mysql.snapshots import (
    Chunk,
    done_chunks,
    mark_done,
    pending_chunks,
    release_generation,
    write_chunk,
)


def _chunk(n: int) -> Chunk:
    return Chunk(0, n, {0: "0-1-5"}, [n * 10], [n * 10 + 9], False, 1, 7)


def test_a_chunk_placed_while_its_reader_lists_the_pending_ones_is_left_out_not_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for n in (0, 1):
        write_chunk(tmp_path, _chunk(n), pa.table({"c1": [n]}))
    real = snapshots.chunk_of

    def placed_meanwhile(path: Path) -> Chunk:
        if path.name.startswith("0000-000000"):  # the puller marks it done, then removes it
            mark_done(tmp_path, real(path), fsync=False)
            path.unlink()
        return real(path)

    monkeypatch.setattr(snapshots, "chunk_of", placed_meanwhile)
    pending = {c.chunk_no for _, c in pending_chunks(tmp_path)}
    assert pending == {1}
    # listed after the pending ones, the done marks have it: it is in one or the other
    assert {c.chunk_no for c in done_chunks(tmp_path).values()} == {0}


def test_a_released_generation_is_gone_at_once_and_lists_as_empty(tmp_path: Path) -> None:
    gen = tmp_path / "snapshot" / "1" / "5"
    write_chunk(gen, _chunk(0), pa.table({"c1": [0]}))
    mark_done(gen, _chunk(0), fsync=False)
    release_generation(gen)
    assert not gen.exists() and list(gen.parent.iterdir()) == []
    assert pending_chunks(gen) == [] and done_chunks(gen) == {}
    release_generation(gen)  # twice: nothing to do


def _range_chunk(range_no: int, n: int, lo, hi, last: bool, rows: int) -> Chunk:
    return Chunk(range_no, n, {0: "0-1-5"}, lo, hi, last, rows, 7)


def test_progress_counts_chunks_read_and_placed_against_the_planned_rows(tmp_path: Path) -> None:
    from cdc_dagster.mysql.snapshots import Plan, table_progress, write_plan

    gen = snapshots.generation_dir(tmp_path, 3, 9)
    write_plan(tmp_path, Plan(3, 9, ((None, [100]), ([100], None)), rows=1000, chunk_rows=100))
    first = table_progress(tmp_path, 3, 9, "shop", "orders")
    assert (first.ranges, first.chunks_read, first.chunks_total, first.rows_read) == (2, 0, 10, 0)
    assert not first.complete and "chunks 0/10 read" in first.line()
    # range 0: two chunks read, the first placed; range 1: read to its end, placed
    mark_done(gen, _range_chunk(0, 0, None, [50], False, 100), fsync=False)
    write_chunk(gen, _range_chunk(0, 1, [50], [90], False, 100), pa.table({"c1": [1]}))
    mark_done(gen, _range_chunk(1, 0, [100], None, True, 40), fsync=False)
    p = table_progress(tmp_path, 3, 9, "shop", "orders")
    assert (p.chunks_read, p.chunks_placed, p.rows_read, p.rows_placed) == (3, 2, 240, 140)
    assert (p.ranges_read, p.chunks_total, p.complete) == (1, 10, False)
    mark_done(gen, _range_chunk(0, 1, [50], [90], False, 100), fsync=False)
    mark_done(gen, _range_chunk(0, 2, [90], [100], True, 10), fsync=False)
    done = table_progress(tmp_path, 3, 9, "shop", "orders")
    # every range read: the total is what was read, not the estimate
    assert (done.chunks_read, done.chunks_placed, done.chunks_total) == (4, 4, 4)
    assert done.complete and done.line().endswith("complete, 250 rows in 4 chunks")


def test_generations_no_snapshot_holds_are_swept_and_held_ones_kept(tmp_path: Path) -> None:
    """A puller that saved a table's release and died before removing its files left them;
    the next run's first placing removes them (and a removal cut short), nothing else."""
    held = tmp_path / "snapshot" / "1" / "5"
    released = tmp_path / "snapshot" / "1" / "3"  # an older generation of the same table
    other = tmp_path / "snapshot" / "2" / "9"
    for gen in (held, released, other):
        write_chunk(gen, _chunk(0), pa.table({"c1": [0]}))
    cut_short = tmp_path / "snapshot" / "2" / ".released-9-abc"
    (cut_short / "chunks").mkdir(parents=True)
    assert snapshots.sweep_generations(tmp_path, {1: 5}) == 3
    assert held.exists() and pending_chunks(held)
    assert not released.exists() and not other.exists() and not cut_short.exists()
    assert snapshots.sweep_generations(tmp_path, {1: 5}) == 0
    assert snapshots.sweep_generations(tmp_path / "none", {}) == 0


def test_the_bell_rings_once_per_chunk_written_and_is_looked_at_no_more_than_asked(
    tmp_path: Path,
) -> None:
    gen_dir = snapshots.generation_dir(tmp_path, 3, 1)
    bell = snapshots.ChunkBell(tmp_path, look_s=0.5)
    assert not bell.rang(100.0)  # no chunk written yet
    write_chunk(gen_dir, _chunk(0), pa.table({"c1": [0]}))
    assert not bell.rang(100.2)  # looked at 100.0: not again before 100.5
    assert bell.rang(100.5)
    assert not bell.rang(101.0)  # the same chunk: rung once
    write_chunk(gen_dir, Chunk(0, 1, {0: "0-1-5"}, [10], None, True, 0, 7), pa.table({"c1": []}))
    write_chunk(gen_dir, Chunk(1, 0, {0: "0-1-5"}, [20], None, True, 0, 7), pa.table({"c1": []}))
    assert bell.rang(101.5)  # empty chunks (their done marks) ring too: a table may be covered
    assert not bell.rang(102.0)  # two rings at once (the same clock tick) seen at one look
    assert (tmp_path / "snapshot" / snapshots.CHUNKS_WRITTEN).is_file()
    assert snapshots.sweep_generations(tmp_path, {3: 1}) == 0  # the bell is no generation


def test_a_reader_that_ended_is_seen_until_the_next_flush_begins(tmp_path: Path) -> None:
    (tmp_path / "snapshot").mkdir()  # its readers' chunks' place
    bell = snapshots.ChunkBell(tmp_path, look_s=0.5)
    assert not bell.ended(100.0)  # none yet
    snapshots.ring_reads_ended(tmp_path)
    assert not bell.ended(100.2)  # looked at 100.0: not again before 100.5
    assert bell.ended(100.5) and bell.ended(101.0)  # until a flush begins
    bell.flushed()
    assert not bell.ended(101.5)
    snapshots.ring_reads_ended(tmp_path)  # the second task's
    assert bell.ended(102.0)
    assert snapshots.sweep_generations(tmp_path, {}) == 0  # no generation either


def _fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths fsynced from now on, in order (a file's or a directory's)."""
    import os

    done: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        done.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return done


def test_a_plan_written_lazily_is_on_disk_before_the_first_chunk_read_against_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``write_plan(durable=False)`` flushes nothing; the first chunk (or empty chunk's done
    mark) written against the plan flushes the plan and its directory first, once."""
    from cdc_dagster.mysql.snapshots import Plan, write_plan

    fsynced = _fsyncs(monkeypatch)
    plans = {}
    for tid in (3, 4):
        plans[tid] = snapshots.generation_dir(tmp_path, tid, 9)
        write_plan(tmp_path, Plan(tid, 9, ((None, None),), rows=10, chunk_rows=5), durable=False)
    assert fsynced == []
    gen = plans[3]
    write_chunk(gen, _chunk(0), pa.table({"c1": [0]}))
    plan, directory, chunk = fsynced[:3]
    assert (plan, directory) == (str(gen / "plan.json"), str(gen))
    assert Path(chunk).parent == gen / "chunks"  # the chunk's own, after its plan's
    fsynced.clear()
    write_chunk(gen, _chunk(1), pa.table({"c1": [1]}))
    assert str(gen / "plan.json") not in fsynced and str(gen) not in fsynced  # once
    fsynced.clear()
    empty = Chunk(0, 0, {0: "0-1-5"}, None, None, True, 0, 7)  # table 4 read empty
    write_chunk(plans[4], empty, pa.table({"c1": pa.array([], pa.int64())}))
    assert fsynced[:2] == [str(plans[4] / "plan.json"), str(plans[4])]
    assert (plans[4] / "done" / f"{empty.name}.json").exists()


def test_a_plan_left_empty_by_a_machine_stop_reads_as_not_planned(tmp_path: Path) -> None:
    """A plan never flushed (no chunk read against it) may be empty or cut short after the
    machine stops: it reads as not planned, and the table is planned again."""
    from cdc_dagster.mysql.snapshots import Plan, read_plan, write_plan

    write_plan(tmp_path, Plan(3, 9, ((None, None),), rows=10, chunk_rows=5), durable=False)
    assert read_plan(tmp_path, 3, 9) == Plan(3, 9, ((None, None),), rows=10, chunk_rows=5)
    path = snapshots.generation_dir(tmp_path, 3, 9) / "plan.json"
    for cut in ("", '{"table_id": 3, "gener', "{}"):
        path.write_text(cut)
        assert read_plan(tmp_path, 3, 9) is None
    assert read_plan(tmp_path, 4, 1) is None  # never planned
