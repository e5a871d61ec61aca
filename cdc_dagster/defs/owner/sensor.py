"""The owner sensor: each evaluation is one owner tick (docs: DESIGN.md "Mapping onto Dagster")."""

import time

import dagster as dg

from cdc_dagster.defs.catalog import Catalog
from cdc_dagster.defs.mysql.requests import with_puller_runs
from cdc_dagster.defs.owner.plan import plan, progress_lines
from cdc_dagster.defs.partitions import CAPTURES
from cdc_dagster.defs.runtime_glue import owner_tick
from cdc_dagster.defs.settings import Settings
from cdc_dagster.defs.tables.assets import latest_checkpoint, progress_observations

SENSOR_NAME = "cdc_owner"
MIN_INTERVAL_S = 5  # the daemon's loop wakes every 5 s: the real floor


def build_owner_sensor(catalog: Catalog, jobs: list[dg.JobDefinition]) -> dg.SensorDefinition:
    """The owner sensor over ``catalog``'s tables, launching ``jobs`` (capture tick, DDL)."""
    by_id = catalog.by_id()

    @dg.sensor(
        name=SENSOR_NAME,
        jobs=jobs,
        minimum_interval_seconds=MIN_INTERVAL_S,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            "The owner loop: keeps or wins the etcd election, runs one coordinator tick per "
            "changefeed, requests a capture_tick run per capture with work and an apply_ddl "
            "run when a DDL's gate opens."
        ),
    )
    def cdc_owner(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        tick = int(context.cursor or 0) + 1
        view = owner_tick(Settings.from_env())

        def checkpoint_of(table_id: int) -> int | None:
            ref = by_id.get(table_id)
            if ref is None:
                return None
            return latest_checkpoint(context.instance, catalog.replica_key(ref))

        known = context.instance.get_dynamic_partitions(CAPTURES.name)
        result = plan(view, tick, known, catalog, checkpoint_of)
        if view.is_owner:  # binlog pullers of mysql:// changefeeds
            result = with_puller_runs(result, context.instance, view.owner_rev, tick)
        for cf, line in progress_lines(view).items():
            context.log.info("changefeed %s: %s", cf, line)
        for note in view.notes:
            context.log.info(note)
        context.log.info(
            "tick %d owner_rev %d: %d run(s) requested, owner tick %.3f s",
            tick,
            view.owner_rev,
            len(result.run_requests or []),
            view.duration_s,
        )
        if view.is_owner and view.tables:
            observations = progress_observations(catalog, view.tables, time.time_ns() // 1_000_000)
            return dg.SensorResult(
                run_requests=result.run_requests,
                dynamic_partitions_requests=result.dynamic_partitions_requests,
                cursor=result.cursor,
                asset_events=observations,
            )
        return result

    return cdc_owner
