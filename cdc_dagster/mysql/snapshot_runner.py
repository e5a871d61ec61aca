"""Run a change log's pending chunked snapshots: plan each table, read its ranges in
parallel (Spark tasks on the given session, else one after another here), write chunks.

The (table, range) reads are spread over at most ``tasks`` Spark tasks as the capture jobs
spread tables (``pipeline.job.balance``: largest first onto the least loaded; a task reads
its ranges one after another): a changefeed of many small
tables is a few tasks, not one per range. The puller places the chunks as it follows the
binlog and releases each table when its plan is covered (``mysql.adoption``); a run killed
midway resumes at each range's first chunk not read (``snapshots.next_read``).
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any

from cdc_dagster.mysql.chunk_reader import plan_table, read_groups, read_spec
from cdc_dagster.mysql.state import load_state
from cdc_dagster.pipeline.job import balance
from cdc_dagster.secrets import resolve_uri
from cdc_dagster.upstream.uri import parse_uri


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
    for tid, gen in sorted(state.snapshots.items()):
        plan = plan_table(upstream, root, tid, gen, parallelism, chunk_rows)
        for r in range(len(plan.ranges)):
            specs.append({"upstream_uri": resolved, "root": root, "table_id": tid,
                          "generation": gen, "range": r, "chunk_rows": chunk_rows,
                          "client": client,
                          "weight": plan.rows // max(len(plan.ranges), 1)})  # fmt: skip
    return specs


def run_snapshots(
    upstream_uri: str,
    root: str,
    spark: Any = None,
    parallelism: int = 2,
    chunk_rows: int = 50_000,
    tasks: int = 0,
    client: str = "auto",
) -> int:
    """Read every pending snapshot's ranges; rows read (the puller places them).
    ``tasks``: Spark tasks at most (0: one per range)."""
    specs = snapshot_specs(upstream_uri, root, parallelism, chunk_rows, client)
    if not specs:
        return 0
    if spark is None:
        return sum(read_spec(s) for s in specs)
    groups = [json.dumps(g) for g in balance(specs, max(1, min(tasks or len(specs), len(specs))))]
    # one partition per group, no shuffle; the groups travel in the task's closure
    df = spark.range(0, len(groups), 1, len(groups))
    body = functools.partial(read_groups, groups)
    result = df.mapInArrow(body, "table_id long, range long, rows long").collect()
    return sum(r["rows"] for r in result)


__all__ = ["run_snapshots", "snapshot_specs"]
