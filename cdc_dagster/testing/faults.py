"""The fault matrix's harness: the whole stack of ``demo`` / ``server start``, faults injected
into it, recovery measured, the validators fed (issue 17).

:class:`FaultStack` runs what ``demo`` runs, supervised as ``demo`` supervises it (private
etcd, Spark Connect, the Dagster code server, daemon and webserver, the embedded generator),
with two changefeeds over it:

- ``demo``: the generator's change log into a Delta root (bank, shop and wide tables, DDLs);
- ``shop`` (with ``mysql=True``): a private MariaDB, pulled by ``mysql_puller`` runs, into a
  private PostgreSQL; :class:`MySqlWorkload` writes bank transfers and orders into it.

Every failpoint of :mod:`cdc_dagster.failpoints` is configured for the Dagster processes and
disarmed (its ``<name>.1`` file exists); :meth:`FaultStack.arm` removes the file, so the next
hit anywhere in the deployment fires once. Each fault of :data:`FAULTS` injects one fault
and returns an :class:`Injected`; :meth:`FaultStack.recover` then measures how long until
every changefeed's checkpoint passes the moment the fault was over, feeding the validators
meanwhile. Tests (tests/e2e/test_fault_matrix.py) and the soak share all of it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from cdc_dagster import admin, failpoints
from cdc_dagster.metastore import Metastore, connect
from cdc_dagster.metastore.errors import MetastoreError
from cdc_dagster.services import procs, stack, workload
from cdc_dagster.testing.validators import (
    ChangeLogOracle,
    DeltaFeed,
    PostgresFeed,
    ProgressFeed,
    UpstreamNow,
    Validators,
    Watch,
    delta_types,
    standard,
)
from scheduler_core.ts import compose, physical_ms

log = logging.getLogger(__name__)

DEMO, SHOP = "demo", "shop"
# Each point fires once when armed; a delay holds its process so a test can stop or kill it.
FAILPOINTS = {
    failpoints.CAPTURE_PREPARE: "crash",
    failpoints.SINK_AFTER_WRITE: "crash",
    failpoints.SINK_BEFORE_WRITE: "delay(5)",
    failpoints.DDL_AFTER_APPLY: "delay(25)",
    failpoints.PULLER_AFTER_CHANGELOG_WRITE: "crash",
}
MYSQL_ACCOUNTS = 40
MYSQL_BALANCE = Decimal("500.00")


def say(message: str) -> None:
    """One progress line (pytest shows it with -s, and in a failing test's output)."""
    print(f"[faults {time.strftime('%H:%M:%S')}] {message}", flush=True)


@dataclass
class Injected:
    """One fault: what, when it began and when it was over (the cause gone)."""

    kind: str
    detail: str
    began_wall_ms: int
    over_wall_ms: int = 0
    over_mono: float = 0.0
    notes: list[str] = field(default_factory=list)

    def over(self) -> Injected:
        """Mark the cause gone now."""
        self.over_wall_ms = time.time_ns() // 1_000_000
        self.over_mono = time.monotonic()
        return self


@dataclass
class Recovery:
    """How long replication took to move past a fault."""

    kind: str
    detail: str
    recovered_s: float | None  # from the fault being over to every checkpoint past it
    fault_s: float  # how long the fault itself lasted
    longest_stall_s: float  # longest time a changefeed checkpoint stood still meanwhile
    notes: list[str] = field(default_factory=list)
    # from the fault being over until every changefeed checkpoint moved again
    advanced_s: float | None = None

    HEADER = f"{'fault':<28} {'advanced':>9} {'caught up':>14}  {'fault':>7}  {'stall':>7}  detail"

    def line(self) -> str:
        """One row for the report (seconds after the fault was over: every checkpoint moved
        again; every checkpoint passed that moment)."""
        took = "NOT RECOVERED" if self.recovered_s is None else f"{self.recovered_s:6.1f} s"
        moved = "never" if self.advanced_s is None else f"{self.advanced_s:5.1f} s"
        return (
            f"{self.kind:<28} {moved:>9} {took:>14}  {self.fault_s:5.1f} s  "
            f"{self.longest_stall_s:5.1f} s  {self.detail}"
        )


# ------------------------------------------------------------------------------ the MySQL side
class MySqlWorkload:
    """Bank transfers (the total stays), orders inserted, updated and deleted, in MariaDB
    database ``shop``; it reconnects after an upstream restart (a transaction either
    committed or not: the total holds either way)."""

    def __init__(self, connect_db: Callable[[], Any], seed: int = 7, rate_per_s: float = 8.0):
        self.connect_db = connect_db
        self.rng = random.Random(seed)
        self.rate_per_s = rate_per_s
        self.committed = 0
        self.errors = 0
        self.paused = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mysql-workload", daemon=True)
        self._next_order = 1

    def create(self) -> None:
        """The tables and their first rows."""
        conn = self.connect_db()
        with conn.cursor() as cur:
            cur.execute("CREATE DATABASE IF NOT EXISTS shop")
            for i in range(2):
                cur.execute(
                    f"CREATE TABLE shop.acct_{i} (id INT PRIMARY KEY, "
                    "balance DECIMAL(18,2) NOT NULL, owner VARCHAR(40))"
                )
                values = ", ".join(
                    f"({k}, {MYSQL_BALANCE}, 'o{k}')" for k in range(MYSQL_ACCOUNTS // 2)
                )
                cur.execute(f"INSERT INTO shop.acct_{i} VALUES {values}")
            cur.execute(
                "CREATE TABLE shop.orders (id INT PRIMARY KEY, account INT NOT NULL, "
                "amount DECIMAL(12,2) NOT NULL, status VARCHAR(12), placed_at DATETIME)"
            )
        conn.close()

    @property
    def total(self) -> Decimal:
        """The bank total (constant)."""
        return MYSQL_BALANCE * MYSQL_ACCOUNTS

    def start(self) -> None:
        """Write until stopped."""
        self._thread.start()

    def stop(self) -> None:
        """Stop writing (the last transaction finishes)."""
        self._stop.set()
        self._thread.join(timeout=60)

    def _run(self) -> None:
        conn = None
        while not self._stop.is_set():
            if self.paused.is_set():
                time.sleep(0.2)
                continue
            try:
                if conn is None:
                    conn = self.connect_db()
                self._one(conn)
                self.committed += 1
            except Exception as exc:  # upstream down or restarting: reconnect and go on
                self.errors += 1
                log.info("mysql workload: %s", exc)
                with contextlib.suppress(Exception):
                    if conn is not None:
                        conn.close()
                conn = None
                time.sleep(1.0)
            time.sleep(self.rng.expovariate(self.rate_per_s))
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def _one(self, conn: Any) -> None:
        r = self.rng.random()
        with conn.cursor() as cur:
            cur.execute("BEGIN")
            if r < 0.6:
                a, b = self.rng.randrange(2), self.rng.randrange(2)
                ka, kb = (
                    self.rng.randrange(MYSQL_ACCOUNTS // 2),
                    self.rng.randrange(MYSQL_ACCOUNTS // 2),
                )
                amount = Decimal(self.rng.randrange(1, 2000)) / 100
                cur.execute(
                    f"UPDATE shop.acct_{a} SET balance = balance - %s WHERE id = %s", (amount, ka)
                )
                cur.execute(
                    f"UPDATE shop.acct_{b} SET balance = balance + %s WHERE id = %s", (amount, kb)
                )
            elif r < 0.85:
                oid = self._next_order
                self._next_order += 1
                cur.execute(
                    "INSERT INTO shop.orders (id, account, amount, status, placed_at) VALUES "
                    "(%s, %s, %s, 'new', NOW()) ON DUPLICATE KEY UPDATE status = 'again'",
                    (
                        oid,
                        self.rng.randrange(MYSQL_ACCOUNTS),
                        Decimal(self.rng.randrange(100, 99999)) / 100,
                    ),
                )
            elif r < 0.95:
                cur.execute(
                    "UPDATE shop.orders SET status = %s WHERE id = %s",
                    (
                        self.rng.choice(["paid", "sent", "back"]),
                        self.rng.randrange(1, self._next_order + 1),
                    ),
                )
            else:
                cur.execute(
                    "DELETE FROM shop.orders WHERE id = %s",
                    (self.rng.randrange(1, self._next_order + 1),),
                )
            cur.execute("COMMIT")


# ------------------------------------------------------------------------------ the stack
class FaultStack:
    """The supervised stack with the demo changefeed (and the MySQL one), failpoints armed
    on demand, validators watching (see the module docstring)."""

    def __init__(
        self,
        state: Path,
        *,
        mysql: bool = True,
        bank_tables: int = 2,
        txns_per_step: int = 10,
        ddl_every: int = 900,
        sync_point_interval_s: int = 60,
        every: int = 1,
        seed: int = 7,
    ) -> None:
        self.state = state.resolve()
        self.mysql = mysql
        self.bank_tables = bank_tables
        self.txns_per_step = txns_per_step
        self.ddl_every = ddl_every
        self.sync_point_interval_s = sync_point_interval_s
        self.every = every  # per-key order on one state in this many (the soak)
        self.seed = seed  # the MySQL workload's
        self.stalls: StallWatch | None = None  # the soak's
        self.runs = 0  # faults injected so far (repeated faults name things apart)
        self.changelog = self.state / "changelog"
        self.lake = self.state / "lake"
        self.fp_dir = self.state / "failpoints"
        self.stack: stack.Stack | None = None
        self.ms: Metastore | None = None
        self.mariadb: Any = None
        self.pg: Any = None
        self.mysql_workload: MySqlWorkload | None = None
        self.watches: dict[str, Watch] = {}
        self.recoveries: list[Recovery] = []
        self._env_before: dict[str, str | None] = {}
        self._supervisor: threading.Thread | None = None
        self._lock = threading.Lock()
        self.paused: set[str] = set()  # changefeeds whose downstream a person is changing

    # -------------------------------------------------------------- start, stop
    def __enter__(self) -> FaultStack:
        try:
            self._start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _set_env(self, **values: str) -> None:
        for k, v in values.items():
            self._env_before.setdefault(k, os.environ.get(k))
            os.environ[k] = v

    def _start(self) -> None:
        self.state.mkdir(parents=True, exist_ok=True)
        self.fp_dir.mkdir(exist_ok=True)
        for name in FAILPOINTS:
            (self.fp_dir / f"{name}.1").write_text("disarmed")
        self._set_env(
            **{
                failpoints.ENV: ";".join(f"{n}=1*{a}" for n, a in FAILPOINTS.items()),
                failpoints.STATE_ENV: str(self.fp_dir),
                "CDC_DAGSTER_MYSQL_PULL_S": "20",
                "PG_PW": "unused-by-trust",
            }
        )
        failpoints.reload()
        if self.mysql:
            self._start_databases()
        say(f"starting the stack under {self.state}")
        self.stack = stack.Stack(
            self.state,
            kind="demo",
            changelog=self.changelog,
            generator=self._generator,
        )
        self.stack.__enter__()
        self._supervisor = threading.Thread(target=self.stack.supervise, daemon=True)
        self._supervisor.start()
        self.ms = connect(self.stack.etcd_endpoints.split(","), self.state, retry_timeout_s=30.0)
        say(
            workload.ensure_demo_changefeed(
                self.stack.etcd_endpoints, self.state, DEMO, self.lake, stack.DEMO_CAPTURES,
                self.changelog, self.stack.generator.start_ts,
                sync_point_interval_s=self.sync_point_interval_s,
            )
        )  # fmt: skip
        self._watch_demo()
        if self.mysql:
            self._create_shop()

    def _generator(self) -> workload.GeneratorThread:
        return workload.GeneratorThread(
            self.changelog,
            self.bank_tables,
            interval_s=1.0,
            txns_per_step=self.txns_per_step,
            ddl_every=self.ddl_every,
        )

    def _start_databases(self) -> None:
        from cdc_dagster.testing.servers import PrivateMariaDB, PrivatePostgres

        self.mariadb = PrivateMariaDB(self.state / "mariadb", server_id=1)
        self.mariadb.start()
        self.pg = PrivatePostgres(self.state / "pg")
        self.pg.start()
        import psycopg

        with psycopg.connect(self.pg.dsn(), autocommit=True) as conn:
            conn.execute("CREATE DATABASE analytics")
        self.mysql_workload = MySqlWorkload(lambda: self.mariadb.connect(), seed=self.seed)
        self.mysql_workload.create()

    def _create_shop(self) -> None:
        assert self.ms is not None and self.mysql_workload is not None
        say("creating changefeed shop (MariaDB -> PostgreSQL), snapshot first")
        admin.create_mysql_changefeed(
            self.ms,
            SHOP,
            f"postgresql://postgres@127.0.0.1:{self.pg.port}/analytics",
            self.mariadb.uri(query="server-id=4242"),
            table_filter=("shop.*",),
            sync_point_interval_s=self.sync_point_interval_s,
            changelog_root=str(self.state / "mysql" / SHOP),
        )
        feed = PostgresFeed(self.pg.dsn("analytics"), SHOP)
        feed.register_copies(["shop.acct_0", "shop.acct_1", "shop.orders"])
        oracle = ChangeLogOracle(self.state / "mysql" / SHOP)
        final = UpstreamNow(lambda: self.mariadb.connect(), oracle)
        ids = self._bank_ids(oracle, "acct_")
        self.watches[SHOP] = Watch(
            standard(oracle, bank=(self.mysql_workload.total, ids), final_expected=final),
            feed,
            ProgressFeed(self.ms, SHOP),
        )
        self.mysql_workload.start()

    @staticmethod
    def _bank_ids(oracle: ChangeLogOracle, prefix: str) -> list[int]:
        tables = oracle.tables_at(2**62)
        return [t for t, s in tables.items() if s.table.startswith(prefix)]

    def _watch_demo(self) -> None:
        assert self.ms is not None
        from cdc_dagster.upstream.generator import WorkloadConfig

        config = WorkloadConfig(bank_tables=self.bank_tables)
        total = config.initial_balance * config.rows_per_table * self.bank_tables
        self.watches[DEMO] = Watch(
            standard(
                ChangeLogOracle(self.changelog),
                bank=(total, range(1, self.bank_tables + 1)),
                types=delta_types,
                every=self.every,
            ),
            DeltaFeed(self.lake, DEMO),
            ProgressFeed(self.ms, DEMO),
        )

    def __exit__(self, *exc: object) -> None:
        if self.mysql_workload is not None:
            self.mysql_workload.stop()
        if self.stack is not None:
            self.stack.stop.set()
            if self._supervisor is not None:
                self._supervisor.join(timeout=30)
            self.stack.__exit__()
        if self.ms is not None:
            with contextlib.suppress(Exception):
                self.ms.close()
        for server in (self.mariadb, self.pg):
            if server is not None:
                with contextlib.suppress(Exception):
                    server.cleanup()
        for k, v in self._env_before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        failpoints.reload()

    # -------------------------------------------------------------- looking
    @property
    def changefeeds(self) -> list[str]:
        """The changefeeds running on the stack."""
        return [DEMO, SHOP] if self.mysql else [DEMO]

    def checkpoint(self, changefeed_id: str) -> int:
        """The changefeed's checkpoint in etcd (0 while etcd does not answer)."""
        assert self.ms is not None
        try:
            return self.ms.changefeeds.get(changefeed_id).status.checkpoint_ts
        except MetastoreError:
            return 0

    def status(self, changefeed_id: str) -> Any:
        """The changefeed's status record (None while etcd does not answer)."""
        assert self.ms is not None
        try:
            return self.ms.changefeeds.get(changefeed_id).status
        except MetastoreError:
            return None

    def poll(self) -> None:
        """Feed the validators what is new (etcd errors while etcd is down are skipped)."""
        if self.stalls is not None:
            for cf in self.changefeeds:
                st = self.status(cf)
                if st is not None:
                    self.stalls.note(cf, st.checkpoint_ts, st.last_error, time.monotonic())
        with self._lock:
            for cf, watch in self.watches.items():
                if cf in self.paused:
                    continue
                try:
                    watch.poll()
                except MetastoreError as exc:
                    log.info("watch %s: etcd: %s", cf, exc)

    def missing_captures(self) -> set[str] | None:
        """Captures the user asked for that are not registered now (None: etcd does not
        answer). Captures heal: only removing or draining one makes it leave."""
        assert self.ms is not None
        try:
            desired = set(self.ms.captures.desired())
            alive = {c.capture_id for c in self.ms.captures.list_alive()}
        except MetastoreError:
            return None
        return desired - alive

    def part(self, name: str) -> procs.Service:
        """A supervised part as recorded now."""
        parts = {p.name: p for p in procs.read_record(self.state).parts}
        return parts[name]

    def held(self, changefeed_id: str) -> dict[str, set[int]]:
        """capture id -> the tables it reports holding."""
        assert self.ms is not None
        from scheduler_core.model import TableState

        out: dict[str, set[int]] = {}
        for capture_id, status in self.ms.task_statuses.read(changefeed_id).items():
            b = status.tables
            live = (b.states != int(TableState.ABSENT)) & (b.states != int(TableState.STOPPED))
            out[capture_id] = {int(t) for t in b.table_ids[live]}
        return out

    # -------------------------------------------------------------- failpoints
    def arm(self, name: str) -> None:
        """The next hit of ``name`` anywhere fires (once)."""
        (self.fp_dir / f"{name}.1").unlink(missing_ok=True)

    def disarm(self, name: str) -> None:
        """``name`` fires no more (unless it fired already)."""
        with contextlib.suppress(FileExistsError), open(self.fp_dir / f"{name}.1", "x") as f:
            f.write("disarmed")

    def fired_pid(self, name: str) -> int | None:
        """The pid that fired ``name`` since it was armed (None: not yet)."""
        try:
            text = (self.fp_dir / f"{name}.1").read_text()
        except FileNotFoundError:
            return None
        return int(text) if text.isdigit() else None

    def wait_fired(self, name: str, timeout_s: float) -> int:
        """Wait for an armed point to fire; its pid."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            pid = self.fired_pid(name)
            if pid is not None:
                return pid
            self.poll()
            time.sleep(0.5)
        self.disarm(name)
        raise TimeoutError(f"failpoint {name} did not fire within {timeout_s:.0f} s")

    # -------------------------------------------------------------- recovery
    def recover(self, injected: Injected, timeout_s: float = 300.0) -> Recovery:
        """Wait until every changefeed's checkpoint passes the moment the fault was over."""
        if not injected.over_wall_ms:
            injected.over()
        target = compose(injected.over_wall_ms)
        done, stall, moved = self._catch_up(
            dict.fromkeys(self.changefeeds, target), injected.over_mono, timeout_s
        )
        fault_s = (injected.over_wall_ms - injected.began_wall_ms) / 1000
        rec = Recovery(injected.kind, injected.detail, done, fault_s, stall, injected.notes, moved)
        self.recoveries.append(rec)
        say(rec.line())
        return rec

    def _catch_up(
        self, targets: dict[str, int], since: float, timeout_s: float
    ) -> tuple[float | None, float, float | None]:
        """Until each changefeed's checkpoint passes its target: (seconds since ``since``
        or None on timeout, the longest time a checkpoint stood still, seconds since
        ``since`` until every checkpoint had moved past where it was at the start)."""
        start = {cf: self.checkpoint(cf) for cf in targets}
        last = {cf: (0, time.monotonic()) for cf in targets}
        moved_at: dict[str, float] = {}
        stall = 0.0
        next_poll = 0.0
        while time.monotonic() < since + timeout_s:
            now = time.monotonic()
            cps = {cf: self.checkpoint(cf) for cf in targets}
            for cf, cp in cps.items():
                if cp > last[cf][0]:
                    last[cf] = (cp, now)
                if not start[cf]:
                    start[cf] = cp  # etcd did not answer at the start
                elif cp > start[cf]:
                    moved_at.setdefault(cf, now)
                stall = max(stall, now - last[cf][1])
            moved = max(moved_at.values()) - since if len(moved_at) == len(targets) else None
            if all(cps[cf] >= ts for cf, ts in targets.items()):
                self.poll()
                return now - since, stall, now - since if moved is None else moved
            if now >= next_poll:
                self.poll()
                next_poll = time.monotonic() + 3.0
            time.sleep(0.5)
        self.poll()
        moved = max(moved_at.values()) - since if len(moved_at) == len(targets) else None
        return None, stall, moved

    def lag_s(self) -> dict[str, float]:
        """Each changefeed's checkpoint lag behind the wall clock now."""
        now = time.time() * 1000
        return {cf: (now - physical_ms(self.checkpoint(cf))) / 1000 for cf in self.changefeeds}

    def wait_replicating(self, timeout_s: float = 600.0) -> float:
        """Until every changefeed's checkpoint passes this moment; the seconds it took."""
        target = compose(_now_ms())
        took, _, _ = self._catch_up(
            dict.fromkeys(self.changefeeds, target), time.monotonic(), timeout_s
        )
        if took is None:
            raise TimeoutError(f"not replicating after {timeout_s:.0f} s: lags {self.lag_s()}")
        say(
            f"replicating ({took:.0f} s to catch up with the moment asked); lags "
            + ", ".join(f"{k} {v:.0f} s" for k, v in self.lag_s().items())
        )
        return took

    # -------------------------------------------------------------- the end
    def finish(self, timeout_s: float = 300.0) -> Validators:
        """Stop the workloads, let replication catch up, check every table at the end;
        returns the validators of every changefeed together (assert_ok them)."""
        from cdc_dagster.upstream.changelog import ChangeLog

        assert self.stack is not None
        self.stack.stop.set()  # no more restarts: the generator is stopped for good
        if self._supervisor is not None:
            self._supervisor.join(timeout=30)
        self.stack.generator.stop()
        if self.mysql_workload is not None:
            self.mysql_workload.stop()
        time.sleep(1)
        log_ = ChangeLog(self.changelog)
        targets = {DEMO: min(log_.table_resolved_ts(t) for t in log_.tables_at(2**62))}
        if self.mysql:
            targets[SHOP] = compose(_now_ms())  # the puller's heartbeats resolve past it
        done, _, _ = self._catch_up(targets, time.monotonic(), timeout_s)
        if done is None:
            raise TimeoutError(
                f"replication did not catch up with the end in {timeout_s:.0f} s: "
                f"checkpoints {[self.checkpoint(cf) for cf in targets]} < {targets}"
            )
        all_of = Validators([])
        for cf, watch in self.watches.items():
            ts = self.checkpoint(cf)
            tables = ChangeLogOracle(self._changelog_of(cf)).tables_at(ts)
            with self._lock:
                watch.final(ts, tables)
            all_of.members += watch.validators.members
        return all_of

    def _changelog_of(self, changefeed_id: str) -> Path:
        return self.changelog if changefeed_id == DEMO else self.state / "mysql" / changefeed_id

    def report(self) -> list[str]:
        """The recoveries measured, one line each, under a header."""
        return [Recovery.HEADER] + [r.line() for r in self.recoveries]


# ------------------------------------------------------------------------------ Dagster runs
def run_pids(state: Path, job_name: str) -> dict[str, int]:
    """Run id -> worker pid of the job's runs in progress (from their "Started process"
    event), alive ones only."""
    import dagster as dg
    from dagster._core.instance.ref import InstanceRef

    out: dict[str, int] = {}
    home = state / "dagster"
    with dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance:
        runs = instance.get_runs(
            dg.RunsFilter(job_name=job_name, statuses=[dg.DagsterRunStatus.STARTED])
        )
        for run in runs:
            for record in instance.get_records_for_run(run.run_id, limit=50).records:
                m = re.search(
                    r"Started process for run \(pid: (\d+)\)", record.event_log_entry.message or ""
                )
                if m and procs.pid_alive(int(m.group(1))):
                    out[run.run_id] = int(m.group(1))
    return out


def run_logs(state: Path, run_id: str) -> list[str]:
    """Every message of one run's event log."""
    import dagster as dg
    from dagster._core.instance.ref import InstanceRef

    with dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(state / "dagster"))) as instance:
        return [
            r.event_log_entry.message or "" for r in instance.get_records_for_run(run_id).records
        ]


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _wait(what: str, predicate: Callable[[], object], timeout_s: float, fs: FaultStack) -> float:
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout_s:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        fs.poll()
        time.sleep(1.0)
    return time.monotonic() - started


# ------------------------------------------------------------------------------ the faults
def capture_crash_in_prepare(fs: FaultStack) -> Injected:
    """kill -9 (an injected crash) of a capture run inside prepare: pulled, not persisted."""
    fs.arm(failpoints.CAPTURE_PREPARE)
    pid = fs.wait_fired(failpoints.CAPTURE_PREPARE, 240)
    return Injected("capture-run kill in prepare", f"pid {pid}", _now_ms()).over()


def capture_crash_in_commit(fs: FaultStack) -> Injected:
    """kill -9 (an injected crash) of a capture run inside commit: sink written, not reported."""
    fs.arm(failpoints.SINK_AFTER_WRITE)
    pid = fs.wait_fired(failpoints.SINK_AFTER_WRITE, 240)
    return Injected("capture-run kill in commit", f"pid {pid}", _now_ms()).over()


def capture_run_sigkill(fs: FaultStack) -> Injected:
    """SIGKILL of a running capture run at whatever it is doing."""
    pids = run_pids(fs.state, "capture_tick")
    if not pids:
        raise TimeoutError("no capture run in progress to kill")
    run_id, pid = random.choice(sorted(pids.items()))
    os.kill(pid, signal.SIGKILL)
    return Injected("capture-run SIGKILL", f"run {run_id[:8]} pid {pid}", _now_ms()).over()


def kill_part(name: str) -> Callable[[FaultStack], Injected]:
    """kill -9 of one supervised part (the JVM itself for Spark Connect)."""

    def inject(fs: FaultStack) -> Injected:
        part = fs.part(name)
        pid = part.pid
        if name == stack.SPARK:
            java = [p for p in procs.group_members(part.pgid) if p != part.pid]
            pid = java[0] if java else part.pid
        began = _now_ms()
        os.kill(pid, signal.SIGKILL)
        inj = Injected(f"{name} kill -9", f"pid {pid}", began)
        _wait(f"{name} to come back", lambda: _part_back(fs, name, part.pid), 240, fs)
        inj.notes.append(f"back after {(_now_ms() - began) / 1000:.1f} s")
        return inj.over()

    return inject


def _part_back(fs: FaultStack, name: str, old_pid: int) -> bool:
    try:
        now = fs.part(name)
    except KeyError:
        return False
    return now.pid != old_pid and stack.part_state(now) == "running"


def etcd_sigstop(fs: FaultStack, seconds: float = 75.0) -> Injected:
    """SIGSTOP of the private etcd past the capture lease TTL (60 s), then SIGCONT."""
    pid = fs.part(stack.ETCD).pid
    began = _now_ms()
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        os.kill(pid, signal.SIGCONT)
    return Injected("etcd SIGSTOP/SIGCONT", f"stopped {seconds:.0f} s", began).over()


def zombie_capture(fs: FaultStack, changefeed_id: str = DEMO) -> Injected:
    """A capture run frozen (SIGSTOP) inside its commit half, holding its fencing tokens,
    until its lease expired and its tables moved to another capture whose writes took new
    tokens; then it resumes (SIGCONT) and its sink writes must be refused."""
    from cdc_dagster.sinks.delta import DeltaSink

    fs.arm(failpoints.SINK_BEFORE_WRITE)
    pid = fs.wait_fired(failpoints.SINK_BEFORE_WRITE, 240)
    os.kill(pid, signal.SIGSTOP)
    began = _now_ms()
    inj = Injected("zombie capture", f"run pid {pid} frozen in commit", began)
    try:
        zombie = _capture_of(fs, pid)
        held = fs.held(changefeed_id).get(zombie, set()) if zombie else set()
        inj.notes.append(f"{zombie} held {sorted(held)} of {changefeed_id}")
        sink = DeltaSink(str(fs.lake))
        log_ = ChangeLogOracle(fs.changelog)
        schemas = {t: log_.tables_at(2**62).get(t) for t in held}
        tokens = {t: sink.committed(changefeed_id, s).token for t, s in schemas.items() if s}

        def moved() -> bool:
            now = {t: sink.committed(changefeed_id, s).token for t, s in schemas.items() if s}
            return all(now[t] > tokens[t] for t in now)

        took = _wait("the zombie's tables to take new tokens elsewhere", moved, 300, fs)
        inj.notes.append(f"its tables took new tokens after {took:.0f} s")
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:  # the launcher killed it as hung (canceling for 30 s)
            inj.notes.append("killed as hung before it thawed")
    inj.over()
    _wait("the zombie run to end", lambda: not procs.pid_alive(pid), 180, fs)
    return inj


def _capture_of(fs: FaultStack, pid: int) -> str | None:
    import dagster as dg
    from dagster._core.instance.ref import InstanceRef

    for run_id, run_pid in run_pids(fs.state, "capture_tick").items():
        if run_pid == pid:
            home = str(fs.state / "dagster")
            with dg.DagsterInstance.from_ref(InstanceRef.from_dir(home)) as instance:
                run = instance.get_run_by_id(run_id)
                return run.tags.get("dagster/partition") if run else None
    return None


def owner_killed_in_slow_ddl(fs: FaultStack) -> Injected:
    """kill -9 of the code server (the owner) while a DDL run applies a slow DDL."""
    fs.arm(failpoints.DDL_AFTER_APPLY)
    pid = fs.wait_fired(failpoints.DDL_AFTER_APPLY, 600)
    inj = kill_part(stack.CODE)(fs)
    inj.kind, inj.detail = "owner kill in slow DDL", f"DDL held by pid {pid}; {inj.detail}"
    return inj


def scale_out_and_in(fs: FaultStack) -> Injected:
    """capture add under load, wait until it holds tables, then drain and remove it."""
    assert fs.ms is not None
    fs.runs += 1
    new = f"capture-{2 + fs.runs}"  # a name of its own each time (the soak repeats faults)
    began = _now_ms()
    admin.add_capture(fs.ms, new)
    took = _wait(f"{new} to hold tables", lambda: fs.held(DEMO).get(new), 300, fs)
    inj = Injected("scale out and in", f"{new} added, drained, removed", began)
    inj.notes.append(f"{new} held tables after {took:.0f} s")
    admin.drain_capture(fs.ms, new)
    took = _wait(
        f"{new} to be drained",
        lambda: not any(fs.held(cf).get(new) for cf in fs.changefeeds),
        300,
        fs,
    )
    admin.remove_capture(fs.ms, new)
    inj.notes.append(f"drained after {took:.0f} s")
    return inj.over()


def puller_crash(fs: FaultStack) -> Injected:
    """kill -9 (an injected crash) of a puller run between its change-log write and its
    binlog position save."""
    fs.arm(failpoints.PULLER_AFTER_CHANGELOG_WRITE)
    pid = fs.wait_fired(failpoints.PULLER_AFTER_CHANGELOG_WRITE, 240)
    return Injected("puller-run kill", f"pid {pid}", _now_ms()).over()


def puller_run_sigkill(fs: FaultStack) -> Injected:
    """SIGKILL of a running puller run at whatever it is doing."""
    deadline = time.monotonic() + 120
    pids: dict[str, int] = {}
    while not pids and time.monotonic() < deadline:
        pids = run_pids(fs.state, "mysql_puller")
        if not pids:
            fs.poll()
            time.sleep(1)
    if not pids:
        raise TimeoutError("no puller run in progress to kill within 120 s")
    run_id, pid = sorted(pids.items())[0]
    time.sleep(random.uniform(0, 5))
    os.kill(pid, signal.SIGKILL)
    return Injected("puller-run SIGKILL", f"run {run_id[:8]} pid {pid}", _now_ms()).over()


def mariadb_restart(fs: FaultStack) -> Injected:
    """kill -9 of MariaDB mid-stream, started again on its port and data."""
    began = _now_ms()
    proc = fs.mariadb.proc
    proc.kill()
    proc.wait()
    fs.mariadb.proc = None
    time.sleep(3)
    fs.mariadb.start()
    return Injected("MariaDB kill -9 + restart", "mid-stream", began).over()


def postgres_restart_in_commit(fs: FaultStack) -> Injected:
    """PostgreSQL stopped (immediate: a crash) while a sink commit is in flight, restarted."""
    import psycopg

    deadline = time.monotonic() + 240
    seen = ""
    with psycopg.connect(fs.pg.dsn(), autocommit=True) as conn:
        while time.monotonic() < deadline and not seen:
            row = conn.execute(
                "SELECT query FROM pg_stat_activity WHERE datname = 'analytics' AND state = "
                "'active' AND (query ILIKE 'MERGE%%' OR query ILIKE 'COPY%%' OR query ILIKE "
                "'%%UPDATE cdc_dagster.checkpoints%%')"
            ).fetchone()
            seen = row[0][:60] if row else ""
            if not seen:
                time.sleep(0.02)
    if not seen:
        raise TimeoutError("no sink commit in flight on PostgreSQL within 240 s")
    began = _now_ms()
    fs.pg.stop(mode="immediate")
    time.sleep(2)
    fs.pg.start()
    return Injected("PostgreSQL restart in commit", f"during {seen!r}", began).over()


def failing_ddl_fixed(fs: FaultStack) -> Injected:
    """A DDL PostgreSQL refuses: a person made a view downstream on a replicated column, and
    the upstream drops that column (PostgreSQL will not drop what a view depends on, and the
    sink never cascades into the user's objects). The changefeed goes to warning with the
    whole message; the person drops the view; it resumes by itself."""
    import psycopg

    # A person changes the downstream by hand: what the validators would read meanwhile
    # (syncpoint copies with the column the view holds) is that person's doing.
    fs.runs += 1
    column = f"coupon{fs.runs}"  # a column of its own each time (the soak repeats faults)
    view = f'"shop"."orders_{column}"'
    fs.poll()
    fs.paused.add(SHOP)
    conn_my = fs.mariadb.connect()
    with conn_my.cursor() as cur:
        cur.execute(f"ALTER TABLE shop.orders ADD COLUMN {column} VARCHAR(16)")

    def replicated() -> bool:
        with psycopg.connect(fs.pg.dsn("analytics"), autocommit=True) as conn:
            found = conn.execute(
                "SELECT 1 FROM information_schema.columns WHERE table_schema = 'shop' "
                "AND table_name = 'orders' AND column_name = %s",
                (column,),
            ).fetchone()
        return found is not None

    _wait(f"the column {column} downstream", replicated, 300, fs)
    with psycopg.connect(fs.pg.dsn("analytics"), autocommit=True) as conn:
        conn.execute(f'CREATE VIEW {view} AS SELECT id, {column} FROM "shop"."orders"')
    with conn_my.cursor() as cur:
        cur.execute(f"ALTER TABLE shop.orders DROP COLUMN {column}")
    conn_my.close()
    began = _now_ms()
    inj = Injected("failing DDL fixed", "DROP COLUMN a downstream view depends on", began)

    def warned() -> bool:
        st = fs.status(SHOP)
        return st is not None and st.state.value == "warning" and column in st.last_error

    took = _wait("the shop changefeed to warn about the DDL", warned, 300, fs)
    message = fs.status(SHOP).last_error
    inj.notes.append(f"warning after {took:.0f} s: {message[:200]}")
    assert fs.checkpoint(DEMO) > 0
    with psycopg.connect(fs.pg.dsn("analytics"), autocommit=True) as conn:
        conn.execute(f"DROP VIEW {view}")
    inj.over()

    def applied() -> bool:
        st = fs.status(SHOP)
        return st is not None and st.state.value == "normal"

    took = _wait("the DDL to apply after the fix", applied, 300, fs)
    skipped = fs.watches[SHOP].feed.syncpoints()  # copied while the column was there by hand
    inj.notes.append(f"normal {took:.0f} s after the fix; {len(skipped)} syncpoint(s) not checked")
    fs.paused.discard(SHOP)
    return inj


FAULTS: dict[str, Callable[[FaultStack], Injected]] = {
    "capture-prepare": capture_crash_in_prepare,
    "capture-commit": capture_crash_in_commit,
    "capture-sigkill": capture_run_sigkill,
    "code-server": kill_part(stack.CODE),
    "daemon": kill_part(stack.DAEMON),
    "spark-connect": kill_part(stack.SPARK),
    "etcd": kill_part(stack.ETCD),
    "etcd-sigstop": etcd_sigstop,
    "zombie": zombie_capture,
    "owner-slow-ddl": owner_killed_in_slow_ddl,
    "scale": scale_out_and_in,
    "puller": puller_crash,
    "puller-sigkill": puller_run_sigkill,
    "mariadb": mariadb_restart,
    "postgres": postgres_restart_in_commit,
    "failing-ddl": failing_ddl_fixed,
}
MYSQL_FAULTS = frozenset({"puller", "puller-sigkill", "mariadb", "postgres", "failing-ddl"})


# ------------------------------------------------------------------------------ the soak
SOAK_ENV = "CDC_DAGSTER_SOAK_MINUTES"
SOAK_SEED_ENV = "CDC_DAGSTER_SOAK_SEED"


@dataclass
class Stall:
    """A stretch of time one changefeed's checkpoint stood still, and why, as far as seen."""

    seconds: float = 0.0
    changefeed: str = ""
    cause: str = ""


class StallWatch:
    """The longest time any changefeed checkpoint stood still over a soak, with its cause:
    the faults that overlapped it, else the warning its changefeed showed meanwhile."""

    def __init__(self) -> None:
        self.longest = Stall()
        self._last: dict[str, tuple[int, float, str]] = {}  # cf -> checkpoint, since, warning
        self._faults: list[tuple[str, float, float]] = []  # name, began, recovered (monotonic)
        self._running: tuple[str, float] | None = None  # the fault injected, not yet over

    def begin(self, name: str, began: float) -> None:
        """A fault is injected at ``began``: a stall that ends before it is over is its."""
        self._running = (name, began)

    def fault(self, name: str, began: float, ended: float) -> None:
        """A fault ran from ``began`` until replication had recovered at ``ended``."""
        self._running = None
        self._faults.append((name, began, ended))

    def note(self, changefeed_id: str, checkpoint_ts: int, warning: str, now: float) -> None:
        """One reading of a changefeed's checkpoint (and its warning, if any)."""
        last = self._last.get(changefeed_id)
        if last is None or checkpoint_ts > last[0]:
            if last is not None:
                self._ended(changefeed_id, last[1], last[2], now)
            self._last[changefeed_id] = (checkpoint_ts, now, warning)
        elif warning and not last[2]:
            self._last[changefeed_id] = (last[0], last[1], warning)

    def close(self, now: float) -> Stall:
        """The longest stall, counting the ones still going on now."""
        for cf, (_, since, warning) in self._last.items():
            self._ended(cf, since, warning, now)
        return self.longest

    def _ended(self, changefeed_id: str, since: float, warning: str, now: float) -> None:
        if now - since <= self.longest.seconds:
            return
        faults = self._faults + ([(*self._running, math.inf)] if self._running else [])
        during = [name for name, b, e in faults if b < now and e > since]
        cause = "during " + ", ".join(during) if during else "no fault running"
        if warning:
            cause += f"; warning: {warning[:160]}"
        self.longest = Stall(now - since, changefeed_id, cause)


@dataclass
class SoakReport:
    """What a soak did and saw."""

    minutes: float
    seed: int
    recoveries: list[Recovery] = field(default_factory=list)
    not_injected: list[str] = field(default_factory=list)
    rows_checked: int = 0
    violations: int = 0
    longest_stall: Stall = field(default_factory=Stall)
    failures: list[str] = field(default_factory=list)
    missing_captures: set[str] | None = field(default_factory=set)  # at the end (None: unknown)

    @property
    def unrecovered(self) -> list[Recovery]:
        """Faults replication did not catch up with in time."""
        return [r for r in self.recoveries if r.recovered_s is None]

    def table(self) -> list[str]:
        """The soak's table, then one line per fault injected."""
        counts: dict[str, int] = {}
        for r in self.recoveries:
            counts[r.kind] = counts.get(r.kind, 0) + 1
        by_kind = ", ".join(f"{k} x{n}" for k, n in sorted(counts.items()))
        caught = [r.recovered_s for r in self.recoveries if r.recovered_s is not None]
        stall = self.longest_stall
        rows = [
            ("soak", f"{self.minutes:.1f} min, seed {self.seed}"),
            ("faults injected", f"{len(self.recoveries)} ({by_kind})"),
            ("faults not injected", f"{len(self.not_injected)}"),
            ("rows checked", f"{self.rows_checked}"),
            ("violations", f"{self.violations}"),
            ("not recovered", f"{len(self.unrecovered)}"),
            ("captures not back", ", ".join(sorted(self.missing_captures or ())) or "none"),
            ("slowest catch-up", f"{max(caught, default=0.0):.1f} s after a fault was over"),
            ("longest stall", f"{stall.seconds:.1f} s ({stall.changefeed}: {stall.cause})"),
        ]
        out = [f"{k:<20} {v}" for k, v in rows]
        out += ["", Recovery.HEADER] + [r.line() for r in self.recoveries]
        out += [f"not injected: {n}" for n in self.not_injected]
        out += [f"violation: {f}" for f in self.failures[:20]]
        return out


def soak(
    fs: FaultStack,
    minutes: float,
    seed: int,
    names: list[str] | None = None,
    recover_timeout_s: float = 300.0,
) -> SoakReport:
    """Random faults of the matrix (seeded), a quiet spell of 10-40 s before each, for
    ``minutes``; then the end checked (:meth:`FaultStack.finish`). Each fault is measured
    as in the matrix; the stall watch notes the longest stand-still and what caused it."""
    rng = random.Random(seed)
    if names is None:
        names = [n for n in FAULTS if fs.mysql or n not in MYSQL_FAULTS]
    report = SoakReport(minutes, seed)
    fs.stalls = StallWatch()
    started = time.monotonic()
    end = started + minutes * 60
    while time.monotonic() < end:
        quiet = min(end, time.monotonic() + rng.uniform(10, 40))
        while time.monotonic() < quiet:
            fs.poll()
            time.sleep(3)
        if time.monotonic() >= end:
            break
        name = rng.choice(sorted(names))
        say(f"soak: {(time.monotonic() - started) / 60:.1f} min in, injecting {name}")
        began = time.monotonic()
        fs.stalls.begin(name, began)
        try:
            injected = FAULTS[name](fs)
        except Exception as exc:  # nothing to inject it into just then, or it broke: noted
            report.not_injected.append(f"{name}: {type(exc).__name__}: {exc}")
            fs.stalls.fault(f"{name} (not injected)", began, time.monotonic())
            continue
        report.recoveries.append(fs.recover(injected, timeout_s=recover_timeout_s))
        fs.stalls.fault(name, began, time.monotonic())
    report.minutes = (time.monotonic() - started) / 60
    settle = time.monotonic() + 120  # a capture registered again by the next owner tick
    while fs.missing_captures() != set() and time.monotonic() < settle:
        fs.poll()
        time.sleep(3)
    report.missing_captures = fs.missing_captures()
    report.longest_stall = fs.stalls.close(time.monotonic())
    fs.stalls = None
    validators = fs.finish()
    report.rows_checked = validators.rows_checked
    report.violations = validators.failure_count
    report.failures = validators.failures
    return report


@contextlib.contextmanager
def fault_stack(state: Path, **kw: Any) -> Iterator[FaultStack]:
    """A started :class:`FaultStack` for a ``with`` block."""
    with FaultStack(state, **kw) as fs:
        yield fs
