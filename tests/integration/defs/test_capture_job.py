"""The owner sensor (real OwnerLoop) and the capture job executed in process with real Spark.

A generated change log, a changefeed into a Delta root, two captures; each round evaluates
the sensor with build_sensor_context and executes the capture runs it requests in process,
until every table replicates. The replicated tables' materializations carry the progress.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from cdc_dagster.testing.dagster import evaluate_sensor, owner_ticked

pytest.importorskip("cdc_dagster.runtime")
pytest.importorskip("cdc_dagster.pipeline.executor")

from cdc_dagster import admin
from cdc_dagster.defs import build_definitions
from cdc_dagster.defs.catalog import catalog_from_changelog
from cdc_dagster.defs.resources import CdcResource
from cdc_dagster.metastore import Metastore


@pytest.fixture(scope="module")
def spark() -> Iterator[object]:
    import os
    import sys

    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers need pyarrow & cdc_dagster
    session = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    # Not stopped: getOrCreate gives this process's one local session, which other modules'
    # session fixtures hold too (stopped here, their tests failed when pytest-xdist ran
    # this module first); the process's end stops it.
    yield session


def _workload(root: Path) -> object:
    from cdc_dagster.upstream.generator import Workload, WorkloadConfig

    config = WorkloadConfig(
        bank_tables=2,
        ddls=False,
        fsync=False,
        wall_clock=True,
        odd_identifiers=False,
        txns_per_step=20,
    )
    return Workload(config, root)


def _first_create(root: Path) -> int:
    """The commit ts of the first bootstrap CREATE TABLE: later tables come as they pass."""
    from cdc_dagster.upstream.changelog import ChangeLog

    return min(r.commit_ts for r in ChangeLog(root).ddl_records())


@pytest.mark.slow
def test_sensor_and_capture_runs_replicate_the_tables(
    tmp_path: Path,
    metastore: Metastore,
    etcd_endpoints: list[str],
    cluster_id: str,
    monkeypatch: pytest.MonkeyPatch,
    spark: object,
) -> None:
    # The spark resource's builder.getOrCreate() picks up this module's local session.
    changelog = tmp_path / "changelog"
    monkeypatch.setenv("CDC_DAGSTER_ETCD", ",".join(etcd_endpoints))
    monkeypatch.setenv("CDC_DAGSTER_CLUSTER_ID", cluster_id)
    monkeypatch.setenv("CDC_DAGSTER_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("CDC_DAGSTER_CHANGELOG", str(changelog))
    monkeypatch.setenv("CDC_DAGSTER_OWNER_ID", "owner-1")
    CdcResource.forget_owner_loops()
    workload = _workload(changelog)
    # Start at the first CREATE: that table exists from the start, every later one (the
    # wide table too) is added as its CREATE passes.
    admin.create_changefeed(
        metastore,
        "cf",
        f"delta://{tmp_path / 'lake'}",
        start_ts=_first_create(changelog),
        upstream_uri=f"changelog://{changelog}",
    )
    admin.add_capture(metastore, "c1")
    admin.add_capture(metastore, "c2")
    catalog = catalog_from_changelog(changelog, 2000)
    assert "types.wide" in {t.name for t in catalog.tables}
    defs = build_definitions(catalog)
    repo = defs.get_repository_def()
    sensor = repo.get_sensor_def("cdc_owner")
    jobs = {name: defs.get_job_def(name) for name in ("capture_tick", "apply_ddl")}
    ddl_runs = 0
    with dg.instance_for_test() as instance:
        cursor = None
        for _ in range(30):
            result = evaluate_sensor(sensor, instance, cursor=cursor, definitions=defs)
            cursor = result.cursor
            assert owner_ticked(result), result.skip_reason
            for req in result.dynamic_partitions_requests or []:
                instance.add_dynamic_partitions("captures", list(req.partition_keys))
            for run in result.run_requests:
                out = jobs[run.job_name].execute_in_process(
                    run_config=run.run_config,
                    partition_key=run.partition_key,
                    instance=instance,
                    raise_on_error=False,
                )
                assert out.success, [e.message for e in out.all_events if e.is_failure]
                ddl_runs += run.job_name == "apply_ddl"
            workload.step()  # type: ignore[attr-defined]
            workload.advance_resolved()  # type: ignore[attr-defined]
            keys = catalog.replica_keys()
            done = all(
                (instance.get_latest_materialization_event(k) is not None)
                and instance.get_latest_materialization_event(k)
                .asset_materialization.metadata["state"]
                .value
                == "replicating"
                for k in keys
            )
            if done:
                break
            time.sleep(0.2)
        assert done, "tables did not reach replicating"
        for key in keys:
            md = instance.get_latest_materialization_event(key).asset_materialization.metadata
            for name in ("checkpoint_ts", "resolved_ts", "barrier_ts"):
                assert isinstance(md[name], dg.TimestampMetadataValue), (key, name)
                assert md[f"{name}_raw"].value > 0, (key, name)
            assert md["resolved_ts_raw"].value >= md["checkpoint_ts_raw"].value
            assert isinstance(md["lag_seconds"].value, float)
            assert md["capture"].value in {"c1", "c2"}
            # Cumulative: at least the table's 50 initial rows (distinct keys, no move here).
            assert md["rows_applied"].value >= 50, (key, md["rows_applied"].value)
        assert ddl_runs == 0  # the CREATEs touch no existing table: the owner applied them
