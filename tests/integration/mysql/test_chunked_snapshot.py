"""Chunked, lock-free snapshots (DBLog's idea with MariaDB's snapshot positions): every
chunk read at its own consistent snapshot while the table is written, placed by the
puller at that binlog position; the change log equals the upstream, nothing doubled."""

from __future__ import annotations

import random
import threading
import time
from decimal import Decimal
from pathlib import Path

import pytest
from test_binlog_puller import execute, gtid_now, table_id
from test_table_join import changelog_table, fingerprint, upstream_rows

from cdc_dagster.mysql.chunk_reader import plan_table, read_range
from cdc_dagster.mysql.puller import Puller, PullerConfig
from cdc_dagster.mysql.snapshot_runner import run_snapshot_reads
from cdc_dagster.mysql.snapshots import ask_gtid_positions, generation_dir
from cdc_dagster.mysql.state import load_state
from cdc_dagster.upstream.changelog import ChangeLog
from cdc_dagster.upstream.uri import parse_uri

ROWS = 3000


class Writer(threading.Thread):
    """Inserts, updates, deletes and key changes, all over the key space, until stopped."""

    def __init__(self, mariadb, db: str) -> None:
        super().__init__(daemon=True)
        self.mariadb, self.db, self.stop_ = mariadb, db, threading.Event()
        self.statements = 0

    def run(self) -> None:
        rng = random.Random(7)
        c = self.mariadb.connect(database=self.db)
        with c.cursor() as cur:
            while not self.stop_.is_set():
                k = rng.randrange(1, ROWS * 2)
                op = rng.random()
                if op < 0.4:
                    cur.execute("UPDATE t SET v = v + 1, s = %s WHERE id = %s", (f"u{k}", k))
                elif op < 0.6:
                    cur.execute("DELETE FROM t WHERE id = %s", (k,))
                elif op < 0.9:
                    cur.execute("REPLACE INTO t VALUES (%s, %s, %s)", (k, k, f"i{k}"))
                else:  # a key change into the upper half
                    cur.execute("UPDATE IGNORE t SET id = id + %s WHERE id = %s", (ROWS * 3, k))
                self.statements += 1
        c.close()


def _follow(cfg: PullerConfig) -> tuple[Puller, threading.Event, threading.Thread]:
    p, done = Puller(cfg), threading.Event()
    th = threading.Thread(target=p.run, args=(lambda s: done.is_set(),), daemon=True)
    th.start()
    return p, done, th


def _until(what, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def _snapshots_planned_by_a_puller(mariadb, mydb: str, root: Path) -> PullerConfig:
    """A puller run until it has set up the change log with every table's snapshot pending."""
    cfg = PullerConfig(mariadb.uri(), str(root), (f"{mydb}.*",), chunked_snapshot=True)
    Puller(cfg).run(lambda s: load_state(root) is not None)
    return cfg


def _count_asks(p: Puller) -> list[tuple]:
    """The puller's ``gtid_at`` calls (coordinates it asked the upstream to turn into GTIDs)."""
    asked, real = [], p.gtid_at

    def gtid_at(*args):
        asked.append(args)
        return real(*args)

    p.gtid_at = gtid_at
    return asked


@pytest.mark.parametrize("positions", ["coordinates", "gtids"])
@pytest.mark.parametrize("client", ["arrow", "rows"])  # connectorx, pymysql
def test_chunks_read_during_writes_land_in_the_stream_and_equal_the_upstream(
    mariadb, mydb, tmp_path: Path, client: str, positions: str
) -> None:
    """Chunks give binlog coordinates, which the puller turns into GTIDs from the
    transactions it saw end there (it asks the upstream for none while writes go by); or,
    once the puller asked for them, GTIDs read by the readers themselves."""
    execute(mariadb, mydb, "CREATE TABLE t (id INT PRIMARY KEY, v INT, s VARCHAR(20))",
            "INSERT INTO t SELECT seq, seq, CONCAT('r', seq) FROM seq_1_to_3000")  # fmt: skip
    root = tmp_path / "cl"
    cfg = PullerConfig(mariadb.uri(), str(root), (f"{mydb}.*",), chunked_snapshot=True)
    p, done, th = _follow(cfg)
    asked = _count_asks(p)
    _until(lambda: load_state(root) is not None)
    tid = table_id(root, "t")
    assert load_state(root).snapshots == {tid: ChangeLog(root).table_resolved_ts(tid)}
    gen_dir = generation_dir(root, tid, load_state(root).snapshots[tid])
    if positions == "gtids":
        ask_gtid_positions(gen_dir)
    read = []
    writer = Writer(mariadb, mydb)
    writer.start()
    try:
        # Killed after three chunks of range 0: the next run goes on from the fourth.
        upstream = parse_uri(cfg.upstream_uri)
        gen = load_state(root).snapshots[tid]
        plan = plan_table(upstream, str(root), tid, gen, parallelism=3, chunk_rows=150)
        assert len(plan.ranges) == 3

        def kill(chunk) -> None:
            read.append(chunk)
            if chunk.chunk_no == 2:
                raise KeyboardInterrupt("killed")

        with pytest.raises(KeyboardInterrupt):
            read_range(upstream, str(root), tid, gen, 0, 150, progress=kill, client=client)
        run_snapshot_reads(
            cfg.upstream_uri, str(root), parallelism=3, chunk_rows=150, client=client
        )
        time.sleep(1.0)  # writes after the last chunk, too
    finally:
        writer.stop_.set()
        writer.join()
    assert writer.statements > 100
    target = gtid_now(mariadb)
    _until(lambda: p.stats.position == target and not p.state.snapshots)
    done.set()
    th.join(30)
    resolved = ChangeLog(root).table_resolved_ts(tid)
    assert resolved >= p.stats.resolved_ts > gen  # released: the mark follows the stream
    assert fingerprint(changelog_table(root, tid)) == fingerprint(upstream_rows(mariadb, mydb, "t"))
    assert not (root / "snapshot" / str(tid) / str(gen)).exists()  # cleaned up once complete
    assert len(read) == 3
    if positions == "gtids":
        assert all(c.binlog is None and c.position for c in read)
    else:
        assert all(c.binlog is not None and not c.position for c in read)
        assert asked == []  # every chunk's coordinates were a transaction's end it saw


def test_chunks_of_a_quiet_upstream_are_placed_by_asking_it_for_their_gtids(
    mariadb, mydb, tmp_path: Path
) -> None:
    """No transaction goes by while the chunks are read: the puller's heartbeats say the
    stream is past their coordinates, and it asks the upstream which GTIDs they are."""
    execute(mariadb, mydb, "CREATE TABLE q (id INT PRIMARY KEY, v INT)",
            "INSERT INTO q SELECT seq, seq FROM seq_1_to_1000")  # fmt: skip
    root = tmp_path / "cl"
    cfg = PullerConfig(mariadb.uri(), str(root), (f"{mydb}.*",), chunked_snapshot=True,
                       heartbeat_s=0.2)  # fmt: skip
    p, done, th = _follow(cfg)
    asked = _count_asks(p)
    _until(lambda: load_state(root) is not None)
    tid = table_id(root, "q")
    run_snapshot_reads(cfg.upstream_uri, str(root), parallelism=2, chunk_rows=300)
    _until(lambda: not p.state.snapshots, timeout=30)
    done.set()
    th.join(30)
    assert asked and all(a[0] == p.stream_server_id for a in asked)
    assert fingerprint(changelog_table(root, tid)) == fingerprint(upstream_rows(mariadb, mydb, "q"))


def test_a_chunk_written_is_placed_without_waiting_for_the_pullers_flush_interval(
    mariadb, mydb, tmp_path: Path
) -> None:
    """A reader rings the puller's bell after each chunk (``ChunkBell``): with a flush
    interval of 30 s and a busy stream (no heartbeats, whose flushes would place it), the
    table is released within seconds of its reads, not at the next interval's flush."""
    execute(mariadb, mydb, "CREATE TABLE t (id INT PRIMARY KEY, v INT, s VARCHAR(20))",
            "INSERT INTO t SELECT seq, seq, CONCAT('r', seq) FROM seq_1_to_3000")  # fmt: skip
    root = tmp_path / "cl"
    cfg = PullerConfig(mariadb.uri(), str(root), (f"{mydb}.*",), chunked_snapshot=True,
                       flush_interval_s=30.0)  # fmt: skip
    p, done, th = _follow(cfg)
    writer = Writer(mariadb, mydb)
    writer.start()
    try:
        _until(lambda: load_state(root) is not None and p.stats.flushes >= 1)
        tid = table_id(root, "t")
        time.sleep(0.5)  # the stream busy: the puller's flushes now come from its interval
        flushes = p.stats.flushes
        run_snapshot_reads(cfg.upstream_uri, str(root), parallelism=2, chunk_rows=1000)
        read = time.monotonic()
        # released (the puller's state) by a flush that has ended (its count): read from this
        # thread, the state is released in the middle of the flush, before it is counted
        _until(lambda: not p.state.snapshots and p.stats.flushes > flushes, timeout=10)
        assert time.monotonic() - read < 10
    finally:
        writer.stop_.set()
        writer.join()
    target = gtid_now(mariadb)
    _until(lambda: p.stats.position == target, timeout=40)
    done.set()
    th.join(30)
    assert fingerprint(changelog_table(root, tid)) == fingerprint(upstream_rows(mariadb, mydb, "t"))


def test_a_chunks_metadata_lock_holds_ddl_off_and_a_catalog_ahead_of_the_log_waits(
    mariadb, mydb, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a chunk is read its table's metadata lock is held (a DDL waits: here it times
    out), and released after; a catalog ahead of the change log (a DDL the puller has not
    written) is waited for, then refused with what to do."""
    import pymysql

    from cdc_dagster.mysql import chunk_reader
    from cdc_dagster.mysql.errors import PullerBusyError

    execute(mariadb, mydb, "CREATE TABLE m (id INT PRIMARY KEY, v INT)",
            "INSERT INTO m VALUES (1, 1)")  # fmt: skip
    root = tmp_path / "cl"
    _p, done, th = _follow(PullerConfig(mariadb.uri(), str(root), (f"{mydb}.*",),
                                       chunked_snapshot=True))  # fmt: skip
    _until(lambda: load_state(root) is not None)
    done.set()
    th.join(30)  # no puller from here on: a DDL stays unwritten
    tid = table_id(root, "m")
    session = chunk_reader.ReadSession(parse_uri(mariadb.uri()), str(root))

    def alter() -> int | None:
        c = mariadb.connect(database=mydb)
        try:
            with c.cursor() as cur:
                cur.execute("SET SESSION lock_wait_timeout = 1")
                cur.execute("ALTER TABLE m ADD COLUMN z INT")
        except pymysql.err.OperationalError as exc:
            return exc.args[0]
        finally:
            c.close()
        return None

    try:
        schema, _ = chunk_reader._lock_and_check(session.lock, session.log, tid)
        assert [c.name for c in schema.columns] == ["id", "v"]
        assert alter() == 1205  # held: the DDL waited and timed out
        session.lock.rollback()
        assert alter() is None  # released: it goes through
        monkeypatch.setattr(chunk_reader, "SCHEMA_WAIT_S", 1.0)
        started = time.monotonic()
        with pytest.raises(PullerBusyError, match="not the change log's"):
            chunk_reader._lock_and_check(session.lock, session.log, tid)
        assert time.monotonic() - started >= 1.0  # waited for the puller first
    finally:
        session.close()


@pytest.fixture(scope="module")
def spark():
    from cdc_dagster.pipeline.engine import spark_session

    session = spark_session("local[2]", conf={"spark.sql.shuffle.partitions": "2"})
    # Not stopped: getOrCreate gives this process's one local session, which other modules'
    # session fixtures hold too (stopped here, their tests failed when pytest-xdist ran
    # this module first); the process's end stops it.
    yield session


@pytest.mark.slow  # a Spark session of its own
def test_ranges_of_several_tables_read_as_a_few_spark_tasks_equal_the_upstream(
    mariadb, mydb, tmp_path: Path, spark
) -> None:
    """Three tables of four ranges each (a DATETIME key among them: the pymysql client) are
    read by two Spark tasks, not one task per range, while the tables are written."""
    execute(mariadb, mydb,
            "CREATE TABLE t1 (id INT PRIMARY KEY, v INT, s VARCHAR(20))",
            "INSERT INTO t1 SELECT seq, seq, CONCAT('r', seq) FROM seq_1_to_3000",
            "CREATE TABLE t2 (id BIGINT UNSIGNED PRIMARY KEY, v INT)",
            "INSERT INTO t2 SELECT seq * 1000, seq FROM seq_1_to_2000",
            "CREATE TABLE t3 (at DATETIME(6) PRIMARY KEY, v INT)",
            "INSERT INTO t3 SELECT TIMESTAMP('2024-01-01') + INTERVAL seq SECOND, seq "
            "FROM seq_1_to_1000")  # fmt: skip
    root = tmp_path / "cl"
    cfg = PullerConfig(mariadb.uri(), str(root), (f"{mydb}.*",), chunked_snapshot=True)
    p, done, th = _follow(cfg)
    _until(lambda: load_state(root) is not None)
    execute(mariadb, mydb, "UPDATE t1 SET v = -v WHERE id % 7 = 0", "DELETE FROM t2 WHERE v < 50",
            "INSERT INTO t3 VALUES ('2030-01-01', 0)")  # fmt: skip
    reads = run_snapshot_reads(cfg.upstream_uri, str(root), spark, parallelism=4,
                               chunk_rows=200, tasks=2)  # fmt: skip
    # the two tasks take the ranges as a queue (``chunk_reader.claim``): each range once,
    # whichever is free first; one could in principle take them all
    assert (reads.rows, reads.ranges) == (3000 + 1951 + 1001, 9) and reads.tasks in (1, 2)
    assert reads.first_began <= reads.last_ended and reads.task_seconds > 0
    assert not any((root / "snapshot" / "claims").iterdir())  # the job's claims removed
    # each task that read said so once its last chunk was written (the puller places at once)
    ended = (root / "snapshot" / "reads-ended").read_bytes()
    assert ended == b"." * reads.tasks, ended
    target = gtid_now(mariadb)
    _until(lambda: p.stats.position == target and not p.state.snapshots)
    done.set()
    th.join(30)

    def plain(rows: list[tuple]) -> list[tuple]:  # BIGINT UNSIGNED: Decimal in the log
        return [tuple(int(v) if isinstance(v, Decimal) else v for v in r) for r in rows]

    for name in ("t1", "t2", "t3"):
        tid = table_id(root, name)
        assert fingerprint(plain(changelog_table(root, tid))) == fingerprint(
            plain(upstream_rows(mariadb, mydb, name))
        ), name


def test_plans_count_rows_only_where_the_estimate_is_small_or_doubtful(
    mariadb, mydb, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Planning many tables must not scan each (100 x 100k rows took 4.5 s with a COUNT(*)
    each): InnoDB's estimate sizes a table's ranges unless it is small (``EXACT_COUNT_SMALL``:
    the count costs a few ms) or looks stale (under half the integer key's span: the statistics of a
    bulk load not updated yet), and it is never taken above the key's span."""
    import cdc_dagster.mysql.chunk_reader as chunk_reader

    execute(mariadb, mydb,
            "CREATE TABLE dense (id INT PRIMARY KEY, v INT)",
            "INSERT INTO dense SELECT seq, seq FROM seq_1_to_30000",
            "CREATE TABLE sparse (id INT PRIMARY KEY, v INT)",
            "INSERT INTO sparse SELECT seq * 20, seq FROM seq_1_to_25000",
            "CREATE TABLE tiny (id INT PRIMARY KEY, v INT)",
            "INSERT INTO tiny SELECT seq, seq FROM seq_1_to_50",
            "ANALYZE TABLE dense, sparse, tiny")  # fmt: skip
    root = tmp_path / "cl"
    cfg = _snapshots_planned_by_a_puller(mariadb, mydb, root)
    counted: list[str] = []
    real_connect = chunk_reader.connect

    def spying(upstream):  # type: ignore[no-untyped-def]
        conn = real_connect(upstream)
        cursor = conn.cursor

        def spy_cursor(*a, **kw):  # type: ignore[no-untyped-def]
            cur = cursor(*a, **kw)
            execute_ = cur.execute

            def spy_execute(sql, args=None):  # type: ignore[no-untyped-def]
                if "COUNT(*)" in sql:
                    counted.append(sql.rsplit(".", 1)[-1].strip("`"))
                return execute_(sql, args)

            cur.execute = spy_execute
            return cur

        conn.cursor = spy_cursor
        return conn

    monkeypatch.setattr(chunk_reader, "connect", spying)
    state = load_state(root)
    plans = chunk_reader.plan_tables(
        parse_uri(cfg.upstream_uri), str(root), state.snapshots, parallelism=4, chunk_rows=5000
    )
    by_name = {name: plans[table_id(root, name)] for name in ("dense", "sparse", "tiny")}
    assert sorted(counted) == ["sparse", "tiny"]  # doubtful (span 500k > 2 x 25k), small
    assert by_name["sparse"].rows == 25000 and by_name["tiny"].rows == 50
    assert 15000 <= by_name["dense"].rows <= 30000  # the estimate, at most the key's span
    assert len(by_name["dense"].ranges) == 4 and len(by_name["tiny"].ranges) == 1


def test_key_spans_of_many_tables_are_read_together_and_plan_as_one_at_a_time(
    mariadb, mydb, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The integer keys' MIN and MAX of every table come in one UNION ALL a few hundred
    tables (``_key_spans``): unsigned 64-bit keys, signed ones and an empty table side by side
    plan exactly as each table read alone, in ints (a union's DECIMAL is not a key)."""
    import cdc_dagster.mysql.chunk_reader as chunk_reader

    execute(mariadb, mydb,
            "CREATE TABLE s1 (id INT PRIMARY KEY, v INT)",
            "INSERT INTO s1 SELECT CAST(seq AS SIGNED) - 500, seq FROM seq_1_to_2000",
            "CREATE TABLE s2 (id BIGINT UNSIGNED PRIMARY KEY, v INT)",
            "INSERT INTO s2 SELECT 18446744073709551615 - seq * 3, seq FROM seq_1_to_2000",
            "CREATE TABLE s3 (id INT PRIMARY KEY, v INT)",
            "CREATE TABLE s4 (a INT, b INT, PRIMARY KEY (a, b))",
            "INSERT INTO s4 SELECT seq, seq FROM seq_1_to_100")  # fmt: skip
    root = tmp_path / "cl"
    cfg = _snapshots_planned_by_a_puller(mariadb, mydb, root)
    monkeypatch.setattr(chunk_reader, "SPANS_PER_QUERY", 2)  # two queries for three tables
    snapshots = load_state(root).snapshots
    upstream = parse_uri(cfg.upstream_uri)
    together = chunk_reader.plan_tables(upstream, str(root), snapshots, parallelism=4,
                                        chunk_rows=200)  # fmt: skip
    ids = {name: table_id(root, name) for name in ("s1", "s2", "s3", "s4")}
    log, conn = ChangeLog(root), mariadb.connect()
    try:
        for name, tid in ids.items():
            schema = chunk_reader._schema(log, tid)[0]
            alone = chunk_reader._plan(conn, schema, tid, snapshots[tid], 4, 200,
                                       together[tid].rows)  # fmt: skip
            assert together[tid].ranges == alone.ranges, name
    finally:
        conn.close()
    assert len(together[ids["s2"]].ranges) == 4 and len(together[ids["s4"]].ranges) == 1
    cuts = [lo for lo, _ in together[ids["s2"]].ranges[1:]]
    assert all(type(c[0]) is int for c in cuts) and cuts[0][0] > 2**63  # no DECIMAL, no float
    assert together[ids["s3"]].ranges == ((None, None),)  # empty: one open range
    assert all(chunk_reader.read_plan(root, tid, snapshots[tid]) == together[tid]
               for tid in ids.values())  # written, each  # fmt: skip
