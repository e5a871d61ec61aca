"""The capture job: receive -> prepare (phase 1) -> commit (phase 2) -> report.

Partitioned by capture id; in-process executor and in-memory IO (a run is one short tick:
no subprocess per op, nothing pickled between ops).
"""

import json
import time
from typing import Any

import dagster as dg

from cdc_dagster.defs.capture.fencing import Received, StaleRunError, check_owner_rev
from cdc_dagster.defs.catalog import Catalog
from cdc_dagster.defs.owner.plan import CAPTURE_JOB
from cdc_dagster.defs.partitions import CAPTURES
from cdc_dagster.defs.resources import CdcResource, SparkConnectResource
from cdc_dagster.defs.runtime_glue import run_capture_commit, run_capture_prepare
from cdc_dagster.defs.tables.assets import materializations


class ReceiveConfig(dg.Config):
    """What the owner sensor put in the run config."""

    capture_id: str
    owner_rev: int
    tick: int = 0
    messages_json: str = "[]"


@dg.op(out=dg.Out(Received, io_manager_key="mem_io"))
def receive(context: dg.OpExecutionContext, config: ReceiveConfig, cdc: CdcResource) -> Received:
    """Fencing: the capture is registered, the run's owner is current; renew the lease."""
    partition = context.partition_key if context.has_partition_key else config.capture_id
    if partition != config.capture_id:
        raise dg.Failure(f"run for partition {partition} carries capture {config.capture_id}")
    with cdc.metastore() as ms:
        try:
            session = ms.captures.attach(config.capture_id)
            ttl = session.keep_alive()
            owner = ms.election.current_owner()
            check_owner_rev(config.capture_id, config.owner_rev, owner.owner_rev if owner else None)
        except StaleRunError as exc:
            raise dg.Failure(str(exc), allow_retries=False) from exc
        except Exception as exc:
            from cdc_dagster.metastore.errors import MetastoreError

            if isinstance(exc, MetastoreError):
                raise dg.Failure(" ".join(str(exc).split())) from exc
            raise
    messages = json.loads(config.messages_json)
    context.log.info(
        "capture %s: %d owner message(s) from owner_rev %d (tick %d); lease renewed, ttl %d s",
        config.capture_id,
        len(messages),
        config.owner_rev,
        config.tick,
        ttl,
    )
    return Received(config.capture_id, config.owner_rev, config.tick, ttl, messages)


@dg.op(out=dg.Out(Any, io_manager_key="mem_io"))
def prepare(
    context: dg.OpExecutionContext,
    received: Received,
    cdc: CdcResource,
    spark: SparkConnectResource,
) -> Any:
    """Phase 1: pull, sort and mount into the capture's staging, up to resolved ts."""
    started = time.perf_counter()
    ctx, outcome = run_capture_prepare(
        cdc.settings(), spark.spark_session, received.capture_id, received.messages
    )
    context.log.info("prepare: %s (%.2f s)", outcome, time.perf_counter() - started)
    return ctx


@dg.op(out=dg.Out(Any, io_manager_key="mem_io"))
def commit(context: dg.OpExecutionContext, ctx: Any) -> Any:
    """Phase 2: sink staged changes up to min(resolved, barrier), advance checkpoints."""
    started = time.perf_counter()
    outcome, reports = run_capture_commit(ctx)
    for r in reports:
        context.log.info(
            "table %d (%s): %s checkpoint %d resolved %d barrier %d, %d row(s) applied",
            r.table_id,
            r.changefeed_id,
            r.state,
            r.checkpoint_ts,
            r.resolved_ts,
            r.barrier_ts,
            r.rows_applied,
        )
    context.log.info("commit: %s (%.2f s)", outcome, time.perf_counter() - started)
    return reports


def build_report_op(catalog: Catalog) -> dg.OpDefinition:
    """The report op: one asset materialization per replicated table (or schema group)."""

    @dg.op(name="report")
    def report(context: dg.OpExecutionContext, received: Received, reports: Any) -> None:
        """Progress into the replicated tables' metadata (the DDL gate reads it)."""
        now_ms = time.time_ns() // 1_000_000
        events = materializations(catalog, reports, received.capture_id, now_ms)
        for event in events:
            context.log_event(event)
        context.log.info("reported %d table(s) as %d asset event(s)", len(reports), len(events))

    return report


def build_capture_job(catalog: Catalog) -> dg.JobDefinition:
    """The capture job over ``catalog``."""
    report = build_report_op(catalog)

    @dg.job(
        name=CAPTURE_JOB,
        partitions_def=CAPTURES,
        executor_def=dg.in_process_executor,
        description="One processor tick of one capture: receive -> prepare -> commit -> report.",
    )
    def capture_tick() -> None:
        received = receive()
        report(received, commit(prepare(received)))

    return capture_tick
