"""Throughput of the upstream side: a binlog backlog drained, and initial snapshots taken.

    python bench/throughput_bench.py [--quick] [--spark-cores 1,2] [--backlog-s N]
                                     [--drain-repeats N] [--cpu-roles] [--keep]

A private MariaDB with sysbench's tables (``sysbench oltp_read_write``: ~200-byte rows,
updates carrying both row images), replicated into Delta through ``server start``'s whole
stack (private etcd, Spark Connect on ``local[N]``, the Dagster code server, daemon and
webserver; the owner sensor, ``mysql_puller``, ``mysql_snapshot`` and capture runs), two
captures. For each Spark core count:

(a) **Backlog drain.** Once the initial snapshot is replicated and the changefeed checkpoint
    has passed it, ``changefeed pause`` (the puller run stops); sysbench runs unthrottled
    for ``--backlog-s`` (its row changes queue in the binlog); then ``changefeed resume``,
    and the clock starts. It stops when every table is readable past the backlog's last
    transaction (every table's reported checkpoint), and every table is then compared with
    the upstream (fingerprints; the bench fails if one differs). Also timed: when the
    backlog's first rows are in the change log (the puller's first flush past the pause),
    when the puller reached the backlog's end, when the changefeed checkpoint passed it.
    Rates: ``drain_rows_per_s`` = row changes (sysbench's writes) / seconds from resume to
    readable; ``drain_after_first_rows_per_s`` = the same over the seconds from the first
    rows in the change log (what is left once the resume's fixed costs, the owner's tick
    and the puller run's launch, are paid). Baselines from the same backlog, same run:
    ``mariadb-binlog`` decoding it, the bare puller (binlog -> change log, one process),
    and mounting the events (change log -> rows, one process). A small backlog (``--quick``)
    measures mostly the fixed costs; give ``--backlog-s`` enough for throughput. The drain
    runs ``--drain-repeats`` times one after another in the same stack (default 3, 1 with
    ``--quick``), each with its own backlog, check and baselines: on this 2-core VM one
    drain's rate varied by a fifth between runs of the same code (26.7k-32.8k/s), so the
    closing line has the median drain, with the fastest and slowest.
(b) **Snapshot.** Tables made with sysbench's layout (``--snapshot-shapes TABLESxROWS``), a
    changefeed created through the stack (``changefeed create``: create records only), and
    its ``mysql_snapshot`` and ``mysql_puller`` runs: rows/s from create until the puller
    has placed every chunk and released every table (the rows are in the change log), and
    until readable downstream; where that time went (sensor tick, run launch, planning, to
    the first read, reading, to the reads' end, placing), from the stack's event log; the
    stream's lag (the drain changefeed, sysbench at ``--lag-rate``) without a snapshot, and
    from the create until the snapshot is readable downstream (its rows sunk too). Baseline in the same run: a bare chunked ``SELECT`` of the same key ranges,
    same chunk size, with the snapshot's own client (connectorx where it reads), spread
    over the same number of Spark tasks on the stack's Spark Connect server (or, below the
    snapshot job's ``local_max_rows``, in one process as the job then reads), into Parquet
    (no snapshot positions, metadata lock, catalog check or puller), twice: while the same
    stream (sysbench at ``--lag-rate``) is sunk by the stack and its lag sampled, as beside
    the snapshot (like for like: on a small machine that stream's Delta MERGEs take much of
    the CPU, and the sampling is the bench's own load), and on the idle stack. The bench's
    Spark Connect session runs its first Python jobs before the bare reads are timed; the
    snapshot runs' own shared session was warmed by ``server start``. Both reads run on the stack's Spark Connect server, whose session
    yields to the daemon's (the stream's captures) by its autogroup niceness
    (``CDC_DAGSTER_SPARK_NICE``, 10); within it the snapshot's readers run at
    ``chunk_reader.SNAPSHOT_NICE``, the bare reads at the server's own.

``--in-process`` adds the older figures (the in-process driver on ``local[N]``, the snapshot
runner in this process) as extra rows. ``--keep`` keeps the work directory (the stack's
Dagster event logs: where the seconds went).

It ends with one line: ``drain_rows_per_s=... drain_ratio=... drain_after_first_rows_per_s=...
drain_runs=... drain_min_rows_per_s=... drain_max_rows_per_s=... snapshot_rows_per_s=...
snapshot_ratio=... snapshot_ratio_idle=... snapshot_reading_ratio=...``
(the drain's figures: its median drain's, of the core count where that is highest;
drain_ratio: the drain's rate over the bare puller's; snapshot_ratio: the snapshot's rate
over the bare parallel chunked read of the same tables into Parquet while the same stream
is sunk; snapshot_ratio_idle: over the bare read on the idle stack;
snapshot_reading_ratio: the bare read under the stream against the snapshot's reading
phase alone, its first read to its last, without the fixed costs before and after:
the sensor tick, the run's launch, the Spark job's start, placing).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import multiprocessing as mp
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cdc_dagster.defs.mysql.snapshot_job import LOCAL_MAX_ROWS
from cdc_dagster.mysql.changefeed import take_initial_snapshot
from cdc_dagster.mysql.chunk_reader import CHUNK_ROWS
from cdc_dagster.mysql.puller import Puller, PullerConfig, pulling
from cdc_dagster.pipeline.engine import spark_session
from cdc_dagster.pipeline.job import parallelism
from cdc_dagster.runtime.spark import spark_executor_factory
from cdc_dagster.sinks.delta import read_table_at
from cdc_dagster.testing.driver import Driver
from cdc_dagster.testing.etcd import EmbeddedEtcd, EtcdTuning
from cdc_dagster.testing.servers import PrivateMariaDB
from cdc_dagster.upstream.changelog import ChangeLog
from cdc_dagster.upstream.oracle import fingerprint
from scheduler_core.ts import MAX_TS

DB = "sbtest"
SINK_QUERY = [""]  # the Delta sink URI's query (--delta-compression, --vacuum-retention-hours)
CPU: list[Any] = []  # --cpu-roles: the sampler (bench/cpu_roles.CpuRoles) while it runs


def say_cpu(cores: int, what: str, t0: float, t1: float) -> None:
    """With ``--cpu-roles``: the machine's CPU by role over wall-clock ``t0``..``t1``."""
    if CPU:
        say(f"[{cores} core(s)] cpu during {what} ({t1 - t0:.1f} s): {CPU[0].line(t0, t1)}")


STATE_POLL_S = 0.5  # how often the snapshot changefeed's state is read while it is awaited
STREAM_SETTLE_S = 5.0  # a stream started: the captures sink it this long before a measurement


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


@dataclass(frozen=True, slots=True)
class Sizes:
    tables: int
    table_size: int
    backlog_s: int
    threads: int


def _sysbench_args(my: PrivateMariaDB, sizes: Sizes, command: str, *extra: str) -> list[str]:
    return [
        "sysbench", "oltp_read_write", "--db-driver=mysql", "--mysql-host=127.0.0.1",
        f"--mysql-port={my.port}", "--mysql-user=root", f"--mysql-db={DB}",
        f"--tables={sizes.tables}", f"--table-size={sizes.table_size}", *extra, command,
    ]  # fmt: skip


def sysbench(my: PrivateMariaDB, sizes: Sizes, command: str, *extra: str) -> str:
    """Run sysbench oltp_read_write against the private MariaDB; its output."""
    args = _sysbench_args(my, sizes, command, *extra)
    return subprocess.run(args, capture_output=True, text=True, check=True).stdout


def under_stream(sampler: LagSampler, fn: Any) -> Any:
    """``fn()`` while ``sampler``'s sysbench writes (the stream the lag is watched on, so the
    stack's captures sink it meanwhile, as during the snapshot) and it samples the stream's
    lag, as it does beside the snapshot: the bare read runs beside the same processes; its
    result."""
    with sampler.streaming():
        time.sleep(STREAM_SETTLE_S)
        return fn()


def gtid_now(my: PrivateMariaDB) -> str:
    c = my.connect()
    with c.cursor() as cur:
        cur.execute("SELECT @@gtid_binlog_pos")
        pos = cur.fetchone()[0]
    c.close()
    return pos


def upstream_fingerprints(my: PrivateMariaDB, tables: int) -> dict[str, Any]:
    c = my.connect(database=DB)
    out = {}
    with c.cursor() as cur:
        for i in range(1, tables + 1):
            cur.execute(f"SELECT id, k, c, pad FROM sbtest{i} ORDER BY id")
            rows = cur.fetchall()
            cols = {n: [r[j] for r in rows] for j, n in enumerate(["id", "k", "c", "pad"])}
            out[f"sbtest{i}"] = fingerprint(pa.table(cols))
    c.close()
    return out


def downstream_fingerprints(lake: Path, root: Path) -> dict[str, Any]:
    log = ChangeLog(root)
    out = {}
    for schema in log.tables_at(MAX_TS).values():
        t = read_table_at(str(lake), schema).select(["id", "k", "c", "pad"]).sort_by("id")
        out[schema.table] = fingerprint(t)
    return out


def mariadb_binlog_s(my: PrivateMariaDB, start: str, stop: str) -> float:
    """Seconds ``mariadb-binlog -v`` takes to decode the binlog between two GTID positions."""
    tool = shutil.which("mariadb-binlog") or shutil.which("mysqlbinlog")
    files = sorted(str(p) for p in my.datadir.glob("binlog.[0-9]*"))
    t0 = time.perf_counter()
    subprocess.run([tool, "--no-defaults", "--base64-output=decode-rows", "-v",
                    f"--start-position={start}", f"--stop-position={stop}", *files],
                   stdout=subprocess.DEVNULL, check=True)  # fmt: skip
    return time.perf_counter() - t0


def pull_until(cfg: PullerConfig, target: str) -> tuple[Puller, float]:
    """A puller run from the change log's state until ``target``; it and its seconds."""
    p = Puller(cfg)
    t0 = time.perf_counter()
    p.run(lambda s: s.position == target)
    return p, time.perf_counter() - t0


def mount_s(root: Path, after_ts: int) -> tuple[int, float]:
    """Rows and seconds to mount every binlog event file above ``after_ts`` in one process."""
    log = ChangeLog(root)
    rows, t0 = 0, time.perf_counter()
    for tid in log.tables_at(MAX_TS):
        for f in log.data_files(tid, after_ts, MAX_TS):
            rows += log.read_data_file(f).num_rows
    return rows, time.perf_counter() - t0


def drain_in_process(
    base: Path, my: PrivateMariaDB, etcd: EmbeddedEtcd, sizes: Sizes, cores: int
) -> dict[str, float]:
    """Scenario (a) through the in-process driver on ``local[cores]`` (``--in-process``)."""
    work = base / f"drain-{cores}"
    root, lake = work / "changelog", work / "lake"
    uri = my.uri(query="server-id=4243")
    snap = take_initial_snapshot(uri, root, (f"{DB}.sbtest*",))
    spark = spark_session(f"local[{cores}]", conf={"spark.sql.shuffle.partitions": str(cores)})
    _snapshot_now(uri, root, spark, cores, (f"{DB}.sbtest*",))
    say(f"[{cores} core(s)] snapshot in the change log; replicating it")
    driver = Driver(work / "state", root, f"delta://{lake}{SINK_QUERY[0]}", 1, spark_executor_factory(spark),
                    endpoints=etcd.endpoints, cluster_id=f"drain{cores}", start_ts=snap.start_ts,
                    table_filter=(f"{DB}.sbtest*",), lease_ttl_s=600)  # fmt: skip
    try:
        resolved = ChangeLog(root).ddl_resolved_ts()
        driver.run_until(lambda t: driver.caught_up(t, resolved), max_ticks=200)
        bare_root = work / "bare"
        shutil.copytree(root, bare_root)  # the bare puller drains the same backlog later
        start = gtid_now(my)
        say(f"[{cores} core(s)] paused; sysbench oltp_read_write for {sizes.backlog_s} s")
        out = sysbench(my, sizes, "run", f"--threads={sizes.threads}", f"--time={sizes.backlog_s}")
        changes = int(re.search(r"write:\s+(\d+)", out).group(1))
        target = gtid_now(my)
        say(f"[{cores} core(s)] backlog of {changes} row changes; resume")
        result = _resume(driver, uri, root, target)
        say(f"[{cores} core(s)] drained in {result['drain_s']:.1f} s; comparing with upstream")
        assert downstream_fingerprints(lake, root) == upstream_fingerprints(my, sizes.tables), (
            "the downstream differs from the upstream after the drain"
        )
        _, puller_s = pull_until(PullerConfig(uri, str(bare_root), (f"{DB}.sbtest*",)), target)
        rows, mounted_s = mount_s(bare_root, resolved)
        tool_s = mariadb_binlog_s(my, start, target)
    finally:
        driver.close()
        spark.stop()
    return {
        "cores": cores,
        "changes": changes,
        "drain_rows_per_s": changes / result["drain_s"],
        "puller_rows_per_s": changes / puller_s,
        "mount_rows_per_s": rows / mounted_s,
        "mariadb_binlog_rows_per_s": changes / tool_s,
        "ticks": result["ticks"],
    }


def _puller_process(uri: str, root: str, target: str, reached: str, stop: str) -> None:
    """A puller in a process of its own (as a Dagster puller run is): follows the binlog,
    writes its resolved ts to ``reached`` once at ``target``, stops when ``stop`` exists."""
    marker = Path(reached)

    def done(s: Any) -> bool:
        if s.position == target and not marker.exists():
            marker.write_text(str(s.resolved_ts))
        return Path(stop).exists()

    Puller(PullerConfig(uri, root, (f"{DB}.sbtest*",))).run(done)


def _resume(driver: Driver, uri: str, root: Path, target: str) -> dict[str, float]:
    """The puller (its own process) and the driver until every table passed the backlog."""
    reached, stop = root.parent / "reached", root.parent / "stop"
    proc = mp.get_context("spawn").Process(
        target=_puller_process, args=(uri, str(root), target, str(reached), str(stop))
    )
    t0 = time.perf_counter()
    proc.start()
    ticks = 0
    try:
        while True:
            tick = driver.tick()
            ticks += 1
            if reached.exists() and driver.caught_up(tick, int(reached.read_text())):
                break
            if not proc.is_alive():
                raise RuntimeError("the puller stopped before the backlog was drained")
    finally:
        elapsed = time.perf_counter() - t0
        stop.touch()
        proc.join(60)
    return {"drain_s": elapsed, "ticks": ticks}


def _snapshot_tables(my: Any, prefix: str, tables: int, rows: int) -> None:
    """``tables`` sysbench-shaped tables ``<prefix><i>`` of ``rows`` rows each (kept if there)."""
    c = my.connect(database=DB)
    with c.cursor() as cur:
        for t in (f"{prefix}{i}" for i in range(tables)):
            cur.execute(f"CREATE TABLE IF NOT EXISTS {t} LIKE sbtest1")
            cur.execute(f"INSERT INTO {t} SELECT seq, seq % 1000, REPEAT('c', 119), "
                        f"REPEAT('p', 59) FROM seq_1_to_{rows}")  # fmt: skip
    c.close()


def _settle(my: Any, ms: Any, tables: int, drain_root: Path, rows: int, cores: int) -> None:
    """Wait until the drain changefeed's puller is past the binlog of the tables just
    filled (it reads every event and skips those of tables it does not replicate) and its
    tables are readable there (filling them took the CPU from its captures): else the lag
    watched "without a snapshot" is that catch-up's, and the snapshot competes with it for
    the CPU. A change to a replicated table marks where the filling ended."""
    from cdc_dagster.mysql.state import load_state

    c = my.connect(database=DB)
    with c.cursor() as cur:
        cur.execute("UPDATE sbtest1 SET k = k + 1 WHERE id = 1")
    c.commit()
    c.close()
    mark = gtid_now(my)
    waited = wait_for(lambda: (s := load_state(drain_root)) is not None and s.gtid == mark,
                      900, "the drain puller to pass the filled tables' binlog")  # fmt: skip
    at = load_state(drain_root).last_ts
    readable = wait_for(lambda: readable_ts(ms, DRAIN_CF, tables) >= at, 900,
                        "the drain changefeed readable past the filling")  # fmt: skip
    say(f"[{cores} core(s)] the drain changefeed's puller passed the {rows} rows' binlog "
        f"(not replicated by it) {waited:.1f} s after they were written, its tables readable "
        f"there {readable:.1f} s later")  # fmt: skip


def _bare_read(
    spark: Any, uri: str, work: Path, pieces: list[tuple], expect: int, tasks: int,
    local: bool = False,
) -> float:  # fmt: skip
    """The bare baseline: each (name, schema, lo, hi, weight) key range read in ``CHUNK_ROWS``-row
    keyset chunks into Parquet by the snapshot's own chunk client (connectorx where the
    snapshot uses it), the ranges spread over ``tasks`` Spark tasks as the snapshot job
    spreads them -- or, ``local`` (where the snapshot job reads without a Spark job), one
    after another in this process; no snapshot transaction or position, metadata lock,
    catalog check, chunk records or puller. The seconds it took."""
    from cdc_dagster.pipeline.job import balance

    specs = []
    for name, schema, lo, hi, weight in pieces:
        out = work / "bare" / name
        out.parent.mkdir(parents=True, exist_ok=True)
        specs.append({"uri": uri, "schema": schema.to_json(), "lo": lo, "hi": hi,
                      "chunk": CHUNK_ROWS, "out": str(out), "weight": weight})  # fmt: skip
    groups = [json.dumps(g) for g in balance(specs, max(1, min(tasks, len(specs))))]
    t0 = time.perf_counter()
    if local:
        ids = pa.RecordBatch.from_pydict({"id": [0]})
        done = _bare_groups([json.dumps(specs)], iter([ids]))
        got = sum(sum(b.column("rows").to_pylist()) for b in done)
    else:
        df = spark.range(0, len(groups), 1, len(groups))
        body = functools.partial(_bare_groups, groups)
        got = sum(r["rows"] for r in df.mapInArrow(body, "rows long").collect())
    bare_s = time.perf_counter() - t0
    assert got == expect, (got, expect)
    return bare_s


def _bare_groups(groups: list[str], batches: Any) -> Any:
    """mapInArrow body of the bare baseline: read each range of group ``id`` into Parquet."""
    import pyarrow.parquet as pq

    from cdc_dagster.mysql.chunk_select import client_for
    from cdc_dagster.mysql.snapshots import decode_key
    from cdc_dagster.schema import TableSchema
    from cdc_dagster.upstream.uri import parse_uri

    out = []
    for batch in batches:
        for gid in batch.column("id").to_pylist():
            for spec in json.loads(groups[gid]):
                schema = TableSchema.from_json(spec["schema"])
                client = client_for(parse_uri(spec["uri"]), schema, 1)
                lo, hi, n, rows_total = decode_key(spec["lo"]), decode_key(spec["hi"]), 0, 0
                try:
                    while True:
                        got = client.select((lo, hi), spec["chunk"], snapshot=False)
                        if got.rows.num_rows:
                            pq.write_table(got.rows, f"{spec['out']}-{n}.parquet")
                        rows_total += got.rows.num_rows
                        if got.rows.num_rows < spec["chunk"]:
                            break
                        lo, n = got.last_key, n + 1
                finally:
                    client.close()
                out.append({"rows": rows_total})
    yield pa.RecordBatch.from_pylist(out, schema=pa.schema([("rows", pa.int64())]))


def snapshot_in_process(
    base: Path, my: PrivateMariaDB, sizes: Sizes, cores: int, tables: int, rows: int
) -> dict[str, float]:
    """Scenario (b) with the snapshot runner on ``local[cores]`` (``--in-process``)."""
    from cdc_dagster.mysql.snapshot_runner import run_snapshot_reads, snapshot_specs
    from cdc_dagster.mysql.snapshots import read_plan
    from cdc_dagster.mysql.state import load_state

    work = base / f"snapshot-{cores}-{tables}"
    _snapshot_tables(my, f"snap{cores}x{tables}_", tables, rows)
    uri = my.uri(query="server-id=4244")
    root = work / "changelog"
    flt = (f"{DB}.snap{cores}x{tables}_*",)
    snap = take_initial_snapshot(uri, root, flt)
    spark = spark_session(f"local[{cores}]", conf={"spark.sql.shuffle.partitions": str(cores)})
    stop = work / "stop"
    proc = mp.get_context("spawn").Process(
        target=_follow_process, args=(uri, str(root), flt, str(stop))
    )
    proc.start()
    try:
        specs = snapshot_specs(uri, str(root), cores * 2, CHUNK_ROWS)  # plans, before the clock
        ranges = {  # kept: a table's plan goes once its snapshot is complete
            (sp["table_id"], sp["range"]): read_plan(root, sp["table_id"], sp["generation"]).ranges[
                sp["range"]
            ]
            for sp in specs
        }
        tasks = parallelism(spark)
        t0 = time.perf_counter()
        run_snapshot_reads(uri, str(root), spark, cores * 2, CHUNK_ROWS, tasks)
        read_s = time.perf_counter() - t0
        while load_state(root).snapshots:
            time.sleep(0.1)
        snap_s = time.perf_counter() - t0
        say(f"chunks read in {read_s:.1f} s, all placed and released after {snap_s:.1f} s")
        log = ChangeLog(root)
        placed = sum(log.read_data_file(f).num_rows for tid in log.tables_at(MAX_TS)
                     for f in log.data_files(tid, snap.start_ts, MAX_TS))  # fmt: skip
        assert placed == tables * rows, (placed, tables * rows)
        pieces = [
            (f"{sp['table_id']}-{sp['range']}", log.schema_at(sp["table_id"], MAX_TS),
             *ranges[(sp["table_id"], sp["range"])], sp["weight"])
            for sp in specs
        ]  # fmt: skip
        bare_s = _bare_read(spark, uri, work, pieces, tables * rows, tasks)
    finally:
        stop.touch()
        proc.join(60)
        spark.stop()
    n = tables * rows
    return {"cores": cores, "tables": tables, "rows": n, "snapshot_rows_per_s": n / snap_s,
            "bare_read_rows_per_s": n / bare_s, "ranges": len(specs)}  # fmt: skip


def _snapshot_now(uri: str, root: Path, spark: Any, cores: int, flt: tuple[str, ...]) -> None:
    """The tables' chunked snapshots read and placed (a puller following meanwhile)."""
    from cdc_dagster.mysql.snapshot_runner import run_snapshot_reads
    from cdc_dagster.mysql.state import load_state

    stop = root.parent / "snapshot-stop"
    proc = mp.get_context("spawn").Process(
        target=_follow_process, args=(uri, str(root), flt, str(stop))
    )
    proc.start()
    try:
        run_snapshot_reads(uri, str(root), spark, cores * 2, CHUNK_ROWS, parallelism(spark))
        while load_state(root).snapshots:
            time.sleep(0.1)
    finally:
        stop.touch()
        proc.join(60)


def _follow_process(uri: str, root: str, flt: tuple[str, ...], stop: str) -> None:
    Puller(PullerConfig(uri, root, flt)).run(lambda s: Path(stop).exists())


# ------------------------------------------------------------------ through the real stack
CAPTURES = ("capture-1", "capture-2")
DRAIN_CF = "drain"


def readable_ts(ms: Any, changefeed_id: str, tables: int) -> int:
    """The ts up to which every table's rows are in the sink (min of the checkpoints the
    captures report after their commits); 0 while a table is not reported replicating."""
    from cdc_dagster.runtime import reported_checkpoints

    per_table = reported_checkpoints(ms.task_statuses.read(changefeed_id))
    return min(per_table.values()) if len(per_table) >= tables else 0


def wait_for(cond: Any, timeout_s: float, what: str, poll_s: float = 0.25) -> float:
    """Poll ``cond`` until true; seconds waited (RuntimeError naming ``what`` on timeout)."""
    t0 = time.perf_counter()
    while not cond():
        if time.perf_counter() - t0 > timeout_s:
            raise RuntimeError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(poll_s)
    return time.perf_counter() - t0


def snapshots_pending(root: Path) -> bool:
    from cdc_dagster.mysql.state import load_state

    state = load_state(root)
    return state is None or bool(state.snapshots)


class LagSampler:
    """Samples a changefeed's readable lag (now - readable ts) every half second, in a thread,
    while sysbench writes at a fixed rate (the stream whose lag is watched); and how much of
    it is the puller's (now - its change log's resolved ts)."""

    def __init__(
        self, ms: Any, my: PrivateMariaDB, sizes: Sizes, rate: int, changelog: Path
    ) -> None:
        import threading

        self.ms, self.my, self.sizes, self.rate = ms, my, sizes, rate
        self.changelog = ChangeLog(changelog)
        self.samples: list[float] = []
        self.pulled: list[float] = []  # the puller's part of each sample
        self.times: list[float] = []  # when each sample was taken (wall clock)
        self.t0 = self.seconds = 0.0
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._sample, daemon=True)]

    def _sample(self) -> None:
        from scheduler_core.ts import physical_ms

        while not self.stop.wait(0.5):
            resolved = self.changelog.ddl_resolved_ts()
            ts = readable_ts(self.ms, DRAIN_CF, self.sizes.tables)
            if ts:
                now = time.time()
                self.samples.append(now - physical_ms(ts) / 1000)
                self.pulled.append(now - physical_ms(resolved) / 1000)
                self.times.append(now)

    def run(self, seconds: int, until: Any = None) -> None:
        """Write at ``rate`` transactions/s while sampling, for ``seconds`` and, given an
        event ``until``, on until it is set (a snapshot readable downstream: its rows are
        sunk after they are placed, and the stream's lag shows that too)."""
        with self.streaming():
            time.sleep(seconds)
            if until is not None:
                until.wait(1800)

    @contextlib.contextmanager
    def streaming(self) -> Iterator[None]:
        """Write at ``rate`` transactions/s and sample (the threads too) while inside."""
        self.t0 = time.time()
        for t in self.threads:
            t.start()
        args = _sysbench_args(self.my, self.sizes, "run", "--threads=2", f"--rate={self.rate}",
                              "--time=3600")  # fmt: skip
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            yield
        finally:
            proc.terminate()
            proc.wait(30)
            self.stop.set()
            for t in self.threads:
                t.join()
            self.seconds = time.time() - self.t0

    def summary(self) -> dict[str, float]:
        v = sorted(self.samples) or [float("nan")]
        at = self.times[self.samples.index(v[-1])] - self.t0 if self.samples else float("nan")
        p = sorted(self.pulled) or [float("nan")]
        # the puller's part when the lag was at its maximum
        at_max = self.pulled[self.samples.index(v[-1])] if self.samples else float("nan")
        return {"p50": v[len(v) // 2], "p90": v[int(len(v) * 0.9)], "max": v[-1],
                "max_at": at, "seconds": self.seconds, "pulled_p50": p[len(p) // 2],
                "pulled_max": p[-1], "pulled_at_max": at_max}  # fmt: skip


def stack_drain(
    base: Path, my: PrivateMariaDB, sizes: Sizes, cores: int, ms: Any, repeats: int = 1
) -> list[dict[str, Any]]:
    """Scenario (a) through ``server start``'s stack: pause, backlog, resume, until readable;
    ``repeats`` times one after another in the same stack (each with its own baselines)."""
    from cdc_dagster.mysql.state import load_state

    work = base / f"stack-{cores}"
    root = work / "changelog-drain"
    t0 = time.perf_counter()
    wait_for(lambda: not snapshots_pending(root), 900, "the initial snapshot")
    caught = load_state(root).last_ts
    # The changefeed checkpoint too: a resume starts every table again from it, and one still
    # below the snapshot would make the drain pull and mount the snapshot's rows again.
    wait_for(lambda: ms.changefeeds.get(DRAIN_CF).status.checkpoint_ts >= caught, 900,
             "its replication")  # fmt: skip
    say(f"[{cores} core(s)] initial snapshot replicated {time.perf_counter() - t0:.0f} s after "
        "the stack was up")  # fmt: skip
    runs = []
    for i in range(repeats):
        runs.append(_one_drain(work, my, sizes, cores, ms, f"{i + 1}/{repeats}"))
    return runs


def _one_drain(
    work: Path, my: PrivateMariaDB, sizes: Sizes, cores: int, ms: Any, which: str
) -> dict[str, Any]:
    """One drain: pause, ``sizes.backlog_s`` of sysbench, resume, until readable; then the
    downstream compared with the upstream, and the baselines on the same backlog."""
    from cdc_dagster import admin
    from cdc_dagster.mysql.state import load_state

    root, lake = work / "changelog-drain", work / "lake"
    say(f"[{cores} core(s)] drain {which}: pausing the changefeed")
    admin.pause_changefeed(ms, DRAIN_CF)
    wait_for(lambda: not pulling(root), 120, "the puller to stop pulling")
    bare_root = work / "bare"
    shutil.copytree(root, bare_root)  # the bare puller drains the same backlog later
    before_backlog = ChangeLog(bare_root).ddl_resolved_ts()
    start = gtid_now(my)
    paused_at = load_state(root).gtid
    say(f"[{cores} core(s)] paused; sysbench oltp_read_write for {sizes.backlog_s} s")
    out = sysbench(my, sizes, "run", f"--threads={sizes.threads}", f"--time={sizes.backlog_s}")
    changes = int(re.search(r"write:\s+(\d+)", out).group(1))
    target = gtid_now(my)
    say(f"[{cores} core(s)] backlog of {changes} row changes; changefeed resume")
    admin.resume_changefeed(ms, DRAIN_CF)
    t0, t0_wall = time.perf_counter(), time.time()
    target_ts = 0
    first_s = pulled_s = 0.0

    def pulled() -> bool:
        nonlocal target_ts, first_s, pulled_s
        state = load_state(root)
        if state is not None and not first_s and state.gtid != paused_at:
            first_s = time.perf_counter() - t0  # the backlog's first rows are in the change log
        if state is not None and state.gtid == target:
            target_ts, pulled_s = state.last_ts, time.perf_counter() - t0
        return bool(target_ts)

    wait_for(pulled, 1800, "the puller to reach the backlog's end", poll_s=0.1)
    wait_for(lambda: readable_ts(ms, DRAIN_CF, sizes.tables) >= target_ts, 1800, "the drain",
             poll_s=0.1)  # fmt: skip
    drain_s = time.perf_counter() - t0
    say_cpu(cores, f"drain {which}, resume until readable", t0_wall, time.time())
    wait_for(lambda: ms.changefeeds.get(DRAIN_CF).status.checkpoint_ts >= target_ts, 600,
             "the changefeed checkpoint")  # fmt: skip
    checkpointed_s = time.perf_counter() - t0
    say(f"[{cores} core(s)] first backlog rows in the change log after {first_s:.1f} s, puller at "
        f"the backlog's end after {pulled_s:.1f} s, readable after {drain_s:.1f} s, checkpoint "
        f"after {checkpointed_s:.1f} s; comparing with upstream")  # fmt: skip
    assert downstream_fingerprints(lake, root) == upstream_fingerprints(my, sizes.tables), (
        "the downstream differs from the upstream after the drain"
    )
    bare_uri = my.uri(query="server-id=4250")  # not the stack puller's id: both stream
    _, puller_s = pull_until(PullerConfig(bare_uri, str(bare_root), (f"{DB}.sbtest*",)), target)
    rows, mounted_s = mount_s(bare_root, before_backlog)
    tool_s = mariadb_binlog_s(my, start, target)
    shutil.rmtree(bare_root, ignore_errors=True)  # the next drain copies it afresh
    return {
        "drain": which,
        "cores": cores,
        "changes": changes,
        "drain_rows_per_s": changes / drain_s,
        "after_first_rows_per_s": changes / (drain_s - first_s),
        "first_s": first_s,
        "pulled_s": pulled_s,
        "drain_s": drain_s,
        "checkpoint_s": checkpointed_s,
        "puller_rows_per_s": changes / puller_s,
        "mount_rows_per_s": rows / mounted_s,
        "mariadb_binlog_rows_per_s": changes / tool_s,
        "ticks": 0,
    }


def _warm_spark(spark_remote: str) -> float:
    """A first Python job on the stack's Spark Connect server, importing what the chunk
    readers import: the server's first job pays its code generation and Python workers'
    start (~8-10 s here), which a running deployment paid long ago, and which would fall on
    whichever of the snapshot and the bare read came first. Seconds it took."""
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.remote(spark_remote).getOrCreate()
    try:
        t0 = time.perf_counter()
        for _ in range(2):
            spark.range(0, 4, 1, 4).mapInArrow(_warm_body, "id long").collect()
        return time.perf_counter() - t0
    finally:
        spark.stop()


def _warm_body(batches: Any) -> Any:
    import cdc_dagster.mysql.chunk_reader  # noqa: F401  (the chunk readers' imports)

    yield from batches


def snapshot_breakdown(
    state_dir: Path, changefeed_id: str, created: float, placed: float
) -> tuple[dict[str, float], list[str]]:
    """Where a snapshot's time went, from the stack's Dagster event log (wall-clock seconds):
    create until the owner sensor requested the ``mysql_snapshot`` run, its launch until the
    op started, planning (and the Spark session), the reads, and from the reads' end until
    the puller had placed every chunk and released every table (``placed``). The stages are
    the first run's; with them, every snapshot run of the changefeed, how it ended and why
    (a run that failed and was followed by another is where a slow snapshot's time went)."""
    import dagster as dg

    instance = dg.DagsterInstance.from_config(str(state_dir / "dagster"))
    try:
        records = sorted(
            instance.get_run_records(
                dg.RunsFilter(job_name="mysql_snapshot", tags={"cdc/changefeed": changefeed_id})
            ),
            key=lambda r: r.create_timestamp.timestamp(),
        )
        if not records:
            return {}, []
        runs = [_run_outcome(instance, r, created) for r in records]
        run = records[0]
        marks = {"requested": run.create_timestamp.timestamp()}
        for e in instance.all_logs(run.dagster_run.run_id):
            msg = e.user_message or ""
            if e.dagster_event is not None and e.dagster_event.event_type_value == "STEP_START":
                marks["started"] = e.timestamp
            elif "table range(s) to read" in msg:
                marks["planned"] = e.timestamp
            elif msg.startswith("reads done"):
                marks["read"] = e.timestamp
                m = re.search(r"reading from ([\d.]+) to ([\d.]+)", msg)
                if m:
                    marks["first_began"], marks["last_ended"] = float(m[1]), float(m[2])
    finally:
        instance.dispose()
    out, last = {}, created
    for name, key in (("sensor tick", "requested"), ("run launch", "started"),
                      ("planning", "planned"), ("to the first read", "first_began"),
                      ("reading", "last_ended"), ("to the reads' end", "read")):  # fmt: skip
        if key in marks:
            # the puller places chunks as they are read: when it had placed them all before
            # the op logged its reads' end, the stages end at the placing (none negative)
            at = min(marks[key], placed)
            out[name], last = at - last, at
    out["placing and release"] = placed - last
    return out, runs


def _run_outcome(instance: Any, record: Any, created: float) -> str:
    """One run as a line: its id, status, when it was created and ended (seconds after the
    changefeed's create) and, when it failed, its first failure's message."""
    run = record.dagster_run
    end = record.end_time or time.time()
    line = (f"{run.run_id[:8]} {run.status.value} {record.create_timestamp.timestamp() - created:.0f}"
            f"-{end - created:.0f} s")  # fmt: skip
    for e in instance.all_logs(run.run_id):
        ev = e.dagster_event
        if ev is not None and ev.event_type_value in ("STEP_FAILURE", "RUN_FAILURE"):
            err = getattr(ev.event_specific_data, "error", None)
            why = (err.message if err is not None else ev.message) or ""
            return f"{line}: {why.strip().splitlines()[0][:200] if why.strip() else '?'}"
    return line


def stack_snapshot(
    base: Path, my: PrivateMariaDB, sizes: Sizes, cores: int, ms: Any, spark_remote: str,
    tables: int, rows: int, rate: int, lag_s: int, state_dir: Path,
) -> dict[str, Any]:  # fmt: skip
    """Scenario (b) through the stack: ``changefeed create`` of tables with rows, while the
    drain changefeed streams sysbench at ``rate``; rows/s until every chunk is placed (in the
    change log) and until readable; the stream's lag with and without the snapshot; the bare
    chunked read of the same ranges on the stack's Spark Connect server."""
    from cdc_dagster import admin
    from cdc_dagster.mysql.chunk_reader import plan_table
    from cdc_dagster.mysql.state import load_state
    from cdc_dagster.upstream.uri import parse_uri

    work = base / f"stack-{cores}"
    prefix = f"snap{cores}x{tables}x{rows}_"
    _snapshot_tables(my, prefix, tables, rows)
    _settle(my, ms, sizes.tables, work / "changelog-drain", tables * rows, cores)
    say(f"[{cores} core(s)] stream lag without a snapshot ({rate} txn/s for {lag_s} s)")
    quiet = LagSampler(ms, my, sizes, rate, work / "changelog-drain")
    quiet_t0 = time.time()
    quiet.run(lag_s)
    say_cpu(cores, "the stream without a snapshot", quiet_t0, time.time())
    cf = f"snap-{cores}-{tables}x{rows}"
    root = work / f"changelog-{cf}"
    uri = my.uri(query=f"server-id={4300 + cores * 100 + zlib.crc32(prefix.encode()) % 97}")
    busy = LagSampler(ms, my, sizes, rate, work / "changelog-drain")
    import threading

    times: dict[str, float] = {}
    states: dict[str, str] = {}  # the snapshot changefeed's states seen -> the first message

    def snap() -> None:
        t0 = time.perf_counter()
        times["t0_wall"] = time.time()
        admin.create_changefeed(ms, cf, f"delta://{work / 'lake-snap'}{SINK_QUERY[0]}", table_filter=(
            f"{DB}.{prefix}*",), upstream_uri=uri, changelog_root=str(root))  # fmt: skip
        times["created"] = time.perf_counter() - t0

        looked = [0.0]  # when the changefeed's state was last read

        def watched(cond: Any) -> Any:  # the changefeed's state as `changefeed query` says it
            def check() -> bool:
                # the state (an etcd read) every STATE_POLL_S, the condition every poll:
                # polling is the bench's own load beside the snapshot, none beside the bare
                # read
                if time.monotonic() - looked[0] >= STATE_POLL_S:
                    looked[0] = time.monotonic()
                    status = ms.changefeeds.get(cf).status
                    states.setdefault(status.state.value, status.last_error or "")
                return bool(cond())

            return check

        wait_for(watched(lambda: not snapshots_pending(root)), 1800, "the snapshot", poll_s=0.1)
        times["placed"] = time.perf_counter() - t0
        times["placed_wall"] = time.time()
        last = load_state(root).last_ts
        wait_for(watched(lambda: readable_ts(ms, cf, tables) >= last), 1800,
                 "the snapshot downstream")  # fmt: skip
        times["readable"] = time.perf_counter() - t0

    readable = threading.Event()

    def snap_then_say() -> None:
        try:
            snap()
        finally:
            readable.set()

    busy.threads.append(threading.Thread(target=snap_then_say))  # started with the sampler
    busy.run(lag_s, until=readable)  # the stream's lag until the snapshot is readable
    say(f"[{cores} core(s)] {tables} x {rows} rows: created in {times['created']:.1f} s, in the "
        f"change log after {times['placed']:.1f} s, readable after {times['readable']:.1f} s; "
        f"its states meanwhile: {states}")  # fmt: skip
    log = ChangeLog(root)
    state = load_state(root)
    placed = sum(log.read_data_file(f).num_rows for tid in log.tables_at(MAX_TS)
                 for f in log.data_files(tid, 0, MAX_TS))  # fmt: skip
    assert placed == tables * rows, (placed, tables * rows)
    # The bare read: the same ranges (the snapshot job's parallelism and chunk) on the same
    # Spark Connect server, into Parquet, with no position, lock or puller.
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.remote(spark_remote).getOrCreate()
    plans = {tid: plan_table(parse_uri(uri), str(root), tid, 999_999, 4, CHUNK_ROWS)
             for tid in sorted(state.tables)}  # fmt: skip
    pieces = [
        (f"{cf}-{tid}-{r}", log.schema_at(tid, MAX_TS), lo, hi, p.rows // len(p.ranges))
        for tid, p in plans.items()
        for r, (lo, hi) in enumerate(p.ranges)
    ]
    local = tables * rows <= LOCAL_MAX_ROWS  # where the snapshot job reads without Spark
    breakdown, runs = snapshot_breakdown(state_dir, cf, times["t0_wall"], times["placed_wall"])
    say(f"[{cores} core(s)] where the time went: " + ", ".join(
        f"{k} {v:.1f} s" for k, v in breakdown.items()))  # fmt: skip
    say(f"[{cores} core(s)] its mysql_snapshot run(s): " + ("; ".join(runs) or "none"))
    say_cpu(cores, "the snapshot, create until in the change log", times["t0_wall"],
            times["placed_wall"])  # fmt: skip
    try:
        bare_s = _bare_read(spark, uri, work, pieces, tables * rows, parallelism(spark), local)
        # ... and again while the stream the snapshot ran beside is sunk (like for like)
        shutil.rmtree(work / "bare", ignore_errors=True)
        beside_bare = LagSampler(ms, my, sizes, rate, work / "changelog-drain")
        bare_stream_s = under_stream(beside_bare, lambda: _bare_read(
            spark, uri, work, pieces, tables * rows, parallelism(spark), local))  # fmt: skip
        say_cpu(cores, "the bare read under the stream", time.time() - bare_stream_s, time.time())
    finally:
        # Release the Connect session while its server is up: a session left open kept the
        # client's release threads retrying after the stack stopped, and the bench never
        # exited after its closing line.
        spark.stop()
    admin.remove_changefeed(ms, cf)
    n = tables * rows
    q, b, bb = quiet.summary(), busy.summary(), beside_bare.summary()
    say(f"[{cores} core(s)] stream lag p50/p90/max without a snapshot {q['p50']:.1f}/"
        f"{q['p90']:.1f}/{q['max']:.1f} s, from its create until readable ({b['seconds']:.0f} s) "
        f"{b['p50']:.1f}/{b['p90']:.1f}/{b['max']:.1f} s (the max {b['max_at']:.0f} s in; "
        f"placed at {times['placed']:.0f} s); the puller's part p50/max {q['pulled_p50']:.1f}/"
        f"{q['pulled_max']:.1f} s without, {b['pulled_p50']:.1f}/{b['pulled_max']:.1f} s "
        f"during ({b['pulled_at_max']:.1f} s of the max); beside the bare read under the "
        f"stream {bb['p50']:.1f}/{bb['p90']:.1f}/{bb['max']:.1f} s")  # fmt: skip
    return {"cores": cores, "tables": tables, "rows": n,
            "snapshot_rows_per_s": n / times["placed"], "readable_rows_per_s": n / times["readable"],
            "bare_read_rows_per_s": n / bare_s, "bare_read_stream_rows_per_s": n / bare_stream_s,
            "ranges": len(pieces),
            "lag_p50_quiet": q["p50"], "lag_max_quiet": q["max"],
            "lag_p50_snapshot": b["p50"], "lag_max_snapshot": b["max"],
            "lag_p50_bare": bb["p50"], "lag_max_bare": bb["max"],
            "breakdown": breakdown, "snapshot_runs": runs}  # fmt: skip


def run_stack(
    base: Path, my: PrivateMariaDB, sizes: Sizes, cores: int, shapes: list[tuple[int, int]],
    args: argparse.Namespace,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:  # fmt: skip
    """``server start`` (private etcd, Spark Connect on ``local[cores]``, the Dagster code
    server, daemon and webserver), two captures, a changefeed into Delta; both scenarios."""

    from cdc_dagster import admin
    from cdc_dagster.metastore import connect
    from cdc_dagster.mysql.state import load_state
    from cdc_dagster.services import stack, workload

    os.environ["CDC_DAGSTER_SPARK_CORES"] = str(cores)  # the Spark Connect server's slots
    state = base / f"stack-{cores}" / "state"
    lake = base / f"stack-{cores}" / "lake"
    root = base / f"stack-{cores}" / "changelog-drain"

    def before(st: stack.Stack) -> None:  # as a user would: captures, then the changefeed
        say(workload.ensure_captures(st.etcd_endpoints, st.state_dir, CAPTURES))
        with connect(st.etcd_endpoints.split(","), st.state_dir) as ms:
            admin.create_changefeed(ms, DRAIN_CF, f"delta://{lake}{SINK_QUERY[0]}", table_filter=(
                f"{DB}.sbtest*",), upstream_uri=my.uri(query="server-id=4243"),
                changelog_root=str(root))  # fmt: skip

    t0 = time.perf_counter()
    with stack.Stack(state, kind="server", before_dagster=before) as st:
        say(f"[{cores} core(s)] stack up in {time.perf_counter() - t0:.0f} s (UI {st.ui_url})")
        ms = connect(st.etcd_endpoints.split(","), st.state_dir)
        try:
            drained = [] if args.skip_drain else stack_drain(base, my, sizes, cores, ms,
                                                              args.drain_repeats)  # fmt: skip
            if args.skip_drain:  # the snapshot scenario watches the drain changefeed's lag
                wait_for(lambda: not snapshots_pending(root), 900, "the initial snapshot")
                caught = load_state(root).last_ts  # its lag is watched from a steady state
                wait_for(lambda: readable_ts(ms, DRAIN_CF, sizes.tables) >= caught, 900,
                         "the initial snapshot's replication")  # fmt: skip
            snaps = []
            if not args.skip_snapshot:
                say(f"[{cores} core(s)] Spark Connect's first Python jobs (warm-up): "
                    f"{_warm_spark(st.spark_remote):.1f} s")  # fmt: skip
                for tables, rows in shapes:
                    say(f"[{cores} core(s)] snapshot of {tables} table(s) x {rows} rows")
                    snaps.append(stack_snapshot(base, my, sizes, cores, ms, st.spark_remote,
                                                tables, rows, args.lag_rate, args.lag_s,
                                                st.state_dir))  # fmt: skip
        finally:
            ms.close()
            say(f"[{cores} core(s)] on disk at the end: " + ", ".join(
                f"{p.name} {_disk_gb(p):.1f} GB" for p in sorted((base / f"stack-{cores}").glob(
                    "lake*"))) + f" (sink URI query {SINK_QUERY[0]!r})")  # fmt: skip
    return drained, snaps


def _disk_gb(path: Path) -> float:
    """The bytes of the files under ``path``, in GB (what the lake's rewrites left)."""
    total = 0
    for d, _, names in os.walk(path):
        for n in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(d, n)).st_size
    return total / 1e9


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, a few minutes")
    ap.add_argument("--spark-cores", default="1,2")
    ap.add_argument("--tables", type=int)
    ap.add_argument("--table-size", type=int)
    ap.add_argument("--backlog-s", type=int)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--skip-drain", action="store_true")
    ap.add_argument("--drain-repeats", type=int,
                    help="drains one after another in each stack (default 3; --quick 1): the "
                         "closing line has their median")  # fmt: skip
    ap.add_argument("--skip-snapshot", action="store_true")
    ap.add_argument("--in-process", action="store_true",
                    help="also the in-process figures (driver ticks, snapshot runner in the "
                         "bench process) as extra rows")  # fmt: skip
    ap.add_argument("--lag-rate", type=int, default=50, help="txn/s while the lag is watched")
    ap.add_argument("--lag-s", type=int, default=30, help="seconds the lag is watched")
    ap.add_argument("--snapshot-shapes", default="", help="TABLESxROWS,... (default by size)")
    ap.add_argument("--delta-compression", default="",
                    help="the Delta sink's ?compression= (default: the sink's, zstd)")  # fmt: skip
    ap.add_argument("--cpu-roles", action="store_true",
                    help="also the machine's CPU by role (capture runs, puller, bulk workers, "
                         "MariaDB, Spark, ...) during each drain, stream and snapshot: "
                         "bench/cpu_roles.py, ~1-2%% of a core more")  # fmt: skip
    ap.add_argument("--vacuum-retention-hours", default="0",
                    help="the Delta sink's ?vacuum_retention_hours= (default 0: a run's rewrites "
                         "took ~22 GB a stack without a vacuum; 'off': none)")  # fmt: skip
    ap.add_argument("--vacuum-every-s", type=float, default=120.0,
                    help="CDC_DAGSTER_VACUUM_EVERY_S for the stack (default 120)")  # fmt: skip
    ap.add_argument("--keep", action="store_true",
                    help="keep the work directory (the stack's Dagster logs) and print it; "
                         "mind the disk: its lakes and change logs")  # fmt: skip
    args = ap.parse_args()
    query = [f"vacuum_retention_hours={args.vacuum_retention_hours}"]
    if args.delta_compression:
        query.append(f"compression={args.delta_compression}")
    SINK_QUERY[0] = "?" + "&".join(query)
    os.environ["CDC_DAGSTER_VACUUM_EVERY_S"] = str(args.vacuum_every_s)  # the stack's processes

    def interrupted(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")  # the stack and MariaDB are stopped

    for sig in (signal.SIGTERM, signal.SIGINT):  # SIGINT too: ignored in a background job
        signal.signal(sig, interrupted)
    quick = Sizes(4, 20_000, 15, args.threads)
    full = Sizes(4, 250_000, 60, args.threads)
    d = quick if args.quick else full
    sizes = Sizes(args.tables or d.tables, args.table_size or d.table_size,
                  args.backlog_s or d.backlog_s, args.threads)  # fmt: skip
    if args.drain_repeats is None:
        args.drain_repeats = 1 if args.quick else 3
    if args.drain_repeats < 1:
        ap.error(f"--drain-repeats {args.drain_repeats}: expected 1 or more")
    base = Path(tempfile.mkdtemp(prefix="throughput-bench-"))  # under $TMPDIR
    my = PrivateMariaDB(base / "my")
    results, snaps, extra, extra_snaps = [], [], [], []
    shapes = [(1, 200_000), (20, 10_000)] if args.quick else [(1, 10_000_000), (100, 100_000)]
    if args.snapshot_shapes:
        shapes = [tuple(int(x) for x in s.split("x")) for s in args.snapshot_shapes.split(",")]
    etcd = None
    if args.cpu_roles:
        from cpu_roles import CpuRoles

        CPU.append(CpuRoles().start())
    try:
        my.start()
        c = my.connect()
        c.cursor().execute(f"CREATE DATABASE {DB}")
        c.close()
        say(f"sysbench prepare: {sizes.tables} tables x {sizes.table_size} rows")
        sysbench(my, sizes, "prepare")
        for cores in [int(x) for x in args.spark_cores.split(",")]:
            drained, snapped = run_stack(base, my, sizes, cores, shapes, args)
            results += drained
            snaps += snapped
            if args.in_process:
                if etcd is None:
                    etcd = EmbeddedEtcd(base / "etcd", tuning=EtcdTuning.for_tests())
                    etcd.start()
                if not args.skip_drain:
                    extra.append(drain_in_process(base, my, etcd, sizes, cores))
                if not args.skip_snapshot:
                    for tables, rows in shapes:
                        extra_snaps.append(
                            snapshot_in_process(base, my, sizes, cores, tables, rows)
                        )
    finally:
        for sampler in CPU:
            sampler.stop()
        if etcd is not None:
            etcd.stop()
        my.cleanup()
        if args.keep:
            say(f"work directory kept: {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    if extra or extra_snaps:
        print(
            "\nin process (driver ticks / snapshot runner in this process; not as a user runs it):"
        )
        _report(extra, extra_snaps, final=False)
        print("\nthrough the stack (server start: Dagster daemon, sensor and runs, Spark Connect):")
    _report(results, snaps)
    return 0


def _bare_stream(r: dict[str, Any]) -> float:
    """The like-for-like baseline: the bare read while the same stream is sunk (the
    in-process rows have no stream: their bare read)."""
    return float(r.get("bare_read_stream_rows_per_s") or r["bare_read_rows_per_s"])


def _reading_ratio(r: dict[str, Any]) -> float:
    """The bare read's seconds under the stream over the snapshot's reading phase (its first
    read began -> its last ended: no sensor tick, run launch, planning or placing); 0 where
    the breakdown has no reading phase."""
    reading = float(r.get("breakdown", {}).get("reading") or 0.0)
    return r["rows"] / _bare_stream(r) / reading if reading > 0 else 0.0


def _report(results: list[dict[str, Any]], snaps: list[dict[str, Any]], final: bool = True) -> None:
    """Tables of the figures; with ``final``, the closing machine-readable line."""
    print()
    if snaps:
        print(f"{'cores':>5} {'tables':>6} {'rows':>9} {'snapshot/s':>11} {'readable/s':>11} "
              f"{'bare+stream/s':>13} {'ratio':>6} {'bare idle/s':>12} {'ratio':>6} "
              f"{'lag p50/max quiet':>18} {'lag p50/max snap':>17} {'reading ratio':>13}")  # fmt: skip
        for r in snaps:
            lag = (
                f"{r.get('lag_p50_quiet', 0):.1f}/{r.get('lag_max_quiet', 0):.1f}",
                f"{r.get('lag_p50_snapshot', 0):.1f}/{r.get('lag_max_snapshot', 0):.1f}",
            )
            print(f"{r['cores']:>5} {r['tables']:>6} {r['rows']:>9} "
                  f"{r['snapshot_rows_per_s']:>11.0f} {r.get('readable_rows_per_s', 0):>11.0f} "
                  f"{_bare_stream(r):>13.0f} {r['snapshot_rows_per_s'] / _bare_stream(r):>6.2f} "
                  f"{r['bare_read_rows_per_s']:>12.0f} "
                  f"{r['snapshot_rows_per_s'] / r['bare_read_rows_per_s']:>6.2f} "
                  f"{lag[0]:>18} {lag[1]:>17} {_reading_ratio(r):>13.2f}")  # fmt: skip
        print(json.dumps(snaps))
    line = ""
    if snaps:
        best = max(snaps, key=lambda r: r["snapshot_rows_per_s"])
        line = (f" snapshot_rows_per_s={best['snapshot_rows_per_s']:.0f} snapshot_ratio="
                f"{best['snapshot_rows_per_s'] / _bare_stream(best):.2f} snapshot_ratio_idle="
                f"{best['snapshot_rows_per_s'] / best['bare_read_rows_per_s']:.2f} "
                f"snapshot_reading_ratio={_reading_ratio(best):.2f}")  # fmt: skip
    if results:
        print(f"{'cores':>5} {'drain':>5} {'changes':>8} {'drain/s':>9} {'after 1st/s':>11} {'puller/s':>9} "
              f"{'mount/s':>9} {'mariadb-binlog/s':>16} {'drain/puller':>12} "
              f"{'1st/pulled/readable/ckpt s':>27}")  # fmt: skip
        for r in results:
            secs = (
                f"{r.get('first_s', 0):.1f}/{r.get('pulled_s', 0):.1f}/{r.get('drain_s', 0):.1f}/"
                f"{r.get('checkpoint_s', 0):.1f}"
            )
            print(f"{r['cores']:>5} {r.get('drain', ''):>5} {r['changes']:>8} "
                  f"{r['drain_rows_per_s']:>9.0f} "
                  f"{r.get('after_first_rows_per_s', 0):>11.0f} "
                  f"{r['puller_rows_per_s']:>9.0f} {r['mount_rows_per_s']:>9.0f} "
                  f"{r['mariadb_binlog_rows_per_s']:>16.0f} "
                  f"{r['drain_rows_per_s'] / r['puller_rows_per_s']:>12.2f} {secs:>27}")  # fmt: skip
        print(json.dumps(results))
    if not final:
        return
    if results:
        # per core count the median drain (by rate) of its repeats; the best core count's
        best = max(_median_drains(results), key=lambda r: r["drain_rows_per_s"])
        same = sorted(r["drain_rows_per_s"] for r in results if r["cores"] == best["cores"])
        line = (f"drain_rows_per_s={best['drain_rows_per_s']:.0f} "
                f"drain_ratio={best['drain_rows_per_s'] / best['puller_rows_per_s']:.2f} "
                f"drain_after_first_rows_per_s={best.get('after_first_rows_per_s', 0):.0f} "
                f"drain_runs={len(same)} drain_min_rows_per_s={same[0]:.0f} "
                f"drain_max_rows_per_s={same[-1]:.0f}{line}")  # fmt: skip
    print(line.strip())


def _median_drains(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per core count, its drain of median rate (the lower middle one of an even count)."""
    out = []
    for cores in sorted({r["cores"] for r in results}):
        runs = sorted((r for r in results if r["cores"] == cores),
                      key=lambda r: r["drain_rows_per_s"])  # fmt: skip
        out.append(runs[(len(runs) - 1) // 2])
    return out


if __name__ == "__main__":
    raise SystemExit(main())
