"""Issue 18 item 4: a table without a key appearing in a replicated database (CREATE TABLE,
RENAME in, a widened filter) is skipped with a warning, as TiCDC skips ineligible tables:
the changefeed goes on, the keyed tables keep replicating, DDLs on the skipped table are
ignored, ``changefeed query`` lists it; given a key later it joins with a snapshot."""

from __future__ import annotations

import json

import dagster as dg
from test_binlog_puller import ddls, execute, table_id
from test_puller_job import _create, _execute, _pullers, _tick
from test_table_join import changelog_table, fingerprint, pull, upstream_rows

from cdc_dagster import admin
from cdc_dagster.cli import main
from cdc_dagster.metastore.changefeeds import ChangefeedState
from cdc_dagster.mysql.snapshot_runner import run_snapshot_reads
from cdc_dagster.mysql.state import load_state, skipped_tables


def _names(root) -> set[str]:
    return {s.table for r in ddls(root) for s in r.tables.values() if s is not None}


def test_keyless_tables_are_skipped_while_keyed_ones_replicate(mariadb, mydb, tmp_path):
    root = tmp_path / "cl"
    filters = (f"{mydb}.*", f"!{mydb}.tmp_*")
    execute(mariadb, mydb, "CREATE TABLE k (id INT PRIMARY KEY, v INT)",
            "INSERT INTO k VALUES (1, 1)", "CREATE TABLE tmp_nk (a INT)")  # fmt: skip
    pull(mariadb, root, filters)
    execute(mariadb, mydb, "CREATE TABLE nokey (a INT, b VARCHAR(5))",
            "INSERT INTO nokey VALUES (1, 'x'), (1, 'x')", "INSERT INTO k VALUES (2, 2)",
            "CREATE TABLE nk_like LIKE nokey", "INSERT INTO nk_like VALUES (5, 'y')",
            "RENAME TABLE tmp_nk TO nk_renamed", "INSERT INTO nk_renamed VALUES (7)",
            "ALTER TABLE nokey ADD COLUMN c INT", "TRUNCATE TABLE nokey",
            "INSERT INTO nokey VALUES (3, 'z', 3)", "UPDATE k SET v = 20 WHERE id = 2")  # fmt: skip
    pull(mariadb, root, filters)  # no error: the puller goes on past all of them
    skipped = skipped_tables(root)
    assert sorted(skipped) == [f"{mydb}.nk_like", f"{mydb}.nk_renamed", f"{mydb}.nokey"]
    why = skipped[f"{mydb}.nokey"]
    assert "no primary key and no NOT NULL unique key" in why and "not replicated" in why
    assert "add a primary key" in why and "force-replicate=true" in why
    assert _names(root) == {"k"}  # no record of a skipped table
    assert load_state(root).ids.next_table_id == 2  # and no id taken for one
    k = table_id(root, "k")
    assert fingerprint(changelog_table(root, k)) == fingerprint(upstream_rows(mariadb, mydb, "k"))

    # Its drop is ignored (and it is no longer listed); an ALTER that gives one a key makes
    # it join the changefeed with a snapshot, its rows so far included.
    execute(mariadb, mydb, "DROP TABLE nk_renamed", "INSERT INTO k VALUES (3, 3)",
            "ALTER TABLE nokey MODIFY a INT NOT NULL, ADD UNIQUE KEY ua (a, c)",  # c: nullable
            "ALTER TABLE nokey MODIFY c INT NOT NULL DEFAULT 0",  # now ua is a key
            "INSERT INTO nokey VALUES (4, 'w', 4)")  # fmt: skip
    execute(mariadb, mydb, "UPDATE nokey SET b = 'zz' WHERE a = 3")
    pull(mariadb, root, filters)
    assert sorted(skipped_tables(root)) == [f"{mydb}.nk_like"]
    nokey = table_id(root, "nokey")
    for name, tid in (("k", k), ("nokey", nokey)):
        want = fingerprint(upstream_rows(mariadb, mydb, name))
        assert fingerprint(changelog_table(root, tid)) == want, name


def test_a_keyless_table_in_a_widened_filter_is_skipped_and_the_others_join(
    mariadb, mydb, tmp_path
):
    root = tmp_path / "cl"
    execute(mariadb, mydb, "CREATE TABLE k (id INT PRIMARY KEY)", "CREATE TABLE nokey (a INT)",
            "CREATE TABLE j (id INT PRIMARY KEY, v INT)", "INSERT INTO j VALUES (1, 1)")  # fmt: skip
    pull(mariadb, root, (f"{mydb}.k",))
    pull(mariadb, root, (f"{mydb}.*",))  # widened: j joins, nokey is skipped
    assert list(skipped_tables(root)) == [f"{mydb}.nokey"]
    assert _names(root) == {"k", "j"}
    j = table_id(root, "j")
    assert fingerprint(changelog_table(root, j)) == fingerprint(upstream_rows(mariadb, mydb, "j"))
    pull(mariadb, root, (f"{mydb}.k",))  # narrowed again: no longer selected, no longer listed
    assert skipped_tables(root) == {}


def test_changefeed_stays_normal_and_query_lists_the_skipped_table(
    mariadb, mydb, metastore, dagster_env, etcd_endpoints, cluster_id, tmp_path, capsys,
    monkeypatch,
):  # fmt: skip
    from cdc_dagster.defs import build_definitions
    from cdc_dagster.defs.catalog import Catalog
    from cdc_dagster.defs.mysql.job import binlog_asset_key

    monkeypatch.setenv("CDC_DAGSTER_MYSQL_PULL_S", "3")
    defs = build_definitions(Catalog(()))
    execute(mariadb, mydb, "CREATE TABLE t (id INT PRIMARY KEY, v INT)",
            "INSERT INTO t VALUES (1, 1)")  # fmt: skip
    root = tmp_path / "cl"
    cf = _create(metastore, mariadb, mydb, root)
    admin.add_capture(metastore, "c1")  # else the changefeed warns: no capture alive
    run_snapshot_reads(cf.info.upstream_uri, str(root), parallelism=1)
    execute(mariadb, mydb, "CREATE TABLE nopk_live (a INT, b INT)",
            "INSERT INTO nopk_live VALUES (1, 2)", "INSERT INTO t VALUES (2, 2)")  # fmt: skip
    with dg.instance_for_test() as instance:
        (req,) = _pullers(_tick(defs, instance, None))
        out = _execute(defs, instance, req)
        assert out.success, [e.message for e in out.all_events if e.is_failure]
        logs = [e.user_message for e in instance.all_logs(out.run_id)]
        warnings = [m for m in logs if "is not replicated" in m]
        assert any(f"{mydb}.nopk_live" in w for w in warnings), warnings
        (obs,) = instance.fetch_observations(binlog_asset_key("shop"), limit=10).records
        assert obs.asset_observation.metadata["skipped_tables"].value == f"{mydb}.nopk_live"
        execute(mariadb, mydb, "DROP TABLE nopk_live", "CREATE TABLE nopk_live (a INT)")
        (req,) = _pullers(_tick(defs, instance, "1"))
        assert _execute(defs, instance, req).success  # the DROP and CREATE again: no error
    assert metastore.changefeeds.get("shop").status.state == ChangefeedState.NORMAL
    tid = table_id(root, "t")
    assert fingerprint(changelog_table(root, tid)) == fingerprint(upstream_rows(mariadb, mydb, "t"))

    capsys.readouterr()
    argv = ["--etcd", ",".join(etcd_endpoints), "--cluster-id", cluster_id,
            "--state-dir", str(tmp_path / "state"), "changefeed", "query", "-c", "shop"]  # fmt: skip
    assert main(argv) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["state"] == "normal" and shown["error"] == ""
    assert list(shown["skipped_tables"]) == [f"{mydb}.nopk_live"]
    assert "add a primary key" in shown["skipped_tables"][f"{mydb}.nopk_live"]
