"""A snapshot run's progress records: a table the puller released between two looks."""

from __future__ import annotations

import time
from typing import Any

import pytest

from cdc_dagster.defs.catalog import Catalog
from cdc_dagster.defs.mysql import snapshot_job
from cdc_dagster.mysql import snapshots
from cdc_dagster.mysql.snapshot_runner import SnapshotReads
from cdc_dagster.mysql.snapshots import SnapshotProgress


class _Log:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, msg: str, *args: Any) -> None:
        self.lines.append(msg % args if args else msg)

    def warning(self, msg: str, *args: Any) -> None:
        self.info(msg, *args)


class _Context:
    def __init__(self) -> None:
        self.log = _Log()
        self.events: list[Any] = []

    def log_event(self, event: Any) -> None:
        self.events.append(event)


def _p(tid: int, rows: int = 0, chunks: int = 0, planned: int = 100_000) -> SnapshotProgress:
    return SnapshotProgress(tid, "db", f"t{tid}", 7, 1, 1 if rows else 0, chunks, chunks,
                            max(chunks, 1), rows, rows, planned, False)  # fmt: skip


def _metadata(ctx: _Context, table: str) -> list[dict[str, Any]]:
    return [
        {k: v.value for k, v in e.metadata.items()}
        for e in ctx.events
        if e.asset_key.path[-1] == table
    ]


@pytest.fixture
def looks(monkeypatch: pytest.MonkeyPatch) -> list[list[SnapshotProgress]]:
    """What each ``snapshot_progress`` call returns, in turn (the last one again after)."""
    seq: list[list[SnapshotProgress]] = []

    def progress(_root: Any) -> list[SnapshotProgress]:
        return seq.pop(0) if len(seq) > 1 else seq[0]

    monkeypatch.setattr(snapshots, "snapshot_progress", progress)
    return seq


def test_a_table_released_between_looks_is_complete_with_the_rows_the_reads_read(
    looks: list[list[SnapshotProgress]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Released before the run looked again, a table's last record said 0 rows read; it is
    rendered complete with what the reads read of it (earlier runs' rows included), not 0."""
    monkeypatch.setattr(snapshot_job, "POLL_S", 0.01)
    looks += [[_p(1), _p(2, rows=40_000, chunks=2)], [_p(2, rows=40_000, chunks=2)], []]
    ctx = _Context()
    watch = snapshot_job.ProgressWatch(ctx, Catalog(()), "cf", "/nowhere")  # type: ignore[arg-type]
    reads = SnapshotReads(160_000, 2, 2, 1.0, 0.0, 1.0, 1.0,
                          {1: (100_000, 1), 2: (60_000, 3)})  # fmt: skip

    def read() -> SnapshotReads:  # the reads end once the run saw t1 gone
        deadline = time.monotonic() + 10
        while len(looks) > 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)
        assert not any(e.asset_key.path[-1] == "t1" and e.metadata["snapshot_complete"].value
                       for e in ctx.events), "rendered complete before its counts were known"  # fmt: skip
        return reads

    assert watch.watch(read) is reads
    watch.wait_placed(1.0)
    (*_, t1) = _metadata(ctx, "t1")
    assert t1["snapshot_complete"] is True
    assert t1["snapshot_rows_read"] == t1["snapshot_rows_placed"] == 100_000
    assert t1["snapshot_chunks_placed"] == t1["snapshot_chunks_total"] == 1
    (*_, t2) = _metadata(ctx, "t2")  # 40k read before its first look (earlier runs) + 60k
    assert t2["snapshot_complete"] is True
    assert t2["snapshot_rows_placed"] == 100_000 and t2["snapshot_chunks_placed"] == 5
    # one log entry per look, a line per table that changed (the first look: both)
    assert ctx.log.lines[0].count("snapshot of db.t") == 2, ctx.log.lines
    lines = [line for entry in ctx.log.lines for line in entry.splitlines()]
    assert "snapshot of db.t1: complete, 100000 rows in 1 chunks" in lines
    assert not any("complete, 0 rows" in line for line in lines), lines


def test_a_tables_progress_is_observed_at_most_every_interval_and_its_end_at_once(
    looks: list[list[SnapshotProgress]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each observation is an event-log write in the run's process beside the reads: a
    table's progress is observed at most every ``OBSERVE_EVERY_S`` (from when the run first
    saw it, planned), its completion at once; every look still logs its lines."""
    from dataclasses import replace

    monkeypatch.setattr(snapshot_job, "OBSERVE_EVERY_S", 0.3)
    ctx = _Context()
    watch = snapshot_job.ProgressWatch(ctx, Catalog(()), "cf", "/nowhere")  # type: ignore[arg-type]
    looks[:] = [[_p(1), _p(2)]]
    watch.poll()  # both planned: seen, not observed
    looks[:] = [[_p(1, rows=50_000, chunks=1), _p(2)]]
    watch.poll()  # t1 moved within the interval: its line only
    assert ctx.events == [] and len(ctx.log.lines) == 2
    time.sleep(0.35)
    looks[:] = [[_p(1, rows=60_000, chunks=2), _p(2)]]
    watch.poll()  # past the interval: observed
    assert [m["snapshot_rows_read"] for m in _metadata(ctx, "t1")] == [60_000]
    done = replace(_p(2, rows=100_000, chunks=1), complete=True)
    looks[:] = [[_p(1, rows=60_000, chunks=2), done]]
    watch.poll()  # complete: observed at once, though seen only 0.35 s before
    (t2,) = _metadata(ctx, "t2")
    assert t2["snapshot_complete"] is True and t2["snapshot_rows_placed"] == 100_000
    assert len(ctx.events) == 2
