"""The dbt downstream: builds of ``dbt_downstream/`` pinned to one syncpoint (docs/dbt.md)."""

from cdc_dagster.dbt.build import PROJECT_DIR, BuildResult, run_build
from cdc_dagster.dbt.errors import BuildError, DbtDownstreamError, PinError, SyncpointNotFoundError
from cdc_dagster.dbt.pin import PinnedSyncpoint, PinnedTable, latest_syncpoint, pin_syncpoint
from cdc_dagster.dbt.settings import DbtSettings

__all__ = [
    "PROJECT_DIR",
    "BuildError",
    "BuildResult",
    "DbtDownstreamError",
    "DbtSettings",
    "PinError",
    "PinnedSyncpoint",
    "PinnedTable",
    "SyncpointNotFoundError",
    "latest_syncpoint",
    "pin_syncpoint",
    "run_build",
]
