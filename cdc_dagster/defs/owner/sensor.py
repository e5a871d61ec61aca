"""The owner sensor: each evaluation is one owner tick (docs: DESIGN.md "Mapping onto Dagster")."""

import dagster as dg

from cdc_dagster.defs.catalog import Catalog
from cdc_dagster.defs.owner.plan import CAPTURE_JOB, plan, progress_lines
from cdc_dagster.defs.partitions import CAPTURES
from cdc_dagster.defs.runtime_glue import owner_tick
from cdc_dagster.defs.settings import Settings
from cdc_dagster.defs.tables.assets import latest_checkpoint

SENSOR_NAME = "cdc_owner"
MIN_INTERVAL_S = 5  # the daemon's loop wakes every 5 s: the real floor


def _pending_admin(settings: Settings) -> list[tuple[str, object]]:
    from cdc_dagster import admin
    from cdc_dagster.metastore import connect

    with connect(
        list(settings.etcd) or None, settings.state_dir, cluster_id=settings.cluster_id
    ) as ms:
        return list(admin.pending_requests(ms))


def _drop_admin(settings: Settings, keys: list[str]) -> None:
    from cdc_dagster.metastore import connect

    with connect(
        list(settings.etcd) or None, settings.state_dir, cluster_id=settings.cluster_id
    ) as ms:
        for key in keys:
            ms.client.delete(key)


def build_owner_sensor(catalog: Catalog, jobs: list[dg.JobDefinition]) -> dg.SensorDefinition:
    """The owner sensor over ``catalog``'s tables, launching ``jobs`` (capture tick, DDL)."""

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
        settings = Settings.from_env()
        tick = int(context.cursor or 0) + 1
        pending = _pending_admin(settings)
        view = owner_tick(settings, [r for _, r in pending])
        if view.is_owner and pending:
            _drop_admin(settings, [k for k, _ in pending])
            context.log.info("handed %d admin request(s) to the coordinator", len(pending))
        by_id = catalog.by_id()

        def checkpoint_of(table_id: int) -> int | None:
            ref = by_id.get(table_id)
            return (
                None
                if ref is None
                else latest_checkpoint(context.instance, catalog.replica_key(ref))
            )

        known = context.instance.get_dynamic_partitions(CAPTURES.name)
        result = plan(view, tick, known, catalog, checkpoint_of)
        for cf, line in progress_lines(view).items():
            context.log.info("changefeed %s: %s", cf, line)
        context.log.info(
            "tick %d owner_rev %d: %d capture run(s), tick took %.3f s",
            tick,
            view.owner_rev,
            len(result.run_requests or []),
            view.duration_s,
        )
        return result

    return cdc_owner


__all__ = ["CAPTURE_JOB", "SENSOR_NAME", "build_owner_sensor"]
