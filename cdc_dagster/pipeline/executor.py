"""SparkTableExecutor: the TableExecutor of one capture and changefeed, on Spark.

A capture tick is two calls, run by Dagster as separate ops (possibly in fresh processes):

- :meth:`SparkTableExecutor.pull_phase` (phase 1): for every table that is PREPARING,
  PREPARED, REPLICATING (or STOPPING with a token), read its change-log slice
  ``(staged_upto, resolved]``, sort by (commit ts, seq), mount, and append it to the
  capture's staging -- **one Spark job for all tables**; a PREPARING table is PREPARED once
  caught up with the resolved ts read at the start of the call.
- :meth:`SparkTableExecutor.sink_phase` (phase 2): for every REPLICATING table (and a
  STOPPING one, its last flush), collapse the staged changes in
  ``(checkpoint, min(staged, barrier, next DDL of the table)]`` to the last change per key
  and write the batch with the sink from a Spark task (one table per task), one commit per
  syncpoint interval (a batch never spans a syncpoint TS: the downstream has every table
  exactly at each syncpoint); advance the checkpoint; stop tables being removed; prune
  staged files at or below the checkpoint. An open barrier (the owner's global barrier is
  only how far it read the DDL stream) is taken past, up to the change log's DDL resolved
  ts or its first DDL above the barrier: new data is sunk as soon as it is resolved.

A table whose changes are a backlog (its newest staged change older than ``batch_behind_s``:
the upstream's puller is catching up) commits at most once per ``batch_behind_s``, unless a
barrier or DDL cuts its batch or it is stopping: a Delta MERGE rewrites every file the
batch's keys touch, about as dear for a thousand rows as for a hundred thousand, so while
draining a backlog one large commit per table is many times cheaper than one per tick.

A table whose batch holds no row change (idle: only its resolved ts moved) advances its
checkpoint without a sink write, unless it is stopping, a DDL, barrier or syncpoint needs
the sink to record it, or the sink's record is ``IDLE_SINK_MS`` behind (``_idle``): the sink's
committed ts stays behind (``sink_ts``; nothing of the table in between) and the next write
starts there. A new primary given a checkpoint above the downstream's committed ts checks
the change log has nothing of the table in between before it takes the table.

A changefeed's tick moves at most ``tick_rows`` row changes per phase (0: no limit): the
tables with the fewest pending changes go first, whole, while they fit; the first that does
not fit moves a slice of what is left (at least one change-log or staged file, cut at its
ts), and the tables after it wait for the next tick. A capture ticks its changefeeds one
after another, so without it a table that turns 10M snapshot rows resolved at once held
every other table and changefeed of that capture for the whole of its pull and MERGE. A
table with a budget's worth pending does not gather a backlog (below): it commits each tick.

Nothing lives in memory between ticks that is not in the manifest
(:class:`~cdc_dagster.pipeline.staging.Staging`): the phases save it, :meth:`save` does
(the runtime calls it after the Agent's commands), and
:meth:`SparkTableExecutor.load` restores it in a fresh process. The sink phase saves each
table's write intent before its Spark job; a load that finds one (a crash between a sink
write and the save) raises the table's checkpoint to the sink's committed ts when the sink
still holds our token -- and asks the sink about no other table.

Invariants (checked after every call): ``checkpoint_ts <= resolved_ts``;
``prepared_from <= checkpoint_ts`` once REPLICATING; a token only while sinking
(REPLICATING or STOPPING); checkpoints never go back.

Bad input (a change-log file that cannot be read or does not fit its schema, a schema
history that cannot be parsed, a batch the sink refuses): the table keeps its state and
last good checkpoint, :meth:`errors` names the table, the file and the fix, nothing is
written past it, the other tables go on, and every later tick retries it (once fixed,
it resumes from where it stopped).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from cdc_dagster.pipeline import job
from cdc_dagster.pipeline.spark_tasks import RESTAGE
from cdc_dagster.pipeline.staging import StagedFile, Staging, TableRecord
from cdc_dagster.schema import SchemaError, TableSchema
from cdc_dagster.sinks.base import Sink
from cdc_dagster.sinks.uri import open_sink
from cdc_dagster.text import shorten
from cdc_dagster.upstream.changelog import ChangeLog, ChangeLogError, snapshot_reading
from scheduler_core.ddl import is_syncpoint, syncpoints_between
from scheduler_core.errors import ExecutorContractError
from scheduler_core.messages import Barrier, TableStatusBatch
from scheduler_core.model import Checkpoint, TableState, TableStatus
from scheduler_core.ts import MAX_TS, physical_ms

log = logging.getLogger(__name__)
# Per change log root: when its bulk pulls began to wait for its snapshot's reads (this
# process: a capture run's ticks; ``_reads_first``)
_READS_HELD_SINCE: dict[str, float] = {}

T = TableState
_PULLING = (T.PREPARING, T.PREPARED, T.REPLICATING)


PACE_MAX_MS = 5_000  # a paced table's batch waits at most this long (sink_duty)
PACE_ROWS = 10_000  # ... and only after a write of fewer rows (a trickle, not a backlog)
# A table without row changes writes its checkpoint to the sink once the sink's record is
# this far behind it, in commit-ts time (its checkpoint moves every tick all the same:
# SparkTableExecutor._idle).
IDLE_SINK_MS = 30_000


class SparkTableExecutor:
    """The data plane of one capture for one changefeed (see the module docstring)."""

    def __init__(
        self,
        capture_id: str,
        changefeed_id: str,
        changelog: ChangeLog,
        sink_uri: str,
        staging_dir: str | os.PathLike[str],
        spark: Any,
        sync_point_interval_ms: int | None = None,
        local_max_bytes: int = 0,
        batch_behind_s: float = 0.0,
        clock: Callable[[], float] = time.time,
        registration: str = "",
        tick_rows: int = 0,
        local_max_rows: int = 0,
        bulk_rows: int = 0,
        defer_rows: int = 0,
        sink_duty: float = 0.0,
        snapshot_first_s: float = 0.0,
    ) -> None:
        self.capture_id = capture_id
        # The share of the changefeed's time its sink writes may take on this capture (0 or
        # 1: no pacing): after a sink phase whose writes took d seconds, the tables it wrote
        # wait d * (1 - duty) / duty seconds (at most PACE_MAX_MS) unless a DDL or syncpoint
        # waits for one or a budget's worth is staged. A Delta MERGE rewrites every file its keys touch: a wide table with a
        # steady trickle of changes otherwise rewrites itself back to back, a core per
        # capture for a few hundred rows/s.
        self.sink_duty = sink_duty
        # A table whose phase would move this many row changes waits for a later tick (0:
        # none waits): a capture run's first tick, whose ops tick every changefeed together,
        # leaves bulk work to the follow loop's lanes (cdc_dagster/defs/capture/job.py).
        self.defer_rows = defer_rows
        # While the change log's snapshot is being read, its tables' bulk pulls (a released
        # table's rows) wait, for at most this long from the first such wait (0: never):
        # ``_reads_first``.
        self.snapshot_first_s = snapshot_first_s
        self.tick_rows = tick_rows  # row changes per phase and tick (0: no limit)
        self.local_max_rows = local_max_rows  # ... and moving fewer rows (0: any)
        self.bulk_rows = bulk_rows  # an in-process phase moving this many runs niced (0: never)
        self._file_rows: dict[str, int] = {}  # change-log files' rows, read once a pull phase
        self.sync_point_interval_ms = sync_point_interval_ms
        self.local_max_bytes = local_max_bytes  # a phase reading less runs without a job
        self.batch_behind_ms = int(batch_behind_s * 1000)  # 0: every tick commits
        self.clock = clock  # wall seconds: how old a backlog is, when a table last committed
        self.changefeed_id = changefeed_id
        self.changelog = changelog
        self.sink_uri = sink_uri
        self.spark = spark
        # A registration's own area: a late run of an expired one cannot touch it.
        self.staging = Staging(staging_dir, changefeed_id, capture_id, registration)
        self.barrier = Barrier(0)  # sink nothing until the owner says how far
        self._stream_ts = 0  # how far the DDL stream lets sinks pass an open barrier
        self._ddl_stop_ts = 0  # the first DDL above an open barrier (0: none seen)
        self._tables: dict[int, TableRecord] = {}
        self._sink: Sink | None = None
        self._doomed_files: list[tuple[int, list[StagedFile]]] = []
        self._doomed_tables: list[int] = []

    @classmethod
    def load(
        cls,
        capture_id: str,
        changefeed_id: str,
        changelog: ChangeLog,
        sink_uri: str,
        staging_dir: str | os.PathLike[str],
        spark: Any,
        sync_point_interval_ms: int | None = None,
        local_max_bytes: int = 0,
        batch_behind_s: float = 0.0,
        clock: Callable[[], float] = time.time,
        registration: str = "",
        tick_rows: int = 0,
        local_max_rows: int = 0,
        bulk_rows: int = 0,
        defer_rows: int = 0,
        sink_duty: float = 0.0,
        snapshot_first_s: float = 0.0,
    ) -> SparkTableExecutor:
        """The executor as the last :meth:`save` left it (empty if none), reconciled with the sink."""
        ex = cls(
            capture_id,
            changefeed_id,
            changelog,
            sink_uri,
            staging_dir,
            spark,
            sync_point_interval_ms,
            local_max_bytes,
            batch_behind_s,
            clock,
            registration,
            tick_rows,
            local_max_rows,
            bulk_rows,
            defer_rows,
            sink_duty,
            snapshot_first_s,
        )
        loaded = ex.staging.load()
        if loaded is None:
            return ex
        ex._tables, ex.barrier = loaded
        ex.staging.remove_orphans(ex._tables)
        for table_id, rec in ex._tables.items():
            # Only tables with a write in flight at the crash: no sink call per table per load.
            if rec.sink_intent and rec.token and rec.state in (T.REPLICATING, T.STOPPING):
                ex._catch_up_with_sink(table_id, rec)
            rec.sink_intent = 0
        ex._check()
        return ex

    def _catch_up_with_sink(self, table_id: int, rec: TableRecord) -> None:
        """A crash between a sink write and the save: the sink's committed ts is the truth."""
        schema = self._schema(table_id, rec.checkpoint_ts)
        if schema is None:
            return
        committed = self.sink.committed(self.changefeed_id, schema)
        if committed.token == rec.token and committed.committed_ts > rec.checkpoint_ts:
            log.info(
                "capture %s: table %s checkpoint %s -> %s (the sink committed before a crash)",
                self.capture_id,
                table_id,
                rec.checkpoint_ts,
                committed.committed_ts,
            )
            rec.checkpoint_ts = committed.committed_ts
            rec.resolved_ts = max(rec.resolved_ts, rec.checkpoint_ts)
        if committed.token == rec.token and committed.committed_ts >= rec.checkpoint_ts:
            rec.sink_ts = 0

    @property
    def sink(self) -> Sink:
        """The driver's sink (commit and load talk to it; writes happen in Spark tasks)."""
        if self._sink is None:
            self._sink = open_sink(self.sink_uri)
        return self._sink

    # ------------------------------------------------------------------ commands
    def prepare(self, table_id: int, checkpoint: Checkpoint) -> None:
        """Phase 1: pull from ``checkpoint.checkpoint_ts`` (PREPARED after a pull catches up)."""
        if table_id in self._tables:
            raise ExecutorContractError(
                f"prepare of table {table_id} on {self.capture_id}, which holds it in "
                f"{self._tables[table_id].state.name}: prepare only an ABSENT table"
            )
        start = checkpoint.checkpoint_ts
        self.staging.drop_table(table_id)  # leftovers of an earlier holding
        self._tables[table_id] = TableRecord(T.PREPARING, start, start, start, start)

    def commit(self, table_id: int, checkpoint: Checkpoint) -> None:
        """Phase 2: check the data is readable, take the fencing token, sink from the checkpoint."""
        rec = self._tables.get(table_id)
        if rec is None or rec.state != T.PREPARED:
            state = "ABSENT" if rec is None else rec.state.name
            raise ExecutorContractError(
                f"commit of table {table_id} on {self.capture_id} in {state}: "
                "commit only a PREPARED table"
            )
        start = checkpoint.checkpoint_ts
        if rec.prepared_from > start:
            raise ExecutorContractError(
                f"table {table_id} on {self.capture_id} was prepared from {rec.prepared_from} "
                f"> commit checkpoint {start}: sinking would skip the changes in between; "
                "prepare it again from the checkpoint"
            )
        schema = self._schema(table_id, start) or self._schema(table_id, rec.staged_upto)
        if schema is None:
            raise ExecutorContractError(
                f"commit of table {table_id} on {self.capture_id} at {start}: the change log "
                "has no schema for it (not created yet or dropped); the owner must not commit it"
            )
        reached = self.sink.committed(self.changefeed_id, schema).committed_ts
        if reached == start - 1 and self._ddl_at(table_id, start):
            reached = start  # held at its DDL: every row change up to it is in (_sink_spec)
        # committed_ts 0: no batch was ever written, so no earlier primary's writes to miss.
        # Below the checkpoint with no change of the table in between: the previous primary
        # moved the checkpoint past idle batches without a sink write (_idle).
        if 0 < reached < start and self._changes_between(table_id, reached, start):
            raise ExecutorContractError(
                f"table {schema.qualified_name} (id {table_id}) on {self.capture_id}: downstream "
                f"committed {reached} < commit checkpoint {start}: the previous "
                "primary's writes are not readable yet"
            )
        rec.token = self.sink.acquire(self.changefeed_id, schema)
        # Never below the downstream: a replay must not rewrite a newer row version.
        rec.checkpoint_ts = max(start, reached)
        rec.sink_ts = reached if 0 < reached < start else 0
        rec.resolved_ts = max(rec.resolved_ts, rec.checkpoint_ts)
        rec.state = T.REPLICATING
        rec.sunk_at_ms = self._now_ms()  # a backlog's first batch gathers from here

    def _changes_between(self, table_id: int, after_ts: int, upto_ts: int) -> bool:
        """Whether the change log holds a row change or a DDL of the table in (after, upto]
        (a data file's name gives its first and last commit ts, and none spans a resolved
        mark, which every checkpoint is)."""
        if self.changelog.data_files(table_id, after_ts, upto_ts):
            return True
        return any(
            table_id in r.tables or table_id in r.table_ids
            for r in self.changelog.ddl_records(after_ts, upto_ts)
        )

    def remove(self, table_id: int) -> None:
        """Begin stopping (idempotent): a sinking table flushes once in the next sink phase."""
        rec = self._tables.get(table_id)
        if rec is None or rec.state in (T.STOPPING, T.STOPPED):
            return
        rec.state = T.STOPPING if rec.token else T.STOPPED

    def forget(self, table_id: int) -> None:
        """Drop a STOPPED table and its staged files (no-op for an ABSENT one)."""
        rec = self._tables.get(table_id)
        if rec is None:
            return
        if rec.state != T.STOPPED:
            raise ExecutorContractError(
                f"forget of table {table_id} on {self.capture_id} in {rec.state.name}: "
                "only a STOPPED table may be forgotten (remove it first)"
            )
        del self._tables[table_id]
        self._doomed_tables.append(table_id)  # deleted once a saved manifest no longer names it

    def set_barrier(self, barrier: Barrier) -> None:
        """Sinks will not pass ``barrier.barrier_ts(table_id)``."""
        self.barrier = barrier

    # ------------------------------------------------------------------ progress
    def advance(self) -> None:
        """One processor tick: :meth:`pull_phase` then :meth:`sink_phase`."""
        self.pull_phase()
        self.sink_phase()

    @property
    def _where_phases_run(self) -> tuple[int, int, int]:
        """``job.run``'s limits: in process below them, niced in the background above."""
        return self.local_max_bytes, self.local_max_rows, self.bulk_rows

    def pull_phase(self) -> dict[int, int]:
        """Phase 1 for every pulling table, in one Spark job; returns rows staged per table."""
        pending = []  # (table_id, rec, resolved, its change-log files in (staged, resolved])
        self._file_rows = {}  # footers are read anew each pull phase
        for table_id, rec in sorted(self._tables.items()):
            if not (rec.state in _PULLING or (rec.state == T.STOPPING and rec.token)):
                continue
            try:
                resolved = self.changelog.table_resolved_ts(table_id)
                if resolved <= rec.staged_upto:
                    self._caught_up(rec)
                    continue
                # listed once: the budget counts their rows, the spec cuts them into segments
                files = self.changelog.data_files(table_id, rec.staged_upto, resolved)
            except (ChangeLogError, SchemaError, OSError, ValueError) as exc:
                self._fail(table_id, rec, self._history_error(table_id, exc), "pull")
                continue
            pending.append((table_id, rec, resolved, files))
        specs = []
        listed = {table_id: files for table_id, _, _, files in pending}
        for table_id, rec, resolved, upto, rows in self._pull_budget(pending):
            try:
                spec = self._pull_spec(table_id, rec, upto, listed[table_id])
            except (ChangeLogError, SchemaError, OSError, ValueError) as exc:
                self._fail(table_id, rec, self._history_error(table_id, exc), "pull")
                continue
            spec["resolved"] = resolved
            spec["rows"] = rows  # about (whole files): where the phase runs, not the budget
            specs.append(spec)
        staged: dict[int, int] = {}
        for res in job.run(self.spark, "pull", specs, *self._where_phases_run):
            table_id = res["table_id"]
            rec = self._tables[table_id]
            if res["status"] != "ok":
                self._fail(table_id, rec, res["message"], "pull")
                continue
            rec.files += [StagedFile(**f) for f in json.loads(res["detail"])]
            spec = next(s for s in specs if s["table_id"] == table_id)
            rec.staged_upto = spec["upto"]
            rec.resolved_ts = max(rec.resolved_ts, rec.staged_upto)
            self._clear(rec, "pull")
            if rec.staged_upto >= spec["resolved"]:  # not a slice: caught up
                self._caught_up(rec)
            staged[table_id] = res["rows"]
        self.save()
        self._check()
        return staged

    def _pull_budget(
        self, pending: list[tuple[int, TableRecord, int, list[Any]]]
    ) -> list[tuple[int, TableRecord, int, int, int]]:
        """(table, record, resolved, upto, rows) of the tables this tick pulls, within
        ``tick_rows`` (the module docstring): whole (upto = resolved) while they fit, fewest
        pending bytes first; the first that does not fit up to the ts where its files'
        rows reach what is left (at least one file); the others wait. A stopping table's
        last pull is never cut or put off. With ``defer_rows``, a table with that many
        pending rows waits whole."""
        if self.defer_rows:
            pending = [
                p
                for p in pending
                if p[1].state == T.STOPPING or self._rows_of(p[3]) < self.defer_rows
            ]
        pending = self._reads_first(pending)
        if not self.tick_rows:
            return [(t, rec, res, res, self._rows_of(files)) for t, rec, res, files in pending]
        out, left, sliced = [], self.tick_rows, False
        order = sorted(pending, key=lambda p: (sum(_size(f.path) for f in p[3]), p[0]))
        for table_id, rec, resolved, files in order:
            if rec.state == T.STOPPING:
                out.append((table_id, rec, resolved, resolved, self._rows_of(files)))
                continue
            if sliced:
                continue  # waits for the next tick
            upto, rows = _slice(files, left, self._file_rows)
            whole = upto >= resolved or not files
            if whole and _cost(rows) <= left:
                out.append((table_id, rec, resolved, resolved, rows))
                left -= _cost(rows)
                continue
            out.append((table_id, rec, resolved, resolved if whole else upto, rows))
            sliced = True
        return out

    def _reads_first(
        self, pending: list[tuple[int, TableRecord, int, list[Any]]]
    ) -> list[tuple[int, TableRecord, int, list[Any]]]:
        """``pending`` without the bulk pulls (``bulk_rows`` or more rows: a snapshot's
        released table) that wait for the change log's snapshot reads: on 2 cores a 100 x 100k
        snapshot's released tables, sunk while the others were read, took the CPU of the
        reads (read in 17.5-17.7 s, not 21-23 s; readable after 68-72 s, not 68 s:
        bench/throughput_bench.py, a run each). They wait while a reader wrote a chunk in
        the last ``changelog.READING_S``, for at most ``snapshot_first_s`` from the first wait
        of those reads (a long snapshot's early tables are then sunk as they come); a
        stopping table's pull never waits."""
        if not (self.snapshot_first_s and self.bulk_rows and pending):
            return pending
        root = str(self.changelog.root)
        if not snapshot_reading(root):
            _READS_HELD_SINCE.pop(root, None)
            return pending
        held = [p for p in pending
                if p[1].state != T.STOPPING and self._rows_of(p[3]) >= self.bulk_rows]  # fmt: skip
        if not held:
            return pending
        since = _READS_HELD_SINCE.get(root)
        if since is None:  # the first wait of these reads: logged once
            since = _READS_HELD_SINCE[root] = time.monotonic()
            log.info("changefeed %s: %d released snapshot table(s) wait for the snapshot's reads "
                     "(at most %.0f s)", self.changefeed_id, len(held),
                     self.snapshot_first_s)  # fmt: skip
        if time.monotonic() - since >= self.snapshot_first_s:
            return pending
        ids = {p[0] for p in held}
        return [p for p in pending if p[0] not in ids]

    def _rows_of(self, files: list[Any]) -> int:
        """Rows of change-log ``files`` (their Parquet footers, each read once a phase)."""
        return sum(_rows(f.path, self._file_rows) for f in files)

    @staticmethod
    def _caught_up(rec: TableRecord) -> None:
        if rec.state == T.PREPARING:
            rec.state = T.PREPARED

    def _pull_spec(
        self, table_id: int, rec: TableRecord, upto: int, listed: list[Any]
    ) -> dict[str, Any]:
        """The table's pull of ``(staged_upto, upto]`` from ``listed`` (its data files in
        ``(staged_upto, resolved]``, ``upto <= resolved``), one segment per DDL of it."""
        after = rec.staged_upto
        ddls = [
            r.commit_ts
            for r in self.changelog.ddl_records(after, upto)
            if table_id in r.tables or table_id in r.table_ids
        ]
        segments, lo, weight = [], after, 0
        for hi in [*sorted(set(ddls)), upto]:
            if hi <= lo:
                continue
            files = [f for f in listed if f.last_ts > lo and f.first_ts <= hi]  # as data_files
            schema = self.changelog.schema_at(table_id, lo)
            if schema is None and files:
                raise ValueError(
                    f"data files {[f.path for f in files][:3]} hold rows in ({lo}, {hi}], where "
                    "the schema history says the table does not exist"
                )
            if files:
                paths = [(f.path, f.shard, f.first_ts, f.last_ts) for f in files]
                weight += sum(_size(p[0]) for p in paths)
                segments.append({"lo": lo, "hi": hi, "schema": schema.to_json(), "files": paths})
            lo = hi
        return {
            "table_id": table_id,
            "changelog_root": str(self.changelog.root),
            "upto": upto,
            "out_dir": self.staging.table_dir(table_id),
            "segments": segments,
            "weight": weight,
        }

    def sink_phase(self) -> dict[int, int]:
        """Phase 2 for every sinking table, one table per Spark task; returns rows written."""
        specs, stopping = [], []
        self._stream_ts = self._read_stream_ts()
        for table_id, rec in sorted(self._tables.items()):
            if rec.state == T.STOPPING:
                stopping.append(table_id)
            if rec.state not in (T.REPLICATING, T.STOPPING) or not rec.token:
                continue
            try:
                spec = self._sink_spec(table_id, rec)
            except (ChangeLogError, SchemaError, OSError, ValueError) as exc:
                self._fail(table_id, rec, self._history_error(table_id, exc), "sink")
                continue
            if spec is None:
                continue
            if spec["end"] <= spec["start"]:  # nothing but its DDL in (checkpoint, upto]
                rec.checkpoint_ts = spec["upto"]
                continue
            if self._idle(rec, spec):  # no row change: the checkpoint moves, nothing written
                rec.sink_ts = rec.sink_ts or rec.checkpoint_ts
                rec.checkpoint_ts = spec["upto"]
                # as the empty commit did: a backlog after an idle stretch gathers from here
                rec.sunk_at_ms = self._now_ms()
                continue
            if self._gathers(rec, spec) or self._paced(rec, spec):
                continue
            specs.append(spec)
        specs = self._sink_budget(specs)
        for spec in specs:  # after idle batches the write starts where the sink is
            spec["start"] = self._tables[spec["table_id"]].sink_ts or spec["start"]
        upto = {spec["table_id"]: spec for spec in specs}
        for spec in specs:
            self._tables[spec["table_id"]].sink_intent = spec["end"]
        if specs:
            self.save()  # the intents: a crash from here on is reconciled with the sink on load
        written: dict[int, int] = {}
        results = list(job.run(self.spark, "sink", specs, *self._where_phases_run))
        # Pacing (sink_duty) counts the phase's writes together: a changefeed's tables sink
        # in one phase, one after another, so each waiting its own write's time alone let
        # the others' writes fill the wait (still back to back). After a large write (a
        # backlog's, a snapshot's: its cost was its rows) nothing waits.
        done = [r for r in results if r["status"] == "ok"]
        small = all(r["rows"] < PACE_ROWS for r in done)
        phase_ms = int(sum(r.get("seconds") or 0.0 for r in done) * 1000) if small else 0
        for res in results:
            table_id, rec = res["table_id"], self._tables[res["table_id"]]
            if res["status"] == "fenced":
                log.warning(
                    "capture %s: table %s fenced at checkpoint %s: %s",
                    self.capture_id,
                    table_id,
                    rec.checkpoint_ts,
                    res["message"],
                )
                rec.state, rec.token, rec.sink_ts = T.STOPPED, 0, 0
            elif res["status"] == RESTAGE:
                self._fail(table_id, rec, res["message"], "sink")
                self._restage(table_id, rec)
            elif res["status"] != "ok":
                self._fail(table_id, rec, res["message"], "sink")
            else:
                done, spec = json.loads(res["detail"]), upto[table_id]
                rec.checkpoint_ts = max(
                    rec.checkpoint_ts, spec["upto"] if done >= spec["end"] else done
                )
                rec.sink_ts = 0 if done >= rec.checkpoint_ts else max(rec.sink_ts, done)
                self._clear(rec, "sink")
                rec.rows_applied += res["rows"]
                rec.sunk_at_ms = self._now_ms()
                rec.sink_ms = phase_ms
                written[table_id] = res["rows"]
        for spec in specs:
            self._tables[spec["table_id"]].sink_intent = 0
        for table_id in stopping:  # flushed once (or could not): final checkpoint
            rec = self._tables[table_id]
            rec.state, rec.token = T.STOPPED, 0
        self._prune()
        self._check()
        return written

    def _sink_budget(self, specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The batches this tick writes, within ``tick_rows`` (as ``_pull_budget``): whole,
        fewest staged rows first, while they fit; the first that does not fit cut at a
        staged file's end (at least one file); the others wait. A stopping table's last
        batch is never cut or put off; with ``defer_rows``, one of that many rows waits."""
        if self.defer_rows:
            specs = [
                s
                for s in specs
                if self._tables[s["table_id"]].state == T.STOPPING or s["rows"] < self.defer_rows
            ]
        if not self.tick_rows:
            return specs
        out, left, sliced = [], self.tick_rows, False
        for spec in sorted(specs, key=lambda sp: (sp["rows"], sp["table_id"])):
            rec = self._tables[spec["table_id"]]
            if rec.state == T.STOPPING:
                out.append(spec)
            elif sliced:
                continue  # waits for the next tick
            elif _cost(spec["rows"]) <= left:
                out.append(spec)
                left -= _cost(spec["rows"])
            else:
                cut = self._sink_spec(spec["table_id"], rec, max_rows=left)
                if cut is not None and cut["end"] > cut["start"]:
                    out.append(cut)
                sliced = True
        return out

    def _held_by_barrier(self, table_id: int, end: int) -> bool:
        b = self.barrier
        closed = not b.open_until_ts and b.global_barrier_ts < MAX_TS
        return table_id in b.table_barriers or closed or 0 < self._ddl_stop_ts <= end

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    def _gathers(self, rec: TableRecord, spec: dict[str, Any]) -> bool:
        """Whether the table's batch waits for more of a backlog instead of committing now
        (see the module docstring): it is replicating, no DDL waits for its batch (the owner's
        view of the DDL stream lagging the staged data is no reason), its newest staged
        change is older than ``batch_behind_s``, and it committed less than
        ``batch_behind_s`` ago."""
        wait = self.batch_behind_ms
        if not wait or rec.state != T.REPLICATING or spec["held"]:
            return False
        if self.tick_rows and spec["rows"] >= self.tick_rows:
            return False  # a budget's worth is staged: it commits each tick
        now = self._now_ms()
        return now - physical_ms(rec.staged_upto) > wait and now - rec.sunk_at_ms < wait

    def _idle(self, rec: TableRecord, spec: dict[str, Any]) -> bool:
        """Whether the table's batch only moves its checkpoint, with nothing that needs the
        sink to record it: replicating (a stopping table's last flush is written), no row
        change staged in it, no DDL or barrier waiting for it, no syncpoint in it or at its
        end, and the sink's record is less than ``IDLE_SINK_MS`` (of commit ts) behind the
        batch's end. Its checkpoint
        moves without a sink commit: an idle table cost one commit per tick (~10-30 ms of
        CPU each: a changefeed of 100 quiet tables kept a capture's core a third busy). The
        sink's record stays behind (``sink_ts``), with nothing of the table in between; a
        new primary checks that in the change log (:meth:`commit`)."""
        if rec.state != T.REPLICATING or spec["held"] or spec["files"]:
            return False
        if spec["syncpoints"] or spec["copy_at"]:
            return False
        recorded = rec.sink_ts or rec.checkpoint_ts
        return physical_ms(spec["upto"]) - physical_ms(recorded) < IDLE_SINK_MS

    def _paced(self, rec: TableRecord, spec: dict[str, Any]) -> bool:
        """Whether the table's batch waits so the changefeed's sink writes take at most
        ``sink_duty`` of its time (see ``__init__``): replicating, nothing waits for its
        batch, less than a budget's worth staged, and the sink phase that last wrote it, of
        writes of fewer than PACE_ROWS rows each (a backlog's tail commits at once), ended
        less than d * (1 - duty) / duty ago (d: that phase's write seconds; at most
        PACE_MAX_MS)."""
        duty = self.sink_duty
        if not 0 < duty < 1 or rec.state != T.REPLICATING or spec["held"] or not rec.sink_ms:
            return False
        if self.tick_rows and spec["rows"] >= self.tick_rows:
            return False
        wait = min(rec.sink_ms * (1 - duty) / duty, PACE_MAX_MS)
        return self._now_ms() - rec.sunk_at_ms < wait

    def _read_stream_ts(self) -> int:
        """How far past an open barrier the change log's DDL stream lets sinks go: its DDL
        resolved ts, or its first DDL above the barrier (of any table: the owner has not
        seen it yet, so it may hold any of them). The global barrier itself when closed."""
        low = self.barrier.global_barrier_ts
        if not self.barrier.open_until_ts:
            return low
        try:
            resolved = self.changelog.ddl_resolved_ts()
            ddls = self.changelog.ddl_records(low, resolved) if resolved > low else []
        except (ChangeLogError, OSError) as exc:
            log.warning(
                "capture %s: DDL stream unreadable (%s): barrier kept", self.capture_id, exc
            )
            return low
        self._ddl_stop_ts = min((r.commit_ts for r in ddls), default=0)
        return min([resolved, *(r.commit_ts for r in ddls)]) if resolved > low else low

    def _sink_spec(
        self, table_id: int, rec: TableRecord, max_rows: int | None = None
    ) -> dict[str, Any] | None:
        """The table's batch (None: nothing to write); ``max_rows``: cut at the end of the
        staged file where the staged rows pass it (at least one file)."""
        start = rec.checkpoint_ts
        limit = self.barrier.open_barrier_ts(table_id, self._stream_ts)
        end = min(rec.staged_upto, limit)
        if end <= start:
            return None
        if max_rows is not None:
            rows = 0
            for i, f in enumerate(sorted((f for f in rec.files if f.hi > start),
                                         key=lambda f: f.hi)):  # fmt: skip
                if i and rows + f.rows > max_rows:
                    end = min(end, f.lo)  # files are the pull's slices: (lo, hi] follow on
                    break
                rows += f.rows
        # A batch never spans a DDL of its table (the barrier cuts there too; this is a guard).
        ddl_at_end = False
        for r in self.changelog.ddl_records(start, end):
            if table_id in r.tables or table_id in r.table_ids:
                end, ddl_at_end = r.commit_ts, True
                break
        # The rows' schema: the one valid above ``start`` (at ``end`` itself a DDL may apply).
        schema = self._schema(table_id, start) or self._schema(table_id, end)
        if schema is None:
            return None
        staged = [f for f in rec.files if f.hi > start and f.lo < end]
        files = [self.staging.path(table_id, f) for f in staged]
        interval = self.sync_point_interval_ms
        sink_end = end - 1 if ddl_at_end else end
        cuts = syncpoints_between(start, sink_end, interval)
        return {
            "table_id": table_id,
            "start": start,
            # A batch up to a DDL of its table holds every row change up to the DDL's commit
            # ts T (none shares T), not the DDL: the sink commit claims T - 1, and the DDL's
            # own commit claims T (a state that claims T holds every effect at or below T).
            # The table's checkpoint is T all the same: the DDL waits for it (DESIGN.md).
            "end": sink_end,
            "upto": end,
            "syncpoints": cuts,
            # Writes that keep what a read of the syncpoint needs (a PostgreSQL copy): each
            # cut, and the end if it is a syncpoint, unless a DDL of the table is there (the
            # syncpoint includes it: what it needs is made when it is recorded, after it).
            "copy_at": [*cuts, *([end] if is_syncpoint(end, interval) and not ddl_at_end else [])],
            "token": rec.token,
            # A DDL waits for this batch (one of the table's, its table barrier, a closed
            # global barrier, the stream's next DDL): it commits without gathering a backlog.
            "held": ddl_at_end or self._held_by_barrier(table_id, end),
            "changefeed": self.changefeed_id,
            "sink_uri": self.sink_uri,
            "schema": schema.to_json(),
            "files": files,
            "weight": sum(_size(p) for p in files),
            "rows": sum(f.rows for f in staged),  # staged changes (before the collapse)
        }

    def _restage(self, table_id: int, rec: TableRecord) -> None:
        """Drop the table's staged files and pull again from its checkpoint: staging only
        caches the change log above the checkpoint (which GC keeps), so a damaged one is
        rebuilt by the next pull phase instead of holding the table until someone acts."""
        log.warning(
            "capture %s: table %s: staging dropped, staged again from checkpoint %s",
            self.capture_id,
            table_id,
            rec.checkpoint_ts,
        )
        if rec.files:
            self._doomed_files.append((table_id, rec.files))
        rec.files = []
        rec.staged_upto = rec.checkpoint_ts

    def _prune(self) -> None:
        for table_id, rec in self._tables.items():
            old = [f for f in rec.files if f.hi <= rec.checkpoint_ts]
            if old:
                self._doomed_files.append((table_id, old))
                rec.files = [f for f in rec.files if f.hi > rec.checkpoint_ts]
        self.save()

    def _fail(self, table_id: int, rec: TableRecord, message: str, phase: str) -> None:
        if rec.error != message:
            log.error("capture %s: table %s: %s", self.capture_id, table_id, message)
        rec.error, rec.error_phase = message, phase

    @staticmethod
    def _clear(rec: TableRecord, phase: str) -> None:
        """``phase`` succeeded for the table: its own error is gone (the other phase's, if
        any, stays until that phase succeeds)."""
        if rec.error_phase in (phase, None):
            rec.error, rec.error_phase = None, None

    def _history_error(self, table_id: int, exc: Exception) -> str:
        root = self.changelog.root
        return (
            f"table {table_id}: the change log at {root} cannot be read for it "
            f"({type(exc).__name__}: {shorten(exc)}); fix the named file or DDL record "
            "under ddl/, then the table resumes from its checkpoint"
        )

    def _ddl_at(self, table_id: int, ts: int) -> bool:
        """Whether a DDL of the table committed at exactly ``ts``."""
        return any(
            table_id in r.tables or table_id in r.table_ids
            for r in self.changelog.ddl_records(ts - 1, ts)
        )

    def _schema(self, table_id: int, ts: int) -> TableSchema | None:
        return self.changelog.schema_at(table_id, ts)

    # ------------------------------------------------------------------ state
    def save(self) -> None:
        """Write the manifest atomically (after the staged files it names are durable).

        The phases save on their own; the commands (prepare, commit, remove, forget,
        set_barrier) only change memory, so a tick that adds many tables saves once. A
        command lost to a crash is harmless: the Agent's task drives it again. Staged files
        the manifest stopped naming are deleted only after it is saved.
        """
        self.staging.save(self._tables, self.barrier)
        for table_id, files in self._doomed_files:
            self.staging.delete(table_id, files)
        for table_id in self._doomed_tables:
            if table_id not in self._tables:
                self.staging.drop_table(table_id)
        self._doomed_files.clear()
        self._doomed_tables.clear()

    def rows_applied(self) -> dict[int, int]:
        """Per held table, the rows the sink wrote for it since this capture took it."""
        return {t: rec.rows_applied for t, rec in self._tables.items()}

    def errors(self) -> dict[int, str]:
        """Tables in the error state and why (the message names the table, file and fix)."""
        return {t: rec.error for t, rec in self._tables.items() if rec.error}

    def _check(self) -> None:
        for table_id, rec in self._tables.items():
            ok = rec.checkpoint_ts <= rec.resolved_ts and (
                rec.token == 0 or rec.state in (T.REPLICATING, T.STOPPING)
            )
            if rec.state == T.REPLICATING:
                ok = ok and rec.prepared_from <= rec.checkpoint_ts
            ok = ok and rec.sink_ts <= rec.checkpoint_ts
            if not ok:
                raise ExecutorContractError(
                    f"capture {self.capture_id}: table {table_id} broke an invariant: {rec}"
                )

    # ------------------------------------------------------------------ reports
    def status(self, table_id: int) -> TableStatus:
        """The table's status (ABSENT at checkpoint 0 if not held)."""
        rec = self._tables.get(table_id)
        if rec is None:
            return TableStatus(table_id, T.ABSENT, Checkpoint(0, 0))
        return TableStatus(table_id, rec.state, Checkpoint(rec.checkpoint_ts, rec.resolved_ts))

    def statuses(self) -> TableStatusBatch:
        """Every held table's status, in columns (by table id)."""
        items = sorted(self._tables.items())
        n = len(items)
        return TableStatusBatch(
            np.fromiter((t for t, _ in items), np.int64, n),
            np.fromiter((int(r.state) for _, r in items), np.int64, n),
            np.fromiter((r.checkpoint_ts for _, r in items), np.int64, n),
            np.fromiter((r.resolved_ts for _, r in items), np.int64, n),
        )

    def tables(self) -> Mapping[int, TableRecord]:
        """The held tables' records (read them, do not change them)."""
        return self._tables


def _rows(path: str, seen: dict[str, int]) -> int:
    """Rows of a change-log file (its Parquet footer, remembered in ``seen``); 0 if it
    cannot be read (the pull reads it and says why)."""
    if path not in seen:
        try:
            seen[path] = pq.read_metadata(path).num_rows
        except (OSError, pa.ArrowException):
            seen[path] = 0
    return seen[path]


# A table moving a large batch in a tick (a snapshot's, a backlog's) costs a Spark task, a
# Delta commit and its files, perhaps the table's creation, whatever its rows: ~0.3-1 s here,
# as much as a few hundred thousand rows of mounting and MERGE. The tick budget counts such a
# batch as at least TABLE_COST_ROWS (a hundred snapshot tables of 100k rows released
# together move ~5 per tick, not 10).
BIG_BATCH_ROWS = 10_000
TABLE_COST_ROWS = 200_000


def _cost(rows: int) -> int:
    """What a table's batch of ``rows`` changes counts for in the tick budget."""
    return rows if rows < BIG_BATCH_ROWS else max(rows, TABLE_COST_ROWS)


def _slice(files: list[Any], budget: int, seen: dict[str, int]) -> tuple[int, int]:
    """(ts, rows): the files in ts order up to the one where their rows pass ``budget`` (at
    least one file), and how many rows that is; ts is the last file's ``last_ts`` (rows of
    files that straddle it above are pulled next tick: the pull filters by ts), MAX_TS
    when all fit."""
    rows = 0
    ordered = sorted(files, key=lambda f: (f.last_ts, f.first_ts))
    for i, f in enumerate(ordered):
        n = _rows(f.path, seen)
        if i and rows + n > budget:
            return ordered[i - 1].last_ts, rows
        rows += n
    return MAX_TS, rows


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
