"""A sensor that builds the dbt models once per new syncpoint, never between syncpoints."""

from __future__ import annotations

import dagster as dg

from cdc_dagster.dbt.assets import BUILD_TAG
from cdc_dagster.dbt.settings import DELTA_ROOT_ENV, DbtSettings, delta_root_of
from cdc_dagster.sinks.delta import list_syncpoints


def syncpoint_requests(
    syncpoints: list[int], cursor: int, changefeed_id: str, op_name: str, max_per_tick: int
) -> tuple[list[dg.RunRequest], int, list[int]]:
    """Run requests for syncpoints newer than ``cursor`` (oldest first); new cursor; skipped.

    A backlog above ``max_per_tick`` keeps only the newest ones: an older syncpoint would
    only be overwritten by the next build (its bank total is still checked by the newer).
    """
    new = [ts for ts in syncpoints if ts > cursor]
    skipped, todo = new[:-max_per_tick], new[-max_per_tick:]
    requests = [
        dg.RunRequest(
            run_key=f"dbt-syncpoint:{changefeed_id}:{ts}",
            run_config={"ops": {op_name: {"config": {"syncpoint_ts": ts}}}},
            tags={"cdc/changefeed": changefeed_id, "cdc/syncpoint_ts": str(ts), BUILD_TAG: "1"},
        )
        for ts in todo
    ]
    return requests, (new[-1] if new else cursor), skipped


def syncpoint_sensor(
    assets: dg.AssetsDefinition,
    delta_root: str | None = None,
    changefeed_id: str | None = None,
    name: str = "dbt_syncpoint_sensor",
    minimum_interval_seconds: int = 10,
    max_per_tick: int = 3,
    default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.RUNNING,
) -> dg.SensorDefinition:
    """Poll the changefeed's syncpoint files; one run of ``assets`` per new syncpoint.

    ``delta_root`` / ``changefeed_id`` left None are read from ``CDC_DAGSTER_DBT_*`` at tick
    time (``cdc_dagster.dbt.settings``); unconfigured, the sensor skips.
    """
    op_name = assets.op.name

    @dg.sensor(
        name=name,
        target=assets,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=default_status,
        description="dbt build at each new syncpoint of the changefeed (never between)",
    )
    def _sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult | dg.SkipReason:
        env = DbtSettings.from_env()
        root = delta_root_of(delta_root) if delta_root else (env.delta_root if env else None)
        if root is None:
            return dg.SkipReason(f"no Delta root: set {DELTA_ROOT_ENV} to the changefeed's sink")
        cf = changefeed_id or (env.changefeed_id if env else "default")
        cursor = int(context.cursor or 0)
        requests, new_cursor, skipped = syncpoint_requests(
            list_syncpoints(root, cf), cursor, cf, op_name, max_per_tick
        )
        if skipped:
            context.log.info(f"skipping {len(skipped)} older syncpoints: {skipped[:10]}")
        return dg.SensorResult(
            run_requests=requests,
            cursor=str(new_cursor),
            skip_reason=None if requests else f"no syncpoint after {cursor}",
        )

    return _sensor
