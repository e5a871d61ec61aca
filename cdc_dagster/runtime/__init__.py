"""The runtime: what the owner and the captures do, for any control plane to call.

docs/architecture.md has the layers; docs/dataplane.md section 4 the contracts. The owner
sensor calls :func:`owner_step` each tick and renders the :class:`OwnerStep` it returns; a
capture run calls :class:`CaptureTick` (``capture_prepare`` / ``capture_commit`` per
changefeed) and renders the :class:`TableProgress` records of its commit; a gated DDL run
calls :func:`apply_ddl_at`. Everything is typed; nothing here imports Dagster.
"""

from cdc_dagster.runtime.capture import (
    CaptureContext,
    CaptureTick,
    CommitOutcome,
    FrontierWatch,
    PrepareOutcome,
    capture_commit,
    capture_prepare,
)
from cdc_dagster.runtime.lanes import ChangefeedLanes, LaneTick
from cdc_dagster.runtime.owner import (
    ChangefeedTick,
    OwnerLoop,
    OwnerStep,
    OwnerTick,
    ReadyDdl,
    ReadySyncpoint,
    apply_ddl_at,
    apply_ready_ddl,
    apply_syncpoint,
    carry_out,
    owner_step,
    reported_checkpoints,
)
from cdc_dagster.runtime.progress import TableProgress
from cdc_dagster.runtime.spark import spark_executor_factory
from cdc_dagster.runtime.spec import ExecutorFactory, ExecutorSpec, RuntimeExecutor

__all__ = [
    "CaptureContext",
    "CaptureTick",
    "ChangefeedLanes",
    "ChangefeedTick",
    "CommitOutcome",
    "ExecutorFactory",
    "ExecutorSpec",
    "FrontierWatch",
    "LaneTick",
    "OwnerLoop",
    "OwnerStep",
    "OwnerTick",
    "PrepareOutcome",
    "ReadyDdl",
    "ReadySyncpoint",
    "RuntimeExecutor",
    "TableProgress",
    "apply_ddl_at",
    "apply_ready_ddl",
    "apply_syncpoint",
    "capture_commit",
    "capture_prepare",
    "carry_out",
    "owner_step",
    "reported_checkpoints",
    "spark_executor_factory",
]
