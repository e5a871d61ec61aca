"""Runtime glue: the capture tick halves, the owner tick, the wire codec, the in-process driver.

See docs/dataplane.md section 4. The Dagster plane calls ``capture_prepare`` /
``capture_commit`` from a capture run's ops, ``OwnerLoop.tick`` from the owner sensor and
``apply_ready_ddl`` / ``apply_syncpoint`` from gated runs; the driver calls the same.
"""

from cdc_dagster.runtime import admin, wire
from cdc_dagster.runtime.capture import (
    CaptureContext,
    CommitOutcome,
    PrepareOutcome,
    TableLine,
    capture_commit,
    capture_prepare,
)
from cdc_dagster.runtime.owner import (
    ChangefeedTick,
    OwnerLoop,
    OwnerTick,
    ReadyDdl,
    ReadySyncpoint,
    TableProgress,
    apply_ddl_at,
    apply_ready_ddl,
    apply_syncpoint,
)
from cdc_dagster.runtime.spark import spark_executor_factory
from cdc_dagster.runtime.spec import ExecutorFactory, ExecutorSpec, RuntimeExecutor

__all__ = [
    "CaptureContext",
    "ChangefeedTick",
    "CommitOutcome",
    "ExecutorFactory",
    "ExecutorSpec",
    "OwnerLoop",
    "OwnerTick",
    "PrepareOutcome",
    "ReadyDdl",
    "ReadySyncpoint",
    "RuntimeExecutor",
    "TableLine",
    "TableProgress",
    "admin",
    "apply_ddl_at",
    "apply_ready_ddl",
    "apply_syncpoint",
    "capture_commit",
    "capture_prepare",
    "spark_executor_factory",
    "wire",
]
