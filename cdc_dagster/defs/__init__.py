"""The production ``Definitions``: this module only assembles (see ``build_definitions``).

Nothing is read at import time; ``defs()`` runs when the code location loads and reads the
table catalog: every changefeed's tables (the list from etcd, each one's change log), plus
the change log named by ``CDC_DAGSTER_CHANGELOG`` (that one alone when etcd is down). The dbt
pieces find their changefeed at tick / run time (``cdc_dagster.dbt.settings``), through
the ``cdc`` resource like every other sensor and op.
"""

from __future__ import annotations

import dagster as dg

from cdc_dagster.defs.admin.jobs import ADMIN_JOBS
from cdc_dagster.defs.capture.job import build_capture_job
from cdc_dagster.defs.catalog import Catalog, load_catalog
from cdc_dagster.defs.changefeeds.health import build_health_checks, changefeed_specs
from cdc_dagster.defs.dbt.assets import dbt_assets_for, dbt_resources, with_replica_lineage
from cdc_dagster.defs.dbt.sensor import syncpoint_sensor
from cdc_dagster.defs.ddl.job import build_ddl_job
from cdc_dagster.defs.mysql import build_snapshot_job, mysql_puller
from cdc_dagster.defs.owner.sensor import build_owner_sensor
from cdc_dagster.defs.resources import table_resources
from cdc_dagster.defs.settings import Settings
from cdc_dagster.defs.tables.assets import replica_specs, upstream_specs
from cdc_dagster.defs.tables.checks import lag_checks, syncpoint_checks, syncpoint_checks_job


def build_definitions(catalog: Catalog) -> dg.Definitions:
    """Everything Dagster shows, over ``catalog``'s tables, and the dbt models on them."""
    capture_job = build_capture_job(catalog)
    ddl_job = build_ddl_job(catalog)
    models = with_replica_lineage(dbt_assets_for(), catalog.source_replica_keys())
    checks = syncpoint_checks(catalog)
    checks_jobs = [syncpoint_checks_job(checks)] if checks else []
    owner_jobs = [capture_job, ddl_job, mysql_puller, build_snapshot_job(catalog), *checks_jobs]
    return dg.Definitions(
        assets=[
            *upstream_specs(catalog),
            *replica_specs(catalog),
            *changefeed_specs(catalog),
            models,
        ],
        asset_checks=[*lag_checks(catalog), *checks, *build_health_checks(catalog)],
        jobs=[*owner_jobs, *ADMIN_JOBS],
        sensors=[build_owner_sensor(catalog, owner_jobs), syncpoint_sensor(models)],
        resources={**table_resources(), **dbt_resources()},
    )


def warm_up() -> None:
    """What a warm run worker does ahead of its run (``services.run_worker``), besides its
    imports: the dbt models' assets once (dagster-dbt's manifest caches: 0.12-0.15 s of the
    run's definitions, 0.02 s after)."""
    dbt_assets_for()


@dg.definitions
def defs() -> dg.Definitions:
    """The code location's definitions (the catalog is read when the location loads)."""
    return build_definitions(load_catalog(Settings.from_env()))
