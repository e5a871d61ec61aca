"""The instance config cdc-dagster writes: the queue is fast, hung runs are failed."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from cdc_dagster.defs import build_definitions
from cdc_dagster.defs.capture.job import MAX_RUNTIME_S
from cdc_dagster.defs.catalog import demo_catalog
from cdc_dagster.defs.mysql.requests import SNAPSHOT_JOB
from cdc_dagster.services.dagster_home import dagster_home
from cdc_dagster.services.run_launcher import WarmRunLauncher


def test_queue_is_checked_every_second_and_runs_are_monitored(tmp_path: Path) -> None:
    home = dagster_home(tmp_path)
    instance = dg.DagsterInstance.from_config(str(home))
    try:
        coordinator = instance.run_coordinator
        assert isinstance(coordinator, dg.QueuedRunCoordinator)
        assert coordinator.dequeue_interval_seconds == 1
        assert instance.run_monitoring_enabled
        assert instance.run_monitoring_start_timeout_seconds == 180
        limits = instance.get_concurrency_config().run_queue_config.tag_concurrency_limits
        assert {"key": "cdc/dbt_build", "limit": 1} in limits  # run_queue kept them
        launcher = instance.run_launcher
        assert isinstance(launcher, WarmRunLauncher)
        assert launcher.warm_workers == 3 and launcher.kill_after_s == 30
        assert launcher.quiet_jobs == (SNAPSHOT_JOB,) and launcher.quiet_max_s == 120
        assert launcher.quiet_idle_cores == 1.0
        assert launcher.supports_check_run_worker_health  # run monitoring sees dead workers
    finally:
        instance.dispose()


def test_capture_runs_carry_a_max_runtime_for_run_monitoring() -> None:
    defs = build_definitions(demo_catalog([(1, "db", "t")]))
    job = defs.resolve_job_def("capture_tick")
    assert job.tags["dagster/max_runtime"] == str(MAX_RUNTIME_S)
    assert 60 < MAX_RUNTIME_S <= 3600
