"""Tables that join a running changefeed with data in them (a widened filter, a RENAME into
the filter): a snapshot at a known binlog position, then the stream; nothing missed or
doubled, downstream equal to upstream. And CREATE TABLE ... SELECT across a stop."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from pathlib import Path

import psycopg
import pymysql
import pytest
from test_binlog_puller import _late, changes, ddls, execute, gtid_now, replay, table_id
from test_mysql_to_pg import replicate

from cdc_dagster.mysql.puller import PullerConfig, PullerStats, run_puller
from cdc_dagster.mysql.state import load_state
from cdc_dagster.sinks.postgres import PostgresSink


def pull(
    mariadb, root: Path, filters: tuple[str, ...], ready: threading.Event | None = None, **kw
) -> PullerStats:
    """Run the puller with ``filters`` until it has read the binlog as it is once ``ready``
    is set (at once without it)."""
    target: dict[str, str] = {}

    def stop(s: PullerStats) -> bool:
        if "t" not in target and (ready is None or ready.is_set()):
            target["t"] = gtid_now(mariadb)
        return s.position == target.get("t") or _late(s)

    cfg = PullerConfig(mariadb.uri(), str(root), filters, heartbeat_s=0.3, **kw)
    stats = run_puller(cfg, stop_after=stop)
    assert stats.position == target.get("t"), (stats.position, target)
    return stats


def upstream_rows(mariadb, db: str, table: str) -> list[tuple]:
    c = mariadb.connect(database=db)
    with c.cursor() as cur:
        cur.execute(f"SELECT * FROM `{table}` ORDER BY 1")
        rows = [tuple(r) for r in cur.fetchall()]
    c.close()
    return rows


def fingerprint(rows: list[tuple]) -> str:
    """Order-independent: row count and the sum of the rows' hashes."""
    total = sum(int(hashlib.sha1(repr(r).encode()).hexdigest()[:15], 16) for r in rows)
    return f"{len(rows)}:{total}"


def changelog_table(root: Path, tid: int) -> list[tuple]:
    """The table the change log describes (replayed), as upstream-like tuples."""
    schema = next(r.tables[tid] for r in reversed(ddls(root)) if r.tables.get(tid))
    final = replay(changes(root, tid), list(schema.primary_key))
    return [tuple(r[f"c{c.id}"] for c in schema.columns) for _, r in sorted(final.items())]


def postgres_rows(pg_server, db: str, table: str) -> list[tuple]:
    with psycopg.connect(pg_server.dsn(db)) as pg:
        return [tuple(r) for r in pg.execute(f'SELECT * FROM "{db}"."{table}" ORDER BY 1')]


def once(fn: Callable[[], None]) -> tuple[threading.Event, Callable[[str, int, int], None]]:
    """A progress callback that runs ``fn`` at the first snapshot chunk (the join is open:
    its snapshot is fixed, so these writes come after the join point)."""
    done = threading.Event()

    def progress(name: str, n: int, total: int) -> None:
        if not done.is_set():
            fn()
            done.set()

    return done, progress


def test_widened_filter_joins_a_table_with_data_and_writes_during_the_join(
    mariadb, mydb, pg_server, tmp_path
):
    root = tmp_path / "cl"
    execute(mariadb, mydb,
            "CREATE TABLE a (id INT PRIMARY KEY, v INT NOT NULL)",
            "CREATE TABLE b (id INT PRIMARY KEY, v INT NOT NULL, s VARCHAR(20))",
            "INSERT INTO a VALUES (1, 1), (2, 2)",
            *[f"INSERT INTO b VALUES {', '.join(f'({i}, {i}, NULL)' for i in range(k, k + 500))}"
              for k in range(0, 2000, 500)])  # fmt: skip
    narrow, wide = (f"{mydb}.*", f"!{mydb}.b"), (f"{mydb}.*",)
    pull(mariadb, root, narrow)
    assert [s.table for r in ddls(root) for s in r.tables.values()] == ["a"]
    a = table_id(root, "a")
    # in the binlog before the join point: b's changes must come only through its snapshot
    late = ", ".join(f"({i}, {i}, 'late')" for i in range(3000, 3100))
    execute(mariadb, mydb, f"INSERT INTO b VALUES {late}",
            "UPDATE b SET v = v + 100 WHERE id < 10", "DELETE FROM b WHERE id BETWEEN 10 AND 19",
            "INSERT INTO a VALUES (3, 3)")  # fmt: skip

    def during() -> None:  # after the join point: must come through the stream
        execute(mariadb, mydb, "INSERT INTO b VALUES (5000, 1, 'new')",
                "UPDATE b SET v = -1 WHERE id = 1999", "DELETE FROM b WHERE id = 0",
                "UPDATE b SET id = 6000 WHERE id = 1", "INSERT INTO a VALUES (4, 4)")  # fmt: skip

    wrote, progress = once(during)
    stats = pull(mariadb, root, wide, wrote, snapshot_chunk_rows=400, progress=progress)
    assert wrote.is_set() and stats.snapshot_rows == 2090

    b = table_id(root, "b")
    create = next(r for r in ddls(root) if b in r.creates)
    assert create.action == "create_table" and "joined the changefeed" in create.query
    rows = changes(root, b)
    snap_ts = rows[0]["_commit_ts"]
    assert snap_ts > create.commit_ts
    snap = [r for r in rows if r["_commit_ts"] == snap_ts]
    assert len(snap) == 2090 and {r["_op"] for r in snap} == {1}  # b at the join point
    assert [r["_op"] for r in rows if r["_commit_ts"] > snap_ts] == [1, 2, 3, 2]  # nothing twice
    a_ts = [r["_commit_ts"] for r in changes(root, a)]
    assert a_ts == sorted(a_ts) and a_ts[-2] < create.commit_ts < snap_ts < a_ts[-1]
    assert load_state(root).filters == wide

    for name, tid in (("a", a), ("b", b)):
        assert fingerprint(changelog_table(root, tid)) == fingerprint(
            upstream_rows(mariadb, mydb, name)
        )
    again = pull(mariadb, root, wide)  # a later run: nothing joins again
    assert again.snapshot_rows == 0 and len(changes(root, b)) == len(rows)

    with psycopg.connect(pg_server.dsn(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{mydb}"')
    replicate(root, PostgresSink(pg_server.uri(mydb)), stats.resolved_ts)
    for name in ("a", "b"):
        assert fingerprint(postgres_rows(pg_server, mydb, name)) == fingerprint(
            upstream_rows(mariadb, mydb, name)
        )


def test_rename_into_the_filter_joins_the_table_with_its_rows(mariadb, mydb, pg_server, tmp_path):
    root = tmp_path / "cl"
    filters = (f"{mydb}.*", f"!{mydb}.tmp_*")
    execute(mariadb, mydb,
            "CREATE TABLE keep (id INT PRIMARY KEY, v INT NOT NULL)",
            "CREATE TABLE tmp_x (id INT PRIMARY KEY, v INT NOT NULL)",
            f"INSERT INTO tmp_x VALUES {', '.join(f'({i}, {i})' for i in range(1000))}")  # fmt: skip
    pull(mariadb, root, filters)
    execute(mariadb, mydb, "INSERT INTO tmp_x VALUES (1000, 0), (1001, 0)")
    execute(mariadb, mydb, "RENAME TABLE tmp_x TO x")
    execute(mariadb, mydb, "INSERT INTO x VALUES (2000, 0)", "UPDATE x SET v = 7 WHERE id < 5",
            "INSERT INTO keep VALUES (1, 1)")  # fmt: skip
    blocked: list[int] = []

    def during() -> None:
        c = mariadb.connect(database=mydb)
        with c.cursor() as cur:  # the join holds x's metadata lock: no DDL slips in
            cur.execute("SET SESSION lock_wait_timeout = 1")
            try:
                cur.execute("ALTER TABLE x ADD COLUMN z INT")
            except pymysql.err.OperationalError as exc:
                blocked.append(exc.args[0])
        c.close()
        execute(mariadb, mydb, "INSERT INTO x VALUES (7000, 1)", "DELETE FROM x WHERE id = 5")

    wrote, progress = once(during)
    stats = pull(mariadb, root, filters, wrote, snapshot_chunk_rows=300, progress=progress)
    assert blocked == [1205] and stats.snapshot_rows == 1003

    x = table_id(root, "x")
    create = next(r for r in ddls(root) if x in r.creates)
    assert "joined the changefeed" in create.query
    rows = changes(root, x)
    snap_ts = rows[0]["_commit_ts"]
    assert len([r for r in rows if r["_commit_ts"] == snap_ts]) == 1003
    assert [r["_op"] for r in rows if r["_commit_ts"] > snap_ts] == [1, 3]
    assert fingerprint(changelog_table(root, x)) == fingerprint(upstream_rows(mariadb, mydb, "x"))

    with psycopg.connect(pg_server.dsn(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{mydb}"')
    replicate(root, PostgresSink(pg_server.uri(mydb)), stats.resolved_ts)
    for name in ("keep", "x"):
        assert fingerprint(postgres_rows(pg_server, mydb, name)) == fingerprint(
            upstream_rows(mariadb, mydb, name)
        )


def test_a_join_cut_short_leaves_nothing_and_the_next_run_joins(mariadb, mydb, tmp_path):
    root = tmp_path / "cl"
    filters = (f"{mydb}.*", f"!{mydb}.tmp_*")
    execute(mariadb, mydb, "CREATE TABLE tmp_y (id INT PRIMARY KEY, v INT NOT NULL)",
            f"INSERT INTO tmp_y VALUES {', '.join(f'({i}, {i})' for i in range(500))}")  # fmt: skip
    pull(mariadb, root, filters)
    execute(mariadb, mydb, "RENAME TABLE tmp_y TO y", "INSERT INTO y VALUES (900, 9)")

    def fail(name: str, n: int, total: int) -> None:
        raise KeyboardInterrupt("killed during the join's snapshot")

    cfg = PullerConfig(mariadb.uri(), str(root), filters, heartbeat_s=0.3, progress=fail)
    with pytest.raises(KeyboardInterrupt):
        run_puller(cfg, stop_after=lambda s: _late(s))
    # the next run removes what the cut-short join wrote and joins y again, once
    pull(mariadb, root, filters)
    y = table_id(root, "y")
    assert [r.tables.get(y) is not None for r in ddls(root) if y in r.creates] == [True]
    assert fingerprint(changelog_table(root, y)) == fingerprint(upstream_rows(mariadb, mydb, "y"))
    assert len(changes(root, y)) == 501


def test_a_keyless_table_joining_is_skipped_naming_it(mariadb, mydb, tmp_path):
    # issue 18 item 4: skipped with a warning, not an error (tests/.../test_keyless_tables.py)
    root = tmp_path / "cl"
    execute(mariadb, mydb, "CREATE TABLE k (id INT PRIMARY KEY)", "CREATE TABLE nokey (a INT)")
    pull(mariadb, root, (f"{mydb}.k",))
    pull(mariadb, root, (f"{mydb}.*",))
    assert "no primary key" in load_state(root).skipped[(mydb, "nokey")]


def test_create_table_select_rows_survive_a_stop_between_create_and_commit(mariadb, mydb, tmp_path):
    root = tmp_path / "cl"
    execute(mariadb, mydb, "CREATE TABLE src (id INT PRIMARY KEY, v INT)",
            "INSERT INTO src VALUES (1, 10), (2, 20), (3, 30)")  # fmt: skip
    pull(mariadb, root, (f"{mydb}.*",))
    execute(mariadb, mydb, "CREATE TABLE ctas (PRIMARY KEY (id)) SELECT * FROM src")
    cfg = PullerConfig(mariadb.uri(), str(root), (f"{mydb}.*",), heartbeat_s=0.3)
    run_puller(cfg, stop_after=lambda s: s.ddls >= 1 or _late(s))  # stops inside the CTAS
    pull(mariadb, root, (f"{mydb}.*",))
    tid = table_id(root, "ctas")
    assert [r["c1"] for r in changes(root, tid)] == [1, 2, 3]
    assert changelog_table(root, tid) == upstream_rows(mariadb, mydb, "ctas")


def test_changefeed_update_widening_the_filter_joins_the_table_in_the_next_puller_run(
    mariadb, mydb, metastore, dagster_env, tmp_path, monkeypatch
):
    import dagster as dg
    from test_puller_job import _execute, _pullers, _tick

    from cdc_dagster import admin
    from cdc_dagster.defs import build_definitions
    from cdc_dagster.defs.catalog import Catalog

    monkeypatch.setenv("CDC_DAGSTER_MYSQL_PULL_S", "3")
    execute(mariadb, mydb, "CREATE TABLE t (id INT PRIMARY KEY)", "INSERT INTO t VALUES (1)",
            "CREATE TABLE extra (id INT PRIMARY KEY, v INT)",
            "INSERT INTO extra VALUES (1, 1), (2, 2)")  # fmt: skip
    root = tmp_path / "cl"
    admin.create_changefeed(
        metastore, "shop", f"delta://{tmp_path / 'lake'}", table_filter=(f"{mydb}.t",),
        upstream_uri=mariadb.uri(query="server-id=4242"), changelog_root=str(root),
    )  # fmt: skip
    assert [s.table for r in ddls(root) for s in r.tables.values()] == ["t"]
    execute(mariadb, mydb, "UPDATE extra SET v = 20 WHERE id = 2")
    metastore.changefeeds.pause("shop")
    metastore.changefeeds.update("shop", table_filter=(f"{mydb}.*",))  # what `update` does
    metastore.changefeeds.resume("shop")
    defs = build_definitions(Catalog(()))
    with dg.instance_for_test() as instance:
        (req,) = _pullers(_tick(defs, instance, None))
        out = _execute(defs, instance, req)
        assert out.success, [e.message for e in out.all_events if e.is_failure]
    extra = table_id(root, "extra")
    assert fingerprint(changelog_table(root, extra)) == fingerprint(
        upstream_rows(mariadb, mydb, "extra")
    )
    assert len(changes(root, extra)) == 2  # its snapshot, nothing twice
