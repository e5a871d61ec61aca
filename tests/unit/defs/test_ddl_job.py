"""The DDL job's gate op fails the run before anything is applied unless the gate is open."""

from __future__ import annotations

import dagster as dg
import pytest

from cdc_dagster.defs import build_definitions
from cdc_dagster.defs.catalog import demo_catalog
from cdc_dagster.defs.ddl import job as ddl_job
from cdc_dagster.defs.tables.assets import materializations
from cdc_dagster.metastore import Metastore
from cdc_dagster.metastore.problems import DDL
from cdc_dagster.runtime import TableProgress
from cdc_dagster.sinks.base import SinkDDLError

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


def _open_gate(instance: dg.DagsterInstance) -> None:
    report = TableProgress("cf", 1, "replicating", "c1", 1000, 1000, 1000, 0)
    for event in materializations(CATALOG, [report], 0):
        instance.report_runless_asset_event(event)


def test_gate_open_applies_the_ddl(monkeypatch: pytest.MonkeyPatch, cdc_env: Metastore) -> None:
    applied: list[int] = []
    monkeypatch.setattr(ddl_job, "apply_ddl_at", lambda ms, cf, ts: applied.append(ts) or ["Q"])
    with dg.instance_for_test() as instance:
        _open_gate(instance)
        assert _run(instance, 1000).success
    assert applied == [1000]


def test_a_ddl_the_downstream_refuses_is_the_changefeeds_problem_until_it_applies(
    monkeypatch: pytest.MonkeyPatch, cdc_env: Metastore
) -> None:
    def refuse(ms: object, cf: str, ts: int) -> list[str]:
        raise SinkDDLError("PostgreSQL refused ALTER TABLE shop.orders: column in use")

    monkeypatch.setattr(ddl_job, "apply_ddl_at", refuse)
    with dg.instance_for_test() as instance:
        _open_gate(instance)
        failed = _run(instance, 1000)
        assert not failed.success
        problem = cdc_env.problems.get("cf", DDL)
        assert problem is not None and "column in use" in problem.message
        assert "ALTER TABLE shop.orders" in problem.message
        monkeypatch.setattr(ddl_job, "apply_ddl_at", lambda ms, cf, ts: ["Q"])
        cdc_env.problems.clear("cf", DDL)  # skip the backoff: the next run's retry
        cdc_env.problems.report("cf", DDL, problem.message, 0)  # an old problem, due now
        assert _run(instance, 1000).success
    assert cdc_env.problems.get("cf", DDL) is None
