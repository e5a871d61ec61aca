"""Chunked snapshots as Dagster runs: one changefeed's pending table snapshots, read as
Spark tasks (one per table key range), while its puller run follows the binlog and places
each chunk at its binlog position (``cdc_dagster.mysql.snapshots``).

Launched by the owner sensor for a running ``mysql://`` changefeed whose change log has
snapshots pending (a new changefeed's tables, a table joining, ``table resnapshot``) and
no snapshot run in flight. A run killed midway is followed by another that resumes at each
range's first chunk not read. Progress: an asset observation per table on
``mysql_snapshot/<changefeed>`` (rows read, ranges) and one per run.
"""

import time

import dagster as dg

from cdc_dagster.defs.catalog import _segment
from cdc_dagster.defs.mysql.requests import SNAPSHOT_JOB
from cdc_dagster.defs.resources import CdcResource, SparkResource
from cdc_dagster.secrets import redact_text

SNAPSHOT_ASSET_PREFIX = "mysql_snapshot"


class SnapshotConfig(dg.Config):
    """Which changefeed's snapshots to read, and how."""

    changefeed_id: str
    parallelism: int = 4  # key ranges per table (Spark tasks)
    chunk_rows: int = 50_000


def snapshot_asset_key(changefeed_id: str) -> dg.AssetKey:
    return dg.AssetKey([SNAPSHOT_ASSET_PREFIX, _segment(changefeed_id)])


@dg.op(name="read_snapshots")
def read_snapshots(
    context: dg.OpExecutionContext, config: SnapshotConfig, cdc: CdcResource, spark: SparkResource
) -> None:
    """Read every pending snapshot range of the changefeed's tables into chunk files."""
    from cdc_dagster.metastore.errors import MetastoreError
    from cdc_dagster.mysql.errors import PullerError
    from cdc_dagster.mysql.snapshot_runner import run_snapshots, snapshot_specs
    from cdc_dagster.upstream.uri import UpstreamError, changelog_path

    try:
        cf = cdc.metastore().changefeeds.get(config.changefeed_id)
        uri = cf.info.upstream_uri
        root = changelog_path(uri)
        specs = snapshot_specs(uri, root, config.parallelism, config.chunk_rows)
        context.log.info("%d table range(s) to read, of tables %s", len(specs),
                         sorted({s["table_id"] for s in specs}))  # fmt: skip
        started = time.monotonic()
        rows = run_snapshots(uri, root, spark.live_session(), config.parallelism, config.chunk_rows)
    except (MetastoreError, PullerError, UpstreamError) as exc:
        raise dg.Failure(redact_text(" ".join(str(exc).split()))) from None
    seconds = time.monotonic() - started
    context.log_event(
        dg.AssetObservation(
            asset_key=snapshot_asset_key(config.changefeed_id),
            metadata={
                "rows": dg.MetadataValue.int(rows),
                "rows_per_s": dg.MetadataValue.float(rows / max(seconds, 1e-9)),
                "ranges": dg.MetadataValue.int(len(specs)),
                "tables": dg.MetadataValue.int(len({s["table_id"] for s in specs})),
            },
        )
    )
    context.log.info("%d rows read in %.1f s; the puller places them", rows, seconds)


@dg.job(
    name=SNAPSHOT_JOB,
    executor_def=dg.in_process_executor,
    description=(
        "Reads a mysql:// changefeed's pending table snapshots in chunks, as Spark tasks "
        "(lock-free, resumable); launched by the owner sensor."
    ),
)
def mysql_snapshot() -> None:
    read_snapshots()
