"""The Spark jobs of a capture tick: one job for all of the capture's tables, per phase.

A job is ``spark.range(n, numPartitions=n)``: one row per task, each carrying the JSON
specs of the tables that task handles (tables balanced over tasks by size), run with
``mapInArrow`` one table at a time. No shuffle and no sampling pass, DataFrame API only,
so it runs the same on a local session and over Spark Connect. Each table's result comes
back to the driver as one small row.

A small tick (``local_max_bytes``: the change-log or staged bytes its specs read, and
``local_max_rows``: the rows they move) runs its specs in the driver instead, the same
functions without a job: a Spark job costs about a second over Spark Connect (planning, a task per slot, Python workers), most of a tick
that carries a second of an OLTP upstream's changes.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Sequence
from typing import Any

from cdc_dagster.pipeline import background, spark_tasks

_RESULT_DDL = (
    "table_id long, status string, message string, detail string, rows long, seconds double"
)


def parallelism(spark: Any) -> int:
    """How many tasks a job may spread over (the session's shuffle partitions)."""
    return max(1, int(spark.conf.get("spark.sql.shuffle.partitions")))


def balance(specs: Sequence[dict[str, Any]], n: int) -> list[list[dict[str, Any]]]:
    """Split specs over ``n`` slots, largest first onto the least loaded slot."""
    slots: list[list[dict[str, Any]]] = [[] for _ in range(n)]
    heap = [(0, i) for i in range(n)]
    for spec in sorted(specs, key=lambda s: -s.get("weight", 0)):
        load, i = heapq.heappop(heap)
        slots[i].append(spec)
        heapq.heappush(heap, (load + max(1, spec.get("weight", 0)), i))
    return [s for s in slots if s]


def local(specs: Sequence[dict[str, Any]], max_bytes: int, max_rows: int) -> bool:
    """Whether a phase of ``specs`` runs in this process: it reads at most ``max_bytes``
    and moves at most ``max_rows`` rows (0: any). Snapshot rows compress to ~12 bytes, so a
    million of them pass a bytes limit that an OLTP tick's few thousand wide rows do not:
    as one task in the capture's process they took a core for seconds beside its other
    changefeeds' ticks; as a Spark job they run beside them."""
    if sum(max(0, s.get("weight", 0)) for s in specs) > max_bytes:
        return False
    return not max_rows or _rows(specs) <= max_rows


def _rows(specs: Sequence[dict[str, Any]]) -> int:
    return sum(max(0, s.get("rows", 0)) for s in specs)


def run(
    spark: Any,
    kind: str,
    specs: Sequence[dict[str, Any]],
    local_max_bytes: int = 0,
    local_max_rows: int = 0,
    bulk_rows: int = 0,
) -> list[dict[str, Any]]:
    """Run ``kind`` ("pull" or "sink") for every spec in one Spark job, or in this process
    when they read at most ``local_max_bytes`` together and move at most ``local_max_rows``
    rows (0: any number) -- in the background worker at low priority when they move at
    least ``bulk_rows`` (0: never; ``pipeline.background``); one result per spec.

    ``spark`` is a session, or a function returning one, called only when a job runs: a
    capture whose ticks run in its process then never touches Spark, so a Spark Connect
    server that is down or restarting holds up only the ticks that need it."""
    from pyspark.sql import functions as F

    if not specs:
        return []
    if local(specs, local_max_bytes, local_max_rows):
        fn = spark_tasks.pull_table if kind == "pull" else spark_tasks.sink_table
        if bulk_rows and _rows(specs) >= bulk_rows:
            return background.run_in_background(fn, list(specs))
        return [fn(s) for s in specs]
    if callable(spark):
        spark = spark()
    slots = balance(specs, min(len(specs), parallelism(spark)))
    payload = F.array(*(F.lit(json.dumps(s)) for s in slots))
    df = spark.range(0, len(slots), 1, len(slots)).select(
        F.element_at(payload, (F.col("id") + 1).cast("int")).alias("spec")
    )
    fn = spark_tasks.pull_partition if kind == "pull" else spark_tasks.sink_partition
    return [r.asDict() for r in df.mapInArrow(fn, _RESULT_DDL).collect()]
