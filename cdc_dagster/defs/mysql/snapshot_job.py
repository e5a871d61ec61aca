"""Chunked snapshots as Dagster runs: one changefeed's pending table snapshots, read as
Spark tasks (one per table key range), while its puller run follows the binlog and places
each chunk at its binlog position (``cdc_dagster.mysql.snapshots``).

Launched by the owner sensor for a running ``mysql://`` changefeed whose change log has
snapshots pending (a new changefeed's tables, a table joining, ``table resnapshot``) and
no snapshot run in flight. A run killed midway is followed by another that resumes at each
range's first chunk not read.

Progress, while the tasks read (they run in Spark's workers, so the op watches the
snapshot files every ``POLL_S``): one ``SnapshotProgress`` per table, rendered as an asset
observation on the table's replica asset (``snapshot_chunks_read`` / ``_placed`` /
``_total``, ``snapshot_rows_read`` / ``_placed`` / ``_planned``, ``snapshot_complete``)
when it changed, and as a run log line; once the reads are done the run waits up to
``place_wait_s`` for the puller to place them, so the last observation says ``complete``.
One observation per run on ``mysql_snapshot/<changefeed>`` sums it up.
"""

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import dagster as dg

from cdc_dagster.defs.catalog import Catalog, TableRef, key_segment
from cdc_dagster.defs.mysql.requests import SNAPSHOT_JOB
from cdc_dagster.defs.resources import CdcResource, SparkResource
from cdc_dagster.secrets import redact_text

SNAPSHOT_ASSET_PREFIX = "mysql_snapshot"
POLL_S = 3.0  # how often a run looks at the chunks its tasks wrote
# A Spark job costs 2-6 s to start over Spark Connect here (planning, Python workers and
# their imports), about what reading half a million rows in one process takes
LOCAL_MAX_ROWS = 500_000
PLACED_POLL_S = 0.5  # ... and, its reads done, whether the puller placed them (then it ends)
# Observations per run (dagster#19618: ~1,000 in one run slowed each to seconds): past
# this, a table's progress goes to the log only, and its last observation at its end.
MAX_OBSERVATIONS = 400
# A table's progress observation before its last at most this often (from when the run
# first saw it): each is an event-log write, 20-60 ms under load, in the run's process
# beside the reads; 100 small tables were observed twice each, 100 of them (~2-6 s of writes)
# in the reads' first seconds when each was only planned. Its last (complete) at once.
OBSERVE_EVERY_S = 10.0


class SnapshotConfig(dg.Config):
    """Which changefeed's snapshots to read, and how."""

    changefeed_id: str
    parallelism: int = 4  # key ranges per table (read in parallel)
    chunk_rows: int = 200_000  # cdc_dagster.mysql.chunk_reader.CHUNK_ROWS (not imported here)
    tasks: int = 0  # Spark tasks the ranges are spread over (0: the session's task slots)
    client: str = "auto"  # chunk reads: auto (connectorx where it can), arrow, rows (pymysql)
    # snapshots of at most this many planned rows are read in the run's process (no job)
    local_max_rows: int = LOCAL_MAX_ROWS
    use_spark: bool = True  # False: the ranges one after another in the run's process
    place_wait_s: float = 30.0  # after reading: wait this long for the chunks to be placed


def snapshot_asset_key(changefeed_id: str) -> dg.AssetKey:
    return dg.AssetKey([SNAPSHOT_ASSET_PREFIX, key_segment(changefeed_id)])


def progress_metadata(p: Any, changefeed_id: str) -> dict[str, dg.MetadataValue]:
    """A table's ``SnapshotProgress`` as observation metadata (ints plot in the UI)."""
    return {
        "changefeed": dg.MetadataValue.text(changefeed_id),
        "snapshot_generation": dg.MetadataValue.int(p.generation),
        "snapshot_chunks_read": dg.MetadataValue.int(p.chunks_read),
        "snapshot_chunks_placed": dg.MetadataValue.int(p.chunks_placed),
        "snapshot_chunks_total": dg.MetadataValue.int(p.chunks_total),
        "snapshot_rows_read": dg.MetadataValue.int(p.rows_read),
        "snapshot_rows_placed": dg.MetadataValue.int(p.rows_placed),
        "snapshot_rows_planned": dg.MetadataValue.int(p.rows_planned),
        "snapshot_ranges": dg.MetadataValue.int(p.ranges),
        "snapshot_ranges_read": dg.MetadataValue.int(p.ranges_read),
        "snapshot_complete": dg.MetadataValue.bool(p.complete),
    }


class ProgressWatch:
    """Renders the changefeed's snapshot progress records while a run reads (see module)."""

    def __init__(
        self, context: dg.OpExecutionContext, catalog: Catalog, changefeed_id: str, root: str
    ) -> None:
        self.context, self.catalog, self.changefeed_id, self.root = (
            context,
            catalog,
            changefeed_id,
            root,
        )
        self.last: dict[tuple[int, int], Any] = {}  # (table, generation) -> last rendered
        self.first: dict[tuple[int, int], Any] = {}  # ... -> the first record this run saw
        # released by the puller between two looks, rendered complete once the reads said
        # how many rows and chunks this run read of them (the records are gone with them)
        self.released: dict[tuple[int, int], Any] = {}
        self.read: dict[int, tuple[int, int]] | None = None  # per table, once the reads end
        self.observations = 0
        self.observed: dict[tuple[int, int], float] = {}  # ... -> when last observed (or seen)
        self.lines: list[str] = []  # the progress lines of this look, not yet logged

    def watch(self, read: Callable[[], Any]) -> Any:
        """Run ``read`` (the Spark job) in a thread, rendering progress until it ends."""
        result: dict[str, Any] = {}

        def go() -> None:
            try:
                result["reads"] = read()
            except BaseException as exc:  # re-raised in the op's thread below
                result["error"] = exc

        job = threading.Thread(target=go, name="snapshot-read", daemon=True)
        job.start()  # first: rendering every table's progress takes ~50 ms a table
        self.poll()
        while job.is_alive():
            job.join(POLL_S)
            self.poll()
        if "error" in result:
            raise result["error"]
        self.reads_done(result["reads"].tables)
        return result["reads"]

    def reads_done(self, tables: dict[int, tuple[int, int]]) -> None:
        """The reads ended, having read ``tables`` (id -> rows, chunks): the tables released
        meanwhile are rendered complete with their counts."""
        self.read = tables
        for key, gone in sorted(self.released.items()):
            self._render(self._final(key, gone), final=True)
        self.released.clear()
        self._log_lines()

    def wait_placed(self, seconds: float) -> None:
        """Poll until the puller placed every table this run saw, or ``seconds`` passed."""
        deadline = time.monotonic() + seconds
        while self.poll() and time.monotonic() < deadline:
            time.sleep(min(PLACED_POLL_S, max(deadline - time.monotonic(), 0.0)))

    def poll(self) -> bool:
        """Render what changed; whether any table this run saw is still being snapshotted."""
        from cdc_dagster.mysql.snapshots import snapshot_progress

        try:
            now = {(p.table_id, p.generation): p for p in snapshot_progress(self.root)}
        except (OSError, ValueError, KeyError) as exc:  # a file replaced while read
            self.context.log.warning("snapshot progress not read this time: %s", exc)
            return True
        for key, p in now.items():
            self.first.setdefault(key, p)
            if self.last.get(key) != p:
                self._render(p, final=p.complete)
        for key in [k for k in self.last if k not in now]:  # released: complete
            gone = self.last.pop(key)
            if gone.complete:
                continue
            if self.read is None:  # its counts come with the reads' end
                self.released[key] = gone
            else:
                self._render(self._final(key, gone), final=True)
        self.last.update(now)
        self._log_lines()
        return any(not p.complete for p in now.values())

    def _log_lines(self) -> None:
        """One log entry for the tables rendered since the last: an event-log write each
        (~50 ms under load), and 100 tables changed two or three times each in a
        snapshot's reads."""
        if self.lines:
            self.context.log.info("\n".join(self.lines))
            self.lines = []

    def _final(self, key: tuple[int, int], gone: Any) -> Any:
        """The complete record of a table released since ``gone`` was seen: what earlier runs
        had read (the first record this run saw) and what this run read, every chunk placed."""
        first = self.first.get(key, gone)
        rows, chunks = (self.read or {}).get(key[0], (0, 0))
        rows, chunks = (
            max(gone.rows_read, first.rows_read + rows),
            max(gone.chunks_read, first.chunks_read + chunks),
        )
        return replace(gone, rows_read=rows, rows_placed=rows, chunks_read=chunks,
                       chunks_placed=chunks, chunks_total=chunks, ranges_read=gone.ranges,
                       complete=True)  # fmt: skip

    def _render(self, p: Any, final: bool) -> None:
        key = (p.table_id, p.generation)
        self.last[key] = p
        self.lines.append(p.line())  # logged together at the end of the look
        now = time.monotonic()
        if not final and (
            self.observations >= MAX_OBSERVATIONS
            or now - self.observed.setdefault(key, now) < OBSERVE_EVERY_S
        ):
            return
        self.observed[key] = now
        self.observations += 1
        ref = TableRef(p.table_id, p.database, p.table, self.changefeed_id)
        self.context.log_event(
            dg.AssetObservation(
                asset_key=self.catalog.replica_key(ref),
                metadata=progress_metadata(p, self.changefeed_id),
            )
        )


def _read(config: SnapshotConfig, uri: str, root: str, spark: SparkResource, planned: int) -> Any:
    from cdc_dagster.mysql.snapshot_runner import SNAPSHOT_SESSION, run_snapshot_reads
    from cdc_dagster.pipeline.job import parallelism

    # no Spark Connect session for a snapshot read here anyway (a client costs ~0.5 s); the
    # session is the one every snapshot run shares: its Python workers imported the chunk
    # readers in an earlier run (or at `server start`), not 2-5 s after this job began
    use = config.use_spark and planned > config.local_max_rows
    session = spark.shared_session(SNAPSHOT_SESSION) if use else None
    tasks = config.tasks or (parallelism(session) if session is not None else 0)
    return run_snapshot_reads(uri, root, session, config.parallelism, config.chunk_rows, tasks,
                              config.client, config.local_max_rows)  # fmt: skip


def build_snapshot_job(catalog: Catalog) -> dg.JobDefinition:
    """The ``mysql_snapshot`` job; progress lands on ``catalog``'s replica asset keys."""

    @dg.op(name="read_snapshots")
    def read_snapshots(
        context: dg.OpExecutionContext,
        config: SnapshotConfig,
        cdc: CdcResource,
        spark: SparkResource,
    ) -> None:
        """Read every pending snapshot range of the changefeed's tables into chunk files."""
        from cdc_dagster.metastore.errors import MetastoreError
        from cdc_dagster.mysql.errors import PullerError
        from cdc_dagster.mysql.snapshot_runner import snapshot_specs
        from cdc_dagster.upstream.uri import UpstreamError, changelog_path

        try:
            cf = cdc.metastore().changefeeds.get(config.changefeed_id)
            uri = cf.info.upstream_uri
            root = changelog_path(uri)
            specs = snapshot_specs(uri, root, config.parallelism, config.chunk_rows, config.client)
            planned = sum(int(s["weight"]) for s in specs)
            context.log.info("%d table range(s) to read, of tables %s, ~%d rows (%s)",
                             len(specs), sorted({s["table_id"] for s in specs}), planned,
                             "Spark tasks" if config.use_spark and planned > config.local_max_rows
                             else "in this process")  # fmt: skip
            watch = ProgressWatch(context, catalog, config.changefeed_id, root)
            started = time.monotonic()
            reads = watch.watch(lambda: _read(config, uri, root, spark, planned))
            rows, seconds = reads.rows, time.monotonic() - started
            context.log.info("reads done: %s; the puller places them", reads.line())
            watch.wait_placed(config.place_wait_s)
        except (MetastoreError, PullerError, UpstreamError) as exc:
            raise dg.Failure(redact_text(" ".join(str(exc).split()))) from None
        _summary(context, config.changefeed_id, rows, seconds, specs)

    @dg.job(
        name=SNAPSHOT_JOB,
        executor_def=dg.in_process_executor,
        description=(
            "Reads a mysql:// changefeed's pending table snapshots in chunks, as Spark tasks "
            "(lock-free, resumable); launched by the owner sensor. Progress per table on its "
            "replica asset (snapshot_* observations)."
        ),
    )
    def mysql_snapshot() -> None:
        read_snapshots()

    return mysql_snapshot


def _summary(
    context: dg.OpExecutionContext, changefeed_id: str, rows: int, seconds: float, specs: list
) -> None:
    context.log_event(
        dg.AssetObservation(
            asset_key=snapshot_asset_key(changefeed_id),
            metadata={
                "rows": dg.MetadataValue.int(rows),
                "rows_per_s": dg.MetadataValue.float(rows / max(seconds, 1e-9)),
                "ranges": dg.MetadataValue.int(len(specs)),
                "tables": dg.MetadataValue.int(len({s["table_id"] for s in specs})),
            },
        )
    )
    context.log.info("%d rows read in %.1f s; the puller places them", rows, seconds)
