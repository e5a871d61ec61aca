"""Seconds of lag under a real OLTP workload, through the stack as a user runs it.

A private MariaDB runs sysbench ``oltp_read_write``; ``cdc-dagster server start`` runs a
private etcd, Spark Connect and ``dagster dev`` (daemon, owner sensor, ``mysql_puller`` and
``capture_tick`` runs); ``capture add`` registers the captures and ``changefeed create``
snapshots the tables, all through the CLI in subprocesses. Each sink (Delta, then
PostgreSQL) is measured in a run of its own, one changefeed at a time on the same stack and
upstream: two changefeeds at once would mean two binlog pullers decoding the same binlog on
this machine, each sink's figures carrying the other's cost.

For each sink:

- **load**: sysbench runs (unthrottled unless ``--rate``); a marker row is committed
  upstream every second and polled downstream (every 0.25 s): its *readable latency* is
  upstream commit -> row readable downstream; the changefeed's checkpoint is read from
  etcd every second: *checkpoint lag* = now - checkpoint. After ``--warmup`` s (from the
  first marker readable downstream), ``--duration`` s are measured.
- **tail**: the workload stops; one more marker: how long until the last row is readable.
- **idle**: nothing is written for ``--idle-s``; checkpoint lag every second.
- **backlog**: ``changefeed pause``, sysbench for ``--backlog-s``, ``changefeed resume``:
  the rows queued in the binlog over the time until the checkpoint passes the last of them.
- the replica equals the upstream (every sysbench table, by fingerprint).
- **where the time goes**, from the Dagster instance (sensor ticks, run records and run
  logs) and the change log (when each marker reached it, resolved).

Then, in the same run, the baselines without Dagster: the bare puller (binlog -> change
log: ``run_puller`` over a queued backlog of the same workload) and the bare sink (that
change log -> the sink: the data plane's mount + collapse + ``Sink.write``, no Spark).

    python bench/oltp_bench.py [--quick] [--sinks delta,postgres] [--duration 600]
        [--rate 0] [--threads 2] [--syncpoint-s 60] [--json PATH] [--keep]

``CDC_DAGSTER_*`` variables in the environment reach the stack (they are its knobs). The
last line is machine-readable; over several sinks each figure is the worst of them:
``readable_p50_s=... readable_p99_s=... checkpoint_p50_s=... checkpoint_p99_s=...
idle_lag_max_s=... upstream_rows_per_s=... replicated_rows_per_s=...``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cdc_dagster.mysql.puller import pulling  # noqa: E402
from cdc_dagster.testing.servers import PrivateMariaDB, PrivatePostgres  # noqa: E402
from scheduler_core.ts import MAX_TS, physical_ms  # noqa: E402

DB = "sbtest"
MARKER = "cdc_bench_marker"
SERVER_ID = 4242  # the changefeed's puller
BARE_SERVER_ID = 4343  # the bare puller's (two clients with one server id kick each other)
POLL_S = 0.25  # how often the markers are looked for downstream and in the change log
SAMPLE_S = 1.0  # how often the checkpoint is read
# Every figure a sink's column shows (NaN when its phase did not run: "-" in the table).
FIGURE_KEYS = (
    "upstream_rows_per_s", "replicated_rows_per_s", "readable_p50_s", "readable_p99_s",
    "readable_max_s", "checkpoint_p50_s", "checkpoint_p99_s", "checkpoint_max_s",
    "lag_trend_s_per_min", "startup_s", "tail_s", "idle_lag_p50_s", "idle_lag_max_s",
    "backlog_rows", "drain_s", "drain_rows_per_s", "replica_equal", "puller_stage_p50_s",
    "puller_stage_p99_s", "capture_stage_p50_s", "capture_stage_p99_s",
    "sensor_interval_p50_s", "sensor_interval_p90_s", "owner_tick_p50_s", "owner_tick_p90_s",
    "capture_runs", "capture_launch_p50_s", "capture_ticks_per_min",
    "capture_data_ticks_per_min", "capture_tick_p50_s", "capture_tick_p90_s", "prepare_p50_s",
    "commit_p50_s", "puller_runs", "puller_launch_p50_s", "puller_gap_p50_s", "puller_gap_max_s",
    "checkpoint_step_p50_s", "checkpoint_step_max_s", "syncpoint_holds", "syncpoint_hold_p50_s",
    "syncpoint_hold_max_s", "markers_written", "markers_readable",
)  # fmt: skip
LINE_KEYS = (
    "readable_p50_s",
    "readable_p99_s",
    "checkpoint_p50_s",
    "checkpoint_p99_s",
    "idle_lag_max_s",
    "upstream_rows_per_s",
    "replicated_rows_per_s",
)


class BenchError(RuntimeError):
    """The bench could not go on (the message says where it stopped and what it saw)."""


def say(message: str) -> None:
    """One progress line, timestamped."""
    print(f"[oltp-bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (nearest rank); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def spread(values: Sequence[float]) -> dict[str, float]:
    """p50, p90, p99 and max."""
    return {
        "p50": percentile(values, 0.5),
        "p90": percentile(values, 0.9),
        "p99": percentile(values, 0.99),
        "max": max(values) if values else math.nan,
        "n": float(len(values)),
    }


def slope_per_min(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of (time s, value) in value per minute (NaN below 3 points)."""
    if len(points) < 3:
        return math.nan
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return (
        60.0 * sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else 0.0
    )


def wait_for(what: str, check: Callable[[], bool], timeout_s: float, every_s: float = 0.5) -> float:
    """Poll ``check`` until true; the seconds it took. BenchError after ``timeout_s``."""
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout_s:
            raise BenchError(f"{what}: not reached in {timeout_s:.0f} s")
        time.sleep(every_s)
    return time.monotonic() - started


# ----------------------------------------------------------------------------- upstream
class Upstream:
    """The private MariaDB, sysbench against it, and the marker rows."""

    def __init__(self, base: Path, args: argparse.Namespace) -> None:
        self.db = PrivateMariaDB(base / "mariadb")
        self.args = args
        self.log_dir = base
        self.load: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.db.start()
        self.execute(
            f"CREATE DATABASE {DB}",
            f"CREATE TABLE {DB}.{MARKER} (id BIGINT PRIMARY KEY, committed_at DOUBLE NOT NULL)",
        )
        self._sysbench("prepare", log="sysbench-prepare.log").check_returncode()

    def uri(self, server_id: int = SERVER_ID) -> str:
        return self.db.uri(query=f"server-id={server_id}")

    def execute(self, *statements: str) -> None:
        conn = self.db.connect()
        try:
            with conn.cursor() as cur:
                for s in statements:
                    cur.execute(s)
        finally:
            conn.close()

    def scalar(self, query: str) -> Any:
        conn = self.db.connect()
        try:
            with conn.cursor() as cur:
                cur.execute(query)
                return cur.fetchone()[0]
        finally:
            conn.close()

    def row_changes(self) -> int:
        """Rows inserted, updated and deleted since the server started (MariaDB 10.11 has no
        Innodb_rows_*; Handler_write/update/delete count table rows, not temporary ones)."""
        conn = self.db.connect()
        try:
            with conn.cursor() as cur:
                cur.execute(
                    "SHOW GLOBAL STATUS WHERE Variable_name IN "
                    "('Handler_write', 'Handler_update', 'Handler_delete')"
                )
                return sum(int(v) for _, v in cur.fetchall())
        finally:
            conn.close()

    def gtid(self) -> str:
        return str(self.scalar("SELECT @@gtid_binlog_pos"))

    def binlog_row_changes(self, start: str, stop: str) -> int:
        """Row changes of ``DB``'s tables the binlog holds after GTID position ``start`` up to
        ``stop``, as ``mariadb-binlog`` decodes them: committed ones only (the Handler_*
        counters of ``row_changes`` also count the rows of transactions sysbench rolled
        back, a deadlock or a duplicate key between its threads)."""
        tool = shutil.which("mariadb-binlog") or shutil.which("mysqlbinlog") or "mariadb-binlog"
        files = sorted(str(p) for p in self.db.datadir.glob("binlog.[0-9]*"))
        out = subprocess.run(
            [tool, "--no-defaults", "--base64-output=decode-rows", "-v",
             f"--start-position={start}", f"--stop-position={stop}", *files],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        heads = tuple(f"### {op} `{DB}`." for op in ("INSERT INTO", "UPDATE", "DELETE FROM"))
        return sum(1 for line in out.splitlines() if line.startswith(heads))

    def _argv(self, command: str, seconds: float = 0) -> list[str]:
        a = self.args
        argv = ["sysbench", "oltp_read_write", "--db-driver=mysql", "--mysql-host=127.0.0.1",
                f"--mysql-port={self.db.port}", "--mysql-user=root", f"--mysql-db={DB}",
                f"--tables={a.tables}", f"--table-size={a.table_size}"]  # fmt: skip
        if command == "run":
            argv += [f"--threads={a.threads}", f"--rate={a.rate}", f"--time={int(seconds)}",
                     "--report-interval=10"]  # fmt: skip
        return [*argv, command]

    def _sysbench(self, command: str, seconds: float = 0, log: str = "") -> Any:
        with open(self.log_dir / (log or f"sysbench-{command}.log"), "ab") as out:
            return subprocess.run(self._argv(command, seconds), stdout=out, stderr=out, check=False)

    def start_load(self, seconds: float) -> None:
        """sysbench in the background for at most ``seconds`` (stop_load ends it sooner)."""
        with open(self.log_dir / "sysbench-run.log", "ab") as out:
            self.load = subprocess.Popen(self._argv("run", seconds), stdout=out, stderr=out)

    def stop_load(self) -> None:
        if self.load is not None and self.load.poll() is None:
            self.load.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.load.wait(10)
            if self.load.poll() is None:
                self.load.kill()
                self.load.wait()
        self.load = None

    def run_load(self, seconds: float) -> None:
        """sysbench for ``seconds``, waiting for it."""
        res = self._sysbench("run", seconds, log="sysbench-run.log")
        if res.returncode != 0:
            raise BenchError(f"sysbench run exited with {res.returncode}: see {self.log_dir}")

    def close(self) -> None:
        self.stop_load()
        self.db.cleanup()


class Markers:
    """One marker row committed upstream a second (while running), with its commit time."""

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self.committed: dict[int, float] = {}  # id -> wall time the commit returned
        self._next = int(upstream.scalar(f"SELECT COALESCE(MAX(id), 0) FROM {DB}.{MARKER}")) + 1
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._conn: Any = None

    def write(self) -> int:
        """Commit one marker now; its id."""
        with self._lock:
            if self._conn is None:
                self._conn = self.upstream.db.connect()
            mid = self._next
            self._next += 1
            with self._conn.cursor() as cur:
                cur.execute(f"INSERT INTO {DB}.{MARKER} VALUES (%s, %s)", (mid, time.time()))
            self.committed[mid] = time.time()
            return mid

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="markers", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(1.0 - time.time() % 1.0):
            self.write()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._thread = None

    def close(self) -> None:
        self.stop()
        if self._conn is not None:
            self._conn.close()


# ----------------------------------------------------------------------------- the stack
class Stack:
    """``cdc-dagster server start`` in a state dir, and the CLI against it."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.log = state.parent / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._ms: Any = None

    def _cmd(self, *argv: str) -> list[str]:
        return [sys.executable, "-m", "cdc_dagster.cli", "--state-dir", str(self.state), *argv]

    def start(self, timeout_s: float = 300.0) -> None:
        self.state.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                self._cmd("server", "start"), stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                start_new_session=True,
            )  # fmt: skip

        def up() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise BenchError(f"server start exited with {self.proc.returncode}: {self.tail()}")
            # "running; Ctrl-C ..." or, supervised, "running in the foreground, ..."
            return "[cdc-dagster] running" in self.log.read_text(errors="replace")

        took = wait_for("server start", up, timeout_s)
        say(f"stack up in {took:.0f} s: {self.tail(4).strip()}")
        os.environ["DAGSTER_HOME"] = str(self.state / "dagster")  # for reading the instance

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no server log)"

    def cli(self, *argv: str, timeout_s: float = 600.0) -> str:
        """One CLI command; its stdout (BenchError with stderr when it fails)."""
        res = subprocess.run(self._cmd(*argv), capture_output=True, text=True, cwd=REPO,
                             timeout=timeout_s, check=False)  # fmt: skip
        if res.returncode != 0:
            raise BenchError(f"cdc-dagster {' '.join(argv)}: {res.stderr.strip()}")
        return res.stdout

    def metastore(self) -> Any:
        if self._ms is None:
            from cdc_dagster.metastore import connect

            self._ms = connect(None, self.state)
        return self._ms

    def stop(self) -> None:
        if self._ms is not None:
            with contextlib.suppress(Exception):
                self._ms.close()
            self._ms = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                say("server start did not stop in 120 s; `server stop`")
                subprocess.run(self._cmd("server", "stop"), cwd=REPO, check=False)
                self.proc.kill()
        self.proc = None


# ----------------------------------------------------------------------------- probes
class DeltaProbe:
    """Marker ids readable in the Delta table (new data files of each new version)."""

    def __init__(self, root: Path) -> None:
        from cdc_dagster.sinks.delta_paths import table_path

        self.path = table_path(str(root), DB, MARKER)
        self.table: Any = None
        self.seen_files: set[str] = set()

    def poll(self) -> list[int]:
        import pyarrow.parquet as pq
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        if self.table is None:
            try:
                self.table = DeltaTable(self.path)
            except TableNotFoundError:
                return []
        else:
            self.table.update_incremental()
        ids: list[int] = []
        for uri in self.table.file_uris():
            if uri not in self.seen_files:
                self.seen_files.add(uri)
                path = uri.removeprefix("file://")
                ids += pq.read_table(path, columns=["id"]).column("id").to_pylist()
        return ids

    def close(self) -> None:
        self.table = None


class PostgresProbe:
    """Marker ids readable in PostgreSQL."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.conn: Any = None
        self.high = 0

    def poll(self) -> list[int]:
        import psycopg

        if self.conn is None:
            self.conn = psycopg.connect(self.dsn, autocommit=True)
        try:
            rows = self.conn.execute(
                f'SELECT id FROM "{DB}"."{MARKER}" WHERE id > %s', (self.high,)
            ).fetchall()
        except psycopg.errors.UndefinedTable:
            return []
        ids = [int(r[0]) for r in rows]
        self.high = max([self.high, *ids])
        return ids

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


class ChangeLogProbe:
    """Marker ids that reached the change log with a resolved mark at or above them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.log: Any = None
        self.table_id = 0
        self.id_column = ""
        self.done_ts = 0
        self.commit_ts: dict[int, int] = {}  # marker id -> its commit ts

    def _open(self) -> bool:
        from cdc_dagster.upstream.changelog import ChangeLog, ChangeLogError

        if not (self.root / "FORMAT").exists():
            return False
        try:
            self.log = self.log or ChangeLog(self.root)
            tables = self.log.tables_at(MAX_TS)
        except ChangeLogError:
            return False
        for tid, schema in tables.items():
            if (schema.database, schema.table) == (DB, MARKER):
                self.table_id = tid
                self.id_column = next(f"c{c.id}" for c in schema.columns if c.name == "id")
                return True
        return False

    def poll(self) -> list[int]:
        import pyarrow.compute as pc

        if not self.table_id and not self._open():
            return []
        resolved = self.log.table_resolved_ts(self.table_id)
        ids: list[int] = []
        for f in self.log.data_files(self.table_id, self.done_ts, resolved):
            # the change log's reader: binlog event files are mounted into columns there
            rows = self.log.read_data_file(f).select([self.id_column, "_commit_ts"])
            ts = rows.column("_commit_ts")
            rows = rows.filter(pc.and_(pc.greater(ts, self.done_ts), pc.less_equal(ts, resolved)))
            for mid, cts in zip(
                rows.column(self.id_column).to_pylist(), rows.column("_commit_ts").to_pylist(),
                strict=True,
            ):  # fmt: skip
                self.commit_ts.setdefault(int(mid), int(cts))
                ids.append(int(mid))
        self.done_ts = max(self.done_ts, resolved)
        return ids

    def close(self) -> None:
        self.log = None


@dataclass
class Sample:
    """One reading of the changefeed's progress in etcd."""

    wall: float
    checkpoint_ts: int
    resolved_ts: int
    state: str

    @property
    def lag_s(self) -> float:
        return self.wall - physical_ms(self.checkpoint_ts) / 1000.0


@dataclass
class Observed:
    """What the sampler saw: when each marker was seen where, and the checkpoint samples."""

    readable: dict[int, float] = field(default_factory=dict)  # marker id -> first seen
    in_changelog: dict[int, float] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class Sampler:
    """A thread: the probes every POLL_S, the checkpoint every SAMPLE_S."""

    def __init__(self, stack: Stack, changefeed_id: str, downstream: Any, changelog: Any) -> None:
        self.stack, self.cf = stack, changefeed_id
        self.downstream, self.changelog = downstream, changelog
        self.seen = Observed()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        next_sample = 0.0
        while not self._stop.wait(POLL_S - time.time() % POLL_S):
            now = time.time()
            self._probe(self.downstream, self.seen.readable, now)
            self._probe(self.changelog, self.seen.in_changelog, now)
            if now >= next_sample:
                next_sample = now + SAMPLE_S - 0.05
                self._sample(now)

    def _probe(self, probe: Any, into: dict[int, float], now: float) -> None:
        try:
            for mid in probe.poll():
                into.setdefault(mid, now)
        except Exception as exc:  # a probe hiccup is noted; the bench goes on
            self.seen.errors.append(f"{type(probe).__name__}: {type(exc).__name__}: {exc}")

    def _sample(self, now: float) -> None:
        try:
            status = self.stack.metastore().changefeeds.get(self.cf).status
        except Exception as exc:  # etcd slow under load: a missing sample
            self.seen.errors.append(f"checkpoint: {type(exc).__name__}: {exc}")
            return
        self.seen.samples.append(
            Sample(now, status.checkpoint_ts, status.resolved_ts, str(status.state))
        )

    def latest(self) -> Sample | None:
        return self.seen.samples[-1] if self.seen.samples else None

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        for probe in (self.downstream, self.changelog):
            probe.close()


# ----------------------------------------------------------------------------- sinks
@dataclass
class Target:
    """One downstream: its sink URI, its marker probe, and its rows of a table."""

    name: str
    uri: str
    probe: Callable[[], Any]
    rows: Callable[[str], list[tuple]]


def delta_target(root: Path) -> Target:
    def rows(table: str) -> list[tuple]:
        from cdc_dagster.sinks.delta import read_table_at
        from cdc_dagster.sinks.delta_paths import table_location

        data = read_table_at(str(root), table_location(DB, table))
        cols = [data.column(n).to_pylist() for n in ("id", "k", "c", "pad")]
        return list(zip(*cols, strict=True))

    return Target("delta", f"delta://{root}", lambda: DeltaProbe(root), rows)


def postgres_target(pg: PrivatePostgres, dbname: str) -> Target:
    def rows(table: str) -> list[tuple]:
        import psycopg

        with psycopg.connect(pg.dsn(dbname), autocommit=True) as conn:
            return [tuple(r) for r in conn.execute(f'SELECT id, k, c, pad FROM "{DB}"."{table}"')]

    return Target("postgres", pg.uri(dbname), lambda: PostgresProbe(pg.dsn(dbname)), rows)


def fingerprint(rows: list[tuple]) -> str:
    """Order-independent: row count and the XOR of each row's hash."""
    acc = 0
    for r in rows:
        acc ^= int.from_bytes(hashlib.sha256(repr(tuple(r)).encode()).digest()[:16], "big")
    return f"{len(rows)}:{acc:032x}"


def replica_differences(up: Upstream, target: Target, tables: int) -> list[str]:
    """The sysbench tables whose replica differs from the upstream (empty: equal)."""
    out = []
    for i in range(1, tables + 1):
        name = f"sbtest{i}"
        conn = up.db.connect()
        try:
            with conn.cursor() as cur:
                cur.execute(f"SELECT id, k, c, pad FROM {DB}.{name}")
                upstream = [tuple(r) for r in cur.fetchall()]
        finally:
            conn.close()
        here, there = fingerprint(upstream), fingerprint(target.rows(name))
        if here != there:
            out.append(f"{name}: upstream {here}, {target.name} {there}")
    return out


# ----------------------------------------------------------------------------- one sink
@dataclass
class Run:
    """What one sink's measurement needs."""

    args: argparse.Namespace
    up: Upstream
    stack: Stack
    base: Path


def create_changefeed(run: Run, cf: str, target: Target) -> None:
    config = run.base / f"{cf}.toml"
    if run.args.syncpoint_s:
        config.write_text(f'sync-point-interval = "{run.args.syncpoint_s}s"\n')
    else:
        config.write_text("enable-sync-point = false\n")
    out = run.stack.cli(
        "changefeed", "create", "-c", cf, "--upstream-uri", run.up.uri(),
        "--sink-uri", target.uri, "--filter", f"{DB}.*", "--config", str(config),
    )  # fmt: skip
    say(" / ".join(line.strip() for line in out.splitlines() if "snapshot " not in line))


def load_phase(run: Run, markers: Markers, sampler: Sampler, fig: dict[str, Any]) -> tuple:
    """sysbench + markers until the first marker is readable, then warm-up and the window."""
    a = run.args
    created = time.time()
    run.up.start_load(a.startup_timeout_s + a.warmup + a.duration + 60)
    markers.start()
    wait_for(
        "the first marker readable downstream", lambda: bool(sampler.seen.readable),
        a.startup_timeout_s,
    )  # fmt: skip
    fig["startup_s"] = time.time() - created
    say(f"first marker readable {fig['startup_s']:.0f} s after create; warming up {a.warmup:.0f} s")
    time.sleep(a.warmup)
    t0, c0 = time.time(), run.up.row_changes()
    say(f"measuring {a.duration:.0f} s")
    time.sleep(a.duration)
    t1, c1 = time.time(), run.up.row_changes()
    run.up.stop_load()
    markers.stop()
    fig["upstream_rows_per_s"] = (c1 - c0) / (t1 - t0)
    return t0, t1


def tail_and_idle(run: Run, markers: Markers, sampler: Sampler, fig: dict[str, Any]) -> tuple:
    """The last row's latency after the workload stopped; then the idle minute. BenchError
    when the last row is not readable in --catchup-timeout-s (the replica fell behind)."""
    last = markers.write()
    wait_for(
        "the workload's last marker readable", lambda: last in sampler.seen.readable,
        run.args.catchup_timeout_s,
    )  # fmt: skip
    fig["tail_s"] = sampler.seen.readable[last] - markers.committed[last]
    say(
        f"last row readable {fig['tail_s']:.1f} s after the workload ended; idle {run.args.idle_s:.0f} s"
    )
    i0 = time.time()
    time.sleep(run.args.idle_s)
    return i0, time.time()


def backlog_phase(
    run: Run, cf: str, markers: Markers, sampler: Sampler, fig: dict[str, Any]
) -> None:
    """Pause; sysbench for backlog_s into the binlog; resume; until the checkpoint passes it."""
    run.stack.cli("changefeed", "pause", "-c", cf)
    # Paused, the puller run stops reading at once (and holds for a resume:
    # CDC_DAGSTER_MYSQL_PAUSE_HOLD_S); its lock on the change log goes with the reading.
    root = sampler.changelog.root
    waited = wait_for("the puller to stop pulling after pause", lambda: not pulling(root), 120,
                      0.5)  # fmt: skip
    say(f"paused (puller stopped after {waited:.0f} s); queueing {run.args.backlog_s:.0f} s")
    b0 = run.up.row_changes()
    run.up.run_load(run.args.backlog_s)
    last = markers.write()
    fig["backlog_rows"] = run.up.row_changes() - b0
    resumed = time.time()
    run.stack.cli("changefeed", "resume", "-c", cf)

    def caught_up() -> bool:
        ts = sampler.changelog.commit_ts.get(last)
        sample = sampler.latest()
        return ts is not None and sample is not None and sample.checkpoint_ts >= ts

    wait_for("the backlog drained (checkpoint past it)", caught_up, run.args.catchup_timeout_s)
    done = sampler.latest().wall  # type: ignore[union-attr]
    fig["drain_s"] = done - resumed
    fig["drain_rows_per_s"] = fig["backlog_rows"] / max(fig["drain_s"], 1e-9)
    say(f"{fig['backlog_rows']} queued row changes drained in {fig['drain_s']:.1f} s")


def latency_figures(
    markers: Markers, seen: Observed, window: tuple[float, float], idle: tuple[float, float]
) -> dict[str, Any]:
    """Readable latency per marker, checkpoint lag per sample, the stages of each marker."""
    t0, t1 = window
    ids = [m for m, at in markers.committed.items() if t0 <= at <= t1]
    readable = [seen.readable[m] - markers.committed[m] for m in ids if m in seen.readable]
    puller = [seen.in_changelog[m] - markers.committed[m] for m in ids if m in seen.in_changelog]
    capture = [
        seen.readable[m] - seen.in_changelog[m]
        for m in ids
        if m in seen.readable and m in seen.in_changelog
    ]
    lag = [s for s in seen.samples if t0 <= s.wall <= t1]
    idle_lag = [s.lag_s for s in seen.samples if idle[0] <= s.wall <= idle[1]]
    r, c, i = spread(readable), spread([s.lag_s for s in lag]), spread(idle_lag)
    p, k = spread(puller), spread(capture)
    return {
        "markers_written": len(ids),
        "markers_readable": len(readable),
        "readable_p50_s": r["p50"], "readable_p99_s": r["p99"], "readable_max_s": r["max"],
        "checkpoint_p50_s": c["p50"], "checkpoint_p99_s": c["p99"], "checkpoint_max_s": c["max"],
        "lag_trend_s_per_min": slope_per_min([(s.wall - t0, s.lag_s) for s in lag]),
        "idle_lag_p50_s": i["p50"], "idle_lag_max_s": i["max"],
        "puller_stage_p50_s": p["p50"], "puller_stage_p99_s": p["p99"],
        "capture_stage_p50_s": k["p50"], "capture_stage_p99_s": k["p99"],
    }  # fmt: skip


def checkpoint_steps(samples: Sequence[Sample], syncpoint_s: int) -> dict[str, Any]:
    """How often the checkpoint moves, and how long it sat on syncpoint ts."""
    moves = [b.wall for a, b in itertools.pairwise(samples) if b.checkpoint_ts != a.checkpoint_ts]
    steps = [b - a for a, b in itertools.pairwise(moves)]
    holds: list[float] = []
    if syncpoint_s:
        run: list[Sample] = []
        for s in [*samples, None]:
            if s is not None and run and s.checkpoint_ts == run[0].checkpoint_ts:
                run.append(s)
                continue
            if run and _on_syncpoint(run[0].checkpoint_ts, syncpoint_s) and len(run) > 1:
                holds.append(run[-1].wall - run[0].wall)
            run = [s] if s is not None else []
    return {
        "checkpoint_step_p50_s": percentile(steps, 0.5),
        "checkpoint_step_max_s": max(steps) if steps else math.nan,
        "syncpoint_holds": len(holds),
        "syncpoint_hold_p50_s": percentile(holds, 0.5),
        "syncpoint_hold_max_s": max(holds) if holds else math.nan,
    }


def _on_syncpoint(ts: int, syncpoint_s: int) -> bool:
    return ts & ((1 << 18) - 1) == 0 and physical_ms(ts) % (syncpoint_s * 1000) == 0


def replicated_rows_per_s(changelog: Path, samples: Sequence[Sample], window: tuple) -> float:
    """Change-log rows the checkpoint passed during the window, per second of it."""
    import pyarrow.compute as pc

    from cdc_dagster.upstream.changelog import ChangeLog

    inside = [s for s in samples if window[0] <= s.wall <= window[1]]
    if len(inside) < 2:
        return math.nan
    lo, hi = inside[0].checkpoint_ts, inside[-1].checkpoint_ts
    log, rows = ChangeLog(changelog), 0
    for tid in log.tables_at(MAX_TS):
        for f in log.data_files(tid, lo, hi):
            ts = log.read_data_file(f).column("_commit_ts")  # rows (an event holds several)
            rows += pc.sum(pc.and_(pc.greater(ts, lo), pc.less_equal(ts, hi))).as_py() or 0
    return rows / (inside[-1].wall - inside[0].wall)


# ----------------------------------------------------------------------------- Dagster
# A follow tick's line: "tick 3: ...; 1.20 s", or (self ticks) "tick 3 (new resolved data):
# ...; 1.20 s (prepare 0.50 s, commit 0.70 s)".
_TICK = re.compile(
    r"^tick \d+(?: \((?P<why>[^)]*)\))?: .*?; (?P<s>\d+\.\d+) s"
    r"(?: \(prepare (?P<p>\d+\.\d+) s, commit (?P<c>\d+\.\d+) s\))?$"
)
_TOOK = re.compile(r"^(prepare|commit) took (\d+\.\d+) s(?:\n|$)")  # then its lines
_EVENTS = {
    "PIPELINE_ENQUEUED": "enqueued",
    "PIPELINE_STARTING": "starting",
    "PIPELINE_START": "started",
    "PIPELINE_SUCCESS": "ended",
    "PIPELINE_FAILURE": "ended",
    "STEP_START": "step_start",
    "STEP_SUCCESS": "step_end",
}


@dataclass
class RunTimes:
    """One run's moments (first of each kind) and its timed log lines."""

    job: str
    at: dict[str, float]
    lines: list[tuple[float, str]]


def run_times(window: tuple[float, float]) -> list[RunTimes]:
    """capture_tick and mysql_puller runs that overlap the window, with their events."""
    import datetime as dt

    from dagster import DagsterInstance, RunsFilter

    after = dt.datetime.fromtimestamp(window[0] - 1800, tz=dt.UTC)
    out = []
    with DagsterInstance.get() as inst:
        for job in ("capture_tick", "mysql_puller"):
            records = inst.get_run_records(RunsFilter(job_name=job, created_after=after))
            for rec in records:
                at: dict[str, float] = {}
                lines: list[tuple[float, str]] = []
                for entry in inst.all_logs(rec.dagster_run.run_id):
                    ev = entry.dagster_event
                    if ev is not None and ev.event_type_value in _EVENTS:
                        at.setdefault(_EVENTS[ev.event_type_value], entry.timestamp)
                    elif ev is None and entry.user_message:
                        lines.append((entry.timestamp, entry.user_message.split("\n", 1)[0]))
                end = at.get("ended", math.inf)
                if at.get("enqueued", math.inf) <= window[1] and end >= window[0]:
                    out.append(RunTimes(job, at, lines))
    return out


def sensor_ticks(window: tuple[float, float]) -> list[tuple[float, float]]:
    """(start, end) of the owner sensor's ticks that started in the window."""
    from dagster import DagsterInstance

    out = []
    with DagsterInstance.get() as inst:
        for state in inst.all_instigator_state():
            if state.name != "cdc_owner":
                continue
            for tick in inst.get_ticks(state.instigator_origin_id, state.selector_id, limit=5000):
                end = getattr(tick, "end_timestamp", None)
                if end and window[0] <= tick.timestamp <= window[1]:
                    out.append((tick.timestamp, end))
    return sorted(out)


def _inside(t: float | None, window: tuple[float, float]) -> bool:
    return t is not None and window[0] <= t <= window[1]


def where_time_goes(window: tuple[float, float]) -> dict[str, Any]:
    """Sensor interval and tick, run launches, capture ticks, puller runs and their gaps."""
    ticks = sensor_ticks(window)
    starts = [s for s, _ in ticks]
    runs = run_times(window)
    caps = [r for r in runs if r.job == "capture_tick"]
    pulls = sorted(
        (r for r in runs if r.job == "mysql_puller"), key=lambda r: r.at.get("step_start", 0)
    )
    launch = [r.at["started"] - r.at["enqueued"] for r in caps
              if "enqueued" in r.at and _inside(r.at.get("started"), window)]  # fmt: skip
    matches = [m for r in caps for t, line in r.lines
               if _inside(t, window) and (m := _TICK.match(line))]  # fmt: skip
    tick_s = [float(m.group("s")) for m in matches]
    took: dict[str, list[float]] = {"prepare": [], "commit": []}
    for m in matches:
        if m.group("p"):
            took["prepare"].append(float(m.group("p")))
            took["commit"].append(float(m.group("c")))
    for r in caps:
        for t, line in r.lines:
            if _inside(t, window) and (m := _TOOK.match(line)):
                took[m.group(1)].append(float(m.group(2)))
    on_data = sum(1 for m in matches if m.group("why") == "new resolved data")
    n_ticks = len(tick_s) + sum(1 for r in caps for t, line in r.lines
                                if _inside(t, window) and line.startswith("commit took"))  # fmt: skip
    p_launch = [r.at["started"] - r.at["enqueued"] for r in pulls
                if "enqueued" in r.at and _inside(r.at.get("started"), window)]  # fmt: skip
    gaps = [b.at["step_start"] - a.at["step_end"] for a, b in itertools.pairwise(pulls)
            if "step_end" in a.at and "step_start" in b.at and _inside(b.at["step_start"], window)]  # fmt: skip
    minutes = (window[1] - window[0]) / 60.0
    return {
        "sensor_interval_p50_s": percentile([b - a for a, b in itertools.pairwise(starts)], 0.5),
        "sensor_interval_p90_s": percentile([b - a for a, b in itertools.pairwise(starts)], 0.9),
        "owner_tick_p50_s": percentile([e - s for s, e in ticks], 0.5),
        "owner_tick_p90_s": percentile([e - s for s, e in ticks], 0.9),
        "capture_runs": len(caps),
        "capture_launch_p50_s": percentile(launch, 0.5),
        "capture_ticks_per_min": n_ticks / max(minutes, 1e-9),  # over all captures
        "capture_data_ticks_per_min": on_data / max(minutes, 1e-9),  # started on new data
        "capture_tick_p50_s": percentile(tick_s, 0.5),
        "capture_tick_p90_s": percentile(tick_s, 0.9),
        "prepare_p50_s": percentile(took["prepare"], 0.5),
        "commit_p50_s": percentile(took["commit"], 0.5),
        "puller_runs": len(pulls),
        "puller_launch_p50_s": percentile(p_launch, 0.5),
        "puller_gap_p50_s": percentile(gaps, 0.5),
        "puller_gap_max_s": max(gaps) if gaps else math.nan,
    }


def measure_sink(run: Run, target: Target) -> dict[str, Any]:
    """One changefeed into ``target``: load, tail, idle, backlog; then removed."""
    cf = f"oltp-{target.name}"
    say(f"=== {target.name}: changefeed {cf}")
    create_changefeed(run, cf, target)
    changelog = run.stack.state / "mysql" / cf
    sampler = Sampler(run.stack, cf, target.probe(), ChangeLogProbe(changelog))
    markers = Markers(run.up)
    fig: dict[str, Any] = {"sink": target.name}
    sampler.start()
    window, idle = (0.0, 0.0), (0.0, 0.0)
    try:
        window = load_phase(run, markers, sampler, fig)
        idle = tail_and_idle(run, markers, sampler, fig)
        backlog_phase(run, cf, markers, sampler, fig)
        diffs = replica_differences(run.up, target, run.args.tables)
        fig["replica_equal"] = not diffs
        for d in diffs:
            say(f"replica differs: {d}")
    except BenchError as exc:  # the figures so far still say something: report them
        fig["error"] = str(exc)
        say(f"{target.name}: stopped early: {exc}")
    finally:
        run.up.stop_load()
        markers.close()
        sampler.stop()
    seen = sampler.seen
    for err in sorted(set(seen.errors))[:5]:
        say(f"sampler noted ({seen.errors.count(err)}x): {err}")
    fig["sampler_errors"] = len(seen.errors)
    fig.update(latency_figures(markers, seen, window, idle))
    fig.update(checkpoint_steps([s for s in seen.samples if window[0] <= s.wall <= window[1]],
                                run.args.syncpoint_s))  # fmt: skip
    fig["replicated_rows_per_s"] = (
        replicated_rows_per_s(changelog, seen.samples, window) if window[1] else math.nan
    )
    if window[1]:
        fig.update(where_time_goes(window))
    fig["samples"] = [
        (round(s.wall - window[0], 2), round(s.lag_s, 3), s.checkpoint_ts) for s in seen.samples
    ]
    run.stack.cli("changefeed", "remove", "-c", cf)
    return {k: fig.get(k, math.nan) for k in FIGURE_KEYS} | fig


# ----------------------------------------------------------------------------- baselines
def bare_puller(run: Run) -> tuple[Path, dict[str, float]]:
    """binlog -> change log without Dagster: the same workload queued, then pulled."""
    from cdc_dagster.mysql.puller import PullerConfig, run_puller

    root = run.base / "bare-changelog"
    cfg = PullerConfig(run.up.uri(BARE_SERVER_ID), str(root), (f"{DB}.*",), snapshot=False)
    here = run.up.gtid()
    run_puller(cfg, stop_after=lambda s: s.position == here)  # starts at the current position
    run.up.run_load(run.args.backlog_s)
    target = run.up.gtid()
    queued = run.up.binlog_row_changes(here, target)
    started = time.perf_counter()
    stats = run_puller(cfg, stop_after=lambda s: s.position == target)
    took = time.perf_counter() - started
    rows = changelog_rows(root)  # a binlog row event holds one or more row changes
    say(
        f"bare puller: {rows} rows in {stats.row_events} row events ({queued} row changes "
        f"upstream) in {took:.1f} s"
    )
    return root, {
        "bare_rows": rows,
        "bare_upstream_rows": queued,
        "bare_puller_rows_per_s": rows / took,
    }


def changelog_rows(root: Path) -> int:
    """Row changes in the change log at ``root`` (its reader mounts binlog event files)."""
    from cdc_dagster.upstream.changelog import ChangeLog

    log = ChangeLog(root)
    return sum(
        log.read_data_file(f).num_rows
        for tid in log.tables_at(MAX_TS)
        for f in log.data_files(tid, 0, MAX_TS)
    )


def bare_sink(changelog: Path, target: Target, sink: Any) -> float:
    """change log -> sink without Dagster or Spark, in the batches a capture tick would give
    the sink (per table, one second of commit ts each): the data plane's mount and collapse,
    then ``Sink.write``. Change rows per second."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from cdc_dagster.pipeline.spark_tasks import collapse, mount
    from cdc_dagster.upstream.changelog import ChangeLog

    log = ChangeLog(changelog)
    for record in log.ddl_records():
        sink.apply_ddl("bare", record, {t: None for t in record.table_ids})
    rows, batches, started = 0, 0, time.perf_counter()
    for tid, schema in log.tables_at(MAX_TS).items():
        files = log.data_files(tid, 0, MAX_TS)
        if not files:
            continue
        data = pa.concat_tables([log.read_data_file(f) for f in files])
        data = data.sort_by([("_commit_ts", "ascending"), ("_seq", "ascending")])
        rows += data.num_rows
        token, start = sink.acquire("bare", schema), 0
        seconds = pc.divide(pc.shift_right(data.column("_commit_ts"), 18), 1000)
        for second in sorted(set(seconds.to_pylist())):
            chunk = data.filter(pc.equal(seconds, second))
            end = chunk.column("_commit_ts")[-1].as_py()
            batch = collapse(schema, mount(schema, chunk), start, end)
            sink.write("bare", schema, batch, start, end, token)
            start, batches = end, batches + 1
    took = time.perf_counter() - started
    say(f"bare sink {target.name}: {rows} change rows in {batches} batches in {took:.1f} s")
    return rows / took


def baselines(run: Run, pg: PrivatePostgres | None) -> dict[str, float]:
    """The bare puller, then the bare sinks over what it pulled."""
    root, out = bare_puller(run)
    for name in run.args.sinks:
        if name == "delta":
            from cdc_dagster.sinks.delta import DeltaSink

            lake = run.base / "bare-lake"
            out["bare_sink_delta_rows_per_s"] = bare_sink(
                root, delta_target(lake), DeltaSink(str(lake))
            )
        elif pg is not None:
            from cdc_dagster.sinks.postgres import PostgresSink

            create_pg_database(pg, "bare")
            sink = PostgresSink(pg.uri("bare"))
            try:
                out["bare_sink_postgres_rows_per_s"] = bare_sink(
                    root, postgres_target(pg, "bare"), sink
                )
            finally:
                sink.close()
    return out


def create_pg_database(pg: PrivatePostgres, name: str) -> None:
    import psycopg

    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')


# ----------------------------------------------------------------------------- report
def _f(value: Any, digits: int = 1) -> str:
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, int) or digits == 0:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def _trio(fig: dict[str, Any], stem: str, last: str = "max") -> str:
    return " / ".join(_f(fig.get(f"{stem}_{q}_s")) for q in ("p50", "p99", last))


ROWS: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
    ("upstream row changes/s", lambda f: _f(f["upstream_rows_per_s"], 0)),
    ("replicated rows/s", lambda f: _f(f["replicated_rows_per_s"], 0)),
    ("readable latency p50/p99/max s", lambda f: _trio(f, "readable")),
    ("checkpoint lag p50/p99/max s", lambda f: _trio(f, "checkpoint")),
    ("checkpoint lag trend s/min", lambda f: _f(f["lag_trend_s_per_min"], 2)),
    ("first row readable after create s", lambda f: _f(f["startup_s"])),
    ("last row readable after load s", lambda f: _f(f["tail_s"])),
    ("idle checkpoint lag p50/max s", lambda f: f"{_f(f['idle_lag_p50_s'])} / {_f(f['idle_lag_max_s'])}"),
    ("backlog row changes queued", lambda f: _f(f["backlog_rows"], 0)),
    ("backlog drain s / rows/s", lambda f: f"{_f(f['drain_s'])} / {_f(f['drain_rows_per_s'], 0)}"),
    ("replica equals upstream", lambda f: _f(f["replica_equal"])),
    ("-- where the time goes", lambda f: ""),
    ("puller stage (commit->change log) p50/p99", lambda f: f"{_f(f['puller_stage_p50_s'])} / {_f(f['puller_stage_p99_s'])}"),
    ("capture stage (change log->readable) p50/p99", lambda f: f"{_f(f['capture_stage_p50_s'])} / {_f(f['capture_stage_p99_s'])}"),
    ("sensor interval p50/p90 s", lambda f: f"{_f(f['sensor_interval_p50_s'])} / {_f(f['sensor_interval_p90_s'])}"),
    ("owner sensor tick p50/p90 s", lambda f: f"{_f(f['owner_tick_p50_s'], 2)} / {_f(f['owner_tick_p90_s'], 2)}"),
    ("capture runs / launch p50 s", lambda f: f"{_f(f['capture_runs'])} / {_f(f['capture_launch_p50_s'])}"),
    ("capture ticks/min: all / on new data", lambda f: f"{_f(f['capture_ticks_per_min'])} / {_f(f.get('capture_data_ticks_per_min'))}"),
    ("capture tick p50/p90 s", lambda f: f"{_f(f['capture_tick_p50_s'], 2)} / {_f(f['capture_tick_p90_s'], 2)}"),
    ("  prepare / commit p50 s", lambda f: f"{_f(f['prepare_p50_s'], 2)} / {_f(f['commit_p50_s'], 2)}"),
    ("puller runs / launch p50 s", lambda f: f"{_f(f['puller_runs'])} / {_f(f['puller_launch_p50_s'])}"),
    ("puller gap between runs p50/max s", lambda f: f"{_f(f['puller_gap_p50_s'])} / {_f(f['puller_gap_max_s'])}"),
    ("checkpoint moves every p50/max s", lambda f: f"{_f(f['checkpoint_step_p50_s'])} / {_f(f['checkpoint_step_max_s'])}"),
    ("held at syncpoints: n / p50 / max s", lambda f: f"{_f(f['syncpoint_holds'])} / {_f(f['syncpoint_hold_p50_s'])} / {_f(f['syncpoint_hold_max_s'])}"),
]  # fmt: skip


def table(
    figures: Sequence[dict[str, Any]], base: dict[str, float], args: argparse.Namespace
) -> str:
    """The printed table: one column per sink, then the baselines."""
    width = max(len(label) for label, _ in ROWS) + 2
    head = "".join(f"{f['sink']:>22}" for f in figures)
    lines = [f"{'':<{width}}{head}"]
    for label, show in ROWS:
        lines.append(f"{label:<{width}}" + "".join(f"{show(f):>22}" for f in figures))
    for f in figures:
        if f.get("error"):
            lines.append(f"{f['sink']} stopped early: {f['error']}")
    lines.append("-- baselines, same run, no Dagster")
    lines.append(
        f"{'bare puller (binlog->change log) rows/s':<{width}}{_f(base.get('bare_puller_rows_per_s'), 0):>22}"
    )
    for f in figures:
        key = f"bare_sink_{f['sink']}_rows_per_s"
        lines.append(
            f"{'bare sink (change log->' + f['sink'] + ') rows/s':<{width}}{_f(base.get(key), 0):>22}"
        )
    for f in figures:
        ratio = (
            f["drain_rows_per_s"] / base["bare_puller_rows_per_s"]
            if base.get("bare_puller_rows_per_s")
            else math.nan
        )
        lines.append(
            f"{'backlog drain / bare puller (' + f['sink'] + ')':<{width}}{_f(ratio, 2):>21}x"
        )
    return "\n".join(lines)  # fmt: skip


def line(figures: Sequence[dict[str, Any]]) -> str:
    """The machine-readable line: each figure the worst over the sinks measured."""

    def worst(key: str) -> float:
        values = [float(f[key]) for f in figures]
        if not values or any(math.isnan(v) for v in values):
            return math.nan  # a sink stopped early: no worst to tell
        return min(values) if key.endswith("rows_per_s") else max(values)

    parts = [f"{k}={worst(k):.1f}" if "rows" in k else f"{k}={worst(k):.2f}" for k in LINE_KEYS]
    return " ".join([*parts, "sinks=" + ",".join(f["sink"] for f in figures)])


# ----------------------------------------------------------------------------- main
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a few minutes: short phases, small tables")
    p.add_argument("--sinks", default="delta,postgres", help="comma list: delta, postgres")
    p.add_argument("--duration", type=float, default=600.0, help="measured seconds under load")
    p.add_argument(
        "--warmup", type=float, default=60.0, help="seconds after the first marker is readable"
    )
    p.add_argument("--idle-s", type=float, default=60.0, help="seconds with no upstream writes")
    p.add_argument("--backlog-s", type=float, default=60.0, help="seconds of workload while paused")
    p.add_argument("--tables", type=int, default=4, help="sysbench tables")
    p.add_argument("--table-size", type=int, default=10_000, help="rows per sysbench table")
    p.add_argument("--threads", type=int, default=2, help="sysbench threads")
    p.add_argument(
        "--rate",
        type=int,
        default=None,
        help="sysbench transactions/s, 4 row changes each (0: unthrottled; default 100, "
        "--quick 50). Unthrottled, sysbench outruns the binlog puller on a busy 2-core machine "
        "(250 did with others' load at 15) and the figures measure that backlog, not the lag",
    )
    p.add_argument(
        "--syncpoint-s", type=int, default=60, help="the changefeed's syncpoint interval (0: off)"
    )
    p.add_argument("--startup-timeout-s", type=float, default=600.0)
    p.add_argument("--catchup-timeout-s", type=float, default=900.0)
    p.add_argument("--no-baselines", action="store_true", help="skip the bare puller and sinks")
    p.add_argument("--json", type=Path, help="write every figure (and the lag samples) here")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (logs, state)")
    args = p.parse_args(argv)
    if args.quick:
        args.duration, args.warmup, args.idle_s, args.backlog_s = 45.0, 15.0, 15.0, 10.0
        args.table_size = 2_000
    if args.rate is None:
        args.rate = 50 if args.quick else 100
    args.sinks = [s.strip() for s in args.sinks.split(",") if s.strip()]
    unknown = set(args.sinks) - {"delta", "postgres"}
    if unknown or not args.sinks:
        p.error(f"--sinks: unknown {sorted(unknown)}; use delta and/or postgres")
    return args  # fmt: skip


def knobs() -> str:
    """The stack's CDC_DAGSTER_* settings in this environment (defaults otherwise)."""
    set_ = {k: v for k, v in os.environ.items() if k.startswith("CDC_DAGSTER_")}
    return ", ".join(f"{k}={v}" for k, v in sorted(set_.items())) or "defaults"


@contextlib.contextmanager
def servers(
    base: Path, args: argparse.Namespace
) -> Iterator[tuple[Upstream, PrivatePostgres | None, Stack]]:
    """MariaDB with the sysbench tables, PostgreSQL (if measured), the stack; stopped after."""
    up, pg, stack = Upstream(base, args), None, Stack(base / "state")
    try:
        say(f"private MariaDB + sysbench prepare ({args.tables} x {args.table_size} rows) ...")
        up.start()
        if "postgres" in args.sinks:
            pg = PrivatePostgres(base / "postgres")
            pg.start()
            create_pg_database(pg, "oltp")
        say("cdc-dagster server start ...")
        stack.start()
        registered = {c["id"] for c in json.loads(stack.cli("capture", "list"))}
        for capture in ("capture-1", "capture-2"):  # `server start` may register them itself
            if capture not in registered:
                say(stack.cli("capture", "add", capture).strip())
        say(
            f"captures: {', '.join(sorted(c['id'] for c in json.loads(stack.cli('capture', 'list'))))}"
        )
        yield up, pg, stack
    except BaseException:
        say(f"server log tail:\n{stack.tail()}")
        raise
    finally:
        stack.stop()
        up.close()
        if pg is not None:
            pg.cleanup()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    for tool in ("sysbench",):
        if shutil.which(tool) is None:
            raise BenchError(f"{tool} not found: apt-get install sysbench")
    base = Path(tempfile.mkdtemp(prefix="oltp-bench-"))
    say(f"in {base}; sysbench oltp_read_write {args.tables} x {args.table_size} rows, "
        f"{args.threads} threads, {'unthrottled' if not args.rate else f'{args.rate} tps'}; "
        f"syncpoint {args.syncpoint_s or 'off'} s; {args.duration:.0f} s measured; stack: {knobs()}")  # fmt: skip
    figures: list[dict[str, Any]] = []
    base_figs: dict[str, float] = {}
    try:
        with servers(base, args) as (up, pg, stack):
            run = Run(args, up, stack, base)
            for name in args.sinks:
                target = (
                    delta_target(base / "lake") if name == "delta" else postgres_target(pg, "oltp")  # type: ignore[arg-type]
                )
                figures.append(measure_sink(run, target))
            if not args.no_baselines:
                base_figs = baselines(run, pg)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
        else:
            say(f"kept {base}")
    print(table(figures, base_figs, args))
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                         "sinks": figures, "baselines": base_figs}, indent=1))  # fmt: skip
    print(line(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
