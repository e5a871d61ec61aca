"""Data-plane benchmark: change log -> pull, sort, mount, stage -> collapse -> Delta (MERGE).

Beside it, on the same change log and in the same run, a bare Spark job does the same
read, sort, keep-latest-per-key and write (``spark.read.parquet`` of every table's files
at once, a window ``row_number`` per (table, key) by (commit ts, seq) descending, then one
task per table writing the latest rows to a fresh Delta table with ``write_deltalake``).

Usage::

    python bench/dataplane_bench.py                                # 1/10/100 tables x narrow/wide
    python bench/dataplane_bench.py --tables 10 --width narrow    # one configuration

A one-configuration run ends with one machine-readable line::

    rows_per_s=... bare_rows_per_s=... ratio=...

Definitions: rows = change-log rows read (every insert, update, delete); the pipeline's
time is one ``SparkTableExecutor.advance()`` (pull phase + sink phase, every table
REPLICATING from ts 0 with an open barrier) over the whole log; the bare job's time is its
read -> write. Both run after an untimed warm-up round (a log of 1/20 the rows) on the same session (``local[2]``, 2 shuffle
partitions). Peak memory = the highest summed RSS of this process and its descendants
(the JVM, the Python workers) sampled every 0.1 s while each side ran.
Targets (2 cores): ratio >= 0.8, >= 150k narrow rows/s at 10 tables.
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cdc_dagster.schema import ColumnSchema, DdlRecord, TableSchema
from scheduler_core.ddl import DDLKind
from scheduler_core.messages import Barrier
from scheduler_core.model import Checkpoint
from scheduler_core.ts import compose

DEFAULT_ROWS = {"narrow": 600_000, "wide": 150_000}
FILES_PER_TABLE = 4
T0 = compose(1_700_000_000_000)

WIDE_TYPES = [
    "int32",
    "int64",
    "decimal(18,2)",
    "float64",
    "string",
    "string",
    "date",
    "datetime",
    "timestamp",
    "json",
    "binary",
    "bool",
    "int16",
    "uint32",
    "decimal(30,6)",
    "string",
    "float32",
    "time",
    "string",
]


def schema(table_id: int, width: str) -> TableSchema:
    cols = [ColumnSchema(1, "id", "int64", False)]
    types = ["string", "decimal(18,2)"] if width == "narrow" else WIDE_TYPES
    cols += [ColumnSchema(i + 2, f"col_{i}", t, True) for i, t in enumerate(types)]
    return TableSchema(table_id, "bench", f"t{table_id}", tuple(cols), (1,), (), 1)


def _values(col: ColumnSchema, n: int, rng: random.Random) -> pa.Array:
    t = col.type
    ints = [rng.randrange(0, 10**6) for _ in range(n)]
    if t.startswith("decimal"):
        scale = int(t.split(",")[1][:-1])
        return pa.array([Decimal(i).scaleb(-scale) for i in ints], col.arrow)
    if t in ("string", "json"):
        return pa.array(
            [f'{{"v": {i}}}' if t == "json" else f"name-{i}-é" for i in ints], pa.string()
        )
    if t == "binary":
        return pa.array([i.to_bytes(4, "little") for i in ints], pa.binary())
    if t == "bool":
        return pa.array([i % 2 == 0 for i in ints], pa.bool_())
    if t in ("float32", "float64"):
        return pa.array([i / 7 for i in ints], col.arrow)
    if t == "date":
        return pa.array([i % 20000 for i in ints], pa.int32()).cast(pa.date32())
    if t in ("datetime", "timestamp"):
        return pa.array([i * 10**6 for i in ints], pa.int64()).cast(col.arrow)
    return pa.array([i % 30000 for i in ints], pa.int64()).cast(col.arrow)


def write_log(root: Path, tables: int, width: str, total_rows: int, seed: int = 1) -> int:
    """A change log of ``total_rows`` changes over ``tables`` tables; returns its resolved ts."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests/integration/pipeline"))
    from changelog_v1 import Writer

    rng = random.Random(seed)
    w = Writer(root)
    schemas = [schema(t, width) for t in range(1, tables + 1)]
    w.write_ddl(
        DdlRecord(
            T0,
            DDLKind.CREATE_TABLE,
            "create_table",
            "CREATE TABLE ...",
            (),
            tuple(s.table_id for s in schemas),
            (),
            "bench",
            {s.table_id: s for s in schemas},
        )
    )
    per_table = total_rows // tables
    per_file = per_table // FILES_PER_TABLE
    last = T0
    for s in schemas:
        keyspace = max(1, per_table // 2)
        for f in range(FILES_PER_TABLE):
            n = per_file
            base_ts = T0 + (f + 1) * (1 << 18) * 1000
            commit = pa.array([base_ts + i // 10 for i in range(n)], pa.int64())
            ops = [1 if r < 0.6 else 2 if r < 0.9 else 3 for r in (rng.random() for _ in range(n))]
            keys = pa.array([rng.randrange(keyspace) for _ in range(n)], pa.int64())
            cols: dict[str, Any] = {
                "_commit_ts": commit,
                "_seq": pa.array([i % 10 for i in range(n)], pa.int32()),
                "_op": pa.array(ops, pa.int8()),
            }
            is_del = pa.array([o == 3 for o in ops])
            for c in s.columns:
                v = keys if c.id == 1 else _values(c, n, rng)
                cols[f"c{c.id}"] = pa.compute.if_else(is_del, pa.nulls(n, c.arrow), v)
            cols["b1"] = pa.compute.if_else(is_del, keys, pa.nulls(n, pa.int64()))
            w.write_rows(s.table_id, 0, T0, pa.table(cols))
            last = max(last, base_ts + n)
    for s in schemas:
        w.advance_resolved(s.table_id, 0, last)
    return last


class PeakRss:
    """Peak summed RSS of this process and its descendants, sampled in a thread."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _tree_rss(os.getpid()))
            self._stop.wait(0.1)


def _tree_rss(root: int) -> int:
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as fh:
                stat = fh.read().rsplit(")", 1)[1].split()
            children.setdefault(int(stat[1]), []).append(int(pid))
            rss[int(pid)] = int(stat[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            continue
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo += children.get(pid, [])
    return total


def run_pipeline(spark: Any, work: Path, tables: int, resolved: int) -> float:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests/integration/pipeline"))
    from changelog_v1 import changelog_reader

    from cdc_dagster.pipeline.executor import SparkTableExecutor

    ex = SparkTableExecutor(
        "bench",
        "cf",
        changelog_reader(work / "log"),
        f"delta://{work / 'delta'}",
        work / "staging",
        spark,
    )
    ex.set_barrier(Barrier())
    for t in range(1, tables + 1):
        ex.prepare(t, Checkpoint(T0, T0))
    # Prepared at an empty slice (resolved = T0 would be the first tick's work), so the
    # timed advance() is exactly one pull + one sink of the whole log.
    for t in range(1, tables + 1):
        ex._tables[t].state = ex._tables[t].state.PREPARED
        ex.commit(t, Checkpoint(T0, T0))
    t0 = time.perf_counter()
    ex.pull_phase()
    t1 = time.perf_counter()
    ex.sink_phase()
    t2 = time.perf_counter()
    assert not ex.errors(), ex.errors()
    assert all(ex.status(t).checkpoint.checkpoint_ts == resolved for t in range(1, tables + 1))
    print(f"  pipeline: pull {t1 - t0:.2f} s, sink {t2 - t1:.2f} s", flush=True)
    return t2 - t0


def _bare_write(out_root: str, batches: Any) -> Any:
    """mapInArrow body of the bare job: one task per table writes its latest rows to Delta."""
    import pyarrow as pa
    from deltalake import write_deltalake

    done = []
    tables: dict[int, list[pa.RecordBatch]] = {}
    for b in batches:
        for t in set(b.column("table_id").to_pylist()):
            tables.setdefault(t, []).append(b.filter(pa.compute.equal(b.column("table_id"), t)))
    for t, parts in tables.items():
        data = pa.Table.from_batches(parts).drop_columns(["table_id"])
        write_deltalake(os.path.join(out_root, f"t{t}"), data, mode="overwrite")
        done.append(t)
    yield pa.RecordBatch.from_pydict({"table_id": pa.array(done, pa.int64())})


def run_bare(spark: Any, work: Path, tables: int, width: str) -> float:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    s = schema(1, width)
    out_root = str(work / "bare")
    files = [str(p) for p in sorted((work / "log" / "tables").rglob("*.parquet"))]
    t0 = time.perf_counter()
    df = spark.read.parquet(*files).withColumn(
        "table_id", F.regexp_extract(F.input_file_name(), r"/tables/(\d+)/", 1).cast("long")
    )
    df = df.where(F.col("_commit_ts") > T0)
    w = Window.partitionBy("table_id", "c1").orderBy(F.desc("_commit_ts"), F.desc("_seq"))
    latest = df.withColumn("_rn", F.row_number().over(w)).where("_rn = 1")
    names = [F.col(f"c{c.id}").alias(c.name) for c in s.columns]
    latest = latest.select("table_id", *names, "_op", "_commit_ts")
    latest = latest.repartition(min(tables, 2), "table_id")
    latest.mapInArrow(functools.partial(_bare_write, out_root), "table_id long").collect()
    return time.perf_counter() - t0


def one(spark: Any, tables: int, width: str, rows: int, work: Path) -> dict[str, float]:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    resolved = write_log(work / "log", tables, width, rows)
    n = (rows // tables // FILES_PER_TABLE) * FILES_PER_TABLE * tables
    with PeakRss() as mem_p:
        t_pipe = run_pipeline(spark, work, tables, resolved)
    with PeakRss() as mem_b:
        t_bare = run_bare(spark, work, tables, width)
    return {
        "rows": n,
        "rows_per_s": n / t_pipe,
        "bare_rows_per_s": n / t_bare,
        "ratio": t_bare / t_pipe,
        "peak_mib": mem_p.peak / 2**20,
        "bare_peak_mib": mem_b.peak / 2**20,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tables", type=int, choices=[1, 10, 100])
    ap.add_argument("--width", choices=["narrow", "wide"])
    ap.add_argument("--rows", type=int, help="change-log rows (default by width)")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--work", default="/tmp/h-pipeline/bench")
    args = ap.parse_args()
    if args.tables is None or args.width is None:
        grid(args)
        return
    from cdc_dagster.pipeline.engine import spark_session

    spark = spark_session(args.master, conf={"spark.sql.shuffle.partitions": "2"})
    # Warm-up: the JVM, a first job, and the Python workers both sides use.
    spark.range(4, numPartitions=2).mapInArrow(lambda it: it, "id long").collect()
    rows = args.rows or DEFAULT_ROWS[args.width]
    # Warm-up round on a small log: both sides' Python workers import what they use, as
    # in a long-lived Spark (Connect) server; then the measured round.
    one(spark, args.tables, args.width, max(rows // 20, 1000), Path(args.work) / "warm")
    r = one(spark, args.tables, args.width, rows, Path(args.work) / "run")
    print(
        f"  {args.tables} tables {args.width}: {r['rows']} rows, peak {r['peak_mib']:.0f} MiB "
        f"(bare {r['bare_peak_mib']:.0f} MiB)"
    )
    print(
        f"rows_per_s={r['rows_per_s']:.0f} bare_rows_per_s={r['bare_rows_per_s']:.0f} "
        f"ratio={r['ratio']:.2f}"
    )


def grid(args: argparse.Namespace) -> None:
    """Every configuration, each in its own process (one Spark session each)."""
    print("| tables | width | rows/s | bare rows/s | ratio | peak MiB (bare) |")
    print("|---|---|---|---|---|---|")
    for width in ("narrow", "wide"):
        for tables in (1, 10, 100):
            cmd = [sys.executable, __file__, "--tables", str(tables), "--width", width]
            cmd += ["--master", args.master, "--work", args.work]
            if args.rows:
                cmd += ["--rows", str(args.rows)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            kv = dict(p.split("=") for p in out.strip().splitlines()[-1].split())
            peak = [ln for ln in out.splitlines() if "peak" in ln][-1].split("peak ")[1]
            print(
                f"| {tables} | {width} | {float(kv['rows_per_s']):,.0f} | "
                f"{float(kv['bare_rows_per_s']):,.0f} | {kv['ratio']} | {peak} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
