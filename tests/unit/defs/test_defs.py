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
    "resume_changefeed",
    "update_changefeed",
}


def test_production_definitions_from_the_change_log(
    monkeypatch: pytest.MonkeyPatch, changelog: Path
) -> None:
    monkeypatch.setenv("CDC_DAGSTER_CHANGELOG", str(changelog))
    repo = defs().get_repository_def()
    keys = {k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()}
    assert keys == {
        "upstream/bank/accounts_0",
        "upstream/bank/accounts_1",
        "upstream/shop/orders",
        "replica/bank/accounts_0",
        "replica/bank/accounts_1",
        "replica/shop/orders",
    }
    assert {j for j in repo.job_names if not j.startswith("__")} == {
        "capture_tick",
        "apply_ddl",
        "mysql_puller",
        *ADMIN_JOBS,
    }
    assert [s.name for s in repo.sensor_defs] == ["cdc_owner"]
    sensor = repo.get_sensor_def("cdc_owner")
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
    assert sensor.minimum_interval_seconds == 5
    checks = {(c.asset_key.to_user_string(), c.name) for c in repo.asset_graph.asset_check_keys}
    assert ("replica/shop/orders", "lag_within_bound") in checks
    assert ("replica/shop/orders", "equals_upstream_at_syncpoint") in checks
    assert ("replica/bank/accounts_0", "bank_total_invariant") in checks
    assert len(checks) == 7
    replica = repo.asset_graph.get(dg.AssetKey(["replica", "shop", "orders"]))
    assert replica.parent_keys == {dg.AssetKey(["upstream", "shop", "orders"])}


def test_capture_job_is_partitioned_by_capture_and_in_process() -> None:
    repo = build_definitions(demo_catalog([(1, "a", "b")])).get_repository_def()
    job = repo.get_job("capture_tick")
    assert isinstance(job.partitions_def, dg.DynamicPartitionsDefinition)
    assert job.partitions_def.name == "captures"
    assert job.executor_def.name == "in_process"
    assert [n.name for n in job.graph.node_defs] == ["receive", "prepare", "commit", "report"]


def test_definitions_without_a_change_log_have_no_table_assets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CDC_DAGSTER_CHANGELOG", raising=False)
    repo = defs().get_repository_def()
    assert not repo.asset_graph.get_all_asset_keys()
    assert "capture_tick" in repo.job_names


def test_tables_beyond_the_limit_are_grouped_per_schema() -> None:
    catalog = demo_catalog([(i, f"db{i % 2}", f"t{i}") for i in range(1, 11)])
    grouped = type(catalog)(catalog.tables, max_table_assets=5)
    repo = build_definitions(grouped).get_repository_def()
    keys = {k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()}
    assert keys == {"upstream/db0", "upstream/db1", "replica/db0", "replica/db1"}
