"""Capture runs of an expired registration are stopped, so the re-registered capture gets a
run again (cdc_dagster/defs/owner/stale_runs.py), on a real Dagster instance's run storage."""

from __future__ import annotations

from collections.abc import Iterator

import dagster as dg
import pytest
from dagster._core.test_utils import create_run_for_test

from cdc_dagster.defs.capture.handoff import capture_runs
from cdc_dagster.defs.owner.plan import CAPTURE_JOB
from cdc_dagster.defs.owner.stale_runs import (
    REGISTRATION_TAG,
    UNATTACHED_S,
    cancel_expired_runs,
    force_cancel_hung_runs,
    is_stale,
)


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as inst:
        yield inst


def _run(
    instance: dg.DagsterInstance,
    capture: str,
    status: dg.DagsterRunStatus,
    registration: str | None = None,
) -> str:
    tags = {"dagster/partition": capture}
    if registration is not None:
        tags[REGISTRATION_TAG] = registration
    run = create_run_for_test(instance, job_name=CAPTURE_JOB, status=status, tags=tags)
    return run.run_id


def _status(instance: dg.DagsterInstance, run_id: str) -> dg.DagsterRunStatus:
    run = instance.get_run_by_id(run_id)
    assert run is not None
    return run.status


def test_a_frozen_run_of_a_re_registered_capture_frees_its_slot(
    instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    frozen = _run(instance, "capture-1", dg.DagsterRunStatus.STARTED, "old")
    healthy = _run(instance, "capture-2", dg.DagsterRunStatus.STARTED, "c2")
    # Runs that belong to the new registration, or to none yet, are left alone: they
    # renew it (retiring them kept a loaded machine's captures expiring, run after run).
    launching = _run(instance, "capture-1", dg.DagsterRunStatus.STARTING)
    attached_anew = _run(instance, "capture-1", dg.DagsterRunStatus.STARTED, "new")
    not_attached_yet = _run(instance, "capture-1", dg.DagsterRunStatus.STARTED)
    # Never the launcher's terminate: on a frozen run it hangs the code server with it.
    monkeypatch.setattr(
        instance.run_launcher, "terminate", lambda run_id: pytest.fail(run_id), raising=False
    )
    lines = cancel_expired_runs(instance, {"capture-1": "new"})

    assert len(lines) == 1 and frozen in lines[0]
    assert _status(instance, frozen) == dg.DagsterRunStatus.CANCELING
    assert _status(instance, healthy) == dg.DagsterRunStatus.STARTED
    assert _status(instance, launching) == dg.DagsterRunStatus.STARTING
    assert _status(instance, attached_anew) == dg.DagsterRunStatus.STARTED
    assert _status(instance, not_attached_yet) == dg.DagsterRunStatus.STARTED
    for run_id in (launching, attached_anew, not_attached_yet):  # out of the way below
        instance.report_run_canceled(instance.get_run_by_id(run_id))
    # Still canceling within the grace: left alone; past it: canceled, the slot is free.
    assert force_cancel_hung_runs(instance, grace_s=3600) == []
    lines = force_cancel_hung_runs(instance, grace_s=0)
    assert len(lines) == 1 and frozen in lines[0]
    assert _status(instance, frozen) == dg.DagsterRunStatus.CANCELED
    assert capture_runs(instance, 300).queued == {"capture-2"}


def test_no_capture_registered_again_terminates_nothing(
    instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    running = _run(instance, "capture-1", dg.DagsterRunStatus.STARTED)
    monkeypatch.setattr(
        instance.run_launcher, "terminate", lambda run_id: pytest.fail(run_id), raising=False
    )
    assert cancel_expired_runs(instance, {}) == []
    assert cancel_expired_runs(instance, {"capture-9": "e9"}) == []
    assert force_cancel_hung_runs(instance, grace_s=0) == []
    assert _status(instance, running) == dg.DagsterRunStatus.STARTED


def test_a_run_is_stale_when_it_attached_to_another_registration_or_never_attached() -> None:
    def run(tag: str | None) -> dg.DagsterRun:
        tags = {"dagster/partition": "capture-1"}
        if tag is not None:
            tags[REGISTRATION_TAG] = tag
        return dg.DagsterRun(job_name=CAPTURE_JOB, tags=tags)

    now = 10_000.0
    assert is_stale(run("old"), now - 5, "new", now)
    assert not is_stale(run("new"), now - 5, "new", now)
    assert not is_stale(run(None), now - 5, "new", now)  # attaches to "new" in its first op
    assert not is_stale(run(None), None, "new", now)
    assert is_stale(run(None), now - UNATTACHED_S - 1, "new", now)  # hung before attaching


def test_the_owner_requests_a_next_run_only_for_a_run_about_to_end(
    instance: dg.DagsterInstance,
) -> None:
    """capture_runs (defs/capture/handoff.py): a started run whose follow loop ends within
    the handoff time is due its successor; one not ending, one not following yet, one not
    started, or an ending one whose successor exists already hold the messages."""
    from cdc_dagster.defs.capture.handoff import FOLLOW_UNTIL_TAG, handoff_s

    now = 1_000_000.0
    window = handoff_s(300)

    def run(capture: str, status: dg.DagsterRunStatus, until: float | None = None) -> None:
        tags = {"dagster/partition": capture}
        if until is not None:
            tags[FOLLOW_UNTIL_TAG] = f"{until:.3f}"
        create_run_for_test(instance, job_name=CAPTURE_JOB, status=status, tags=tags)

    run("ending", dg.DagsterRunStatus.STARTED, now + window - 1)
    run("overdue", dg.DagsterRunStatus.STARTED, now - 30)  # its successor failed: another
    run("following", dg.DagsterRunStatus.STARTED, now + window + 1)
    run("first_tick", dg.DagsterRunStatus.STARTED)  # not in its follow loop yet
    run("queued", dg.DagsterRunStatus.NOT_STARTED)
    run("handed", dg.DagsterRunStatus.STARTED, now + 1)
    run("handed", dg.DagsterRunStatus.NOT_STARTED)  # its successor, requested already
    run("done", dg.DagsterRunStatus.SUCCESS, now + 1)
    runs = capture_runs(instance, 300, now=now)
    assert runs.handoff == {"ending", "overdue"}
    assert runs.queued == {"following", "first_tick", "queued", "handed"}
    assert runs.following == {"ending", "overdue", "following", "first_tick", "handed"}
    # One tick per run (no follow loop): only a run not started holds messages.
    once = capture_runs(instance, 0, now=now)
    assert once.queued == {"queued", "handed"} and not once.handoff and not once.following
