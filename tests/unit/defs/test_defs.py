"""The production Definitions, loaded the way the code server loads them."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

from cdc_dagster.defs import build_definitions, defs
from cdc_dagster.defs.catalog import demo_catalog

ADMIN_JOBS = {
    "add_capture",
    "create_changefeed",
    "drain_capture",
    "move_table",
    "pause_changefeed",
    "rebalance",
    "remove_capture",
    "remove_changefeed",
    "resign_owner",
    "resnapshot_table",
    "resume_changefeed",
    "update_changefeed",
}


DBT_MODELS = {
    "dbt/stg_accounts",
    "dbt/stg_customers",
    "dbt/stg_orders",
    "dbt/account_balances",
    "dbt/bank_total",
    "dbt/bank_total_history",
    "dbt/order_facts",
    "dbt/daily_order_summary",
}


def test_production_definitions_from_the_change_log(
    monkeypatch: pytest.MonkeyPatch, changelog: Path
) -> None:
    monkeypatch.setenv("CDC_DAGSTER_CHANGELOG", str(changelog))
    production = defs()
    dg.Definitions.validate_loadable(production)  # what the code server does: every name unique
    repo = production.get_repository_def()
    keys = {k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()}
    assert keys == {
        "upstream/bank/accounts_0",
        "upstream/bank/accounts_1",
        "upstream/shop/orders",
        "replica/bank/accounts_0",
        "replica/bank/accounts_1",
        "replica/shop/orders",
        *DBT_MODELS,
    }
    assert {j for j in repo.job_names if not j.startswith("__")} == {
        "capture_tick",
        "apply_ddl",
        "dbt_build",
        "mysql_puller",
        "mysql_snapshot",
        "check_at_syncpoint",
        *ADMIN_JOBS,
    }
    assert [s.name for s in repo.sensor_defs] == ["cdc_owner", "dbt_syncpoint_sensor"]
    sensor = repo.get_sensor_def("cdc_owner")
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
    assert (
        sensor.minimum_interval_seconds == 1
    )  # ticks at every 5 s wake of the daemon (MIN_INTERVAL_S)
    checks = {(c.asset_key.to_user_string(), c.name) for c in repo.asset_graph.asset_check_keys}
    assert ("replica/shop/orders", "lag_within_bound") in checks
    assert ("replica/shop/orders", "equals_upstream_at_syncpoint") in checks
    assert ("replica/bank/accounts_0", "bank_total_invariant") in checks
    assert len([c for c in checks if c[0].startswith("replica/")]) == 7
    replica = repo.asset_graph.get(dg.AssetKey(["replica", "shop", "orders"]))
    assert replica.parent_keys == {dg.AssetKey(["upstream", "shop", "orders"])}


def test_production_lineage_reads_upstream_to_replica_to_model(
    monkeypatch: pytest.MonkeyPatch, changelog: Path
) -> None:
    monkeypatch.setenv("CDC_DAGSTER_CHANGELOG", str(changelog))
    graph = defs().get_repository_def().asset_graph
    key = dg.AssetKey
    parents = {k: graph.get(k).parent_keys for k in graph.get_all_asset_keys()}
    for d, t in (("bank", "accounts_0"), ("bank", "accounts_1"), ("shop", "orders")):
        assert parents[key(["replica", d, t])] == {key(["upstream", d, t])}
    # sources map onto the replica assets (meta.dagster.asset_key); a source whose table
    # this change log lacks (shop.customers, bank.accounts_2..7) gets no stub asset
    assert parents[key(["dbt", "stg_accounts"])] == {
        key(["replica", "bank", "accounts_0"]),
        key(["replica", "bank", "accounts_1"]),
    }
    assert parents[key(["dbt", "stg_orders"])] == {key(["replica", "shop", "orders"])}
    assert parents[key(["dbt", "stg_customers"])] == set()
    assert parents[key(["dbt", "order_facts"])] == {
        key(["dbt", "stg_orders"]),
        key(["dbt", "stg_customers"]),
    }
    assert parents[key(["dbt", "bank_total"])] == {key(["dbt", "account_balances"])}
    checks = {(c.asset_key.to_user_string(), c.name) for c in graph.asset_check_keys}
    assert ("dbt/bank_total_history", "assert_bank_total_constant") in checks
    assert ("dbt/stg_accounts", "unique_stg_accounts_account_key") in checks


def test_dbt_builds_once_per_syncpoint_by_default_one_at_a_time() -> None:
    repo = build_definitions(demo_catalog([(1, "bank", "accounts_0")])).get_repository_def()
    sensor = repo.get_sensor_def("dbt_syncpoint_sensor")
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
    job = repo.get_job("dbt_build")
    assert sensor.job_name == "dbt_build"
    assert job.executor_def.name == "in_process"
    assert job.tags["cdc/dbt_build"] == "1"
    assert {k.path[0] for k in job.asset_layer.executable_asset_keys} == {"dbt"}
    assert set(repo.get_top_level_resources()) >= {"dbt", "cdc_dbt", "cdc", "spark"}


def test_grouped_tables_give_models_the_schemas_replica() -> None:
    catalog = demo_catalog(
        [(i, "bank", f"accounts_{i}") for i in range(8)] + [(9, "shop", "orders")]
    )
    grouped = type(catalog)(catalog.tables, max_table_assets=5)
    graph = build_definitions(grouped).get_repository_def().asset_graph
    stg = graph.get(dg.AssetKey(["dbt", "stg_accounts"]))
    assert stg.parent_keys == {dg.AssetKey(["replica", "bank"])}


def test_capture_job_is_partitioned_by_capture_and_in_process() -> None:
    repo = build_definitions(demo_catalog([(1, "a", "b")])).get_repository_def()
    job = repo.get_job("capture_tick")
    assert isinstance(job.partitions_def, dg.DynamicPartitionsDefinition)
    assert job.partitions_def.name == "captures"
    assert job.executor_def.name == "in_process"
    names = [n.name for n in job.graph.node_defs]
    assert names == ["receive", "prepare", "commit", "report", "follow"]


def test_definitions_without_a_change_log_have_no_table_assets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CDC_DAGSTER_CHANGELOG", raising=False)
    repo = defs().get_repository_def()
    keys = {k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()}
    assert keys == DBT_MODELS  # the models stay; no table asset, no stub for their sources
    assert "capture_tick" in repo.job_names


def test_tables_beyond_the_limit_are_grouped_per_schema() -> None:
    catalog = demo_catalog([(i, f"db{i % 2}", f"t{i}") for i in range(1, 11)])
    grouped = type(catalog)(catalog.tables, max_table_assets=5)
    repo = build_definitions(grouped).get_repository_def()
    keys = {k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()}
    assert keys == {"upstream/db0", "upstream/db1", "replica/db0", "replica/db1", *DBT_MODELS}
