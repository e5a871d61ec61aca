"""The DDL job: ``ddl_gate`` fails the run before anything is applied unless the gate is open.

The owner sensor launches it only when the gate is open; the gate op checks again inside
the run, so a launch from the UI cannot skip it.
"""

import functools

import dagster as dg

from cdc_dagster.defs.catalog import Catalog
from cdc_dagster.defs.owner.plan import DDL_JOB
from cdc_dagster.defs.resources import CdcResource
from cdc_dagster.defs.tables.assets import latest_checkpoint
from cdc_dagster.defs.tables.gate import DdlRequest, checkpoint_lookup, gate_status
from cdc_dagster.metastore.problems import DDL
from cdc_dagster.runtime import apply_ddl_at, carry_out, reported_checkpoints


class DdlConfig(dg.Config):
    """Which DDL: the changefeed, its commit ts, the tables it blocks (empty: all)."""

    changefeed_id: str
    commit_ts: int
    table_ids: list[int] = []


def build_ddl_job(catalog: Catalog) -> dg.JobDefinition:
    """The DDL job over ``catalog`` (the gate reads its tables' checkpoint metadata)."""

    @dg.op(name="ddl_gate")
    def ddl_gate(context: dg.OpExecutionContext, config: DdlConfig, cdc: CdcResource) -> int:
        """Fail unless every blocked table's checkpoint metadata reached the commit ts."""
        ddl = DdlRequest(config.changefeed_id, config.commit_ts, tuple(config.table_ids))

        @functools.cache
        def tasks() -> dict:  # etcd is read once, and only when the gate needs it
            return cdc.metastore().task_statuses.read(config.changefeed_id)

        @functools.cache
        def reported(changefeed_id: str) -> dict[int, int]:  # always this run's changefeed
            return reported_checkpoints(tasks())

        checkpoint_of = checkpoint_lookup(
            catalog, lambda key: latest_checkpoint(context.instance, key), reported
        )
        current = None
        if not ddl.table_ids:  # a global DDL blocks every table the captures hold now
            current = {int(t) for s in tasks().values() for t in s.tables.table_ids} or None

        is_open, reason = gate_status(ddl, catalog, checkpoint_of, current)
        if not is_open:
            raise dg.Failure(f"DDL gate closed: {reason}", allow_retries=False)
        context.log.info("DDL gate open: %s", reason)
        return config.commit_ts

    @dg.op(name="ddl_apply")
    def ddl_apply(
        context: dg.OpExecutionContext, gate: int, config: DdlConfig, cdc: CdcResource
    ) -> None:
        """Apply the DDL at the sink (idempotent: a replay skips it); a failure is the
        changefeed's problem (its state says so), retried by the next run after a backoff."""
        queries: list[str] = []
        done, line = carry_out(
            cdc.metastore(),
            config.changefeed_id,
            DDL,
            f"applying the DDL(s) at commit ts {gate}",
            lambda: queries.extend(apply_ddl_at(cdc.metastore(), config.changefeed_id, gate)),
        )
        if not done:
            raise dg.Failure(line, allow_retries=False)
        for query in queries:
            context.log.info("applied DDL at %d of %s: %s", gate, config.changefeed_id, query)

    @dg.job(
        name=DDL_JOB,
        executor_def=dg.in_process_executor,
        description="Apply one DDL after its gate opened.",
    )
    def apply_ddl() -> None:
        ddl_apply(ddl_gate())

    return apply_ddl
