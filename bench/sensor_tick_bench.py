"""Owner-sensor benchmark: the Dagster sensor tick at 10k..100k tables, against its 60 s timeout.

A real private etcd, a change log whose tables are created by DDL records, one changefeed
over N tables, M captures running the real capture halves (``capture_prepare`` /
``capture_commit``: the Agent, its fencing, its state key and the task-status report in
etcd) on an in-memory executor, and the real owner sensor (``build_owner_sensor``) evaluated
the way the code server does it: ``sensor.evaluate_tick(build_sensor_context(...))`` on a
Dagster instance in a temp dir, then the result serialized as the gRPC reply carries it.

Usage::

    python bench/sensor_tick_bench.py                   # 100,000 tables, 10 captures
    python bench/sensor_tick_bench.py --tables 10000    # a fast run

It ends with one machine-readable line::

    sensor_tick_p50_s=... sensor_tick_max_s=... owner_tick_p50_s=... dagster_side_p50_s=... init_ticks=... tables=...

Definitions
-----------
* sensor tick (``sensor_tick_*``): wall time of ``evaluate_tick`` (what runs in the code
  server under ``DAGSTER_SENSOR_GRPC_TIMEOUT_SECONDS``, 60 s by default) plus
  ``serialize_value`` of its result (the gRPC reply the daemon receives).
* owner tick (``owner_tick_*``): ``OwnerStep.duration_s`` of that evaluation: election, the
  one etcd snapshot read, the Coordinator tick, the guarded write (``OwnerLoop.tick``). It
  is the baseline the ratios divide by: measured inside the same evaluations.
* Dagster side (``dagster_side_*``): sensor tick - owner tick: the plan into RunRequests
  (``plan``), the capture-runs query (``capture_runs``), the puller-run lookup
  (``with_puller_runs``), the progress observations (``progress_observations``), and the
  rest ("other": dynamic-partition read, logging, ``evaluate_tick``'s checks,
  serialization). The parts are timed by wrapping the sensor module's own functions (the
  real ones run; the wrapper only reads the clock).
* daemon store (``store_*``): not part of the 60 s budget, but what the daemon then does
  with the reply: ``create_run_for_job`` per run request (config validated, execution plan
  snapshot written), ``report_runless_asset_event`` per observation, the dynamic
  partitions added. Each stored run is then moved to STARTED and SUCCESS after its capture
  ran, so the next tick's queued-runs query sees it finished (as the run queue would).
* run config bytes: ``len(json.dumps(run_config))`` summed over a tick's run requests (and
  the largest single one); the gRPC reply's bytes are the serialized evaluation.
* Phases: **init** from a fresh owner with every capture empty until the owner sees all N
  tables REPLICATING (ticks, their sum and max; beyond ``--max-init-ticks`` the tick
  count is extrapolated from the last ticks' rate, marked ``~``); **steady**: ``--ticks``
  ticks with every table replicating and the upstream resolved ts moving 1 s per tick.
  Between two sensor ticks each capture with a run request runs its two halves (untimed:
  captures run elsewhere), as if every run started before the next tick.
* Before/after in one run: ``steady, before`` is ``--before-ticks`` steady ticks of the
  sensor built with ``observations_per_tick=None`` (an observation per asset per tick, as
  it was); ``init, before`` is the first ``--before-init-ticks`` ticks of an owner adding
  50 tables a tick (``CDC_DAGSTER_ADD_TABLE_BATCH=50``, TiCDC's batch and the default
  until now) in a second cluster over the same change log, extrapolated to the end. The
  bench's ticks come faster than the daemon's 5 s, so observations refreshed after 60 s
  rarely show in ``steady``; the budget bounds them at 50 a tick either way.
* Tables: ``--databases`` schemas of equal size (default 100), so past
  ``CDC_DAGSTER_MAX_TABLE_ASSETS`` (2000) the catalog groups them into one asset per schema.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dagster as dg
import numpy as np
from dagster._core.events import DagsterEvent, DagsterEventType
from dagster._serdes import serialize_value

import cdc_dagster.testing.fake_runtime  # noqa: F401  (the file:// fake downstream)
from cdc_dagster import admin
from cdc_dagster.defs.capture.job import build_capture_job
from cdc_dagster.defs.catalog import Catalog, TableRef
from cdc_dagster.defs.ddl.job import build_ddl_job
from cdc_dagster.defs.mysql import mysql_puller
from cdc_dagster.defs.owner import sensor as sensor_module
from cdc_dagster.defs.owner.plan import CAPTURE_JOB
from cdc_dagster.defs.owner.sensor import build_owner_sensor
from cdc_dagster.defs.resources import CdcResource, table_resources
from cdc_dagster.defs.settings import Settings
from cdc_dagster.metastore import Metastore, connect
from cdc_dagster.metastore.mailbox import merge
from cdc_dagster.runtime import CaptureContext, OwnerStep, capture_commit, capture_prepare, wire
from cdc_dagster.runtime.spec import ExecutorSpec
from cdc_dagster.schema import ColumnSchema, DdlRecord, TableSchema
from cdc_dagster.testing.etcd import EmbeddedEtcd
from cdc_dagster.upstream.changelog import ChangeLogWriter
from scheduler_core.ddl import DDLKind
from scheduler_core.errors import ExecutorContractError
from scheduler_core.messages import Barrier, TableStatusBatch
from scheduler_core.model import Checkpoint, TableState, TableStatus
from scheduler_core.ts import compose

T = TableState
CHANGEFEED = "cf"
SENSOR_TIMEOUT_S = 60.0
GRPC_MAX_BYTES = 100 * 10**6  # dagster._grpc.utils.max_rx_bytes() default
PARTS = ("plan", "queued_query", "puller_runs", "observations")


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------ data plane
class Upstream:
    """The change log: one CREATE TABLE record per schema; resolved ts moved per tick."""

    def __init__(self, root: Path, tables: int, databases: int) -> None:
        self.root = root
        self.t0_ms = int(time.time() * 1000) - 600_000
        self.writer = ChangeLogWriter(root, fsync=False)
        cols = (ColumnSchema(1, "id", "int64", False), ColumnSchema(2, "v", "string", True))
        self.refs: list[TableRef] = []
        per_db = math.ceil(tables / databases)
        for db in range(databases):
            ids = range(db * per_db + 1, min(tables, (db + 1) * per_db) + 1)
            if not ids:
                break
            name = f"db{db:03d}"
            schemas = {t: TableSchema(t, name, f"t{t}", cols, (1,)) for t in ids}
            self.writer.write_ddl(
                DdlRecord(
                    compose(self.t0_ms) + db + 1,
                    DDLKind.CREATE_TABLE,
                    "create_table",
                    f"CREATE TABLE {name}.t{ids[0]} .. t{ids[-1]}",
                    creates=tuple(ids),
                    tables=schemas,
                )
            )
            self.refs += [TableRef(t, name, f"t{t}") for t in ids]
        self.start_ts = compose(self.t0_ms + 1000)
        self.resolved = self.start_ts
        self.writer.advance_ddl_resolved(self.start_ts)

    def advance(self, ms: int) -> None:
        """Every table and the DDL stream resolved ``ms`` further."""
        self.resolved += ms << 18
        self.writer.advance_ddl_resolved(self.resolved)


class MemoryExecutor:
    """An in-memory RuntimeExecutor: the DurableFakeExecutor's behaviour (prepare, then
    PREPARED after one pull phase; sink up to min(upstream resolved, barrier); stop in one
    sink phase) without its per-table JSON files, which cost O(tables) per write. Its state
    outlives a "run" in ``store`` (what the manifest does for the real ones)."""

    def __init__(self, spec: ExecutorSpec, upstream: Upstream, store: dict[Any, Any]) -> None:
        self.upstream = upstream
        key = (spec.changefeed_id, spec.capture_id)
        self.tables: dict[int, list[int]] = store.setdefault(key, {})  # id -> [state, ck, rs]
        self.barrier = store.get((key, "barrier"), Barrier(0))
        self._store, self._key = store, key

    def prepare(self, table_id: int, checkpoint: Checkpoint) -> None:
        if table_id in self.tables:
            raise ExecutorContractError(f"prepare of table {table_id}, which is held")
        ck = checkpoint.checkpoint_ts
        self.tables[table_id] = [int(T.PREPARING), ck, max(ck, self.upstream.resolved)]

    def commit(self, table_id: int, checkpoint: Checkpoint) -> None:
        row = self.tables.get(table_id)
        if row is None or row[0] != T.PREPARED:
            raise ExecutorContractError(f"commit of table {table_id}: not PREPARED")
        row[0], row[1] = int(T.REPLICATING), max(row[1], checkpoint.checkpoint_ts)
        row[2] = max(row[2], row[1])

    def remove(self, table_id: int) -> None:
        row = self.tables.get(table_id)
        if row is not None and row[0] not in (T.STOPPING, T.STOPPED):
            row[0] = int(T.STOPPING)

    def forget(self, table_id: int) -> None:
        row = self.tables.get(table_id)
        if row is not None and row[0] != T.STOPPED:
            raise ExecutorContractError(f"forget of table {table_id} in {T(row[0]).name}")
        self.tables.pop(table_id, None)

    def set_barrier(self, barrier: Barrier) -> None:
        self.barrier = barrier

    def pull_phase(self) -> None:
        resolved = self.upstream.resolved
        for row in self.tables.values():
            if row[0] == T.STOPPED:
                continue
            row[2] = max(row[2], resolved)
            if row[0] == T.PREPARING:
                row[0] = int(T.PREPARED)

    def sink_phase(self) -> None:
        b = self.barrier
        cap = b.global_barrier_ts
        per_table = b.table_barriers
        for table_id, row in self.tables.items():
            if row[0] == T.REPLICATING:
                target = min(row[2], per_table.get(table_id, cap) if per_table else cap)
                row[1] = max(row[1], target)
            elif row[0] == T.STOPPING:
                row[0] = int(T.STOPPED)

    def advance(self) -> None:
        self.pull_phase()
        self.sink_phase()

    def save(self) -> None:
        self._store[(self._key, "barrier")] = self.barrier

    def errors(self) -> Mapping[int, str]:
        return {}

    def rows_applied(self) -> Mapping[int, int]:
        return {}

    def status(self, table_id: int) -> TableStatus:
        row = self.tables.get(table_id)
        if row is None:
            return TableStatus(table_id, T.ABSENT, Checkpoint(0, 0))
        return TableStatus(table_id, T(row[0]), Checkpoint(row[1], row[2]))

    def statuses(self) -> TableStatusBatch:
        n = len(self.tables)
        rows = np.array(list(self.tables.values()), np.int64).reshape(n, 3)
        ids = np.fromiter(self.tables.keys(), np.int64, n)
        return TableStatusBatch(ids, rows[:, 0], rows[:, 1], rows[:, 2])


# ------------------------------------------------------------------------------ measuring
@dataclass(slots=True)
class Tick:
    """One sensor evaluation and what followed it."""

    sensor_s: float  # evaluate_tick + serialize
    owner_s: float  # OwnerStep.duration_s
    serialize_s: float
    parts: dict[str, float]
    run_requests: int
    config_bytes: int
    max_config_bytes: int
    reply_bytes: int
    observations: int
    messages: int  # owner messages carried by the run requests
    adds: int  # table dispatches in those messages (burst adds, promotions, removes)
    store_s: float  # daemon side: create runs, store observations and partitions
    replicating: int

    @property
    def dagster_s(self) -> float:
        return self.sensor_s - self.owner_s


class Probe:
    """Times the sensor module's own steps by wrapping them (the real functions run)."""

    def __init__(self) -> None:
        self.parts: dict[str, float] = {}
        self.view: OwnerStep | None = None
        self._saved: dict[str, Any] = {}

    def _wrap(self, attr: str, part: str) -> None:
        real = getattr(sensor_module, attr)
        self._saved[attr] = real

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                out = real(*args, **kwargs)
            finally:
                self.parts[part] = self.parts.get(part, 0.0) + time.perf_counter() - started
            if attr == "owner_step":
                self.view = out
            return out

        setattr(sensor_module, attr, timed)

    @contextlib.contextmanager
    def installed(self) -> Iterator[Probe]:
        for attr, part in (
            ("owner_step", "owner"),
            ("plan", "plan"),
            ("capture_runs", "queued_query"),
            ("with_puller_runs", "puller_runs"),
            ("progress_observations", "observations"),
        ):
            self._wrap(attr, part)
        try:
            yield self
        finally:
            for attr, real in self._saved.items():
                setattr(sensor_module, attr, real)

    def reset(self) -> None:
        self.parts, self.view = {}, None


def _messages(run_config: Mapping[str, Any]) -> tuple[dict[str, list[dict[str, Any]]], int, int]:
    work = json.loads(run_config["ops"]["receive"]["config"]["messages_json"])
    n = sum(len(m) for m in work.values())
    adds = sum(
        len((m.get("adds") or {}).get("table_ids", [])) + len(m.get("requests", []))
        for msgs in work.values()
        for m in msgs
        if m.get("type") == "dispatch"
    )
    return work, n, adds


# ------------------------------------------------------------------------------ the cluster
class SensorBench:
    """Upstream, etcd, captures and the owner sensor of one run (see the module docstring)."""

    def __init__(
        self,
        root: Path,
        endpoints: Sequence[str],
        tables: int,
        captures: int,
        *,
        databases: int = 100,
        store_runs: bool = True,
        environ: dict[str, str] | None = None,
        upstream: Upstream | None = None,
    ) -> None:
        self.root = root
        self.tables = tables
        self.store_runs = store_runs
        self.cluster_id = f"sensorbench{uuid.uuid4().hex[:8]}"
        self.upstream = upstream or Upstream(root / "changelog", tables, databases)
        self.env = {
            "CDC_DAGSTER_ETCD": ",".join(endpoints),
            "CDC_DAGSTER_CLUSTER_ID": self.cluster_id,
            "CDC_DAGSTER_OWNER_ID": "sensor-bench",
            "CDC_DAGSTER_STATE_DIR": str(root / "state" / self.cluster_id),
            "CDC_DAGSTER_CHANGELOG": str(self.upstream.root),
            **(environ or {}),
        }
        os.environ.update(self.env)
        self.settings = Settings.from_env()
        self.ms: Metastore = connect(list(endpoints), cluster_id=self.cluster_id)
        self.ms.changefeeds.create(
            CHANGEFEED,
            f"file://{root / 'downstream' / self.cluster_id}",  # the fake downstream
            start_ts=self.upstream.start_ts,
            upstream_uri=f"changelog://{self.upstream.root}",
        )
        self.capture_ids = [f"capture-{i}" for i in range(captures)]
        for cid in self.capture_ids:
            admin.add_capture(self.ms, cid, 600)
        self.executor_state: dict[Any, Any] = {}
        self.catalog = Catalog.of(self.upstream.refs, self.settings.max_table_assets)
        self.capture_job = build_capture_job(self.catalog)
        jobs = [self.capture_job, build_ddl_job(self.catalog), mysql_puller]
        # The sensor as built now, and one with an observation per asset per tick (before).
        self.sensors = {
            "after": build_owner_sensor(self.catalog, jobs),
            "before": build_owner_sensor(self.catalog, jobs, observations_per_tick=None),
        }
        # evaluate_tick resolves partitioned run requests against the repository.
        self.repositories = {
            name: dg.Definitions(
                jobs=jobs, sensors=[sensor], resources=table_resources()
            ).get_repository_def()
            for name, sensor in self.sensors.items()
        }
        self.capture_job = self.repositories["after"].get_job(CAPTURE_JOB)
        self.cursor: str | None = None
        self.probe = Probe()
        CdcResource.forget_owner_loops()  # a fresh owner (a new code server)

    def close(self) -> None:
        CdcResource.forget_owner_loops()
        self.ms.client.delete(self.ms.layout.prefix, prefix=True)
        self.ms.close()

    # -------------------------------------------------------------- one tick
    def tick(self, instance: dg.DagsterInstance, which: str = "after") -> Tick:
        """One sensor evaluation (timed), the daemon's storing of it, then the capture runs."""
        sensor, repository = self.sensors[which], self.repositories[which]
        os.environ.update(self.env)  # the sensor reads its settings at tick time
        self.upstream.advance(1000)
        self.probe.reset()
        with self.probe.installed():
            started = time.perf_counter()
            # As the code server's get_external_sensor_execution does: the instance from its
            # ref, the repository to resolve partitioned run requests against.
            with dg.SensorEvaluationContext(
                instance.get_ref(),
                last_tick_completion_time=None,
                last_run_key=None,
                cursor=self.cursor,
                log_key=None,
                repository_name=repository.name,
                repository_def=repository,
                sensor_name=sensor.name,
                resources={
                    k: v
                    for k, v in repository.get_top_level_resources().items()
                    if k in sensor.required_resource_keys
                },
            ) as ctx:
                data = sensor.evaluate_tick(ctx)
            evaluated = time.perf_counter()
            reply = serialize_value(data)
            done = time.perf_counter()
        view = self.probe.view
        assert view is not None and view.tick.is_owner, (
            f"the bench's owner lost: {view.notes if view else None}"
        )
        if data.cursor is not None:
            self.cursor = data.cursor
        requests = list(data.run_requests or [])
        sizes = [len(json.dumps(r.run_config, separators=(",", ":"))) for r in requests]
        store_s, runs = self._store(instance, data, requests)
        messages = adds = 0
        for req, run in zip(requests, runs, strict=True):
            if req.job_name == CAPTURE_JOB:
                n, a = self._run_capture(req)
                messages, adds = messages + n, adds + a
            if run is not None:
                _finish(instance, run)
        return Tick(
            sensor_s=done - started,
            owner_s=view.duration_s,
            serialize_s=done - evaluated,
            parts={p: self.probe.parts.get(p, 0.0) for p in PARTS},
            run_requests=len(requests),
            config_bytes=sum(sizes),
            max_config_bytes=max(sizes, default=0),
            reply_bytes=len(reply),
            observations=sum(isinstance(e, dg.AssetObservation) for e in data.asset_events or []),
            messages=messages,
            adds=adds,
            store_s=store_s,
            replicating=sum(t.state == "replicating" for t in view.tables),
        )

    def _store(
        self, instance: dg.DagsterInstance, data: Any, requests: list[dg.RunRequest]
    ) -> tuple[float, list[Any]]:
        """What the sensor daemon does with the reply (timed): partitions, runs, events."""
        started = time.perf_counter()
        for pr in data.dynamic_partitions_requests or []:
            if isinstance(pr, dg.AddDynamicPartitionsRequest):
                instance.add_dynamic_partitions(pr.partitions_def_name, list(pr.partition_keys))
            else:
                for key in pr.partition_keys:
                    instance.delete_dynamic_partition(pr.partitions_def_name, key)
        runs: list[Any] = []
        for req in requests:
            if not self.store_runs or req.job_name != CAPTURE_JOB:
                runs.append(None)
                continue
            tags = {**req.tags, "dagster/partition": str(req.partition_key)}
            runs.append(
                instance.create_run_for_job(
                    self.capture_job, run_config=req.run_config, tags=tags, status=None
                )
            )
        if self.store_runs:
            for event in data.asset_events or []:
                instance.report_runless_asset_event(event)
        return time.perf_counter() - started, runs

    def _run_capture(self, req: dg.RunRequest) -> tuple[int, int]:
        """The capture run's two halves over the run config's messages (untimed)."""
        work, n, adds = _messages(req.run_config)
        cid = str(req.partition_key)
        # As the receive op: what the owner held in the capture's mailbox comes after.
        owner_rev = req.run_config["ops"]["receive"]["config"]["owner_rev"]
        work = merge(work, self.ms.mailbox.take(cid, owner_rev))
        for cf in sorted(work):
            ctx = CaptureContext(
                self.ms,
                cid,
                cf,
                self.settings.staging_dir(),
                lambda spec: MemoryExecutor(spec, self.upstream, self.executor_state),
                lease_ttl_s=600,
            )
            capture_prepare(ctx, wire.decode(work[cf]))
            capture_commit(ctx)
        return n, adds

    # -------------------------------------------------------------- phases
    def initialize(self, instance: dg.DagsterInstance, max_ticks: int, name: str = "init") -> Phase:
        """Ticks from a fresh owner until every table replicates (or ``max_ticks``)."""
        phase = Phase(name)
        while len(phase.ticks) < max_ticks:
            t = self.tick(instance)
            phase.ticks.append(t)
            if len(phase.ticks) % 20 == 0 or t.replicating == self.tables:
                _log(
                    f"  init tick {len(phase.ticks)}: {t.replicating:,}/{self.tables:,} "
                    f"replicating, sensor {t.sensor_s:.3f} s"
                )
            if t.replicating == self.tables:
                phase.complete = True
                break
        return phase

    def steady(self, instance: dg.DagsterInstance, ticks: int, which: str = "after") -> Phase:
        """``ticks`` ticks with every table replicating."""
        phase = Phase("steady" if which == "after" else "steady, before", complete=True)
        for _ in range(ticks):
            t = self.tick(instance, which)
            assert t.replicating == self.tables, f"{t.replicating} of {self.tables} replicate"
            phase.ticks.append(t)
        return phase


def _finish(instance: dg.DagsterInstance, run: Any) -> None:
    """The run started and succeeded (its capture ran): out of the queued-runs query."""
    for kind in (DagsterEventType.PIPELINE_START, DagsterEventType.PIPELINE_SUCCESS):
        instance.report_dagster_event(
            DagsterEvent(event_type_value=kind.value, job_name=run.job_name), run_id=run.run_id
        )


# ------------------------------------------------------------------------------ results
@dataclass(slots=True)
class Phase:
    """The ticks of one phase."""

    name: str
    ticks: list[Tick] = field(default_factory=list)
    complete: bool = False

    def pct(self, values: Sequence[float], q: float) -> float:
        if not values:
            return 0.0
        s = sorted(values)
        return s[min(len(s) - 1, math.ceil(q * len(s)) - 1)]

    def stat(self, get: Callable[[Tick], float]) -> tuple[float, float, float]:
        v = [get(t) for t in self.ticks]
        return statistics.median(v), self.pct(v, 0.99), max(v)

    def ticks_to_finish(self, tables: int) -> tuple[int, bool]:
        """Ticks until every table replicated; extrapolated from the last 20 when cut short."""
        if self.complete:
            return len(self.ticks), False
        tail = self.ticks[-20:]
        rate = (tail[-1].replicating - tail[0].replicating) / max(1, len(tail) - 1)
        left = tables - self.ticks[-1].replicating
        return len(self.ticks) + (math.ceil(left / rate) if rate > 0 else 10**9), True


def _fmt(x: tuple[float, float, float], unit: str = "s") -> str:
    if unit == "s":
        return " / ".join(f"{v:.3f}" for v in x)
    return " / ".join(f"{v:,.0f}" for v in x)


def report(phases: Sequence[Phase], tables: int, captures: int) -> dict[str, float]:
    """Print the tables and ratios; returns the figures of the machine line."""
    print(f"owner sensor at {tables:,} tables, {captures} captures (p50 / p99 / max)")
    print()
    print("| phase | ticks | sensor tick s | owner tick s | Dagster side s | sensor/owner p50 |")
    print("|---|---:|---:|---:|---:|---:|")
    for p in phases:
        owner = p.stat(lambda t: t.owner_s)
        sensor = p.stat(lambda t: t.sensor_s)
        ratio = sensor[0] / owner[0] if owner[0] else float("inf")
        print(
            f"| {p.name} | {len(p.ticks)} | {_fmt(sensor)} | {_fmt(owner)} "
            f"| {_fmt(p.stat(lambda t: t.dagster_s))} | {ratio:.2f}x |"
        )
    print()
    print("Dagster side, p50 per part (s):")
    print()
    print("| phase | plan | queued-runs query | puller runs | observations | serialize | other |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for p in phases:
        parts = [p.stat(lambda t, k=k: t.parts[k])[0] for k in PARTS]
        ser = p.stat(lambda t: t.serialize_s)[0]
        other = statistics.median(
            t.dagster_s - sum(t.parts.values()) - t.serialize_s for t in p.ticks
        )
        cells = " | ".join(f"{v:.4f}" for v in (*parts, ser, other))
        print(f"| {p.name} | {cells} |")
    print()
    print("What a tick hands Dagster (p50 / p99 / max):")
    print()
    print(
        "| phase | run requests | run config bytes | largest run config | reply bytes "
        "| messages | table dispatches | observations | daemon store s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for p in phases:
        print(
            f"| {p.name} | {_fmt(p.stat(lambda t: t.run_requests), 'n')} "
            f"| {_fmt(p.stat(lambda t: t.config_bytes), 'n')} "
            f"| {_fmt(p.stat(lambda t: t.max_config_bytes), 'n')} "
            f"| {_fmt(p.stat(lambda t: t.reply_bytes), 'n')} "
            f"| {_fmt(p.stat(lambda t: t.messages), 'n')} "
            f"| {_fmt(p.stat(lambda t: t.adds), 'n')} "
            f"| {_fmt(p.stat(lambda t: t.observations), 'n')} "
            f"| {_fmt(p.stat(lambda t: t.store_s))} |"
        )
    init = phases[0]
    steady = next((p for p in phases if p.name == "steady"), init)  # init cut short: none
    before = next((p for p in phases if p.name == "steady, before"), None)
    n_init, estimated = init.ticks_to_finish(tables)
    mark = "~" if estimated else ""
    print()
    print(
        f"init: {mark}{n_init} ticks until all {tables:,} tables replicate "
        f"({'extrapolated from ' + str(len(init.ticks)) + ' ticks' if estimated else 'measured'}); "
        f"sensor time {sum(t.sensor_s for t in init.ticks):.1f} s over the measured ticks, "
        f"max tick {max(t.sensor_s for t in init.ticks):.3f} s; at the 5 s sensor floor "
        f"{mark}{n_init * 5 / 60:.1f} min"
    )
    worst = max(max(t.sensor_s for t in p.ticks) for p in phases if p is not before)
    biggest = max(t.reply_bytes for p in phases for t in p.ticks)
    print(
        f"headroom: worst tick {worst:.3f} s = {worst / SENSOR_TIMEOUT_S:.1%} of the 60 s "
        f"timeout; largest reply {biggest:,} bytes = {biggest / GRPC_MAX_BYTES:.2%} of gRPC's "
        "100 MB"
    )
    before_init = next((p for p in phases if p.name == "init, before"), None)
    if before_init is not None:
        nb, est = before_init.ticks_to_finish(tables)
        print(
            f"init before/after: {'~' if est else ''}{nb} ticks at 50 tables a tick "
            f"({'~' if est else ''}{nb * 5 / 3600:.1f} h at the 5 s floor; "
            f"{'extrapolated from ' + str(len(before_init.ticks)) if est else 'measured'}) "
            f"-> {mark}{n_init} ticks ({n_init * 5 / 60:.1f} min)"
        )
    if before is not None:
        b, a = before.stat(lambda t: t.sensor_s)[0], steady.stat(lambda t: t.sensor_s)[0]
        bs, as_ = before.stat(lambda t: t.store_s)[0], steady.stat(lambda t: t.store_s)[0]
        print(
            f"before/after (steady p50): sensor tick {b:.3f} -> {a:.3f} s ({b / a:.1f}x); "
            f"daemon store {bs:.3f} -> {as_:.3f} s ({bs / max(as_, 1e-9):.1f}x); observations "
            f"{before.stat(lambda t: t.observations)[0]:.0f} -> "
            f"{steady.stat(lambda t: t.observations)[0]:.0f} per tick"
        )
    figures = {
        "sensor_tick_p50_s": steady.stat(lambda t: t.sensor_s)[0],
        "sensor_tick_max_s": worst,  # of the sensor as built now
        "owner_tick_p50_s": steady.stat(lambda t: t.owner_s)[0],
        "dagster_side_p50_s": steady.stat(lambda t: t.dagster_s)[0],
        "init_ticks": n_init,
        "tables": tables,
    }
    print()
    print(
        " ".join(
            f"{k}={v:.4f}"
            if isinstance(v, float)
            else f"{k}={mark if k == 'init_ticks' else ''}{v}"
            for k, v in figures.items()
        )
    )
    return figures


def run(
    tables: int,
    captures: int,
    *,
    endpoints: Sequence[str] | None = None,
    databases: int = 100,
    steady_ticks: int = 20,
    before_ticks: int = 5,
    before_init_ticks: int = 30,
    max_init_ticks: int = 400,
    store_runs: bool = True,
) -> list[Phase]:
    """The phases at one size: init and steady of the sensor as built now; then (before)
    steady ticks with an observation per asset, and the first init ticks of an owner
    adding 50 tables a tick (TiCDC's batch, the default until now) in another cluster."""
    with tempfile.TemporaryDirectory(prefix="sensor-bench-") as tmp:
        root = Path(tmp)
        server = None if endpoints else EmbeddedEtcd(root / "etcd").start()
        eps = list(endpoints) if endpoints else server.endpoints
        _log(f"writing a change log of {tables:,} tables in {databases} schemas ...")
        upstream = Upstream(root / "changelog", tables, databases)
        try:
            phases = _measure(
                root,
                eps,
                upstream,
                tables,
                captures,
                databases,
                store_runs,
                steady_ticks,
                before_ticks,
                max_init_ticks,
            )
            if before_init_ticks and phases[0].complete:
                phases.append(
                    _before_init(root, eps, upstream, tables, captures, before_init_ticks)
                )
        finally:
            upstream.writer.close()
            if server is not None:
                server.stop()
    return phases


def _instance(root: Path, name: str) -> Any:
    (root / name).mkdir()
    return dg.instance_for_test(temp_dir=str(root / name))


def _measure(
    root: Path,
    eps: list[str],
    upstream: Upstream,
    tables: int,
    captures: int,
    databases: int,
    store_runs: bool,
    steady_ticks: int,
    before_ticks: int,
    max_init_ticks: int,
) -> list[Phase]:
    bench = SensorBench(
        root, eps, tables, captures, databases=databases, store_runs=store_runs, upstream=upstream
    )
    try:
        with _instance(root, "dagster") as instance:
            _log("init: from a fresh owner until every table replicates ...")
            init = bench.initialize(instance, max_init_ticks)
            if not init.complete:
                return [init]
            _log(f"steady: {steady_ticks} ticks, then {before_ticks} as before ...")
            phases = [init, bench.steady(instance, steady_ticks)]
            if before_ticks:
                phases.append(bench.steady(instance, before_ticks, "before"))
            return phases
    finally:
        bench.close()


def _before_init(
    root: Path, eps: list[str], upstream: Upstream, tables: int, captures: int, ticks: int
) -> Phase:
    bench = SensorBench(
        root,
        eps,
        tables,
        captures,
        upstream=upstream,
        environ={"CDC_DAGSTER_ADD_TABLE_BATCH": "50"},
    )
    try:
        with _instance(root, "dagster-before") as instance:
            _log(f"init, before: {ticks} ticks of an owner adding 50 tables a tick ...")
            return bench.initialize(instance, ticks, "init, before")
    finally:
        bench.close()
        os.environ.pop("CDC_DAGSTER_ADD_TABLE_BATCH", None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tables", type=int, default=100_000)
    parser.add_argument("--captures", type=int, default=10)
    parser.add_argument("--databases", type=int, default=100)
    parser.add_argument("--ticks", type=int, default=20, help="steady ticks")
    parser.add_argument(
        "--before-ticks",
        type=int,
        default=5,
        help="steady ticks of the sensor as it was (an observation per asset per tick)",
    )
    parser.add_argument("--max-init-ticks", type=int, default=400)
    parser.add_argument(
        "--before-init-ticks",
        type=int,
        default=30,
        help="init ticks of an owner adding 50 tables a tick (extrapolated to the end)",
    )
    parser.add_argument("--no-store", action="store_true", help="skip the daemon-side store")
    parser.add_argument("--etcd", help="host:port,... of an etcd to use (default: a private one)")
    args = parser.parse_args(argv)
    phases = run(
        args.tables,
        args.captures,
        endpoints=args.etcd.split(",") if args.etcd else None,
        databases=args.databases,
        steady_ticks=args.ticks,
        before_ticks=args.before_ticks,
        before_init_ticks=args.before_init_ticks,
        max_init_ticks=args.max_init_ticks,
        store_runs=not args.no_store,
    )
    figures = report(phases, args.tables, args.captures)
    return 0 if figures["sensor_tick_max_s"] < SENSOR_TIMEOUT_S else 1


if __name__ == "__main__":
    sys.exit(main())
