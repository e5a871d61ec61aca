"""Run a change log's pending chunked snapshots: plan each table, read its ranges in
parallel (Spark tasks on the given session, else one after another here), write chunks.

The puller places the chunks as it follows the binlog and releases each table when its
plan is covered (``mysql.adoption``); a run killed midway resumes at each range's first
chunk not read (``snapshots.next_read``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from cdc_dagster.mysql.chunk_reader import plan_table, read_range
from cdc_dagster.mysql.state import load_state
from cdc_dagster.secrets import resolve_uri
from cdc_dagster.upstream.uri import parse_uri

RESULT = pa.schema([("table_id", pa.int64()), ("range", pa.int64()), ("rows", pa.int64())])


def snapshot_specs(
    upstream_uri: str, root: str, parallelism: int, chunk_rows: int
) -> list[dict[str, Any]]:
    """One spec per (table, range) of every pending snapshot (plans written if missing)."""
    state = load_state(root)
    if state is None:
        return []
    upstream = parse_uri(upstream_uri)
    # ${VAR}s resolved here, where the run's environment has them (a Spark worker's may
    # not): the specs carry the credentials to the tasks; they are never printed
    resolved = resolve_uri(upstream_uri, os.environ)
    specs = []
    for tid, gen in sorted(state.snapshots.items()):
        plan = plan_table(upstream, root, tid, gen, parallelism, chunk_rows)
        for r in range(len(plan.ranges)):
            specs.append({"upstream_uri": resolved, "root": root, "table_id": tid,
                          "generation": gen, "range": r, "chunk_rows": chunk_rows})  # fmt: skip
    return specs


def read_spec(spec: dict[str, Any]) -> int:
    """Read one (table, range) spec to its end; rows read."""
    return read_range(parse_uri(spec["upstream_uri"]), spec["root"], spec["table_id"],
                      spec["generation"], spec["range"], spec["chunk_rows"])  # fmt: skip


def read_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body: the specs of this partition, one after another."""
    out = []
    for batch in batches:
        for text in batch.column("spec").to_pylist():
            spec = json.loads(text)
            out.append({"table_id": spec["table_id"], "range": spec["range"],
                        "rows": read_spec(spec)})  # fmt: skip
    yield pa.RecordBatch.from_pylist(out, schema=RESULT)


def run_snapshots(
    upstream_uri: str, root: str, spark: Any = None, parallelism: int = 2, chunk_rows: int = 50_000
) -> int:
    """Read every pending snapshot's ranges; rows read (the puller places them)."""
    specs = snapshot_specs(upstream_uri, root, parallelism, chunk_rows)
    if not specs:
        return 0
    if spark is None:
        return sum(read_spec(s) for s in specs)
    rows = [(json.dumps(s),) for s in specs]
    df = spark.createDataFrame(rows, "spec string").repartition(len(specs))
    result = df.mapInArrow(read_partition, "table_id long, range long, rows long").collect()
    return sum(r["rows"] for r in result)


__all__ = ["read_partition", "read_spec", "run_snapshots", "snapshot_specs"]
