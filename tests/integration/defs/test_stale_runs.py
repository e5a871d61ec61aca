"""Capture runs of an expired registration are stopped, so the re-registered capture gets a
run again (cdc_dagster/defs/owner/stale_runs.py), on a real Dagster instance's run storage."""

from __future__ import annotations

from collections.abc import Iterator

import dagster as dg
import pytest
from dagster._core.errors import DagsterUserCodeUnreachableError
from dagster._core.test_utils import create_run_for_test

from cdc_dagster.defs.owner.plan import CAPTURE_JOB
from cdc_dagster.defs.owner.sensor import queued_captures
from cdc_dagster.defs.owner.stale_runs import force_cancel_hung_runs, terminate_expired_runs


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
    asked: list[str] = []

    def terminate(run_id: str) -> bool:  # the code server asks the process; it is frozen
        asked.append(run_id)
        return True

    monkeypatch.setattr(instance.run_launcher, "terminate", terminate, raising=False)
    lines = terminate_expired_runs(instance, ["capture-1"])

    assert asked == [frozen] and len(lines) == 1 and frozen in lines[0]
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
    assert terminate_expired_runs(instance, []) == []
    assert terminate_expired_runs(instance, ["capture-9"]) == []
    assert force_cancel_hung_runs(instance, grace_s=0) == []
    assert _status(instance, running) == dg.DagsterRunStatus.STARTED


def test_a_launcher_that_cannot_reach_the_run_still_leads_to_a_forced_cancel(
    instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    orphan = _run(instance, "capture-1", dg.DagsterRunStatus.STARTED)

    def unreachable(run_id: str) -> bool:
        raise DagsterUserCodeUnreachableError("the code server that launched it is gone")

    monkeypatch.setattr(instance.run_launcher, "terminate", unreachable, raising=False)
    assert len(terminate_expired_runs(instance, ["capture-1"])) == 1
    assert _status(instance, orphan) == dg.DagsterRunStatus.CANCELING
    assert len(force_cancel_hung_runs(instance, grace_s=0)) == 1
    assert _status(instance, orphan) == dg.DagsterRunStatus.CANCELED
