"""Capture runs of an expired registration are stopped, so the re-registered capture gets a
run again (cdc_dagster/defs/owner/stale_runs.py), on a real Dagster instance's run storage."""

from __future__ import annotations

from collections.abc import Iterator

import dagster as dg
import pytest
from dagster._core.test_utils import create_run_for_test

from cdc_dagster.defs.owner.plan import CAPTURE_JOB
from cdc_dagster.defs.owner.sensor import queued_captures
from cdc_dagster.defs.owner.stale_runs import cancel_expired_runs, force_cancel_hung_runs


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as inst:
        yield inst


def _run(instance: dg.DagsterInstance, capture: str, status: dg.DagsterRunStatus) -> str:
    run = create_run_for_test(
        instance, job_name=CAPTURE_JOB, status=status, tags={"dagster/partition": capture}
    )
    return run.run_id


def _status(instance: dg.DagsterInstance, run_id: str) -> dg.DagsterRunStatus:
    run = instance.get_run_by_id(run_id)
    assert run is not None
    return run.status


def test_a_frozen_run_of_a_re_registered_capture_frees_its_slot(
    instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    frozen = _run(instance, "capture-1", dg.DagsterRunStatus.STARTED)
    healthy = _run(instance, "capture-2", dg.DagsterRunStatus.STARTED)
    # Never the launcher's terminate: on a frozen run it hangs the code server with it.
    monkeypatch.setattr(
        instance.run_launcher, "terminate", lambda run_id: pytest.fail(run_id), raising=False
    )
    lines = cancel_expired_runs(instance, ["capture-1"])

    assert len(lines) == 1 and frozen in lines[0]
    assert _status(instance, frozen) == dg.DagsterRunStatus.CANCELING
    assert _status(instance, healthy) == dg.DagsterRunStatus.STARTED
    # Still canceling within the grace: left alone; past it: canceled, the slot is free.
    assert force_cancel_hung_runs(instance, grace_s=3600) == []
    lines = force_cancel_hung_runs(instance, grace_s=0)
    assert len(lines) == 1 and frozen in lines[0]
    assert _status(instance, frozen) == dg.DagsterRunStatus.CANCELED
    assert queued_captures(instance, in_progress=True) == {"capture-2"}


def test_no_capture_registered_again_terminates_nothing(
    instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    running = _run(instance, "capture-1", dg.DagsterRunStatus.STARTED)
    monkeypatch.setattr(
        instance.run_launcher, "terminate", lambda run_id: pytest.fail(run_id), raising=False
    )
    assert cancel_expired_runs(instance, []) == []
    assert cancel_expired_runs(instance, ["capture-9"]) == []
    assert force_cancel_hung_runs(instance, grace_s=0) == []
    assert _status(instance, running) == dg.DagsterRunStatus.STARTED
