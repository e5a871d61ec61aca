"""Binlog puller against a private MariaDB: rows, TS order, DDL placement, resume, snapshot."""

from __future__ import annotations

import json
import threading
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest

from cdc_dagster.mysql.puller import PullerConfig, PullerError, run_puller
from cdc_dagster.mysql.upstream import check_upstream
from cdc_dagster.schema import DdlRecord
from cdc_dagster.upstream.changelog import ChangeLog
from cdc_dagster.upstream.uri import UpstreamError, parse_uri
from scheduler_core.ts import MAX_TS, physical_ms

TIMEOUT = 60.0


def ddls(root: Path) -> list[DdlRecord]:
    return [
        DdlRecord.from_json(json.loads(p.read_text()))
        for p in sorted((root / "ddl").glob("0*.json"))
    ]


def changes(root: Path, table_id: int) -> list[dict]:
    """The table's change-log rows (binlog event files mounted), in (ts, seq) order."""
    log = ChangeLog(root)
    files = (
        log.data_files(table_id, 0, MAX_TS) if (root / "tables" / str(table_id)).exists() else []
    )
    if not files:
        return []
    t = pa.concat_tables([log.read_data_file(f) for f in files], promote_options="permissive")
    return sorted(t.to_pylist(), key=lambda r: (r["_commit_ts"], r["_seq"]))


def table_id(root: Path, name: str) -> int:
    for rec in ddls(root):
        for tid, s in rec.tables.items():
            if s is not None and s.table == name:
                return tid
    raise KeyError(name)


def gtid_now(mariadb) -> str:
    c = mariadb.connect()
    with c.cursor() as cur:
        cur.execute("SELECT @@gtid_binlog_pos")
        pos = cur.fetchone()[0]
    c.close()
    return pos


def pull_until_caught_up(mariadb, root: Path, db: str, **kw) -> object:
    target = gtid_now(mariadb)
    cfg = PullerConfig(mariadb.uri(), str(root), (f"{db}.*",), heartbeat_s=0.5, **kw)
    stats = run_puller(cfg, stop_after=lambda s: s.position == target or _late(s))
    assert stats.position == target, f"puller reached {stats.position}, upstream at {target}"
    return stats


def _late(s) -> bool:
    import time

    return time.monotonic() - s.started > TIMEOUT


def execute(mariadb, db: str, *stmts: str) -> None:
    c = mariadb.connect(database=db, autocommit=False)
    with c.cursor() as cur:
        for s in stmts:
            if s == "COMMIT":
                c.commit()
            else:
                cur.execute(s)
    c.commit()
    c.close()


def replay(rows: list[dict], key_cols: list[int]) -> dict[tuple, dict]:
    """Apply change-log rows in (ts, seq) order: the table they describe."""
    state: dict[tuple, dict] = {}
    for r in rows:
        if r["_op"] in (2, 3) and r[f"b{key_cols[0]}"] is not None:
            state.pop(tuple(r[f"b{k}"] for k in key_cols), None)
        if r["_op"] in (1, 2):
            state[tuple(r[f"c{k}"] for k in key_cols)] = r
    return state


def test_multi_table_transactions_ddl_and_restart_land_in_order_exactly_once(
    mariadb, mydb, tmp_path
):
    root = tmp_path / "cl"
    execute(mariadb, mydb,
            "CREATE TABLE acc (id INT PRIMARY KEY, bal DECIMAL(12,2) NOT NULL, note VARCHAR(20))",
            "CREATE TABLE log (id BIGINT UNSIGNED PRIMARY KEY, msg TEXT, at DATETIME(6))")  # fmt: skip
    pull_until_caught_up(mariadb, root, mydb)  # bootstrap: create records, empty snapshot
    acc, lg = table_id(root, "acc"), table_id(root, "log")
    execute(mariadb, mydb,
            "INSERT INTO acc VALUES (1, 10.00, 'a'), (2, 20.00, NULL)",
            "INSERT INTO log VALUES (18446744073709551615, '😀 first', '2024-01-02 03:04:05.678901')",
            "COMMIT",
            "UPDATE acc SET bal = bal - 5 WHERE id = 1", "UPDATE acc SET bal = bal + 5 WHERE id = 2",
            "INSERT INTO log VALUES (2, 'transfer', NULL)", "COMMIT")  # fmt: skip
    pull_until_caught_up(mariadb, root, mydb)  # restart #1: resume by GTID
    execute(mariadb, mydb, "ALTER TABLE acc ADD COLUMN flag INT NOT NULL DEFAULT 7 AFTER bal")
    execute(mariadb, mydb, "UPDATE acc SET id = 3, flag = 8 WHERE id = 1",
            "DELETE FROM log WHERE id = 2")  # fmt: skip
    execute(mariadb, mydb, "ALTER TABLE acc RENAME COLUMN note TO memo")
    execute(mariadb, mydb, "INSERT INTO acc VALUES (4, 1.00, 1, 'm')")
    stats = pull_until_caught_up(mariadb, root, mydb)  # restart #2, two DDLs behind
    assert stats.ddls == 2

    a, g = changes(root, acc), changes(root, lg)
    assert [r["_op"] for r in a] == [1, 1, 2, 2, 2, 1]
    assert [r["_op"] for r in g] == [1, 1, 3]
    # one transaction, one commit ts across tables; transactions strictly ordered
    assert a[0]["_commit_ts"] == a[1]["_commit_ts"] == g[0]["_commit_ts"]
    assert a[2]["_commit_ts"] == a[3]["_commit_ts"] == g[1]["_commit_ts"] > a[0]["_commit_ts"]
    assert a[4]["_commit_ts"] == g[2]["_commit_ts"] > a[3]["_commit_ts"]
    assert g[0]["c1"] == Decimal(2**64 - 1) and g[0]["c2"] == "😀 first"
    recs = ddls(root)
    add, ren = recs[-2], recs[-1]
    assert (add.action, ren.action) == ("add_column", "rename_column")
    # the DDLs sit between the right rows, and rows carry the schema they were written with
    assert (
        a[3]["_commit_ts"] < add.commit_ts < a[4]["_commit_ts"] < ren.commit_ts < a[5]["_commit_ts"]
    )
    assert [r["_schema_version"] for r in a] == [recs[0].commit_ts] * 4 + [
        add.commit_ts,
        ren.commit_ts,
    ]
    after = add.tables[acc]
    flag = next(c for c in after.columns if c.name == "flag")
    assert (flag.default, flag.nullable) == ("7", False)
    memo = next(c for c in ren.tables[acc].columns if c.name == "memo")
    assert memo.id == next(c.id for c in after.columns if c.name == "note")  # id kept
    # the key-changing update carries the old key as the before image
    assert (a[4]["b1"], a[4]["c1"], a[4][f"c{flag.id}"]) == (1, 3, 8)
    final = replay(a, [1])
    assert sorted(final) == [(2,), (3,), (4,)]
    # the shared reader sees the same history and resolved marks
    log = ChangeLog(root)
    assert log.table_resolved_ts(acc) >= a[-1]["_commit_ts"]
    assert log.schema_at(acc, a[-1]["_commit_ts"]) == ren.tables[acc]
    assert log.schema_at(acc, a[3]["_commit_ts"]) == recs[0].tables[acc]


@pytest.mark.slow
def test_crash_after_data_files_before_state_rewrites_nothing_twice(mariadb, mydb, tmp_path):
    root = tmp_path / "cl"
    execute(mariadb, mydb, "CREATE TABLE t (id INT PRIMARY KEY, v INT)")
    pull_until_caught_up(mariadb, root, mydb)
    tid = table_id(root, "t")
    execute(mariadb, mydb, *[f"INSERT INTO t VALUES ({i}, {i})" for i in range(50)])
    # the crash point: data files renamed into place, the state write (and so the resolved
    # marks after it) never happened
    marks = [root / "puller" / "state.json", root / "ddl" / "resolved.json",
             root / "tables" / str(tid) / "resolved" / "0.json"]  # fmt: skip
    saved = [m.read_bytes() for m in marks]
    pull_until_caught_up(mariadb, root, mydb)
    for m, b in zip(marks, saved, strict=True):
        m.write_bytes(b)
    pull_until_caught_up(mariadb, root, mydb)
    rows = changes(root, tid)
    assert sorted(r["c1"] for r in rows) == list(range(50))


def test_idle_upstream_resolved_marks_follow_the_clock(mariadb, mydb, tmp_path):
    """No row events for seconds: the server's heartbeats (default config: every second)
    move the table's resolved mark on disk, where the captures read it, with the clock."""
    import time

    root = tmp_path / "cl"
    execute(mariadb, mydb, "CREATE TABLE t (id INT PRIMARY KEY)")
    pull_until_caught_up(mariadb, root, mydb)
    tid = table_id(root, "t")
    cfg = PullerConfig(mariadb.uri(), str(root), (f"{mydb}.*",))
    lags: list[float] = []
    started = time.monotonic()

    def stop(s) -> bool:
        if time.monotonic() - started > 1.5:  # past the connect and the first heartbeat
            mark = ChangeLog(root).table_resolved_ts(tid)
            lags.append(time.time() - physical_ms(mark) / 1000)
        return time.monotonic() - started > 6 or _late(s)

    run_puller(cfg, stop_after=stop)
    assert len(lags) >= 3, lags  # stop() runs at each heartbeat
    assert max(lags) < 2.5, lags


def _backlog(
    mariadb, db: str, root: Path, n_bytes: int, pace_s: float = 0.0
) -> tuple[int, int, str]:
    """A table caught up in the change log at ``root``, then ~``n_bytes`` of row events
    written past it in transactions of 500 rows, ``pace_s`` apart (a backlog's binlog time
    spans seconds): its id, the rows, the upstream's GTID."""
    import time

    execute(mariadb, db, "CREATE TABLE t (id INT PRIMARY KEY, pad VARCHAR(600))")
    pull_until_caught_up(mariadb, root, db)
    n = n_bytes // 500
    for lo in range(0, n, 500):
        values = ", ".join(f"({i}, REPEAT('x', 500))" for i in range(lo, min(lo + 500, n)))
        execute(mariadb, db, f"INSERT INTO t VALUES {values}")
        time.sleep(pace_s)
    return table_id(root, "t"), n, gtid_now(mariadb)


@pytest.fixture(params=["end known", "end not known"])
def binlog_end(request, monkeypatch) -> str:
    """Both ways a stream learns its backlog's end: the server's binlog status as the dump
    begins (``BinlogStream.end``), or, without the grant, that the server sends no more."""
    if request.param == "end not known":
        monkeypatch.setattr("cdc_dagster.mysql.binlog_wire.binlog_end", lambda cur: None)
    return request.param


def test_a_backlogs_last_rows_are_flushed_when_the_stream_is_drained_not_at_the_interval(
    mariadb, mydb, tmp_path, binlog_end
):
    """A backlog of more than DRAINED_FLUSH_BYTES: once the server has sent it all, its rows
    are in the change log at once, not at the next interval (60 s here) or heartbeat (4 s):
    the captures of a resumed changefeed waited for that to sink its backlog's end."""
    import time

    from cdc_dagster.mysql.puller import DRAINED_FLUSH_BYTES
    from cdc_dagster.mysql.state import load_state

    root = tmp_path / "cl"
    tid, n, target = _backlog(mariadb, mydb, root, 2 * DRAINED_FLUSH_BYTES)
    cfg = PullerConfig(mariadb.uri(), str(root), (f"{mydb}.*",), flush_interval_s=60.0,
                       heartbeat_s=4.0)  # fmt: skip
    started = time.monotonic()
    seen: list[float] = []

    def watch() -> None:  # the captures' view: the puller's state on disk
        while not seen and time.monotonic() - started < TIMEOUT:
            state = load_state(root)
            if state is not None and state.gtid == target:
                seen.append(time.monotonic() - started)
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    run_puller(cfg, stop_after=lambda s: bool(seen) or _late(s))  # ends at a heartbeat
    watcher.join()
    # without the drained flush, the backlog's end waits for the heartbeat 4 s after it
    assert seen and seen[0] < 3.0, f"the backlog's end was flushed after {seen} s"
    assert sorted(r["c1"] for r in changes(root, tid)) == list(range(n))


def test_a_backlog_is_flushed_at_its_end_not_cut_by_the_interval_or_flush_bytes(
    mariadb, mydb, tmp_path, binlog_end, monkeypatch
):
    """Catching up with a backlog of recent rows (read far faster than the binlog's time
    ran), the puller holds them for its end: the interval (10 ms) and ``flush_bytes`` (8
    MiB) do not cut them. Cut there, their last seconds looked like a caught-up stream to
    the captures, sunk at once, and the rest a moment later in a second MERGE."""
    from cdc_dagster.mysql import puller as pm

    # Writing the backlog takes ~15 s here (100 transactions 0.1 s apart), as long as
    # RECENT_S: on a slow or busy machine its first rows were older than that when read, and
    # a slow read outlasts HOLD_MAX_S -- either rightly flushes before the end (3 files in
    # a full suite here). Those caps are not what this test is about: every row here is
    # recent, held at most 2 min.
    monkeypatch.setattr(pm, "RECENT_S", 600.0)
    monkeypatch.setattr(pm, "HOLD_MAX_S", 120.0)
    root = tmp_path / "cl"
    tid, n, _ = _backlog(mariadb, mydb, root, 24 << 20, pace_s=0.1)
    before = ChangeLog(root).data_files(tid, 0, MAX_TS)
    stats = pull_until_caught_up(mariadb, root, mydb, flush_interval_s=0.01,
                                 flush_bytes=8 << 20)  # fmt: skip
    files = [f for f in ChangeLog(root).data_files(tid, 0, MAX_TS) if f not in before]
    # one flush: one file per minute of commit ts its rows span (at most two here)
    assert 1 <= len(files) <= 2, (len(files), stats.flushes)
    assert sorted(r["c1"] for r in changes(root, tid)) == list(range(n))


def test_a_resumed_backlogs_first_rows_are_flushed_soon_after_they_come(
    mariadb, mydb, tmp_path, monkeypatch
):
    """The first flush comes FIRST_FLUSH_S after a pull's first rows, not a whole interval
    after an earlier flush that found nothing (the interval's first check came first, at the
    stream's first events: it was set up slowly, here by 0.5 s). That empty
    flush restarted the interval, the backlog was in its held last seconds by then, and
    its rows went out in one flush at its end: the captures mounted all of it after the
    puller was done."""
    import time

    from cdc_dagster.mysql import puller as pm
    from cdc_dagster.mysql.binlog_wire import BinlogStream

    root = tmp_path / "cl"
    execute(mariadb, mydb, "CREATE TABLE t (id INT PRIMARY KEY)")
    pull_until_caught_up(mariadb, root, mydb)
    for i in range(100):
        execute(mariadb, mydb, f"INSERT INTO t VALUES ({i})")
    target = gtid_now(mariadb)
    monkeypatch.setattr(pm, "RECENT_S", 0.0)  # nothing held: only the interval times flushes
    start, batches = pm.Puller.start, BinlogStream.batches

    def slow_start(self):  # set up slowly: the interval's first check comes at once
        start(self)
        time.sleep(2 * pm.FIRST_FLUSH_S)

    def a_read_per_transaction(self):  # and a backlog read over a couple of seconds
        for batch in batches(self):
            for event in batch:
                yield [event]
                if event[0] == pm.XID:
                    time.sleep(0.02)

    flushes: list[tuple[float, int]] = []
    flush = pm.Puller.flush

    def recorded(self, *args, **kw):
        flushes.append((time.monotonic(), self.buffered))
        flush(self, *args, **kw)

    monkeypatch.setattr(pm.Puller, "start", slow_start)
    monkeypatch.setattr(BinlogStream, "batches", a_read_per_transaction)
    monkeypatch.setattr(pm.Puller, "flush", recorded)
    cfg = PullerConfig(mariadb.uri(), str(root), (f"{mydb}.*",), flush_interval_s=1.0)
    run_puller(cfg, stop_after=lambda s: s.position == target or _late(s))
    empty = [t for t, buffered in flushes if not buffered]
    with_rows = [t for t, buffered in flushes if buffered]
    assert empty and with_rows and empty[0] < with_rows[0], flushes
    # the first transaction, then FIRST_FLUSH_S: not the interval (1 s)
    assert with_rows[0] - empty[0] < 0.6, flushes
    assert len(with_rows) >= 2, flushes  # the backlog went out in more than one flush
    assert sorted(r["c1"] for r in changes(root, table_id(root, "t"))) == list(range(100))


def test_a_server_pausing_mid_backlog_does_not_cut_it(mariadb, mydb, tmp_path, monkeypatch):
    """The server's dump thread may send nothing for a moment mid-backlog (a busy machine):
    the stream looks drained there. Knowing where the binlog ended as the dump began, the
    puller flushes the backlog once, at that end: here the server seems to pause after
    every transaction (each socket read ends there, and nothing more waits), and the
    backlog still lands in one flush."""
    from cdc_dagster.mysql.binlog_wire import BinlogStream
    from cdc_dagster.mysql.puller import XID

    root = tmp_path / "cl"
    tid, n, _ = _backlog(mariadb, mydb, root, 24 << 20, pace_s=0.1)
    before = ChangeLog(root).data_files(tid, 0, MAX_TS)
    batches = BinlogStream.batches

    def a_read_per_transaction(self):
        for batch in batches(self):
            start = 0
            for i, event in enumerate(batch):
                if event[0] == XID:
                    yield batch[start : i + 1]
                    start = i + 1
            if start < len(batch):
                yield batch[start:]

    monkeypatch.setattr(BinlogStream, "batches", a_read_per_transaction)
    monkeypatch.setattr(BinlogStream, "drained", lambda self, last_event_time: True)
    stats = pull_until_caught_up(mariadb, root, mydb, flush_interval_s=0.01,
                                 flush_bytes=8 << 20)  # fmt: skip
    files = [f for f in ChangeLog(root).data_files(tid, 0, MAX_TS) if f not in before]
    assert 1 <= len(files) <= 2, (len(files), stats.flushes)  # one flush (see above)
    assert sorted(r["c1"] for r in changes(root, tid)) == list(range(n))


def test_a_busy_live_stream_is_flushed_each_interval(mariadb, mydb, tmp_path):
    """A writer that never pauses keeps bytes on the socket, but the binlog's time runs with
    the clock: the puller flushes each interval while it writes (not only when it stops)."""
    import time

    from cdc_dagster.mysql.state import load_state

    root = tmp_path / "cl"
    execute(mariadb, mydb, "CREATE TABLE t (id INT PRIMARY KEY, v INT)")
    pull_until_caught_up(mariadb, root, mydb)
    stop = threading.Event()

    def write() -> None:
        c = mariadb.connect(database=mydb, autocommit=True)
        i = 0
        with c.cursor() as cur:
            while not stop.is_set():
                cur.execute("REPLACE INTO t VALUES (%s, %s)", (i % 1000, i))
                i += 1
        c.close()

    writer = threading.Thread(target=write)
    writer.start()
    positions: list[str] = []
    started = time.monotonic()

    def watch(s) -> bool:
        state = load_state(root)
        if state is not None and (not positions or positions[-1] != state.gtid):
            positions.append(state.gtid)
        return time.monotonic() - started > 4.0 or _late(s)

    try:
        cfg = PullerConfig(mariadb.uri(), str(root), (f"{mydb}.*",), flush_interval_s=0.3)
        run_puller(cfg, stop_after=watch)
    finally:
        stop.set()
        writer.join()
    assert len(positions) >= 6, positions  # ~13 flushes in 4 s; none while writing if held


def test_snapshot_and_concurrent_writes_arrive_exactly_once(mariadb, mydb, tmp_path):
    root = tmp_path / "cl"
    execute(mariadb, mydb, "CREATE TABLE s (id INT PRIMARY KEY, v INT NOT NULL, tag CHAR(3))",
            *[f"INSERT INTO s VALUES {', '.join(f'({i}, {i}, NULL)' for i in range(k, k + 500))}"
              for k in range(0, 3000, 500)])  # fmt: skip
    wrote = threading.Event()
    progress: list[tuple[int, int]] = []

    def on_chunk(name: str, done: int, total: int) -> None:
        progress.append((done, total))
        if not wrote.is_set():  # writes while the snapshot is being read
            execute(mariadb, mydb, "INSERT INTO s VALUES (5000, 1, 'new')",
                    "UPDATE s SET v = -1 WHERE id = 2999", "DELETE FROM s WHERE id = 0",
                    "UPDATE s SET id = 6000 WHERE id = 1")  # fmt: skip
            wrote.set()

    cfg_kw = {"snapshot_chunk_rows": 400, "progress": on_chunk}
    target_holder: dict[str, str] = {}

    def stop(s) -> bool:
        if wrote.is_set() and "t" not in target_holder:
            target_holder["t"] = gtid_now(mariadb)
        return s.position == target_holder.get("t") or _late(s)

    cfg = PullerConfig(mariadb.uri(), str(root), (f"{mydb}.*",), heartbeat_s=0.3, **cfg_kw)
    run_puller(cfg, stop_after=stop)
    assert progress[-1] == (3000, 3000) and len(progress) == 8
    rows = changes(root, table_id(root, "s"))
    snap_ts = rows[0]["_commit_ts"]
    snap = [r for r in rows if r["_commit_ts"] == snap_ts]
    assert len(snap) == 3000 and all(r["_op"] == 1 for r in snap)  # the state before the writes
    stream = [r for r in rows if r["_commit_ts"] > snap_ts]
    assert [r["_op"] for r in stream] == [1, 2, 3, 2]
    final = replay(rows, [1])
    c = mariadb.connect(database=mydb)
    with c.cursor() as cur:
        cur.execute("SELECT id, v, tag FROM s ORDER BY id")
        upstream = cur.fetchall()
    c.close()
    assert [(k[0], r["c2"], r["c3"]) for k, r in sorted(final.items())] == list(upstream)


def test_table_without_key_is_refused_unless_force_replicate(mariadb, mydb, tmp_path):
    execute(mariadb, mydb, "CREATE TABLE nokey (a INT, b INT)")
    cfg = PullerConfig(mariadb.uri(), str(tmp_path / "a"), (f"{mydb}.*",))
    with pytest.raises(PullerError, match=rf"{mydb}\.nokey has no primary key.*force-replicate"):
        run_puller(cfg, stop_after=0)
    forced = PullerConfig(mariadb.uri(query="server-id=99&force-replicate=true"),
                          str(tmp_path / "b"), (f"{mydb}.*",))  # fmt: skip
    run_puller(forced, stop_after=0)
    rec = ddls(tmp_path / "b")[0]
    assert len(rec.tables[rec.creates[0]].primary_key) == 2


def test_unparseable_ddl_stops_the_puller_with_a_clear_error(mariadb, mydb, tmp_path):
    root = tmp_path / "cl"
    execute(mariadb, mydb, "CREATE TABLE t (id INT PRIMARY KEY)")
    pull_until_caught_up(mariadb, root, mydb)
    execute(mariadb, mydb, "ALTER TABLE t ADD CONSTRAINT c CHECK (id > 0)")
    execute(mariadb, mydb, "ALTER TABLE t PARTITION BY HASH(id) PARTITIONS 2")
    with pytest.raises(PullerError, match=r"cannot replicate.*PARTITION"):
        run_puller(PullerConfig(mariadb.uri(), str(root), (f"{mydb}.*",)), stop_after=20)


def test_wrong_upstream_settings_say_what_to_change(mariadb):
    c = mariadb.connect()
    with c.cursor() as cur:
        cur.execute("SET GLOBAL binlog_format = 'MIXED'")
        cur.execute("CREATE USER IF NOT EXISTS 'weak'@'127.0.0.1'")
        cur.execute("GRANT SELECT ON *.* TO 'weak'@'127.0.0.1'")
    try:
        weak = mariadb.connect(user="weak") if False else None  # noqa: F841
        import pymysql

        conn = pymysql.connect(host="127.0.0.1", port=mariadb.port, user="weak")
        with pytest.raises(UpstreamError) as err:
            check_upstream(conn)
        conn.close()
        msg = str(err.value)
        assert "binlog_format is MIXED, need ROW: SET GLOBAL binlog_format=ROW" in msg
        assert "lacks REPLICATION SLAVE, BINLOG MONITOR" in msg
    finally:
        with c.cursor() as cur:
            cur.execute("SET GLOBAL binlog_format = 'ROW'")
        c.close()


def test_upstream_uri_errors_and_redaction(monkeypatch):
    with pytest.raises(UpstreamError, match="scheme must be mysql"):
        parse_uri("postgres://u@h/")
    with pytest.raises(UpstreamError, match="server-id must be"):
        parse_uri("mysql://u@h:3306/?server-id=x")
    cfg = parse_uri("mysql://cdc:s3cret@db1:3306/?server-id=4242")
    assert "s3cret" not in repr(cfg) and "***" in repr(cfg)
    env = parse_uri("mysql://cdc:${CDC_PW_T}@db1/")
    monkeypatch.delenv("CDC_PW_T", raising=False)
    with pytest.raises(UpstreamError, match=r"CDC_PW_T.*does not set"):
        env.connect_kwargs()
    monkeypatch.setenv("CDC_PW_T", "pw")
    assert env.connect_kwargs()["password"] == "pw"


@pytest.mark.slow
def test_upstream_restart_mid_stream_rotates_the_binlog_and_loses_nothing(mariadb, mydb, tmp_path):
    root = tmp_path / "cl"
    execute(mariadb, mydb, "CREATE TABLE r (id INT PRIMARY KEY, v INT)")
    pull_until_caught_up(mariadb, root, mydb)
    tid = table_id(root, "r")
    execute(mariadb, mydb, *[f"INSERT INTO r VALUES ({i}, {i})" for i in range(20)])
    cfg = PullerConfig(mariadb.uri(), str(root), (f"{mydb}.*",), heartbeat_s=0.3)
    done = threading.Event()
    target: dict[str, str] = {}
    errors: list[BaseException] = []

    def run() -> None:
        try:
            run_puller(cfg, stop_after=lambda s: s.position == target.get("t") or _late(s))
        except BaseException as exc:
            errors.append(exc)
        done.set()

    th = threading.Thread(target=run)
    th.start()
    import time

    time.sleep(1.0)
    mariadb.restart()  # a new binlog file; the puller's connection drops
    execute(mariadb, mydb, *[f"INSERT INTO r VALUES ({i}, {i})" for i in range(20, 40)],
            "UPDATE r SET v = -1 WHERE id = 3")  # fmt: skip
    target["t"] = gtid_now(mariadb)
    th.join(TIMEOUT + 10)
    assert not errors, errors
    rows = changes(root, tid)
    assert sorted(r["c1"] for r in rows if r["_op"] == 1) == list(range(40))
    assert [r["c2"] for r in rows if r["_op"] == 2] == [-1]


@pytest.mark.slow
def test_purged_binlog_is_a_clear_error_saying_how_to_resnapshot(mariadb, mydb, tmp_path):
    root = tmp_path / "cl"
    execute(mariadb, mydb, "CREATE TABLE p (id INT PRIMARY KEY)")
    pull_until_caught_up(mariadb, root, mydb)
    execute(mariadb, mydb, "INSERT INTO p VALUES (1)")
    c = mariadb.connect()
    with c.cursor() as cur:
        cur.execute("FLUSH BINARY LOGS")
        cur.execute("SHOW BINARY LOGS")
        last = cur.fetchall()[-1][0]
        import time

        for _ in range(100):  # the old file goes only after MariaDB's binlog checkpoint
            cur.execute(f"PURGE BINARY LOGS TO '{last}'")
            cur.execute("SHOW BINARY LOGS")
            if cur.fetchall()[0][0] == last:
                break
            time.sleep(0.1)
    c.close()
    cfg = PullerConfig(mariadb.uri(), str(root), (f"{mydb}.*",), heartbeat_s=0.3)
    with pytest.raises(PullerError, match=r"no longer has the binlog.*re-snapshot") as err:
        run_puller(cfg, stop_after=20)
    assert "were purged before the puller read them, and are lost" in str(err.value)
    assert f"its change log {root}" in str(err.value) and not err.value.retryable


@pytest.mark.slow
def test_killed_binlog_connection_resumes_at_the_last_transaction_not_the_start(
    mariadb, mydb, tmp_path
):
    """A reconnect resumes from the last committed transaction, not where the run began."""
    import time

    root = tmp_path / "cl"
    execute(mariadb, mydb, "CREATE TABLE k (id INT PRIMARY KEY)")
    pull_until_caught_up(mariadb, root, mydb)
    tid = table_id(root, "k")
    cfg = PullerConfig(mariadb.uri(), str(root), (f"{mydb}.*",), heartbeat_s=0.3)
    target: dict[str, str] = {}
    seen_rows: list[int] = []

    def stop(s) -> bool:
        seen_rows.append(s.row_events)
        return s.position == target.get("t") or _late(s)

    th = threading.Thread(target=run_puller, args=(cfg, stop))
    th.start()
    execute(mariadb, mydb, *[f"INSERT INTO k VALUES ({i})" for i in range(20)])
    deadline = time.monotonic() + 20
    while (not seen_rows or seen_rows[-1] < 20) and time.monotonic() < deadline:
        time.sleep(0.05)
    c = mariadb.connect()
    with c.cursor() as cur:
        cur.execute(
            "SELECT ID FROM information_schema.PROCESSLIST WHERE COMMAND LIKE 'Binlog Dump%'"
        )
        for (pid,) in cur.fetchall():
            cur.execute(f"KILL {pid}")
    c.close()
    execute(mariadb, mydb, *[f"INSERT INTO k VALUES ({i})" for i in range(20, 30)])
    target["t"] = gtid_now(mariadb)
    th.join(TIMEOUT + 10)
    assert sorted(r["c1"] for r in changes(root, tid)) == list(range(30))


def test_validate_changefeed_names_every_keyless_table(mariadb, mydb):
    from cdc_dagster.mysql.checks import validate_changefeed

    execute(mariadb, mydb, "CREATE TABLE ok1 (id INT PRIMARY KEY)",
            "CREATE TABLE ok2 (u INT NOT NULL, UNIQUE KEY uk (u))",
            "CREATE TABLE bad1 (a INT)", "CREATE TABLE bad2 (u INT NULL, UNIQUE KEY uk (u))",
            "CREATE TABLE tmp_x (a INT)")  # fmt: skip
    with pytest.raises(UpstreamError) as err:
        validate_changefeed(mariadb.uri(), [f"{mydb}.*", f"!{mydb}.tmp_*"])
    assert f"{mydb}.bad1, {mydb}.bad2;" in str(err.value)
    assert validate_changefeed(mariadb.uri(), [f"{mydb}.ok*"]) == [f"{mydb}.ok1", f"{mydb}.ok2"]
    forced = mariadb.uri(query="force-replicate=true")
    assert len(validate_changefeed(forced, [f"{mydb}.*"])) == 5


def test_the_catalog_of_many_tables_is_read_in_a_few_queries_as_table_by_table(mariadb, mydb):
    """``read_tables``: two queries per database for all its tables, each table as its own
    ``read_columns`` plus keys reads it; a table gone is left out; an unsupported type is
    named for its table alone (or raised)."""
    from cdc_dagster.mysql.catalog import read_columns, read_tables
    from cdc_dagster.mysql.types import UnsupportedTypeError

    execute(mariadb, mydb, "CREATE TABLE a (id INT PRIMARY KEY, s VARCHAR(5) DEFAULT 'x', "
            "d DECIMAL(10,2) NULL, KEY ks (s, d))",
            "CREATE TABLE b (u BIGINT UNSIGNED NOT NULL, t DATETIME(3), UNIQUE KEY uk (u))",
            "CREATE TABLE g (id INT PRIMARY KEY, p POINT)",
            "CREATE TABLE c (x INT)")  # fmt: skip
    conn = mariadb.connect()
    try:
        names = [(mydb, "a"), (mydb, "b"), (mydb, "nope"), (mydb, "c")]
        bad: list[str] = []
        got = read_tables(conn, [*names, (mydb, "g")], lambda d, t, e: bad.append(f"{d}.{t}"))
        assert bad == [f"{mydb}.g"] and set(got) == {(mydb, "a"), (mydb, "b"), (mydb, "c")}
        for db, t in got:
            assert got[(db, t)].columns == read_columns(conn, db, t), t
        assert got[(mydb, "a")].keys == {"PRIMARY": (True, ["id"]), "ks": (False, ["s", "d"])}
        assert got[(mydb, "b")].keys == {"uk": (True, ["u"])} and got[(mydb, "c")].keys == {}
        with pytest.raises(UnsupportedTypeError):
            read_tables(conn, [(mydb, "g")])
    finally:
        conn.close()


def test_snapshot_of_a_composite_key_table_in_chunks(mariadb, mydb, tmp_path):
    rows = [f"({a}, '{b}', {a * 10 + len(b)})" for a in range(7) for b in ("", "a", "b", "ü")]
    execute(mariadb, mydb, "CREATE TABLE ck (a INT, b VARCHAR(3), v INT, PRIMARY KEY (a, b))",
            f"INSERT INTO ck VALUES {', '.join(rows)}")  # fmt: skip
    root = tmp_path / "cl"
    pull_until_caught_up(mariadb, root, mydb, snapshot_chunk_rows=3)
    got = changes(root, table_id(root, "ck"))
    assert len(got) == 28 and len({(r["c1"], r["c2"]) for r in got}) == 28


def test_a_second_puller_on_the_same_change_log_is_refused(mariadb, mydb, tmp_path):
    import fcntl

    root = tmp_path / "cl"
    (root / "puller").mkdir(parents=True)
    with open(root / "puller" / "lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        cfg = PullerConfig(mariadb.uri(), str(root), (f"{mydb}.*",))
        with pytest.raises(PullerError, match="another puller is running"):
            run_puller(cfg, stop_after=0)


def test_binlog_event_files_are_lz4_with_dictionaries_only_where_values_repeat(
    mariadb, mydb, tmp_path
):
    """The puller's files are written for speed (BINLOG_WRITE_OPTIONS): lz4, a dictionary on
    the table map but none tried on the row images; they read back whole."""
    import pyarrow.parquet as pq

    root = tmp_path / "cl"
    tid, n, _ = _backlog(mariadb, mydb, root, 1 << 20)
    pull_until_caught_up(mariadb, root, mydb)
    files = ChangeLog(root).data_files(tid, 0, MAX_TS)
    assert files
    for f in files:
        group = pq.ParquetFile(f.path).metadata.row_group(0)
        cols = {group.column(i).path_in_schema: group.column(i) for i in range(group.num_columns)}
        assert {c.compression for c in cols.values()} == {"LZ4"}, f.path
        assert "RLE_DICTIONARY" in cols["_table_map"].encodings
        assert "RLE_DICTIONARY" not in cols["_rows"].encodings
    assert sorted(r["c1"] for r in changes(root, tid)) == list(range(n))
