"""A snapshot's reads come first: while a reader writes chunks into a change log (its bell
rang in the last ``READING_S``), the bulk pulls of that change log (``bulk_rows`` or more
rows: a released snapshot table) wait, for at most ``snapshot_first_s`` from the first wait;
small pulls (a stream's) never wait. On real Spark, change-log files and Delta."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from changelog_v1 import changelog_reader
from scenario import Workload, delta_content, ts
from test_backlog_batching import OPEN

from cdc_dagster.mysql.snapshots import CHUNKS_WRITTEN, READING_S, snapshot_reading
from cdc_dagster.pipeline import executor as executor_module
from cdc_dagster.pipeline.executor import SparkTableExecutor
from scheduler_core.model import Checkpoint


def make(tmp_path: Path, spark: Any, bulk_rows: int, first_s: float) -> SparkTableExecutor:
    ex = SparkTableExecutor.load(
        "c1", "cf", changelog_reader(tmp_path / "log"), f"delta://{tmp_path / 'delta'}",
        tmp_path / "staging", spark, bulk_rows=bulk_rows, snapshot_first_s=first_s,
    )  # fmt: skip
    ex.set_barrier(OPEN)
    return ex


def ring(log: Path, age_s: float = 0.0) -> None:
    """A reader wrote a chunk ``age_s`` seconds ago."""
    bell = log / "snapshot" / CHUNKS_WRITTEN
    bell.parent.mkdir(parents=True, exist_ok=True)
    with open(bell, "ab") as f:
        f.write(b".")
    at = time.time() - age_s
    os.utime(bell, (at, at))


def test_bulk_pulls_wait_for_the_snapshots_reads_at_most_snapshot_first_s(
    tmp_path: Path, spark: Any, writer: Any
) -> None:
    log = tmp_path / "log"
    w = Workload(writer, [1, 2])
    big = make(tmp_path, spark, bulk_rows=50, first_s=60)
    for t in (1, 2):
        big.prepare(t, Checkpoint(ts(1), ts(1)))
    big.pull_phase()
    for t in (1, 2):
        big.commit(t, Checkpoint(ts(1), ts(1)))
    big.save()
    first = w.write(steps=3, per_step=20)  # 60 changes a table: a bulk pull at 50
    assert not snapshot_reading(log)
    ring(log)
    assert snapshot_reading(log)
    big = make(tmp_path, spark, bulk_rows=50, first_s=60)
    assert big.pull_phase() == {}  # both wait for the reads
    assert {r.staged_upto for r in big.tables().values()} == {ts(1)}
    # a pull below bulk_rows (a stream's) does not wait for them
    small = make(tmp_path, spark, bulk_rows=1000, first_s=60)
    assert set(small.pull_phase()) == {1, 2}
    second = w.write(steps=3, per_step=20)
    # no chunk for READING_S: the reads are over, the bulk pulls go
    ring(log, age_s=READING_S + 1)
    assert not snapshot_reading(log)
    big = make(tmp_path, spark, bulk_rows=50, first_s=60)
    assert set(big.pull_phase()) == {1, 2}
    big.sink_phase()
    assert delta_content(tmp_path / "delta", w.schemas[1]) == w.expected(1, second)
    assert first < second


def test_the_wait_ends_after_snapshot_first_s_and_zero_never_waits(
    tmp_path: Path, spark: Any, writer: Any
) -> None:
    log = tmp_path / "log"
    w = Workload(writer, [1])
    ex = make(tmp_path, spark, bulk_rows=10, first_s=60)
    ex.prepare(1, Checkpoint(ts(1), ts(1)))
    ex.pull_phase()
    ex.commit(1, Checkpoint(ts(1), ts(1)))
    ex.save()
    w.write(steps=1, per_step=20)
    ring(log)
    ex = make(tmp_path, spark, bulk_rows=10, first_s=60)
    assert ex.pull_phase() == {}
    # the reads go on, but the first wait of them began snapshot_first_s ago
    root = str(ex.changelog.root)
    executor_module._READS_HELD_SINCE[root] = time.monotonic() - 61
    ring(log)
    ex = make(tmp_path, spark, bulk_rows=10, first_s=60)
    assert set(ex.pull_phase()) == {1}
    w.write(steps=1, per_step=20)
    ring(log)
    executor_module._READS_HELD_SINCE.pop(root, None)
    assert set(make(tmp_path, spark, bulk_rows=10, first_s=0).pull_phase()) == {1}
