"""A table the filter stops selecting and selects again (narrow, then widen): it leaves the
changefeed (a drop record the owner ignores, its binlog rows skipped), then re-joins as a new
table whose create record replaces its stale downstream table, snapshotted at a known binlog
position; the downstream equals the upstream, with the rows deleted meanwhile gone."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from test_binlog_puller import _late, changes, ddls, execute, table_id
from test_mysql_to_pg import _batch, _rows
from test_table_join import changelog_table, fingerprint, once, postgres_rows, pull, upstream_rows

from cdc_dagster.metastore.validation import TableFilter
from cdc_dagster.mysql.puller import PullerConfig, run_puller
from cdc_dagster.mysql.state import load_state
from cdc_dagster.schema import TableSchema
from cdc_dagster.sinks.delta import DeltaSink, read_table_at
from cdc_dagster.sinks.postgres import PostgresSink
from cdc_dagster.upstream.changelog import ChangeLog

CF = "rejoin"


class Owner:
    """The owner's rules over the change log, one sink (a stand-in for the capture pipeline):
    a changed filter rebuilds the table set at the checkpoint (``tables_at`` through the
    filter, each table starting there); DDLs of tables outside the set are ignored, creates
    through the filter add tables; every DDL is applied with the schemas before it."""

    def __init__(self, root: Path, sink) -> None:
        self.root, self.sink = root, sink
        self.rules: tuple[str, ...] = ()
        self.cp = 0
        self.schemas: dict[int, TableSchema] = {}
        self.done: dict[int, int] = {}
        self.tokens: dict[int, int] = {}

    def run(self, rules: tuple[str, ...], upto: int) -> None:
        flt = TableFilter.parse(rules)
        self.log = ChangeLog(self.root)  # a fresh reader: the puller rewrote files
        if rules != self.rules:  # pause, update, resume: rebuilt at the checkpoint
            self.rules = rules
            at = self.log.tables_at(self.cp)
            self.schemas = {t: s for t, s in at.items() if flt.matches(s.database, s.table)}
            self.done = {t: self.cp for t in self.schemas}
        for rec in self.log.ddl_records(after_ts=self.cp, upto_ts=upto):
            self._flush(rec.commit_ts)
            creates = [t for t in rec.creates if flt.matches(rec.tables[t].database,
                                                             rec.tables[t].table)]  # fmt: skip
            if not creates and not any(t in self.schemas for t in rec.table_ids):
                continue  # a DDL on tables outside the filter
            before = {t: self.log.schema_at(t, rec.commit_ts - 1) for t in rec.table_ids}
            self.sink.apply_ddl(CF, rec, before)
            for t, s in rec.tables.items():
                if s is None:
                    self.schemas.pop(t, None)
                elif t in self.schemas or t in creates:
                    self.schemas[t] = s
                    self.done.setdefault(t, rec.commit_ts)
        self._flush(upto + 1)
        self.cp = upto

    def _flush(self, before_ts: int) -> None:
        for tid, t in self.schemas.items():
            rows = [
                r for r in _rows(self.root, tid) if self.done[tid] < r["_commit_ts"] < before_ts
            ]
            if tid not in self.tokens:
                self.tokens[tid] = self.sink.acquire(CF, t)
            # a table started above what the sink holds for it is refused (SinkGapError)
            self.sink.write(CF, t, _batch(t, rows), self.done[tid], before_ts - 1, self.tokens[tid])
            self.done[tid] = before_ts - 1


def _setup(mariadb, mydb: str, pg_server, tmp_path: Path):
    execute(mariadb, mydb,
            "CREATE TABLE a (id INT PRIMARY KEY, v INT NOT NULL)",
            "CREATE TABLE b (id INT PRIMARY KEY, v INT NOT NULL, s VARCHAR(20))",
            "INSERT INTO a VALUES (1, 1), (2, 2)",
            f"INSERT INTO b VALUES {', '.join(f'({i}, {i}, NULL)' for i in range(600))}")  # fmt: skip
    with psycopg.connect(pg_server.dsn(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{mydb}"')
    root = tmp_path / "cl"
    sinks = [
        Owner(root, PostgresSink(pg_server.uri(mydb))),
        Owner(root, DeltaSink(str(tmp_path / "lake"))),
    ]
    return root, sinks


def _narrowed_writes(mariadb, mydb: str) -> None:
    """While b is not replicated: inserts, updates and deletes (rows the old downstream
    table holds must go)."""
    execute(mariadb, mydb, "INSERT INTO b VALUES (700, 7, 'narrow'), (701, 7, 'narrow')",
            "UPDATE b SET v = v + 1000, s = 'upd' WHERE id < 50",
            "DELETE FROM b WHERE id BETWEEN 100 AND 199", "DELETE FROM b WHERE id = 700",
            "INSERT INTO a VALUES (3, 3)")  # fmt: skip


def _check(mariadb, mydb: str, pg_server, root: Path, owners: list[Owner]) -> None:
    for name in ("a", "b"):
        up = fingerprint(upstream_rows(mariadb, mydb, name))
        assert fingerprint(changelog_table(root, table_id_now(root, name))) == up, name
        assert fingerprint(postgres_rows(pg_server, mydb, name)) == up, name
        lake = read_table_at(owners[1].sink.root, owners[1].schemas[table_id_now(root, name)])
        assert fingerprint(sorted(tuple(r.values()) for r in lake.to_pylist())) == up, name
    ids = [r[0] for r in postgres_rows(pg_server, mydb, "b")]
    assert len(ids) == len(set(ids)) and not set(ids) & {*range(100, 200), 700}


def table_id_now(root: Path, name: str) -> int:
    """The id the change log's latest create gives ``name`` (a re-joined table has a new one)."""
    return max(t for r in ddls(root) for t, s in r.tables.items() if s and s.table == name)


def test_narrowed_then_widened_filter_replaces_the_downstream_table_with_a_fresh_snapshot(
    mariadb, mydb, pg_server, tmp_path
):
    root, owners = _setup(mariadb, mydb, pg_server, tmp_path)
    wide, narrow = (f"{mydb}.*",), (f"{mydb}.*", f"!{mydb}.b")
    s = pull(mariadb, root, wide)
    b = table_id(root, "b")
    for o in owners:
        o.run(wide, s.resolved_ts)
    assert len(postgres_rows(pg_server, mydb, "b")) == 600

    s = pull(mariadb, root, narrow)  # b leaves: a drop record, then untracked
    gone = next(r for r in ddls(root) if b in r.drops)
    assert gone.action == "drop_table" and "left the changefeed" in gone.query
    assert load_state(root).left == {(mydb, "b"): b} and b not in load_state(root).tables
    _narrowed_writes(mariadb, mydb)
    s = pull(mariadb, root, narrow)
    assert [r["_commit_ts"] for r in changes(root, b)][-1] < gone.commit_ts  # skipped
    for o in owners:
        o.run(narrow, s.resolved_ts)  # the owner ignores the drop: b downstream is kept
    assert len(postgres_rows(pg_server, mydb, "b")) == 600

    def during() -> None:  # after the join point: through the stream
        execute(mariadb, mydb, "INSERT INTO b VALUES (800, 8, 'during')",
                "UPDATE b SET v = -1 WHERE id = 599", "DELETE FROM b WHERE id = 0",
                "UPDATE b SET id = 900 WHERE id = 1", "INSERT INTO a VALUES (4, 4)")  # fmt: skip

    wrote, progress = once(during)
    s = pull(mariadb, root, wide, wrote, snapshot_chunk_rows=200, progress=progress)
    assert wrote.is_set() and s.snapshot_rows == 501
    b2 = table_id_now(root, "b")
    create = next(r for r in ddls(root) if b2 in r.creates)
    assert b2 != b and create.replaces == (b,) and f"replaces table id {b}" in create.query
    rows = changes(root, b2)
    assert gone.commit_ts < create.commit_ts < rows[0]["_commit_ts"]
    assert [r["_op"] for r in rows if r["_commit_ts"] > rows[0]["_commit_ts"]] == [1, 2, 3, 2]
    assert load_state(root).left == {}
    for o in owners:
        o.run(wide, s.resolved_ts)
    _check(mariadb, mydb, pg_server, root, owners)

    execute(mariadb, mydb, "INSERT INTO b VALUES (1000, 1, 'after')", "DELETE FROM b WHERE id = 2")
    s = pull(mariadb, root, wide)  # a later run: nothing leaves or joins again
    assert s.snapshot_rows == 0 and [r.replaces for r in ddls(root) if r.replaces] == [(b,)]
    for o in owners:
        o.run(wide, s.resolved_ts)
    _check(mariadb, mydb, pg_server, root, owners)


def test_a_rejoin_cut_short_leaves_nothing_and_the_next_run_rejoins_once(
    mariadb, mydb, pg_server, tmp_path
):
    root, owners = _setup(mariadb, mydb, pg_server, tmp_path)
    wide, narrow = (f"{mydb}.*",), (f"{mydb}.*", f"!{mydb}.b")
    s = pull(mariadb, root, wide)
    b = table_id(root, "b")
    for o in owners:
        o.run(wide, s.resolved_ts)
    s = pull(mariadb, root, narrow)
    _narrowed_writes(mariadb, mydb)

    def fail(name: str, n: int, total: int) -> None:
        execute(mariadb, mydb, "INSERT INTO b VALUES (850, 1, 'cut')", "DELETE FROM b WHERE id = 3")
        raise KeyboardInterrupt("killed during the re-join's snapshot")

    cfg = PullerConfig(mariadb.uri(), str(root), wide, heartbeat_s=0.3, progress=fail)
    with pytest.raises(KeyboardInterrupt):
        run_puller(cfg, stop_after=lambda st: _late(st))
    assert load_state(root).left == {(mydb, "b"): b}  # the join was not saved
    for o in owners:
        o.run(narrow, load_state(root).last_ts)
    s = pull(mariadb, root, wide)  # removes the cut-short join's files, joins b once
    replacing = [r for r in ddls(root) if r.replaces]
    assert [r.replaces for r in replacing] == [(b,)]
    assert len(changes(root, replacing[0].creates[0])) == 501
    for o in owners:
        o.run(wide, s.resolved_ts)
    _check(mariadb, mydb, pg_server, root, owners)


def test_changefeed_update_narrowing_then_widening_re_joins_through_the_puller_runs(
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
            "INSERT INTO extra VALUES (1, 1), (2, 2), (3, 3)")  # fmt: skip
    root = tmp_path / "cl"
    admin.create_changefeed(
        metastore, "shop", f"delta://{tmp_path / 'lake'}", table_filter=(f"{mydb}.*",),
        upstream_uri=mariadb.uri(query="server-id=4242"), changelog_root=str(root),
    )  # fmt: skip
    old = table_id(root, "extra")
    defs = build_definitions(Catalog(()))

    def update_and_pull(rules: tuple[str, ...]) -> None:
        metastore.changefeeds.pause("shop")
        metastore.changefeeds.update("shop", table_filter=rules)  # what `update` does
        metastore.changefeeds.resume("shop")
        (req,) = _pullers(_tick(defs, instance, None))
        out = _execute(defs, instance, req)
        assert out.success, [e.message for e in out.all_events if e.is_failure]

    with dg.instance_for_test() as instance:
        update_and_pull((f"{mydb}.t",))
        assert load_state(root).left == {(mydb, "extra"): old}
        execute(mariadb, mydb, "UPDATE extra SET v = 20 WHERE id = 2",
                "DELETE FROM extra WHERE id = 3", "INSERT INTO extra VALUES (4, 4)")  # fmt: skip
        update_and_pull((f"{mydb}.*",))
    new = table_id_now(root, "extra")
    (create,) = [r for r in ddls(root) if new in r.creates]
    assert new != old and create.replaces == (old,)
    assert fingerprint(changelog_table(root, new)) == fingerprint(
        upstream_rows(mariadb, mydb, "extra")
    )
    assert len(changes(root, new)) == 3  # its snapshot, nothing twice
