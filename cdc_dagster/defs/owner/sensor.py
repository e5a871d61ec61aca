"""The owner sensor: each evaluation is one owner step, and more while etcd shows changes
the owner acts on, until its wait budget is spent (``wait.py``; docs: DESIGN.md "Mapping
onto Dagster")."""

import functools
import time
from typing import Any

import dagster as dg
from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition

from cdc_dagster.defs.capture.handoff import CaptureRuns, capture_runs
from cdc_dagster.defs.catalog import Catalog
from cdc_dagster.defs.changefeeds.health import HealthReporter
from cdc_dagster.defs.mysql.requests import with_puller_runs
from cdc_dagster.defs.owner.mailbox import MailboxOutbox
from cdc_dagster.defs.owner.plan import (
    DDL_RETRY_S,
    awaiting_answers,
    idle_reason,
    moving,
    plan,
    progress_lines,
)
from cdc_dagster.defs.owner.stale_runs import cancel_expired_runs, force_cancel_hung_runs
from cdc_dagster.defs.owner.wait import SETTLE_S, OwnerWaiter
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
from cdc_dagster.metastore.errors import MetastoreError
from cdc_dagster.runtime import OwnerLoop, OwnerStep, owner_step
from cdc_dagster.sinks.uri import is_delta

SENSOR_NAME = "cdc_owner"
# The daemon's sensor loop wakes every 5 s (Dagster's floor; every second in the daemon of
# `server start`: services/run_coordinator.py SENSOR_LOOP_S) and skips a sensor whose last
# tick started less than its minimum interval ago: at 5 s a tick 4.9 s after the last one
# waited for the next wake, so the owner ticked every 10 s. At 1 s it ticks each wake.
MIN_INTERVAL_S = 1
# Asset observations per tick: each is one event-log write in the daemon (~12 ms on SQLite).
OBSERVATIONS_PER_TICK = 50
LAG_REFRESH_S = 600.0


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


class _Evaluation:
    """One evaluation's owner steps: each planned into a result with its run requests."""

    def __init__(
        self,
        context: dg.SensorEvaluationContext,
        catalog: Catalog,
        loop: OwnerLoop,
        follow_s: float,
        checks_job: bool,
    ) -> None:
        self.context, self.catalog, self.loop = context, catalog, loop
        # A run that follows its mailbox (capture_loop_s > 0) takes the messages sent while
        # it runs: no second run for its capture meanwhile; they wait in its etcd mailbox.
        self.follow_s = follow_s
        self.checks_job = checks_job
        self.outbox = MailboxOutbox(loop.metastore.mailbox)
        self.known = context.instance.get_dynamic_partitions(CAPTURES.name)
        self.queued: set[str] = set()
        self.following: set[str] = set()
        self.handoff: set[str] = set()

    def step(self, tick: int, first: bool = False) -> tuple[OwnerStep, dg.SensorResult]:
        """One owner step as ``tick``, and what the sensor would return for it."""
        context, ms = self.context, self.loop.metastore
        step = owner_step(self.loop)
        if first or step.tick.registered:
            _cancel_stale_runs(context, ms, step)
        is_owner = step.tick.is_owner
        # Again each step: a run that ended meanwhile no longer takes its mailbox; one about
        # to end gets its successor (defs/capture/handoff.py).
        runs = capture_runs(context.instance, self.follow_s) if is_owner else CaptureRuns()
        self.queued, self.following, self.handoff = runs.queued, runs.following, runs.handoff
        result = plan(
            step, tick, self.known, self.catalog, _checkpoints(context, self.catalog, step),
            queued=self.queued, outbox=self.outbox, follow_s=self.follow_s,
            retry_epoch=int(time.time() // DDL_RETRY_S), handoff=self.handoff,
        )  # fmt: skip
        if not is_owner:
            return step, result
        # binlog pullers of mysql:// changefeeds (and their snapshots)
        result = with_puller_runs(result, context.instance, ms, step.tick.owner_rev, tick)
        checks = checks_runs(step, ms, tick, self.checks_job)
        if checks:
            result = dg.SensorResult(
                run_requests=[*(result.run_requests or []), *checks],
                dynamic_partitions_requests=result.dynamic_partitions_requests,
                cursor=result.cursor,
            )
        return step, result


def _must_return(result: dg.SensorResult) -> bool:
    """Runs are launched and partitions changed only once the evaluation returns."""
    return bool(result.run_requests or result.dynamic_partitions_requests)


def _keep_ticking(
    ev: _Evaluation,
    wait_s: float,
    started: float,
    last: tuple[int, OwnerStep, dg.SensorResult],
) -> tuple[int, OwnerStep, dg.SensorResult]:
    """Tick again within the evaluation while something the owner acts on changes in etcd,
    until ``wait_s`` after ``started`` (0: only while following captures answer, for
    SETTLE_S), or a step has runs to launch, or this process is no longer the owner
    (``defs/owner/wait.py``). Never raises for etcd's trouble: the last good step stands."""
    tick, step, result = last
    deadline = started + wait_s if wait_s > 0 else time.monotonic() + SETTLE_S
    waiter = OwnerWaiter(ev.loop.metastore, step.tick.owner_rev, deadline, general=wait_s > 0)
    stepped_at = started
    try:
        while True:
            targets = awaiting_answers(step, ev.following)
            why = waiter.next(step.tick.revision, stepped_at, targets, ev.outbox.marks)
            if why is None:
                if waiter.stopped():
                    ev.context.log.info("owner stopped waiting: %s", waiter.stopped())
                return tick, step, result
            _log_step(ev.context, ev.catalog, step, tick, 0)
            ev.context.log.info("tick %d: ticking again at once: %s", tick + 1, why)
            stepped_at = time.monotonic()
            try:
                step, result = ev.step(tick + 1)
            except MetastoreError as exc:  # etcd went away mid-wait: the last step stands
                ev.context.log.warning("owner stopped waiting: %s", exc)
                return tick, step, result
            tick += 1
            if not step.tick.is_owner or _must_return(result):
                return tick, step, result
    finally:
        waiter.close()


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
        started = time.monotonic()
        settings = cdc.settings()
        ev = _Evaluation(context, catalog, cdc.owner_loop(), settings.capture_loop_s, checks_job)
        tick = int(context.cursor or 0) + 1
        step, result = ev.step(tick, first=True)
        if step.tick.is_owner and not _must_return(result):
            tick, step, result = _keep_ticking(
                ev, settings.owner_wait_s, started, (tick, step, result)
            )
        if step.tick.is_owner:
            _log_unsettled(context, step, ev.following)
        _log_step(context, catalog, step, tick, len(result.run_requests or []))
        if ev.queued:  # one line, no etcd read per capture
            context.log.info(
                "run queued or following its mailbox (their messages wait there): %s",
                ", ".join(sorted(ev.queued)),
            )
        if not step.tick.is_owner:
            return result
        runs = list(result.run_requests or [])
        return dg.SensorResult(
            run_requests=runs,
            dynamic_partitions_requests=result.dynamic_partitions_requests,
            cursor=str(tick),
            asset_events=_asset_events(catalog, step, budgets, settings.lag_bound_s),
            skip_reason=None if runs else idle_reason(step),
        )

    return cdc_owner
