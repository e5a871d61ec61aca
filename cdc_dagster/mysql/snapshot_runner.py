"""Run a change log's pending chunked snapshots: plan each table, read its ranges in
parallel (Spark tasks on the given session, else one after another here), write chunks.

The (table, range) reads are shared by at most ``tasks`` Spark tasks as a queue: each task
is given every range, largest first, and reads one after another those it claims first
(``chunk_reader.claim``): a changefeed of many small tables is a few tasks, not one per
range, and no slot idles at the end while another task works through a fixed share. The
puller places the chunks as it follows the binlog and releases each table when its plan is
covered (``mysql.adoption``); a run killed midway resumes at each range's first chunk not
read (``snapshots.next_read``).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from cdc_dagster.mysql.chunk_reader import (
    CHUNK_ROWS,
    RESULT_DDL,
    plan_tables,
    read_group,
    read_groups,
    yield_cpu,
)
from cdc_dagster.mysql.snapshots import claims_dir
from cdc_dagster.mysql.state import load_state
from cdc_dagster.secrets import resolve_uri
from cdc_dagster.upstream.uri import parse_uri

# The Spark Connect session snapshot runs share (``pipeline.engine.shared_session``).
SNAPSHOT_SESSION = "cdc-dagster-snapshot"


def warm_imports(batches: Any) -> Any:
    """``mapInArrow`` body that warms a session's Python workers for chunk reads: unpickling
    it imports this module (the chunk readers); connectorx's first read imports pandas
    (~0.3 s), done here; and the workers take the readers' CPU priority."""
    yield_cpu()
    with contextlib.suppress(ImportError):
        importlib.import_module("pandas")
    yield from batches


def snapshot_specs(
    upstream_uri: str, root: str, parallelism: int, chunk_rows: int, client: str = "auto"
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
    plans = plan_tables(upstream, root, state.snapshots, parallelism, chunk_rows)
    for tid, gen in sorted(state.snapshots.items()):
        plan = plans[tid]
        for r in range(len(plan.ranges)):
            specs.append({"upstream_uri": resolved, "root": root, "table_id": tid,
                          "generation": gen, "range": r, "chunk_rows": chunk_rows,
                          "client": client,
                          "weight": plan.rows // max(len(plan.ranges), 1)})  # fmt: skip
    return specs


@dataclass(frozen=True, slots=True)
class SnapshotReads:
    """What one ``run_snapshot_reads`` did: rows, and where its time went."""

    rows: int
    ranges: int
    tasks: int  # Spark tasks (0: read here, one range after another)
    seconds: float  # the whole call, planning included
    first_began: float  # wall clock: the first range's read began (after planning, the
    last_ended: float  # job's start and the workers' start), ... and the last one ended
    task_seconds: float  # the longest task's reading time
    # per table id: (rows, chunks) this call read (a resumed snapshot's earlier runs not in)
    tables: dict[int, tuple[int, int]] = field(default_factory=dict)

    def line(self) -> str:
        """One line for a run log."""
        return (
            f"{self.rows} rows of {self.ranges} range(s) read in {self.seconds:.1f} s by "
            f"{self.tasks or 'no'} Spark task(s): reading from {self.first_began:.3f} to "
            f"{self.last_ended:.3f} (wall clock), the longest task {self.task_seconds:.1f} s"
        )


def run_snapshot_reads(
    upstream_uri: str,
    root: str,
    spark: Any = None,
    parallelism: int = 2,
    chunk_rows: int = CHUNK_ROWS,
    tasks: int = 0,
    client: str = "auto",
    local_max_rows: int = 0,
) -> SnapshotReads:
    """Read every pending snapshot's ranges (the puller places them). ``tasks``: Spark
    tasks at most (0: one per range). Snapshots of ``local_max_rows`` planned rows or fewer
    are read here, one range after another, without a Spark job: a job costs seconds to
    start over Spark Connect (planning, Python workers, imports), more than reading a few
    hundred thousand rows takes (as the capture ticks' ``local_max_bytes``)."""
    started = time.monotonic()
    specs = snapshot_specs(upstream_uri, root, parallelism, chunk_rows, client)
    if not specs:
        return SnapshotReads(0, 0, 0, time.monotonic() - started, 0.0, 0.0, 0.0)
    local = spark is None or sum(int(s["weight"]) for s in specs) <= local_max_rows
    if local:
        rows = read_group(specs, 0)
    else:
        n = max(1, min(tasks or len(specs), len(specs)))
        # Every task is given every range, largest first, and reads those it claims first
        # (``chunk_reader.claim``): a task free takes the next range, as a queue, so the job
        # does not end waiting for one task's share while the other slots are idle (4 fixed
        # shares of 25 tables on 2 slots ended 0.5-1.3 s apart). The claims' directory is
        # this call's own.
        text = json.dumps(sorted(specs, key=lambda s: -int(s["weight"])))
        claims = claims_dir(root, uuid.uuid4().hex)
        claims.mkdir(parents=True)
        try:
            # one partition per task, no shuffle; the ranges travel in the task's closure
            df = spark.range(0, n, 1, n)
            body = functools.partial(read_groups, [text] * n, claims=str(claims))
            rows = [r.asDict() for r in df.mapInArrow(body, RESULT_DDL).collect()]
        finally:
            shutil.rmtree(claims, ignore_errors=True)
    per_task: dict[int, float] = {}
    tables: dict[int, tuple[int, int]] = {}
    for r in rows:
        per_task[r["task"]] = per_task.get(r["task"], 0.0) + r["ended"] - r["began"]
        n, c = tables.get(r["table_id"], (0, 0))
        tables[r["table_id"]] = (n + r["rows"], c + r["chunks"])
    return SnapshotReads(
        sum(r["rows"] for r in rows),
        len(specs),
        0 if local else len(per_task),
        time.monotonic() - started,
        min(r["began"] for r in rows),
        max(r["ended"] for r in rows),
        max(per_task.values()),
        tables,
    )


__all__ = [
    "SNAPSHOT_SESSION",
    "SnapshotReads",
    "run_snapshot_reads",
    "snapshot_specs",
    "warm_imports",
]
