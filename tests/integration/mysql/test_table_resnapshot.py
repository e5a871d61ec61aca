"""Re-snapshot of a replicated table (``cdc-dagster table resnapshot``): a truncate at one
binlog position, then the table's rows again in chunks on the chunked snapshot path, the
stream of every table going on; a downstream that diverged (rows deleted, changed, added at
the sink; upstream changes that never reached the binlog) ends equal to the upstream, no
key twice. Killed midway it resumes; bad requests are refused; the admin job and the
Dagster runs carry it, the snapshot run observing progress on the table's asset."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import psycopg
import pytest
from test_binlog_puller import changes, ddls, execute, gtid_now, replay, table_id
from test_chunked_snapshot import _follow, _until
from test_table_join import fingerprint, postgres_rows, pull, upstream_rows
from test_table_rejoin import _setup

from cdc_dagster.mysql.chunk_reader import plan_table, read_range
from cdc_dagster.mysql.context import ResnapshotOutcome
from cdc_dagster.mysql.puller import PullerConfig
from cdc_dagster.mysql.snapshot_runner import run_snapshot_reads
from cdc_dagster.mysql.snapshots import done_chunks, generation_dir
from cdc_dagster.mysql.state import load_state
from cdc_dagster.sinks.delta import read_table_at
from cdc_dagster.upstream.changelog import ChangeLog
from cdc_dagster.upstream.uri import parse_uri


class Requests:
    """Re-snapshot requests as a puller run sees them (etcd's stand-in)."""

    def __init__(self, *names: str) -> None:
        self.names = list(names)
        self.outcomes: list[ResnapshotOutcome] = []

    def pending(self) -> list[str]:
        return list(self.names)

    def taken(self, outcome: ResnapshotOutcome) -> None:
        self.names.remove(outcome.name)
        self.outcomes.append(outcome)


class Writes(threading.Thread):
    """Inserts, updates, deletes and key changes on ``b`` and writes on ``a``, until stopped."""

    def __init__(self, mariadb, db: str) -> None:
        super().__init__(daemon=True)
        self.mariadb, self.db, self.stop_ = mariadb, db, threading.Event()
        self.statements = 0

    def run(self) -> None:
        rng = random.Random(11)
        c = self.mariadb.connect(database=self.db)
        with c.cursor() as cur:
            while not self.stop_.is_set():
                k, op = rng.randrange(0, 1200), rng.random()
                if op < 0.3:
                    cur.execute("UPDATE b SET v = v + 1, s = %s WHERE id = %s", (f"u{k}", k))
                elif op < 0.5:
                    cur.execute("DELETE FROM b WHERE id = %s", (k,))
                elif op < 0.75:
                    cur.execute("REPLACE INTO b VALUES (%s, %s, %s)", (k, k, f"i{k}"))
                elif op < 0.8:
                    cur.execute("UPDATE IGNORE b SET id = id + 2000 WHERE id = %s", (k,))
                else:
                    cur.execute("REPLACE INTO a VALUES (%s, %s)", (k, k))
                self.statements += 1
        c.close()


def _silently(mariadb, db: str, *stmts: str) -> None:
    """Upstream changes that never reach the binlog: the downstream cannot hear of them."""
    execute(mariadb, db, "SET SESSION sql_log_bin = 0", *stmts)


def _diverge(mariadb, db: str, pg_server) -> None:
    _silently(mariadb, db, "DELETE FROM b WHERE id < 20",
              "UPDATE b SET v = -5 WHERE id BETWEEN 20 AND 29",
              "INSERT INTO b VALUES (5000, 1, 'silent')")  # fmt: skip
    with psycopg.connect(pg_server.dsn(db), autocommit=True) as pg:
        pg.execute(f'DELETE FROM "{db}"."b" WHERE id BETWEEN 300 AND 309')
        pg.execute(f'UPDATE "{db}"."b" SET s = \'sink\' WHERE id BETWEEN 400 AND 409')
        pg.execute(f'INSERT INTO "{db}"."b" VALUES (9000, 9, \'only downstream\')')


def _check(mariadb, db: str, pg_server, owners, root: Path, truncate_ts: int) -> None:
    b = table_id(root, "b")
    for name in ("a", "b"):
        up = fingerprint(upstream_rows(mariadb, db, name))
        assert fingerprint(postgres_rows(pg_server, db, name)) == up, name
        lake = read_table_at(owners[1].sink.root, owners[1].schemas[table_id(root, name)])
        assert fingerprint(sorted(tuple(r.values()) for r in lake.to_pylist())) == up, name
    ids = [r[0] for r in postgres_rows(pg_server, db, "b")]
    assert len(ids) == len(set(ids)) and 9000 not in ids
    # the change log from the truncate on describes the table exactly
    schema = ChangeLog(root).schema_at(b, truncate_ts)
    after = [r for r in changes(root, b) if r["_commit_ts"] > truncate_ts]
    final = replay(after, list(schema.primary_key))
    rows = [tuple(r[f"c{c.id}"] for c in schema.columns) for _, r in sorted(final.items())]
    assert fingerprint(rows) == fingerprint(upstream_rows(mariadb, db, "b"))


def _truncate(root: Path, tid: int):
    (rec,) = [r for r in ddls(root) if r.action == "truncate_table" and tid in r.table_ids]
    assert "re-snapshot requested at" in rec.query
    return rec


def test_resnapshot_replaces_a_diverged_downstream_while_both_tables_are_written(
    mariadb, mydb, pg_server, tmp_path
):
    root, owners = _setup(mariadb, mydb, pg_server, tmp_path)
    rules = (f"{mydb}.*",)
    s = pull(mariadb, root, rules)
    a, b = table_id(root, "a"), table_id(root, "b")
    for o in owners:
        o.run(rules, s.resolved_ts)
    _diverge(mariadb, mydb, pg_server)
    assert fingerprint(postgres_rows(pg_server, mydb, "b")) != fingerprint(
        upstream_rows(mariadb, mydb, "b")
    )

    requests = Requests(f"{mydb}.b")
    cfg = PullerConfig(mariadb.uri(), str(root), rules, heartbeat_s=0.3, requests=requests)
    writes = Writes(mariadb, mydb)
    writes.start()
    p, done, th = _follow(cfg)
    try:
        _until(lambda: requests.outcomes)
        (outcome,) = requests.outcomes
        assert outcome.started and outcome.table_id == b, outcome.note
        gen = outcome.generation
        assert load_state(root).snapshots == {b: gen}
        log = ChangeLog(root)
        # the stream goes on: a's mark passes the truncate, b's waits below it
        _until(lambda: log.table_resolved_ts(a) > gen)
        assert log.table_resolved_ts(b) < gen
        run_snapshot_reads(cfg.upstream_uri, str(root), parallelism=3, chunk_rows=150)
        time.sleep(1.0)  # writes after the last chunk, too
    finally:
        writes.stop_.set()
        writes.join()
    assert writes.statements > 100
    target = gtid_now(mariadb)
    _until(lambda: p.stats.position == target and not p.state.snapshots)
    done.set()
    th.join(30)
    assert ChangeLog(root).table_resolved_ts(b) > gen  # released: it follows the stream
    for o in owners:
        o.run(rules, p.stats.resolved_ts)
    _check(mariadb, mydb, pg_server, owners, root, gen)
    assert _truncate(root, b).commit_ts == gen


def test_a_resnapshot_killed_midway_resumes_in_the_next_runs(mariadb, mydb, pg_server, tmp_path):
    root, owners = _setup(mariadb, mydb, pg_server, tmp_path)
    rules = (f"{mydb}.*",)
    s = pull(mariadb, root, rules)
    b = table_id(root, "b")
    for o in owners:
        o.run(rules, s.resolved_ts)
    _diverge(mariadb, mydb, pg_server)
    requests = Requests(f"{mydb}.b")
    cfg = PullerConfig(mariadb.uri(), str(root), rules, heartbeat_s=0.3, requests=requests)
    upstream = parse_uri(cfg.upstream_uri)

    p, done, th = _follow(cfg)
    _until(lambda: requests.outcomes)
    gen = requests.outcomes[0].generation
    plan = plan_table(upstream, str(root), b, gen, parallelism=2, chunk_rows=100)
    assert len(plan.ranges) == 2

    def kill(chunk) -> None:
        if chunk.chunk_no == 1:
            raise KeyboardInterrupt("snapshot run killed")

    with pytest.raises(KeyboardInterrupt):
        read_range(upstream, str(root), b, gen, 0, 100, progress=kill)
    _until(lambda: done_chunks(generation_dir(root, b, gen)))  # placed by the puller
    execute(mariadb, mydb, "UPDATE b SET v = 77 WHERE id BETWEEN 30 AND 40",
            "DELETE FROM b WHERE id = 500", "INSERT INTO b VALUES (1500, 1, 'x')")  # fmt: skip
    done.set()  # the puller run ends too
    th.join(30)
    assert load_state(root).snapshots == {b: gen}  # resumable: still held, chunk 0 placed

    # Another snapshot run reads the rest while no puller runs; the next puller run places
    # them (or drops those read before the stream it remembers, and they are read again).
    run_snapshot_reads(cfg.upstream_uri, str(root), parallelism=2, chunk_rows=100)
    execute(mariadb, mydb, "DELETE FROM b WHERE id = 501", "INSERT INTO a VALUES (9, 9)")
    p, done, th = _follow(PullerConfig(mariadb.uri(), str(root), rules, heartbeat_s=0.3))
    time.sleep(1.5)
    run_snapshot_reads(cfg.upstream_uri, str(root), parallelism=2, chunk_rows=100)
    target = gtid_now(mariadb)
    _until(lambda: p.stats.position == target and not p.state.snapshots)
    done.set()
    th.join(30)
    for o in owners:
        o.run(rules, p.stats.resolved_ts)
    _check(mariadb, mydb, pg_server, owners, root, gen)
    assert [r.commit_ts for r in ddls(root) if r.action == "truncate_table"] == [gen]


def _snapshot_done(mariadb, root: Path, rules: tuple[str, ...]) -> None:
    """The changefeed's initial chunked snapshot, read here and placed by a puller."""
    cfg = PullerConfig(mariadb.uri(), str(root), rules, heartbeat_s=0.3)
    p, done, th = _follow(cfg)
    run_snapshot_reads(cfg.upstream_uri, str(root), parallelism=1)
    _until(lambda: not p.state.snapshots)
    done.set()
    th.join(30)


def _cli(etcd_endpoints, cluster_id, capsys, *argv: str) -> tuple[int, str, str]:
    from cdc_dagster.cli import main

    code = main(["--etcd", ",".join(etcd_endpoints), "--cluster-id", cluster_id, *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_resnapshot_refuses_bad_requests_and_says_what_happens(
    mariadb, mydb, metastore, etcd_endpoints, cluster_id, tmp_path, capsys
):
    import json

    from cdc_dagster import admin

    execute(mariadb, mydb, "CREATE TABLE t (id INT PRIMARY KEY, v INT)",
            "INSERT INTO t VALUES (1, 1), (2, 2)")  # fmt: skip
    root = tmp_path / "cl"
    admin.create_changefeed(
        metastore, "shop", f"delta://{tmp_path / 'lake'}", table_filter=(f"{mydb}.*",),
        upstream_uri=mariadb.uri(query="server-id=4242"),
        changelog_root=str(root),
    )  # fmt: skip
    metastore.changefeeds.create("gen", f"delta://{tmp_path / 'lake2'}",
                                 upstream_uri=f"changelog://{tmp_path / 'gen'}")  # fmt: skip

    def refused(cf: str, table: str, *words: str) -> None:
        code, out, err = _cli(etcd_endpoints, cluster_id, capsys,
                              "table", "resnapshot", "-c", cf, table)  # fmt: skip
        assert code == 1 and out == "" and err.startswith("cdc-dagster: error: "), err
        for w in words:
            assert w in err, (w, err)

    refused("nope", f"{mydb}.t", "nope")
    refused("gen", f"{mydb}.t", "does not read a MySQL/MariaDB upstream")
    refused("shop", "t", "DATABASE.TABLE")
    refused("shop", f"{mydb}.missing", "replicates no table", f"{mydb}.t")
    refused("shop", "elsewhere.t", "does not select it")
    # the initial snapshot is still pending: that table is being snapshotted already
    refused("shop", f"{mydb}.t", "being snapshotted already", "changefeed query")
    assert admin.resnapshot_requests(metastore, "shop") == {}  # nothing written

    _snapshot_done(mariadb, root, (f"{mydb}.*",))
    code, out, err = _cli(etcd_endpoints, cluster_id, capsys,
                          "table", "resnapshot", "-c", "shop", f"{mydb}.t")  # fmt: skip
    assert code == 0, err
    assert f"re-snapshot of {mydb}.t (table id" in out and "Watch:" in out
    assert f"replica/{mydb}/t" in out and "changefeed query -c shop" in out
    refused("shop", f"{mydb}.t", "already requested")
    code, out, _ = _cli(etcd_endpoints, cluster_id, capsys, "changefeed", "query", "-c", "shop")
    shown = json.loads(out)
    assert shown["resnapshot_requested"] == [f"{mydb}.t"] and shown["snapshots"] == []
    # a removed changefeed takes its requests with it
    admin.remove_changefeed(metastore, "shop", keep_state=True)
    assert metastore.client.get_prefix(metastore.layout.resnapshot_requests("shop")).kvs == ()


def test_admin_job_then_puller_and_snapshot_runs_resnapshot_with_progress_on_the_asset(
    mariadb, mydb, metastore, dagster_env, tmp_path, monkeypatch
):
    import dagster as dg
    from test_puller_job import _create, _execute, _pullers, _tick

    from cdc_dagster import admin
    from cdc_dagster.defs import build_definitions
    from cdc_dagster.defs.catalog import Catalog
    from cdc_dagster.defs.mysql.requests import SNAPSHOT_JOB

    monkeypatch.setenv("CDC_DAGSTER_MYSQL_PULL_S", "3")
    execute(mariadb, mydb, "CREATE TABLE t (id INT PRIMARY KEY, v INT)",
            "INSERT INTO t SELECT seq, seq FROM seq_1_to_500")  # fmt: skip
    root = tmp_path / "cl"
    _create(metastore, mariadb, mydb, root)
    _snapshot_done(mariadb, root, (f"{mydb}.*",))
    tid = table_id(root, "t")
    defs = build_definitions(Catalog(()))
    job = defs.get_job_def("resnapshot_table")

    def request(table: str):
        config = {"changefeed_id": "shop", "table": table}
        return job.execute_in_process(
            run_config={"ops": {"resnapshot_table_op": {"config": config}}},
            instance=instance,
            raise_on_error=False,
        )

    with dg.instance_for_test() as instance:
        bad = request(f"{mydb}.missing")
        assert not bad.success
        (failure,) = [e for e in bad.all_events if e.is_failure and e.is_step_failure]
        assert "replicates no table" in failure.step_failure_data.error.message
        assert request(f"{mydb}.t").success
        assert list(admin.resnapshot_requests(metastore, "shop")) == [f"{mydb}.t"]

        # The next puller run takes it: truncate record, the table held, the request gone.
        (req,) = _pullers(_tick(defs, instance, None))
        out = _execute(defs, instance, req)
        assert out.success, [e.message for e in out.all_events if e.is_failure]
        (trunc,) = [r for r in ddls(root) if r.action == "truncate_table"]
        assert load_state(root).snapshots == {tid: trunc.commit_ts}
        assert admin.resnapshot_requests(metastore, "shop") == {}

        # The owner requests a snapshot run; it reads (here, no Spark) while a puller places.
        (snap,) = [r for r in _tick(defs, instance, "1").run_requests or []
                   if r.job_name == SNAPSHOT_JOB]  # fmt: skip
        config = snap.run_config["ops"]["read_snapshots"]["config"]
        config.update(use_spark=False, parallelism=2, chunk_rows=100)
        cfg = PullerConfig(mariadb.uri(), str(root), (f"{mydb}.*",), heartbeat_s=0.3)
        _, done, th = _follow(cfg)
        try:
            result = defs.get_job_def(SNAPSHOT_JOB).execute_in_process(
                run_config=snap.run_config, instance=instance, tags=snap.tags
            )
        finally:
            done.set()
            th.join(30)
        assert result.success
        assert not load_state(root).snapshots  # complete: placed and released
        key = dg.AssetKey(["replica", mydb, "t"])
        records = instance.fetch_observations(key, limit=100).records
        seen = [r.asset_observation.metadata for r in reversed(records)]
        assert seen and all(m["snapshot_generation"].value == trunc.commit_ts for m in seen)
        last = seen[-1]
        assert last["snapshot_complete"].value is True
        assert last["snapshot_rows_placed"].value == last["snapshot_rows_read"].value == 500
        assert last["snapshot_chunks_placed"].value == last["snapshot_chunks_total"].value >= 5
        assert last["snapshot_rows_planned"].value == 500
    rows = [r for r in changes(root, tid) if r["_commit_ts"] > trunc.commit_ts]
    assert sorted(r["c1"] for r in rows) == list(range(1, 501))
