"""The owner sensor: each evaluation is one owner step (docs: DESIGN.md "Mapping onto Dagster")."""

import dataclasses
import functools
import json
import time
from collections.abc import Mapping
from typing import Any

import dagster as dg
from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition

from cdc_dagster.defs.catalog import Catalog
from cdc_dagster.defs.changefeeds.health import HealthReporter
from cdc_dagster.defs.mysql.requests import PULLER_JOB, with_puller_runs
from cdc_dagster.defs.owner.mailbox import MailboxOutbox
from cdc_dagster.defs.owner.plan import (
    CAPTURE_JOB,
    awaiting_answers,
    idle_reason,
    moving,
    plan,
    progress_lines,
)
from cdc_dagster.defs.owner.stale_runs import cancel_expired_runs, force_cancel_hung_runs
from cdc_dagster.defs.partitions import CAPTURES
from cdc_dagster.defs.resources import CdcResource
from cdc_dagster.defs.tables.assets import (
    ObservationBudget,
    latest_checkpoint,
    progress_observations,
)
from cdc_dagster.defs.tables.checks import SYNCPOINT_CHECKS_JOB, lag_evaluations
from cdc_dagster.defs.tables.gate import checkpoint_lookup
from cdc_dagster.metastore import Metastore
from cdc_dagster.runtime import OwnerStep, owner_step
from cdc_dagster.sinks.uri import is_delta

SENSOR_NAME = "cdc_owner"
# The daemon's loop wakes every 5 s (the real floor) and skips a sensor whose last tick
# started less than its minimum interval ago: at 5 s a tick 4.9 s after the last one waited
# for the next wake, so the owner ticked every 10 s. Below the loop time it ticks each wake.
MIN_INTERVAL_S = 1
# Asset observations per tick: each is one event-log write in the daemon (~12 ms on SQLite).
OBSERVATIONS_PER_TICK = 50
LAG_REFRESH_S = 600.0
# How long one evaluation may go on ticking the owner while following capture runs answer
# (each step then waits for their answers, polling etcd every SETTLE_POLL_S): a resume's
# reports, prepare and commit take three owner steps, 15 s at one per daemon wake.
SETTLE_S = 3.0
SETTLE_POLL_S = 0.1


NOT_STARTED = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED]
IN_PROGRESS = [dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED]


def queued_captures(instance: dg.DagsterInstance, in_progress: bool = False) -> set[str]:
    """Captures with a capture run that has not started yet, or (``in_progress``) not
    finished yet (one query)."""
    statuses = NOT_STARTED + (IN_PROGRESS if in_progress else [])
    records = instance.get_run_records(
        dg.RunsFilter(job_name=CAPTURE_JOB, statuses=statuses), limit=1000
    )
    return {p for r in records if (p := r.dagster_run.tags.get("dagster/partition"))}


def following_captures(instance: dg.DagsterInstance) -> set[str]:
    """Captures whose capture run has started (and so takes its mailbox within a poll)."""
    records = instance.get_run_records(
        dg.RunsFilter(job_name=CAPTURE_JOB, statuses=[dg.DagsterRunStatus.STARTED]), limit=1000
    )
    return {p for r in records if (p := r.dagster_run.tags.get("dagster/partition"))}


def settle(
    ms: Metastore,
    targets: Mapping[str, tuple[str, ...]],
    marks: Mapping[str, int],
    deadline: float,
) -> bool:
    """Wait until every capture in ``targets`` took its mailbox and finished the tick that
    took it (its agent state, written after ``marks[capture]``, the revision at which its
    messages were put there, is out of the tick); False at ``deadline``.

    Best effort: a capture whose own tick (on new data) ended between the put and the take
    may look answered early; the owner's next tick then finds nothing new, and the protocol
    goes on at the next evaluation, as without settling.
    """
    while time.monotonic() < deadline:
        if all(_answered(ms, c, cfs, marks.get(c, 0)) for c, cfs in targets.items()):
            return True
        time.sleep(SETTLE_POLL_S)
    return False


def _answered(ms: Metastore, capture_id: str, changefeeds: tuple[str, ...], since: int) -> bool:
    if ms.mailbox.held(capture_id):
        return False
    for cf in changefeeds:
        kv = ms.client.get(ms.layout.agent_state(cf, capture_id))
        if kv is None or kv.mod_revision <= since or json.loads(kv.value).get("in_tick"):
            return False
    return True


def _cancel_stale_runs(
    context: dg.SensorEvaluationContext, metastore: Metastore, step: OwnerStep
) -> None:
    """Runs of expired registrations must not hold their capture's slot (owner only)."""
    if step.tick.is_owner:
        registered = {  # the captures registered again this tick, with their new epoch
            c: info.epoch
            for c in step.tick.registered
            if (info := metastore.captures.get(c)) is not None
        }
        stopped = cancel_expired_runs(context.instance, registered)
        for line in stopped + force_cancel_hung_runs(context.instance):
            context.log.warning(line)


def _log_unsettled(
    context: dg.SensorEvaluationContext, step: OwnerStep, following: set[str]
) -> None:
    """Say which changefeeds' protocol steps wait for the next evaluation, and why."""
    stepped = moving(step)
    if stepped and not awaiting_answers(step, following):
        context.log.info(
            "changefeed(s) %s wait for the next evaluation: captures with messages %s, "
            "following their mailbox %s", ", ".join(stepped), sorted(step.work),
            sorted(following),
        )  # fmt: skip


def _new_runs(before: list[dg.RunRequest], more: list[dg.RunRequest]) -> list[dg.RunRequest]:
    """Run requests of a later step in the same evaluation that are not asked already: a DDL
    run once per DDL (its run key moves with the tick)."""
    seen = {_run_identity(r) for r in before}
    return [r for r in more if _run_identity(r) not in seen]


def _run_identity(r: dg.RunRequest) -> str:
    tags = r.tags or {}
    if "cdc/ddl_commit_ts" in tags:
        return f"ddl:{tags.get('cdc/changefeed')}:{tags['cdc/ddl_commit_ts']}"
    return r.run_key or ""


def _checkpoints(context: dg.SensorEvaluationContext, catalog: Catalog, step: OwnerStep) -> Any:
    """The DDL gate's checkpoint lookup: the tables' materializations, or the owner's view
    for tables without an asset (built once per changefeed per step)."""
    owner = step.tick
    return checkpoint_lookup(
        catalog,
        lambda key: latest_checkpoint(context.instance, key),
        functools.cache(  # asked once per table of a gated DDL: built once per changefeed
            lambda cf: {
                t.table_id: t.checkpoint_ts
                for t in (owner.changefeeds[cf].tables if cf in owner.changefeeds else ())
                if t.replicating
            }
        ),
    )


def _log_step(
    context: dg.SensorEvaluationContext, catalog: Catalog, step: OwnerStep, tick: int, runs: int
) -> None:
    for cf, line in progress_lines(step).items():
        context.log.info("changefeed %s: %s", cf, line)
    for cf, health in sorted(step.tick.health.items()):
        if health.message:
            state = "failed" if health.failed else "warning"
            context.log.warning("changefeed %s is %s: %s", cf, state, health.message)
        if cf not in catalog.changefeeds:
            context.log.info(
                "changefeed %s has no asset yet (created after this code server loaded the "
                "definitions): restart the code server to see its health check and tables "
                "(changefeed create does it for a local `server start`)",
                cf,
            )
    for note in step.notes:
        context.log.info(note)
    context.log.info(
        "tick %d owner_rev %d: %d run(s) requested, owner tick %.3f s",
        tick,
        step.tick.owner_rev,
        runs,
        step.duration_s,
    )


def checks_runs(step: OwnerStep, ms: Metastore, tick: int, enabled: bool) -> list[dg.RunRequest]:
    """A run of the syncpoint checks after each syncpoint recorded at a Delta sink this tick
    (equality with the upstream, the bank total: they read the Delta versions it pinned)."""
    if not enabled:
        return []
    runs = []
    for sp in step.recorded:
        if is_delta(ms.changefeeds.get(sp.changefeed_id).info.sink_uri):
            runs.append(
                dg.RunRequest(
                    run_key=f"checks:{sp.changefeed_id}:{sp.ts}:{tick}",
                    job_name=SYNCPOINT_CHECKS_JOB,
                    tags={"cdc/changefeed": sp.changefeed_id, "cdc/syncpoint_ts": str(sp.ts)},
                )
            )
    return runs


def _asset_events(
    catalog: Catalog,
    step: OwnerStep,
    budgets: tuple[ObservationBudget, ObservationBudget, HealthReporter],
    lag_bound_s: float,
) -> list[dg.AssetObservation | dg.AssetCheckEvaluation]:
    """The owner's view for the UI: table observations, lag checks, changefeed health."""
    observed, lagged, health = budgets
    now_ms = time.time_ns() // 1_000_000
    return [
        *progress_observations(catalog, step.tables, now_ms, observed),
        *lag_evaluations(catalog, step.tables, now_ms, lag_bound_s, lagged),
        *health.evaluations(catalog, step.tick, now_ms / 1000.0),
    ]


def build_owner_sensor(
    catalog: Catalog,
    jobs: list[dg.JobDefinition | UnresolvedAssetJobDefinition],
    *,
    observations_per_tick: int | None = OBSERVATIONS_PER_TICK,
) -> dg.SensorDefinition:
    """The owner sensor over ``catalog``'s tables, launching ``jobs`` (capture tick, DDL,
    puller, syncpoint checks); at most ``observations_per_tick`` asset observations and as
    many lag check evaluations a tick (None: one per asset)."""
    # These live as long as the code server (losing them only reports everything again).
    budgets = (
        ObservationBudget(observations_per_tick),
        # A lag verdict that did not change is evaluated again only every ten minutes: each
        # evaluation is an event-log write in the daemon; a flip is reported at once.
        ObservationBudget(observations_per_tick, refresh_s=LAG_REFRESH_S),
        HealthReporter(),
    )
    checks_job = any(j.name == SYNCPOINT_CHECKS_JOB for j in jobs)

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
    def cdc_owner(context: dg.SensorEvaluationContext, cdc: CdcResource) -> dg.SensorResult:
        tick = int(context.cursor or 0) + 1
        settings = cdc.settings()
        loop = cdc.owner_loop()
        step = owner_step(loop)
        _cancel_stale_runs(context, loop.metastore, step)
        # A run that follows its mailbox (capture_loop_s > 0) takes the messages sent while
        # it runs: no second run for its capture meanwhile; they wait in its etcd mailbox.
        follow_s = settings.capture_loop_s
        is_owner = step.tick.is_owner
        queued = queued_captures(context.instance, in_progress=follow_s > 0) if is_owner else set()
        following = following_captures(context.instance) if is_owner and follow_s > 0 else set()
        outbox = MailboxOutbox(loop.metastore.mailbox)
        known = context.instance.get_dynamic_partitions(CAPTURES.name)

        def planned(step: OwnerStep, tick: int) -> dg.SensorResult:
            return plan(step, tick, known, catalog, _checkpoints(context, catalog, step),
                        queued=queued, outbox=outbox, follow_s=follow_s)  # fmt: skip

        result = planned(step, tick)
        if is_owner:  # binlog pullers of mysql:// changefeeds (and their snapshots)
            result = with_puller_runs(
                result, context.instance, loop.metastore, step.tick.owner_rev, tick
            )
        runs, recorded = list(result.run_requests or []), list(step.recorded)
        partitions = result.dynamic_partitions_requests
        # While the protocol waits on answers the following capture runs give within a
        # second (a resume's first reports, a prepare, a commit), tick again as soon as they
        # came instead of one daemon wake (5 s) per step (``settle``); not when a puller run
        # is asked for: runs start only once the evaluation returns, and its launch is the
        # longer wait.
        settling = not any(r.job_name == PULLER_JOB for r in runs)
        deadline = time.monotonic() + SETTLE_S
        while (
            settling
            and (targets := awaiting_answers(step, following))
            and settle(loop.metastore, targets, outbox.marks, deadline)
        ):
            _log_step(context, catalog, step, tick, len(result.run_requests or []))
            queued |= {r.partition_key for r in runs if r.partition_key}
            tick, step = tick + 1, owner_step(loop)
            result = planned(step, tick)
            runs += _new_runs(runs, result.run_requests or [])
            recorded += step.recorded
            partitions = result.dynamic_partitions_requests
        if settling:
            _log_unsettled(context, step, following)
        if step.tick.is_owner:  # syncpoint checks of every step's recorded syncpoints
            last = dataclasses.replace(step, recorded=tuple(recorded))
            runs += checks_runs(last, loop.metastore, tick, checks_job)
        _log_step(context, catalog, step, tick, len(runs))
        if queued:  # one line, no etcd read per capture
            context.log.info(
                "run queued or following its mailbox (their messages wait there): %s",
                ", ".join(sorted(queued)),
            )
        if step.tick.is_owner:
            return dg.SensorResult(
                run_requests=runs,
                dynamic_partitions_requests=partitions,
                cursor=str(tick),
                asset_events=_asset_events(catalog, step, budgets, settings.lag_bound_s),
                skip_reason=None if runs else idle_reason(step),
            )
        return result

    return cdc_owner
