"""The run coordinator: a run the queue would not hold back starts at once in the daemon;
every other run is queued as by Dagster's queued coordinator."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from dagster._core.remote_origin import (
    RegisteredCodeLocationOrigin,
    RemoteJobOrigin,
    RemoteRepositoryOrigin,
)
from dagster._core.run_coordinator import SubmitRunContext
from dagster._core.storage.dagster_run import DagsterRunStatus
from dagster._core.test_utils import create_run_for_test, instance_for_test

import cdc_dagster.services.run_coordinator as rc
from cdc_dagster.services.dagster_home import dagster_home

LIMITS = [
    {"key": "dagster/partition", "value": {"applyLimitPerUniqueValue": True}, "limit": 2},
    {"key": "cdc/dbt_build", "limit": 1},
]


@pytest.fixture
def instance(monkeypatch: pytest.MonkeyPatch) -> Any:
    from dagster._daemon import sensor as sensor_daemon

    monkeypatch.setattr(rc, "in_daemon", lambda: True)
    # made "in the daemon", the coordinator tightens the sensor loop: as it was after
    monkeypatch.setattr(
        sensor_daemon, "MIN_INTERVAL_LOOP_TIME", sensor_daemon.MIN_INTERVAL_LOOP_TIME
    )
    overrides = {
        "run_coordinator": {
            "module": "cdc_dagster.services.run_coordinator",
            "class": "PromptRunCoordinator",
            "config": {"dequeue_interval_seconds": 1},
        },
        "run_launcher": {"module": "dagster._core.test_utils", "class": "MockedRunLauncher"},
        "concurrency": {"runs": {"tag_concurrency_limits": LIMITS, "max_concurrent_runs": 3}},
    }
    with instance_for_test(overrides=overrides) as inst:
        yield inst


ORIGIN = RemoteJobOrigin(RemoteRepositoryOrigin(RegisteredCodeLocationOrigin("loc"), "repo"), "j")


def submit(instance: Any, **tags: str) -> Any:
    run = create_run_for_test(instance, job_name="j", tags=tags, remote_job_origin=ORIGIN)
    return instance.run_coordinator.submit_run(SubmitRunContext(run, workspace=None))


def test_a_run_no_limit_holds_back_starts_at_once_the_others_are_queued(instance: Any) -> None:
    launched = submit(instance, **{"cdc/changefeed": "shop"})  # a snapshot run's tags
    assert launched.status == DagsterRunStatus.STARTING
    assert instance.run_launcher.did_run_launch(launched.run_id)
    # a tag under a limit (a capture's run, a dbt build): queued, the limit holds
    capture = submit(instance, **{"dagster/partition": "capture-1"})
    assert capture.status == DagsterRunStatus.QUEUED
    assert not instance.run_launcher.did_run_launch(capture.run_id)
    # with a run waiting in the queue, a free run waits behind it (none is overtaken)
    behind = submit(instance, **{"cdc/changefeed": "shop"})
    assert behind.status == DagsterRunStatus.QUEUED


def test_the_run_limit_holds_and_only_the_daemon_launches_at_once(
    instance: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    for _ in range(3):  # max_concurrent_runs 3
        assert submit(instance).status == DagsterRunStatus.STARTING
    assert submit(instance).status == DagsterRunStatus.QUEUED  # 3 in progress: the queue's
    monkeypatch.setattr(rc, "in_daemon", lambda: False)
    with instance_for_test(
        overrides={
            "run_coordinator": {
                "module": "cdc_dagster.services.run_coordinator",
                "class": "PromptRunCoordinator",
            },
            "run_launcher": {"module": "dagster._core.test_utils", "class": "MockedRunLauncher"},
        }
    ) as other:  # the webserver, a CLI: their launcher holds no warm workers
        assert submit(other).status == DagsterRunStatus.QUEUED


def test_the_daemon_is_known_by_its_program(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.argv", ["/venv/bin/dagster-daemon", "run", "-w", "w.yaml"])
    assert rc.in_daemon()
    monkeypatch.setattr("sys.argv", ["/venv/bin/python", "-m", "cdc_dagster.services.run_worker"])
    assert not rc.in_daemon()


def test_the_dagster_yaml_uses_it_with_the_limits(tmp_path: Path) -> None:
    instance = dg.DagsterInstance.from_config(str(dagster_home(tmp_path)))
    try:
        assert isinstance(instance.run_coordinator, rc.PromptRunCoordinator)
        limits = instance.get_concurrency_config().run_queue_config.tag_concurrency_limits
        assert {"cdc/upstream", "dagster/partition", "cdc/dbt_build"} <= rc.limited_keys(limits)
    finally:
        instance.dispose()


def test_made_in_the_daemon_it_makes_the_sensor_loop_wake_every_second(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The owner's evaluation that requests runs returns at once; the next one starts at the
    sensor loop's next wake: every ``SENSOR_LOOP_S`` in the daemon, not Dagster's 5 s."""
    from dagster._daemon import sensor as sensor_daemon

    monkeypatch.setattr(sensor_daemon, "MIN_INTERVAL_LOOP_TIME", 5)
    overrides = {
        "run_coordinator": {
            "module": "cdc_dagster.services.run_coordinator",
            "class": "PromptRunCoordinator",
        },
        "run_launcher": {"module": "dagster._core.test_utils", "class": "MockedRunLauncher"},
    }
    for daemon, wakes_every in ((False, 5), (True, rc.SENSOR_LOOP_S)):
        monkeypatch.setattr(rc, "in_daemon", lambda daemon=daemon: daemon)
        with instance_for_test(overrides=overrides) as inst:
            assert isinstance(inst.run_coordinator, rc.PromptRunCoordinator)
        assert wakes_every == sensor_daemon.MIN_INTERVAL_LOOP_TIME
    rc.tighten_sensor_loop(3.0)  # never less often than it wakes already
    assert sensor_daemon.MIN_INTERVAL_LOOP_TIME == rc.SENSOR_LOOP_S
