"""The binlog puller as a Dagster job: one bounded pull of one changefeed's upstream.

The run pulls until ``max_seconds`` or ``max_rows`` (the puller flushes every second, so
captures see progress during the run), persists its position and exits; the next owner
tick launches the next run, which resumes from the persisted GTID / file:pos. Progress is
an asset observation per changefeed (``mysql_binlog/<changefeed>``: rows/s, rows,
resolved ts and lag, binlog position) and run tags (position, rows/s) in the runs list.
"""

import time
from typing import Any

import dagster as dg

from cdc_dagster.defs.catalog import _segment
from cdc_dagster.defs.mysql.requests import DEFAULT_PULL_ROWS, DEFAULT_PULL_S, PULLER_JOB
from cdc_dagster.defs.resources import CdcResource
from cdc_dagster.metastore.changefeeds import wall_ms
from cdc_dagster.metastore.problems import PULLER
from cdc_dagster.secrets import redact_text

BINLOG_ASSET_PREFIX = "mysql_binlog"
MAX_TAG_CHARS = 200


class PullConfig(dg.Config):
    """Which changefeed to pull for, and for how long."""

    changefeed_id: str
    max_seconds: float = DEFAULT_PULL_S
    max_rows: int = DEFAULT_PULL_ROWS


def binlog_asset_key(changefeed_id: str) -> dg.AssetKey:
    """The asset whose observations carry a changefeed's puller progress."""
    return dg.AssetKey([BINLOG_ASSET_PREFIX, _segment(changefeed_id)])


def puller_metadata(stats: Any, seconds: float, now_s: float) -> dict[str, dg.MetadataValue]:
    """A run's progress as metadata the UI plots (floats and ints) plus the position text."""
    from scheduler_core.ts import physical_ms

    lag = max(now_s - physical_ms(stats.resolved_ts) / 1000.0, 0.0) if stats.resolved_ts else 0.0
    return {
        "rows": dg.MetadataValue.int(stats.rows),
        "rows_per_s": dg.MetadataValue.float(float(stats.rows / max(seconds, 1e-9))),
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


def _pull(context: dg.OpExecutionContext, config: PullConfig, ms: Any, cf: Any) -> Any:
    from cdc_dagster.mysql.puller import PullerConfig, PullerError, run_puller
    from cdc_dagster.upstream.uri import UpstreamError, changelog_path

    started = time.monotonic()

    def stop(stats: Any) -> bool:
        return time.monotonic() - started >= config.max_seconds or stats.rows >= config.max_rows

    try:
        uri = cf.info.upstream_uri
        pcfg = PullerConfig(uri, changelog_path(uri), tuple(cf.info.table_filter))
        return run_puller(pcfg, stop_after=stop)
    except PullerError as exc:
        message = f"binlog puller: {redact_text(' '.join(str(exc).split()))}"
        then = _report_problem(ms, config.changefeed_id, message, fatal=not exc.retryable)
        raise dg.Failure(f"{message} ({then})", allow_retries=False) from None
    except UpstreamError as exc:  # unreachable or misconfigured upstream: retried with backoff
        message = f"binlog puller: {redact_text(' '.join(str(exc).split()))}"
        then = _report_problem(ms, config.changefeed_id, message, fatal=False)
        raise dg.Failure(f"{message} ({then})", allow_retries=False) from None


@dg.op(name="pull_binlog")
def pull_binlog(context: dg.OpExecutionContext, config: PullConfig, cdc: CdcResource) -> None:
    """Pull the changefeed's binlog into its change log for a bounded time, then persist."""
    from cdc_dagster.metastore.errors import MetastoreError

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
    context.log_event(
        dg.AssetObservation(asset_key=binlog_asset_key(cf.changefeed_id), metadata=metadata)
    )
    context.instance.add_run_tags(
        context.run_id,
        {
            "cdc/binlog_position": stats.position[:MAX_TAG_CHARS],
            "cdc/rows_per_s": f"{stats.rows / max(seconds, 1e-9):.0f}",
        },
    )
    context.log.info(
        "changefeed %s: %d rows in %d transactions, %d DDLs in %.1f s (%.0f rows/s); "
        "binlog position %s",
        cf.changefeed_id,
        stats.rows,
        stats.transactions,
        stats.ddls,
        seconds,
        stats.rows / max(seconds, 1e-9),
        stats.position,
    )


@dg.job(
    name=PULLER_JOB,
    executor_def=dg.in_process_executor,
    description=(
        "One bounded binlog pull of a mysql:// changefeed into its change log, launched by "
        "the owner sensor; at most one at a time per upstream (tag cdc/upstream)."
    ),
)
def mysql_puller() -> None:
    pull_binlog()
