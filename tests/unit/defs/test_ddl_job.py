"""The DDL job's gate op fails the run before anything is applied unless the gate is open."""

from __future__ import annotations

import dagster as dg
import pytest

from cdc_dagster.defs import build_definitions
from cdc_dagster.defs.catalog import demo_catalog
from cdc_dagster.defs.ddl import job as ddl_job
from cdc_dagster.defs.tables.assets import materializations
from cdc_dagster.runtime import TableProgress

CATALOG = demo_catalog([(1, "bank", "a")])


def _run(instance: dg.DagsterInstance, commit_ts: int) -> dg.ExecuteInProcessResult:
    job = build_definitions(CATALOG).get_job_def("apply_ddl")
    config = {"changefeed_id": "cf", "commit_ts": commit_ts, "table_ids": [1]}
    return job.execute_in_process(
        run_config={"ops": {"ddl_gate": {"config": config}, "ddl_apply": {"config": config}}},
        instance=instance,
        raise_on_error=False,
    )


def test_gate_closed_fails_the_run_and_applies_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    applied: list[int] = []
    monkeypatch.setattr(ddl_job, "apply_ddl_at", lambda ms, cf, ts: applied.append(ts) or [])
    with dg.instance_for_test() as instance:
        result = _run(instance, 1000)
        assert not result.success and applied == []
        failure = next(e for e in result.all_events if e.is_step_failure)
        assert "DDL gate closed" in str(failure.event_specific_data.error.message)


def test_gate_open_applies_the_ddl(monkeypatch: pytest.MonkeyPatch) -> None:
    applied: list[int] = []
    monkeypatch.setattr(ddl_job, "apply_ddl_at", lambda ms, cf, ts: applied.append(ts) or ["Q"])
    monkeypatch.setattr(ddl_job.CdcResource, "metastore", lambda self: None)
    with dg.instance_for_test() as instance:
        report = TableProgress("cf", 1, "replicating", "c1", 1000, 1000, 1000, 0)
        for event in materializations(CATALOG, [report], 0):
            instance.report_runless_asset_event(event)
        assert _run(instance, 1000).success
    assert applied == [1000]
