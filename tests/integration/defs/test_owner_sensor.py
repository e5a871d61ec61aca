"""The owner sensor evaluated with build_sensor_context + instance_for_test over a real etcd."""

from __future__ import annotations

from collections.abc import Iterator

import dagster as dg
import pytest

from cdc_dagster import admin
from cdc_dagster.defs import build_definitions
from cdc_dagster.defs.catalog import demo_catalog
from cdc_dagster.defs.owner import sensor as sensor_module
from cdc_dagster.defs.runtime_glue import TickView, forget_owner_loops
from cdc_dagster.metastore import Metastore

CATALOG = demo_catalog([(1, "bank", "a"), (2, "bank", "b")])


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, etcd_endpoints: list[str], cluster_id: str) -> None:
    monkeypatch.setenv("CDC_DAGSTER_ETCD", ",".join(etcd_endpoints))
    monkeypatch.setenv("CDC_DAGSTER_CLUSTER_ID", cluster_id)
    monkeypatch.setenv("CDC_DAGSTER_OWNER_ID", "dagster-test")
    forget_owner_loops()


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as inst:
        yield inst


def _evaluate(instance: dg.DagsterInstance, cursor: str | None = None) -> dg.SensorResult:
    defs = build_definitions(CATALOG)
    sensor = defs.get_repository_def().get_sensor_def("cdc_owner")
    ctx = dg.build_sensor_context(instance=instance, cursor=cursor, definitions=defs)
    return sensor(ctx)


def _tick_from_etcd(ms: Metastore) -> TickView:
    """What the owner tick reports, read from etcd (stands in for OwnerLoop.tick)."""
    owner = ms.election.current_owner()
    if owner is None or owner.owner_id != "dagster-test":
        return TickView(
            False, f"{owner.owner_id} (owner_rev {owner.owner_rev})" if owner else "nobody"
        )
    captures = tuple(sorted(c.capture_id for c in ms.captures.list_alive()))
    return TickView(
        True,
        "dagster-test",
        owner.owner_rev,
        captures,
        {captures[0]: {"cf": [{"type": "heartbeat"}]}},
    )


def test_sensor_skips_naming_the_owner_when_another_holds_the_election(
    env: None, instance: dg.DagsterInstance, metastore: Metastore, monkeypatch: pytest.MonkeyPatch
) -> None:
    metastore.election.try_campaign("someone-else", ttl_s=10)
    monkeypatch.setattr(sensor_module, "owner_tick", lambda s: _tick_from_etcd(metastore))
    result = _evaluate(instance)
    assert "someone-else" in result.skip_reason.skip_message


def test_sensor_as_owner_requests_capture_runs_and_adds_partitions(
    env: None, instance: dg.DagsterInstance, metastore: Metastore, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = metastore.election.try_campaign("dagster-test", ttl_s=10)
    admin.add_capture(metastore, "c1")
    admin.add_capture(metastore, "c2")
    monkeypatch.setattr(sensor_module, "owner_tick", lambda s: _tick_from_etcd(metastore))
    result = _evaluate(instance, cursor="4")
    assert result.cursor == "5"
    (run,) = [r for r in result.run_requests]
    assert run.partition_key == "c1" and run.run_key == f"capture:c1:{session.owner_rev}:5"
    (add,) = result.dynamic_partitions_requests
    assert sorted(add.partition_keys) == ["c1", "c2"]


def test_admin_requests_are_written_where_the_owner_loop_reads_them(metastore: Metastore) -> None:
    admin.add_capture(metastore, "c1")
    metastore.changefeeds.create("cf", "delta:///tmp/x")
    admin.rebalance(metastore, "cf")
    admin.move_table(metastore, "cf", 3, "c1")
    bodies = [body for _, body in admin.pending_requests(metastore)]
    assert {"op": "rebalance"} in bodies
    assert {"op": "move_table", "table_id": 3, "to": "c1"} in bodies
    keys = [key for key, _ in admin.pending_requests(metastore)]
    assert all(k.startswith(f"{metastore.layout.prefix}admin/cf/") for k in keys)
