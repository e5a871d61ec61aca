"""Change-log benchmark: how many rows per second the embedded generator writes.

Grid: ``Workload.step`` (row-by-row transactions over every table, DDLs included) and
``Workload.step_transfers`` (vectorised two-row bank transfers) x fsync on / off. Each
cell is compared with a bare ``pyarrow.parquet.write_table`` of the very same rows, in
the same run, on the same disk.

Usage::

    python bench/changelog_bench.py                       # the whole grid
    python bench/changelog_bench.py --transfers 200000 --step-txns 5000 --repeat 3

It ends with one machine-readable line (the headline cell: ``step_transfers``, fsync
off, the generator's top rate)::

    rows_per_s=... bare_rows_per_s=... ratio=...

Definitions
-----------
* Timed region (generator): one ``step(n)`` or ``step_transfers(n)`` call on a workload
  whose set-up (create_table records, initial rows) is already written, ending when every
  row is renamed into place: row generation, the model, Arrow conversion, validation,
  sorting, minute cuts, Parquet encoding, temp file, fsync of file and directory when on,
  rename. Resolved marks are not included (``advance_resolved`` is not called).
* Rows: data-file rows written (a transfer is two rows; a step's DDLs write none).
* Bare baseline: the same rows, read back from the data files the call wrote, written
  again with ``pq.write_table`` (default options) one file per data file, straight to
  their final names: no validation, no sort, no temp file, no rename, no fsync. The same
  file split keeps the per-file cost in both.
* ratio = generator rows/s / bare rows/s (1.0: the change log costs nothing over Parquet).
* Best of ``--repeat`` runs per cell (time.perf_counter), fresh log each run.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from cdc_dagster.upstream.changelog import ChangeLog
from cdc_dagster.upstream.generator import Workload, WorkloadConfig
from scheduler_core.ts import MAX_TS


@dataclass(frozen=True, slots=True)
class Cell:
    """One measured cell of the grid."""

    mode: str
    fsync: bool
    rows: int
    files: int
    seconds: float
    bare_seconds: float

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds

    @property
    def bare_rows_per_s(self) -> float:
        return self.rows / self.bare_seconds

    @property
    def ratio(self) -> float:
        return self.rows_per_s / self.bare_rows_per_s


def _data_files(root: Path) -> set[str]:
    log = ChangeLog(root)
    tables = {t for r in log.ddl_records() for t in r.tables}
    return {f.path for t in tables for f in log.data_files(t, 0, MAX_TS)}


def measure(mode: str, fsync: bool, n: int, tmp: Path) -> Cell:
    """One fresh workload, one timed call, then the bare baseline of the same rows."""
    root, bare = tmp / "log", tmp / "bare"
    for d in (root, bare):
        shutil.rmtree(d, ignore_errors=True)
    bare.mkdir(parents=True)
    cfg = WorkloadConfig(seed=1, bank_tables=4, rows_per_table=1_000, fsync=fsync)
    with Workload(cfg, root) as w:
        before = _data_files(root)
        t0 = time.perf_counter()
        rows = w.step(n) if mode == "step" else w.step_transfers(n)
        seconds = time.perf_counter() - t0
    new = sorted(_data_files(root) - before)
    tables: list[pa.Table] = [pq.read_table(p) for p in new]
    assert sum(t.num_rows for t in tables) == rows, "rows read back differ from rows written"
    t0 = time.perf_counter()
    for i, table in enumerate(tables):
        pq.write_table(table, bare / f"{i}.parquet")
    bare_seconds = time.perf_counter() - t0
    return Cell(mode, fsync, rows, len(new), seconds, bare_seconds)


def best(mode: str, fsync: bool, n: int, tmp: Path, repeat: int) -> Cell:
    cells = [measure(mode, fsync, n, tmp) for _ in range(repeat)]
    return min(cells, key=lambda c: c.seconds)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--step-txns", type=int, default=2_000, help="transactions per step() call")
    p.add_argument("--transfers", type=int, default=100_000, help="transfers per step_transfers")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--dir", type=Path, default=None, help="where the logs go (default: a temp dir)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        cells = [
            best(mode, fsync, n, Path(tmp), args.repeat)
            for mode, n in (("step", args.step_txns), ("step_transfers", args.transfers))
            for fsync in (False, True)
        ]
    print(
        f"{'mode':<15} {'fsync':<5} {'rows':>8} {'files':>5} {'rows/s':>10} "
        f"{'bare rows/s':>12} {'ratio':>6}"
    )
    for c in cells:
        print(
            f"{c.mode:<15} {'on' if c.fsync else 'off':<5} {c.rows:>8} {c.files:>5} "
            f"{c.rows_per_s:>10,.0f} {c.bare_rows_per_s:>12,.0f} {c.ratio:>6.3f}"
        )
    head = next(c for c in cells if c.mode == "step_transfers" and not c.fsync)
    print(
        f"rows_per_s={head.rows_per_s:.0f} bare_rows_per_s={head.bare_rows_per_s:.0f} "
        f"ratio={head.ratio:.3f}"
    )


if __name__ == "__main__":
    main()
