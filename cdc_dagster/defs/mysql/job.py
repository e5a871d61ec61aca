"""The binlog puller as a Dagster job: one changefeed's upstream, followed for a while.

A run follows the binlog for ``max_seconds`` (``CDC_DAGSTER_MYSQL_PULL_S``, 600 s: one run
launch and one reconnect per ten minutes); it flushes at least every
second while rows flow and, with an idle upstream, on the server's heartbeats, so captures
see progress and resolved ts follow the clock during the run. It looks at its changefeed
in etcd once a second and stops within a few seconds when the changefeed is no longer
normal (paused, failed, removed). Then it persists its position and exits; the next run
resumes from the persisted GTID / file:pos. The runs of one upstream (``cdc/upstream``) are
a lane of :mod:`cdc_dagster.defs.handoff`: the owner requests the next run 20 s before the
follow time ends, the next run waits in its op (launched, imported) while the earlier one
is in progress, and the earlier one follows past its time until the next has started (at
most 60 s), so the binlog is unread only from its last flush to the next run's reconnect,
not for a sensor tick and a run launch (a cold one: 6-35 s under load). Paused, it
first closes its binlog connection and waits up to ``CDC_DAGSTER_MYSQL_PAUSE_HOLD_S`` (300
s, within its follow time) for ``changefeed resume``: a resume then pulls again within a
second, without an owner tick or a run launch on its path (a resume that changed the
changefeed's configuration ends the run instead: the next one follows the new one). Progress is
an asset observation per changefeed (``mysql_binlog/<changefeed>``: row events and their
rate, resolved ts and lag, binlog position) and run tags (position, row events/s) in the
runs list. (The puller writes row events as read; the data plane counts rows.)
"""

import dataclasses
import time
from typing import Any

import dagster as dg

from cdc_dagster.defs.catalog import key_segment
from cdc_dagster.defs.handoff import (
    FOLLOW_UNTIL_TAG,
    HANDOFF_MAX_S,
    HandOver,
    Lane,
    wait_for_earlier_runs,
)
from cdc_dagster.defs.mysql.requests import DEFAULT_PULL_S, PULLER_JOB, UPSTREAM_TAG
from cdc_dagster.defs.resources import CdcResource
from cdc_dagster.metastore.changefeeds import ChangefeedState, wall_ms
from cdc_dagster.metastore.problems import PULLER
from cdc_dagster.secrets import redact_text

BINLOG_ASSET_PREFIX = "mysql_binlog"
MAX_TAG_CHARS = 200
CHANGEFEED_CHECK_S = 1.0  # a following run looks whether its changefeed is still normal
DEFAULT_PAUSE_HOLD_S = 300.0  # a paused changefeed's run waits this long for its resume
RESUME_POLL_S = 0.1  # ... looking at the changefeed this often (one etcd read)
HANDOVER_POLL_S = 0.5  # past its time, it looks this often whether the next run started


class PullConfig(dg.Config):
    """Which changefeed to pull for, and for how long."""

    changefeed_id: str
    max_seconds: float = DEFAULT_PULL_S


def binlog_asset_key(changefeed_id: str) -> dg.AssetKey:
    """The asset whose observations carry a changefeed's puller progress."""
    return dg.AssetKey([BINLOG_ASSET_PREFIX, key_segment(changefeed_id)])


def puller_metadata(stats: Any, seconds: float, now_s: float) -> dict[str, dg.MetadataValue]:
    """A run's progress as metadata the UI plots (floats and ints) plus the position text."""
    from scheduler_core.ts import physical_ms

    lag = max(now_s - physical_ms(stats.resolved_ts) / 1000.0, 0.0) if stats.resolved_ts else 0.0
    return {
        "row_events": dg.MetadataValue.int(stats.row_events),
        "row_events_per_s": dg.MetadataValue.float(float(stats.row_events / max(seconds, 1e-9))),
        "transactions": dg.MetadataValue.int(stats.transactions),
        "ddls": dg.MetadataValue.int(stats.ddls),
        "snapshot_rows": dg.MetadataValue.int(stats.snapshot_rows),
        "resolved_ts_raw": dg.MetadataValue.int(stats.resolved_ts),
        "resolved_lag_seconds": dg.MetadataValue.float(float(lag)),
        "binlog_position": dg.MetadataValue.text(stats.position),
        "run_seconds": dg.MetadataValue.float(float(seconds)),
    }


def _report_problem(ms: Any, changefeed_id: str, message: str, *, fatal: bool) -> str:
    """The puller's problem with the changefeed, for the owner to show (warning; failed when
    ``fatal``); returns when the next run may try again."""
    problem = ms.problems.report(changefeed_id, PULLER, message, wall_ms(), fatal=fatal)
    if fatal:
        return "the changefeed fails: fix it, then `cdc-dagster changefeed resume`"
    return (
        f"retried in {(problem.retry_at_ms - wall_ms()) / 1000:.0f} s (attempt {problem.attempts})"
    )


def puller_lane(run: dg.DagsterRun) -> Lane | None:
    """The puller runs of the run's upstream (None: a run without the owner's tags)."""
    upstream = run.tags.get(UPSTREAM_TAG)
    return (
        Lane(PULLER_JOB, UPSTREAM_TAG, upstream, f"binlog puller of {upstream}")
        if upstream
        else None
    )


class FollowStop:
    """When a following puller run stops: its time is up (and, with ``handover`` set, the
    next run of its upstream has started), or its changefeed is no longer normal (looked up
    in etcd at most once per ``check_s``)."""

    def __init__(self, config: PullConfig, ms: Any, check_s: float = CHANGEFEED_CHECK_S) -> None:
        self.config, self.ms, self.check_s = config, ms, check_s
        self.started = time.monotonic()
        self.checked = self.started
        self.why = ""
        self.paused = False  # it stopped because the changefeed is paused
        self.handover: HandOver | None = None

    def hand_over(self, context: dg.OpExecutionContext) -> None:
        """Past its time, follow on until the next run of the upstream has started (at most
        60 s, or the follow time when shorter); tag the run with when its time is up, for
        the owner to request that run (defs/handoff.py)."""
        lane = puller_lane(context.run)
        if lane is None:
            return
        until = self.started + self.config.max_seconds
        self.handover = HandOver(context.instance, lane, context.run_id, until, HANDOVER_POLL_S,
                                 max_s=min(HANDOFF_MAX_S, self.config.max_seconds))  # fmt: skip
        context.instance.add_run_tags(
            context.run_id, {FOLLOW_UNTIL_TAG: f"{time.time() + self.remaining_s():.3f}"}
        )

    def remaining_s(self) -> float:
        """Seconds of the run's follow time left."""
        return max(0.0, self.config.max_seconds - (time.monotonic() - self.started))

    def again(self) -> None:
        """Follow again (after a resume), within the same follow time."""
        self.why, self.paused, self.checked = "", False, time.monotonic()

    def __call__(self, stats: Any) -> bool:
        now = time.monotonic()
        if now - self.checked >= self.check_s:
            self.checked = now
            self.why = self._changefeed_gone()
        if not self.why and now - self.started >= self.config.max_seconds:
            self.why = self._time_up()
        return bool(self.why)

    def _time_up(self) -> str:
        followed = f"followed the binlog for {self.config.max_seconds:.0f} s"
        if self.handover is None:
            return followed
        up = self.handover()
        return f"{followed}; {up}" if up else ""

    def _changefeed_gone(self) -> str:
        from cdc_dagster.metastore.errors import ChangefeedNotFoundError, MetastoreError

        try:
            state = self.ms.changefeeds.get(self.config.changefeed_id).status.state
        except ChangefeedNotFoundError:
            return f"changefeed {self.config.changefeed_id} was removed"
        except MetastoreError:
            return ""  # etcd unreachable for a moment: keep pulling, look again
        if not state.running:
            self.paused = state is ChangefeedState.STOPPED
            return f"changefeed {self.config.changefeed_id} is {state.value}"
        return ""


def pause_hold_s(environ: Any = None) -> float:
    """``CDC_DAGSTER_MYSQL_PAUSE_HOLD_S`` (0: a pause ends the run at once)."""
    import os

    env = os.environ if environ is None else environ
    return float(env.get("CDC_DAGSTER_MYSQL_PAUSE_HOLD_S", DEFAULT_PAUSE_HOLD_S))


def await_resume(ms: Any, changefeed_id: str, info: Any, hold_s: float) -> str:
    """Wait up to ``hold_s`` for the paused changefeed to run again with the configuration
    ``info`` the run pulls for; "" when it does, else why the run should end."""
    from cdc_dagster.metastore.errors import ChangefeedNotFoundError, MetastoreError

    deadline = time.monotonic() + hold_s
    while time.monotonic() < deadline:
        try:
            cf = ms.changefeeds.get(changefeed_id)
        except ChangefeedNotFoundError:
            return f"changefeed {changefeed_id} was removed"
        except MetastoreError:
            cf = None  # etcd away for a moment: look again
        if cf is not None and cf.status.state.running:
            if cf.info != info:
                return f"changefeed {changefeed_id} was resumed with another configuration"
            return ""
        if cf is not None and cf.status.state is not ChangefeedState.STOPPED:
            return f"changefeed {changefeed_id} is {cf.status.state.value}"
        time.sleep(RESUME_POLL_S)
    return f"changefeed {changefeed_id} was not resumed within {hold_s:.0f} s"


def _plus(a: Any, b: Any) -> Any:
    """Two pulls of one run as one (counts added, the later position)."""
    return dataclasses.replace(
        a,
        row_events=a.row_events + b.row_events,
        transactions=a.transactions + b.transactions,
        ddls=a.ddls + b.ddls,
        snapshot_rows=a.snapshot_rows + b.snapshot_rows,
        flushes=a.flushes + b.flushes,
        resolved_ts=b.resolved_ts or a.resolved_ts,
        position=b.position or a.position,
        start_ts=b.start_ts or a.start_ts,
    )


class EtcdResnapshotRequests:
    """``table resnapshot`` requests of one changefeed in etcd, as its puller run takes them
    (``cdc_dagster.mysql.context.ResnapshotRequests``); outcomes go to the run's log."""

    def __init__(self, context: dg.OpExecutionContext, ms: Any, changefeed_id: str) -> None:
        self.context, self.ms, self.changefeed_id = context, ms, changefeed_id
        self.keys: dict[str, str] = {}

    def pending(self) -> list[str]:
        from cdc_dagster import admin
        from cdc_dagster.metastore.errors import MetastoreError

        try:
            self.keys = admin.resnapshot_requests(self.ms, self.changefeed_id)
        except MetastoreError as exc:  # etcd away for a moment: looked at again soon
            self.context.log.warning("re-snapshot requests not read: %s", exc)
            return []
        return sorted(self.keys)

    def taken(self, outcome: Any) -> None:
        from cdc_dagster.metastore.errors import MetastoreError

        (self.context.log.info if outcome.started else self.context.log.warning)(outcome.note)
        try:
            self.ms.client.delete(self.keys.pop(outcome.name))
        except MetastoreError as exc:  # taken again later: refused while it snapshots
            self.context.log.warning("re-snapshot request of %s not deleted: %s",
                                     outcome.name, exc)  # fmt: skip


def _pull(
    context: dg.OpExecutionContext,
    config: PullConfig,
    ms: Any,
    cf: Any,
    stop: FollowStop | None = None,
) -> Any:
    from cdc_dagster.mysql.puller import PullerConfig, PullerError, run_puller
    from cdc_dagster.upstream.uri import UpstreamError, changelog_path

    if stop is None:
        stop = FollowStop(config, ms)
        stop.hand_over(context)
    try:
        uri = cf.info.upstream_uri
        requests = EtcdResnapshotRequests(context, ms, cf.changefeed_id)
        pcfg = PullerConfig(uri, changelog_path(uri), tuple(cf.info.table_filter),
                            requests=requests)  # fmt: skip
        stats = run_puller(pcfg, stop_after=stop)
        context.log.info("puller stopped: %s", stop.why or "done")
        while stop.paused and (hold := min(pause_hold_s(), stop.remaining_s())) > 0:
            context.log.info(
                "binlog connection closed at %s; waiting up to %.0f s for `changefeed "
                "resume` (then this run pulls again at once)", stats.position, hold,
            )  # fmt: skip
            why = await_resume(ms, cf.changefeed_id, cf.info, hold)
            if why:
                context.log.info("puller run ends: %s", why)
                break
            context.log.info("changefeed %s resumed: pulling again", cf.changefeed_id)
            stop.again()
            stats = _plus(stats, run_puller(pcfg, stop_after=stop))
            context.log.info("puller stopped: %s", stop.why or "done")
        return stats
    except PullerError as exc:
        message = f"binlog puller: {redact_text(' '.join(str(exc).split()))}"
        then = _report_problem(ms, config.changefeed_id, message, fatal=not exc.retryable)
        raise dg.Failure(f"{message} ({then})", allow_retries=False) from None
    except UpstreamError as exc:  # unreachable or misconfigured upstream: retried with backoff
        message = f"binlog puller: {redact_text(' '.join(str(exc).split()))}"
        then = _report_problem(ms, config.changefeed_id, message, fatal=False)
        raise dg.Failure(f"{message} ({then})", allow_retries=False) from None


def _skipped(cf: Any) -> dict[str, str]:
    from cdc_dagster.mysql.state import skipped_tables
    from cdc_dagster.upstream.uri import changelog_path

    return skipped_tables(changelog_path(cf.info.upstream_uri))


@dg.op(name="pull_binlog")
def pull_binlog(context: dg.OpExecutionContext, config: PullConfig, cdc: CdcResource) -> None:
    """Follow the changefeed's binlog into its change log for a while, then persist."""
    from cdc_dagster.metastore.errors import MetastoreError

    # One run of an upstream pulls at a time: the next one waits here for the earlier one,
    # which follows until this one has started (defs/handoff.py).
    if (lane := puller_lane(context.run)) is not None:
        wait_for_earlier_runs(context.instance, lane, context.run_id, context.log.info)
    try:
        ms = cdc.metastore()
        cf = ms.changefeeds.get(config.changefeed_id)
    except MetastoreError as exc:
        raise dg.Failure(redact_text(" ".join(str(exc).split()))) from None
    if not cf.status.state.running:
        context.log.info("changefeed %s is %s: nothing to pull", cf.changefeed_id, cf.status.state)
        return
    started = time.monotonic()
    stats = _pull(context, config, ms, cf)
    ms.problems.clear(cf.changefeed_id, PULLER)
    seconds = time.monotonic() - started
    metadata = puller_metadata(stats, seconds, time.time())
    skipped = _skipped(cf)
    for name, why in skipped.items():
        context.log.warning("table %s is not replicated: %s", name, why)
    metadata["skipped_tables"] = dg.MetadataValue.text(", ".join(skipped) or "none")
    context.log_event(
        dg.AssetObservation(asset_key=binlog_asset_key(cf.changefeed_id), metadata=metadata)
    )
    context.instance.add_run_tags(
        context.run_id,
        {
            "cdc/binlog_position": stats.position[:MAX_TAG_CHARS],
            "cdc/row_events_per_s": f"{stats.row_events / max(seconds, 1e-9):.0f}",
        },
    )
    context.log.info(
        "changefeed %s: %d row events in %d transactions, %d DDLs in %.1f s (%.0f events/s); "
        "binlog position %s",
        cf.changefeed_id,
        stats.row_events,
        stats.transactions,
        stats.ddls,
        seconds,
        stats.row_events / max(seconds, 1e-9),
        stats.position,
    )


@dg.job(
    name=PULLER_JOB,
    executor_def=dg.in_process_executor,
    description=(
        "Follows a mysql:// changefeed's binlog into its change log for a while (stops when "
        "the changefeed is paused), launched by the owner sensor; at most one at a time per "
        "upstream (tag cdc/upstream)."
    ),
)
def mysql_puller() -> None:
    pull_binlog()
