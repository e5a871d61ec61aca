"""The Spark jobs of a capture tick: one job for all of the capture's tables, per phase.

A job is ``spark.range(n, numPartitions=n)``: one row per task, each carrying the JSON
specs of the tables that task handles (tables balanced over tasks by size), run with
``mapInArrow`` one table at a time. No shuffle and no sampling pass, DataFrame API only,
so it runs the same on a local session and over Spark Connect. Each table's result comes
back to the driver as one small row.

A small tick (``local_max_bytes``: the change-log or staged bytes its specs read) runs its
specs in the driver instead, the same functions without a job: a Spark job costs about a
second over Spark Connect (planning, a task per slot, Python workers), most of a tick
that carries a second of an OLTP upstream's changes.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Sequence
from typing import Any

from cdc_dagster.pipeline import spark_tasks

_RESULT_DDL = "table_id long, status string, message string, detail string, rows long"


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


def run(
    spark: Any, kind: str, specs: Sequence[dict[str, Any]], *, local_max_bytes: int = 0
) -> list[dict[str, Any]]:
    """Run ``kind`` ("pull" or "sink") for every spec in one Spark job, or in this process
    when they read at most ``local_max_bytes`` together; one result per spec.

    ``spark`` is a session, or a function returning one, called only when a job runs: a
    capture whose ticks run in its process then never touches Spark, so a Spark Connect
    server that is down or restarting holds up only the ticks that need it."""
    from pyspark.sql import functions as F

    if not specs:
        return []
    if sum(max(0, s.get("weight", 0)) for s in specs) <= local_max_bytes:
        fn = spark_tasks.pull_table if kind == "pull" else spark_tasks.sink_table
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
