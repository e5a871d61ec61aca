"""The Spark executor factory: ``SparkTableExecutor`` loaded from its manifest for a capture tick."""

from __future__ import annotations

from typing import Any

from cdc_dagster.pipeline.executor import SparkTableExecutor
from cdc_dagster.runtime.spec import ExecutorFactory, ExecutorSpec, RuntimeExecutor
from cdc_dagster.upstream.changelog import ChangeLog
from cdc_dagster.upstream.uri import changelog_path


def spark_executor_factory(
    spark: Any,
    *,
    local_max_bytes: int = 0,
    batch_behind_s: float = 0.0,
    tick_rows: int = 0,
    local_max_rows: int = 0,
    bulk_rows: int = 0,
    defer_rows: int = 0,
    sink_duty: float = 0.0,
    snapshot_first_s: float = 0.0,
) -> ExecutorFactory:
    """A factory of SparkTableExecutors on ``spark`` (a local session or Spark Connect, or a
    function returning one when a job runs); a tick phase reading at most
    ``local_max_bytes`` and moving at most ``local_max_rows`` rows (0: any) runs in this
    process, without a job (niced, in a worker process, when it moves ``bulk_rows`` or more;
    0: never); a table draining a backlog
    older than ``batch_behind_s`` commits at most that often; a changefeed's tick phase
    moves at most ``tick_rows`` row changes (0: no limit), and a table whose phase would
    move ``defer_rows`` or more waits for a later tick (0: none waits); a table's sink
    writes take at most ``sink_duty`` of its time (0: no pacing); a bulk pull waits for its
    change log's snapshot reads at most ``snapshot_first_s`` (0: never waits)."""

    def make(spec: ExecutorSpec) -> RuntimeExecutor:
        return SparkTableExecutor.load(  # type: ignore[return-value]
            spec.capture_id,
            spec.changefeed_id,
            ChangeLog(changelog_path(spec.upstream_uri)),
            spec.sink_uri,
            spec.staging_root,
            spark,
            spec.sync_point_interval_ms,
            local_max_bytes,
            batch_behind_s,
            registration=spec.registration,
            tick_rows=tick_rows,
            local_max_rows=local_max_rows,
            bulk_rows=bulk_rows,
            defer_rows=defer_rows,
            sink_duty=sink_duty,
            snapshot_first_s=snapshot_first_s,
        )

    return make
