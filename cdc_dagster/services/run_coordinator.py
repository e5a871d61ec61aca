"""A queued run coordinator that launches a run at once when the queue would launch it anyway.

Dagster's :class:`QueuedRunCoordinator` puts every submitted run in the queue, and its
daemon dequeues it at its next iteration (``dequeue_interval_seconds``, at least a whole
second): 1-1.6 s between a run's request and its launch in the throughput bench, on every
run the owner sensor asks for -- a new changefeed's ``mysql_snapshot`` run (its rows wait
for it), a DDL's ``apply_ddl``, a syncpoint check.

:class:`PromptRunCoordinator` (``run_coordinator`` in the ``dagster.yaml`` that ``server
start`` / ``demo`` write) launches a run directly, as Dagster's default in-process
coordinator does, when the queue could not hold it back: submitted in the daemon (whose run
launcher keeps the warm run workers: ``services.run_launcher``), no tag of it under a
concurrency limit (captures' and pullers' runs, dbt builds stay queued: their limits
hold), no run waiting in the queue (none is overtaken), and fewer runs in progress than
the run limit. Every other run is queued as before.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from dagster._core.run_coordinator import QueuedRunCoordinator, SubmitRunContext
from dagster._core.storage.dagster_run import (
    IN_PROGRESS_RUN_STATUSES,
    DagsterRun,
    DagsterRunStatus,
    RunsFilter,
)

# the process whose runs may start at once: the daemon's (its sensor daemon submits the
# owner's run requests; its launcher holds the warm workers)
DAEMON_PROGRAM = "dagster-daemon"


def in_daemon() -> bool:
    """Whether this process is ``dagster-daemon``."""
    return Path(sys.argv[0] if sys.argv else "").name == DAEMON_PROGRAM


# How often the daemon's sensor loop wakes (Dagster's: every 5 s, ``MIN_INTERVAL_LOOP_TIME``
# in ``dagster._daemon.sensor``). An owner evaluation that requests runs returns at once (runs
# are launched only then), and the next one started at the next wake: in the throughput
# bench the owner ticked 5.9 s after requesting two captures' next runs, while a resumed
# changefeed's tables waited for it in "prepared" (a drain readable after 8.0 s instead of
# 4.1-4.4). Each wake costs the daemon a look at the sensors' states (a few ms).
SENSOR_LOOP_S = 1.0


def tighten_sensor_loop(seconds: float = SENSOR_LOOP_S) -> None:
    """Make this process's sensor loop wake every ``seconds`` (not more often than Dagster
    would); nothing if this Dagster has no such setting."""
    from dagster._daemon import sensor as sensor_daemon

    current = getattr(sensor_daemon, "MIN_INTERVAL_LOOP_TIME", None)
    if isinstance(current, int | float) and seconds < current:
        sensor_daemon.MIN_INTERVAL_LOOP_TIME = seconds  # type: ignore[assignment]


def limited_keys(tag_limits: Any) -> set[str]:
    """The tag keys a concurrency limit applies to."""
    return {str(limit["key"]) for limit in tag_limits or () if "key" in limit}


class PromptRunCoordinator(QueuedRunCoordinator):
    """Queued, except that a run nothing would hold back in the queue is launched at once.
    Made in the daemon (as it starts: its queue daemon asks for the coordinator), it also
    makes the daemon's sensor loop wake every ``SENSOR_LOOP_S``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if in_daemon():
            tighten_sensor_loop()

    def submit_run(self, context: SubmitRunContext) -> DagsterRun:
        run = context.dagster_run
        if run.status == DagsterRunStatus.NOT_STARTED and in_daemon() and self._free(run):
            self._instance.launch_run(run.run_id, context.workspace)
            launched = self._instance.get_run_by_id(run.run_id)
            assert launched is not None
            return launched
        return super().submit_run(context)

    def _free(self, run: DagsterRun) -> bool:
        """Whether the queue would launch ``run`` at its next iteration anyway."""
        config = self._instance.get_concurrency_config().run_queue_config
        if config is None:
            return False
        if limited_keys(config.tag_concurrency_limits) & set(run.tags):
            return False
        if self._instance.get_runs_count(RunsFilter(statuses=[DagsterRunStatus.QUEUED])):
            return False
        most = config.max_concurrent_runs
        if most == -1:
            return True
        return self._instance.get_runs_count(RunsFilter(statuses=IN_PROGRESS_RUN_STATUSES)) < most


__all__ = [
    "DAEMON_PROGRAM",
    "SENSOR_LOOP_S",
    "PromptRunCoordinator",
    "in_daemon",
    "limited_keys",
    "tighten_sensor_loop",
]
