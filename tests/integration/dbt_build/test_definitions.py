"""The dbt assets in the production Definitions: lineage, checks, the sensor, a real run.

``build_definitions`` (cdc_dagster.defs) is the real wiring; the tests point its
``cdc_dbt`` / sensor at the test's Delta root through the environment, which is how a
deployment can override the changefeed found in etcd.
"""

from __future__ import annotations

import os

import dagster as dg
import duckdb
import pytest

from cdc_dagster.dbt import PROJECT_DIR
from cdc_dagster.defs.dbt.assets import DbtDownstreamResource, dbt_assets_for
from cdc_dagster.defs.dbt.sensor import syncpoint_requests, syncpoint_sensor
from cdc_dagster.testing.dagster import evaluate_sensor
from tests.integration.dbt_build.expected import built_models, expected_models
from tests.integration.dbt_build.replica import CF, TABLES, Replica

TABLE_NAMES = [(t.database, t.table) for t in TABLES]


def catalog():
    from cdc_dagster.defs.catalog import demo_catalog

    return demo_catalog([(t.table_id, t.database, t.table) for t in TABLES])


def build_defs(
    delta_root: str, duckdb_path: str, monkeypatch: pytest.MonkeyPatch | None = None
) -> dg.Definitions:
    """The production Definitions over the test's tables, built on ``delta_root``."""
    from cdc_dagster.defs import build_definitions

    env = {
        "CDC_DAGSTER_DBT_DELTA_ROOT": f"delta://{delta_root}",
        "CDC_DAGSTER_DBT_CHANGEFEED": CF,
        "CDC_DBT_DUCKDB_PATH": duckdb_path,
    }
    for k, v in env.items():
        if monkeypatch is not None:
            monkeypatch.setenv(k, v)
    return build_definitions(catalog())


def test_lineage_reads_upstream_to_replica_to_model(tmp_path) -> None:
    defs = build_defs(str(tmp_path / "delta"), str(tmp_path / "d.duckdb"))
    graph = defs.resolve_asset_graph()
    parents = {k: graph.get(k).parent_keys for k in graph.get_all_asset_keys()}
    for d, t in TABLE_NAMES:
        assert parents[dg.AssetKey(["replica", d, t])] == {dg.AssetKey(["upstream", d, t])}
    key = dg.AssetKey
    assert parents[key(["dbt", "stg_accounts"])] == {
        key(["replica", "bank", "accounts_0"]),
        key(["replica", "bank", "accounts_1"]),
    }
    assert parents[key(["dbt", "stg_orders"])] == {key(["replica", "shop", "orders"])}
    assert parents[key(["dbt", "stg_customers"])] == {key(["replica", "shop", "customers"])}
    assert parents[key(["dbt", "order_facts"])] == {
        key(["dbt", "stg_orders"]),
        key(["dbt", "stg_customers"]),
    }
    assert parents[key(["dbt", "bank_total"])] == {key(["dbt", "account_balances"])}
    # no dbt source became an asset of its own: every source is a replica
    assert not [
        k for k in graph.get_all_asset_keys() if k.path[0] not in ("upstream", "replica", "dbt")
    ]
    checks = {(c.asset_key.path[-1], c.name) for c in graph.asset_check_keys}
    assert ("bank_total_history", "assert_bank_total_constant") in checks
    assert (
        "stg_orders",
        "relationships_stg_orders_customer_id__customer_id__ref_stg_customers_",
    ) in checks
    assert defs.resolve_sensor_def("dbt_syncpoint_sensor")


def test_sensor_requests_one_run_per_new_syncpoint() -> None:
    requests, cursor, skipped = syncpoint_requests([10, 20, 30, 40, 50], 20, CF, "op", 2)
    assert [r.run_config["ops"]["op"]["config"]["syncpoint_ts"] for r in requests] == [40, 50]
    assert [r.run_key for r in requests] == [f"dbt-syncpoint:{CF}:40", f"dbt-syncpoint:{CF}:50"]
    assert (cursor, skipped) == (50, [30])
    assert syncpoint_requests([10, 20], 20, CF, "op", 2) == ([], 20, [])


@pytest.mark.slow
def test_sensor_run_builds_the_syncpoint_with_its_metadata_and_checks(
    replica: Replica, duckdb_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ts = replica.syncpoint()
    defs = build_defs(replica.root, duckdb_path, monkeypatch)
    sensor = defs.resolve_sensor_def("dbt_syncpoint_sensor")
    with dg.instance_for_test() as instance:
        result = evaluate_sensor(sensor, instance, definitions=defs)
        assert [r.tags["cdc/syncpoint_ts"] for r in result.run_requests] == [str(ts)]
        replica.transfer_half(True)  # lands after the syncpoint: the run must not see it
        assert result.run_requests[0].tags["cdc/dbt_build"] == "1"
        job = defs.resolve_job_def("dbt_build")  # the job the sensor targets
        run = job.execute_in_process(
            run_config=result.run_requests[0].run_config, instance=instance
        )
        assert run.success
        mats = run.get_asset_materialization_events()
        assert len(mats) == 8
        for event in mats:
            meta = event.materialization.metadata
            assert meta["syncpoint_ts"].value == ts
            assert meta["delta_version/bank.accounts_0"].value == replica_version(replica, ts, 1)
        checks = run.get_asset_check_evaluations()
        assert checks and all(c.passed for c in checks)
        again = evaluate_sensor(sensor, instance, definitions=defs, cursor=result.cursor)
        assert not again.run_requests
    assert built_models(duckdb_path, ts) == expected_models(replica.snapshots[ts])
    with duckdb.connect(duckdb_path, read_only=True) as con:
        assert con.execute("select syncpoint_ts from cdc_meta.syncpoint_builds").fetchall() == [
            (ts,)
        ]


def replica_version(replica: Replica, ts: int, table_id: int) -> int:
    from cdc_dagster.sinks.delta import read_syncpoint

    return read_syncpoint(replica.root, CF, ts).versions[table_id]


def test_sensor_reads_the_changefeed_from_the_environment_at_tick_time(
    replica: Replica, duckdb_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ts = replica.syncpoint()
    assets = dbt_assets_for(PROJECT_DIR)
    sensor = syncpoint_sensor(assets)  # what production definitions build: no paths yet
    monkeypatch.delenv("CDC_DAGSTER_DBT_DELTA_ROOT", raising=False)
    monkeypatch.delenv("CDC_DAGSTER_ETCD", raising=False)  # etcd: the state dir's, not running
    monkeypatch.setenv("CDC_DAGSTER_STATE_DIR", os.path.dirname(replica.root))
    with dg.instance_for_test() as instance:
        skipped = evaluate_sensor(sensor, instance)
        assert isinstance(skipped, dg.SkipReason) and "CDC_DAGSTER_DBT_DELTA_ROOT" in str(
            skipped.skip_message
        )
        monkeypatch.setenv("CDC_DAGSTER_DBT_DELTA_ROOT", f"delta://{replica.root}")
        monkeypatch.setenv("CDC_DAGSTER_DBT_CHANGEFEED", CF)
        result = evaluate_sensor(sensor, instance)
    assert [r.tags["cdc/syncpoint_ts"] for r in result.run_requests] == [str(ts)]
    settings = DbtDownstreamResource().settings()
    assert (settings.delta_root, settings.changefeed_id) == (replica.root, CF)


def test_every_source_key_is_the_control_planes_replica_key() -> None:
    catalog_mod = pytest.importorskip("cdc_dagster.defs.catalog")  # lands with the defs module
    import json

    from cdc_dagster.defs.dbt.assets import CdcDbtTranslator, project_for

    manifest = json.loads(project_for(PROJECT_DIR).manifest_path.read_text(encoding="utf-8"))
    translator = CdcDbtTranslator()
    for i, source in enumerate(manifest["sources"].values(), start=1):
        ref = catalog_mod.TableRef(i, source["schema"], source["identifier"])
        catalog = catalog_mod.Catalog.of([ref])
        assert translator.get_asset_key(source) == catalog.replica_key(ref), source["unique_id"]
