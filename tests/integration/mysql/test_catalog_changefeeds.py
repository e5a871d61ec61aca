"""The code location's table catalog is every changefeed's tables (etcd's changefeed list,
each one's change log through its filter), not only CDC_DAGSTER_CHANGELOG's: a MySQL
changefeed's tables are assets, ids that collide across change logs stay apart, and the
DDL gate and asset checks look a table up in its own changefeed."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import dagster as dg
from test_binlog_puller import execute, table_id

from cdc_dagster import admin
from cdc_dagster.defs import defs
from cdc_dagster.defs.catalog import load_catalog
from cdc_dagster.defs.settings import Settings
from cdc_dagster.defs.tables.assets import materializations
from cdc_dagster.defs.tables.checks import _feeds_of
from cdc_dagster.defs.tables.gate import DdlRequest, checkpoint_lookup, gate_status
from cdc_dagster.runtime import TableProgress
from cdc_dagster.schema import ColumnSchema, DdlRecord, TableSchema
from cdc_dagster.upstream.changelog import ChangeLogWriter
from scheduler_core.ddl import DDLKind
from scheduler_core.ts import compose

TABLES = [(1, "bank", "accounts_0"), (2, "bank", "accounts_1"), (3, "shop", "orders")]


def write_changelog(root: Path) -> Path:
    """A change log like the embedded demo's: ``TABLES`` created, the DDL stream resolved."""
    writer = ChangeLogWriter(root)
    ts = compose(1_700_000_000_000)
    for i, (tid, database, table) in enumerate(TABLES):
        schema = TableSchema(
            tid, database, table, (ColumnSchema(1, "id", "int64", False),), (1,), shards=1
        )
        query = f"CREATE TABLE `{database}`.`{table}` (id bigint primary key)"
        writer.write_ddl(DdlRecord(ts + i, DDLKind.CREATE_TABLE, "create_table", query,
                                   creates=(tid,), tables={tid: schema}))  # fmt: skip
    writer.advance_ddl_resolved(ts + len(TABLES))
    writer.close()
    return root


def _keys(repo: dg.RepositoryDefinition) -> set[str]:
    return {k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()}


def _report(cf: str, tid: int) -> TableProgress:
    return TableProgress(cf, tid, "replicating", "c1", 5, 5, 5, 0)


def test_defs_list_every_changefeeds_tables_and_keep_colliding_ids_apart(
    mariadb, mydb, metastore, dagster_env, tmp_path, monkeypatch
):
    execute(mariadb, mydb, "CREATE TABLE orders (id INT PRIMARY KEY, v INT)",
            "CREATE TABLE tmp_scratch (id INT PRIMARY KEY)")  # fmt: skip
    root = tmp_path / "mysql-cl"
    admin.create_changefeed(
        metastore, "shop", f"delta://{tmp_path / 'lake'}", table_filter=(f"{mydb}.*", f"!{mydb}.tmp_*"),
        upstream_uri=mariadb.uri(query="server-id=4242"), changelog_root=str(root),
    )  # fmt: skip
    # the embedded demo's log, read by another changefeed: its ids count from 1 too
    demo = write_changelog(tmp_path / "demo-cl")
    admin.create_changefeed(
        metastore, "demo", "delta:///tmp/lake", table_filter=("bank.*",),
        upstream_uri=f"changelog://{demo}",
    )  # fmt: skip
    monkeypatch.setenv("CDC_DAGSTER_CHANGELOG", str(demo))

    repo = defs().get_repository_def()
    keys = _keys(repo)
    assert {f"replica/{mydb}/orders", f"upstream/{mydb}/orders"} <= keys
    assert {"replica/bank/accounts_0", "replica/bank/accounts_1"} <= keys
    assert f"replica/{mydb}/tmp_scratch" not in keys  # outside the shop filter
    assert "replica/shop/orders" not in keys  # outside the demo filter, and its log is a feed's
    checks = {(c.asset_key.to_user_string(), c.name) for c in repo.asset_graph.asset_check_keys}
    assert (f"replica/{mydb}/orders", "lag_within_bound") in checks

    catalog = load_catalog(Settings.from_env())
    orders = table_id(root, "orders")
    assert orders == 1 and catalog.ref("demo", 1).table == "accounts_0"  # one id, two tables
    assert catalog.ref("shop", 1).table == "orders"
    events = materializations(catalog, [_report("shop", 1), _report("demo", 1)], 0)
    assert [e.asset_key.to_user_string() for e in events] == [
        f"replica/{mydb}/orders",
        "replica/bank/accounts_0",
    ]
    # the gate looks at the DDL's own changefeed's tables (a global DDL: all of them)
    metadata = {dg.AssetKey(["replica", mydb, "orders"]): 100}
    lookup = checkpoint_lookup(catalog, metadata.get, lambda cf: {})
    assert gate_status(DdlRequest("shop", 100, ()), catalog, lookup)[0]
    is_open, reason = gate_status(DdlRequest("demo", 100, ()), catalog, lookup)
    assert not is_open and "1@none, 2@none" in reason
    # the checks compare a table only with its own changefeed's syncpoints and log
    feeds = metastore.changefeeds.list()
    assert [cf.changefeed_id for cf in _feeds_of(catalog.ref("shop", 1), feeds, demo)] == ["shop"]


def test_without_etcd_the_catalog_is_the_changelog_of_the_environment(
    tmp_path, monkeypatch, caplog
):
    demo = write_changelog(tmp_path / "demo-cl")
    monkeypatch.setenv("CDC_DAGSTER_CHANGELOG", str(demo))
    monkeypatch.setenv("CDC_DAGSTER_ETCD", "127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("CDC_DAGSTER_STATE_DIR", str(tmp_path / "state"))
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="cdc_dagster.defs.catalog"):
        repo = defs().get_repository_def()
    assert time.monotonic() - started < 30
    assert {"replica/bank/accounts_0", "replica/shop/orders"} <= _keys(repo)
    assert any("etcd is not reachable" in r.getMessage() for r in caplog.records)
