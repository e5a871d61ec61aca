"""Which binlog puller runs the owner sensor requests this tick (pure planning + one adapter).

One following puller run per changefeed whose upstream is ``mysql://``/``mariadb://`` and
whose state is normal, unless one is already queued or running for it that is not about to
end (its successor is requested shortly before its follow time ends: ``defs/handoff.py``).
Runs carry ``cdc/upstream = host:port/server-id``: pullers sharing an upstream and server id
never pull at once (they would disconnect each other): a run waits in its op while an
earlier one of its upstream is in progress, and ``dagster.yaml`` lets at most two of them
(the ending one and the next) start; and ``cdc/changefeed`` for the UI and for the
in-flight check.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import dagster as dg

from cdc_dagster.defs.handoff import AHEAD_TAG, lane_runs
from cdc_dagster.metastore import Metastore
from cdc_dagster.metastore.changefeeds import wall_ms
from cdc_dagster.metastore.errors import MetastoreError
from cdc_dagster.metastore.problems import PULLER
from cdc_dagster.upstream.uri import UpstreamError, is_mysql_uri, parse_uri

PULLER_JOB = "mysql_puller"
SNAPSHOT_JOB = "mysql_snapshot"
UPSTREAM_TAG = "cdc/upstream"
CHANGEFEED_TAG = "cdc/changefeed"
DEFAULT_PULL_S = 600.0  # a run follows the binlog this long (one launch per ten minutes)
MAX_RUNTIME_TAG = "dagster/max_runtime"
HUNG_AFTER_S = 600  # past its follow time (a join may finish first): hung
IN_FLIGHT = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]


@dataclass(frozen=True, slots=True)
class PullBounds:
    """How long one puller run follows the binlog before it persists and exits."""

    max_seconds: float = DEFAULT_PULL_S

    @staticmethod
    def from_env(environ: Mapping[str, str] | None = None) -> PullBounds:
        """``CDC_DAGSTER_MYSQL_PULL_S`` (read at tick time)."""
        env = os.environ if environ is None else environ
        return PullBounds(float(env.get("CDC_DAGSTER_MYSQL_PULL_S", DEFAULT_PULL_S)))


@dataclass(frozen=True, slots=True)
class PullerTarget:
    """A changefeed that needs a puller run."""

    changefeed_id: str
    upstream_key: str  # host:port/server-id (no credentials)


def pullers_to_run(
    changefeeds: Iterable[Any], busy: set[str], backing_off: Iterable[str] = ()
) -> list[PullerTarget]:
    """The running ``mysql://`` changefeeds without a queued or running puller, and not
    waiting out the backoff of a failed one, by id."""
    out = []
    for cf in changefeeds:
        uri = cf.info.upstream_uri
        if not uri or not is_mysql_uri(uri) or not cf.status.state.running:
            continue
        if cf.changefeed_id in busy or cf.changefeed_id in backing_off:
            continue
        try:
            key = parse_uri(uri).key
        except UpstreamError:
            continue  # the run would fail the same way; create validated it
        out.append(PullerTarget(cf.changefeed_id, key))
    return sorted(out, key=lambda t: t.changefeed_id)


def puller_run_request(
    target: PullerTarget, owner_rev: int, tick: int, bounds: PullBounds, ahead: bool = False
) -> dg.RunRequest:
    """One following puller run (its run key is new every tick: Dagster dedupes them forever);
    ``ahead``: the changefeed's next run, asked for before its run ends (``AHEAD_TAG``)."""
    config = {"changefeed_id": target.changefeed_id, "max_seconds": bounds.max_seconds}
    return dg.RunRequest(
        run_key=f"mysql:{target.changefeed_id}:{owner_rev}:{tick}",
        job_name=PULLER_JOB,
        run_config={"ops": {"pull_binlog": {"config": config}}},
        tags={
            UPSTREAM_TAG: target.upstream_key,
            CHANGEFEED_TAG: target.changefeed_id,
            "cdc/owner_rev": str(owner_rev),
            # run monitoring fails a run hung past this, so it frees its upstream's slot
            MAX_RUNTIME_TAG: str(int(bounds.max_seconds + HUNG_AFTER_S)),
            **({AHEAD_TAG: "1"} if ahead else {}),
        },
    )


def in_flight_pullers(instance: dg.DagsterInstance, job: str) -> set[str]:
    """Changefeeds with a run of ``job`` queued or running (one query per tick)."""
    records = instance.get_run_records(dg.RunsFilter(job_name=job, statuses=IN_FLIGHT), limit=1000)
    return {r.dagster_run.tags.get(CHANGEFEED_TAG, "") for r in records}


def snapshot_requests(
    instance: dg.DagsterInstance, metastore: Any, owner_rev: int, tick: int
) -> list[dg.RunRequest]:
    """A snapshot run per running mysql:// changefeed with snapshots pending in its change
    log (the puller state lists them) and none in flight."""
    from cdc_dagster.mysql.state import load_state
    from cdc_dagster.upstream.uri import UpstreamError, changelog_path

    feeds = {cf.changefeed_id: cf for cf in metastore.changefeeds.list()}
    out = []
    for t in pullers_to_run(feeds.values(), in_flight_pullers(instance, SNAPSHOT_JOB)):
        try:
            state = load_state(changelog_path(feeds[t.changefeed_id].info.upstream_uri))
        except (UpstreamError, OSError, ValueError):
            continue  # the puller run reports what is wrong with its change log
        if state is None or not state.snapshots:
            continue
        out.append(
            dg.RunRequest(
                run_key=f"snapshot:{t.changefeed_id}:{owner_rev}:{tick}",
                job_name=SNAPSHOT_JOB,
                run_config={
                    "ops": {"read_snapshots": {"config": {"changefeed_id": t.changefeed_id}}}
                },
                tags={CHANGEFEED_TAG: t.changefeed_id, "cdc/owner_rev": str(owner_rev)},
            )
        )
    return out


def puller_requests(
    instance: dg.DagsterInstance, metastore: Metastore, owner_rev: int, tick: int
) -> list[dg.RunRequest]:
    """The owner tick's puller runs: one per normal mysql:// changefeed not already pulling."""
    feeds = metastore.changefeeds.list()
    now = wall_ms()
    backing_off = [
        cf.changefeed_id
        for cf in feeds
        if is_mysql_uri(cf.info.upstream_uri)
        and (p := metastore.problems.get(cf.changefeed_id, PULLER)) is not None
        and p.retry_at_ms > now
    ]
    bounds = PullBounds.from_env()
    # a changefeed whose one run ends within the handoff time is due its next run
    lanes = lane_runs(instance, PULLER_JOB, CHANGEFEED_TAG, bounds.max_seconds)
    targets = pullers_to_run(feeds, lanes.queued, backing_off)
    return [
        puller_run_request(t, owner_rev, tick, bounds, ahead=t.changefeed_id in lanes.handoff)
        for t in targets
    ]


def with_puller_runs(
    result: dg.SensorResult,
    instance: dg.DagsterInstance,
    ms: Metastore,
    owner_rev: int,
    tick: int,
) -> dg.SensorResult:
    """The owner's ``result`` plus this tick's puller runs (etcd read failing: none this tick)."""
    try:
        runs = puller_requests(instance, ms, owner_rev, tick)
        runs += snapshot_requests(instance, ms, owner_rev, tick)
    except MetastoreError as exc:
        logging.getLogger(__name__).warning("no puller runs this tick: %s", exc)
        return result
    if not runs:
        return result
    return dg.SensorResult(
        run_requests=[*(result.run_requests or []), *runs],
        dynamic_partitions_requests=result.dynamic_partitions_requests,
        cursor=result.cursor,
        skip_reason=result.skip_reason,
    )
