"""Bulk tick phases run in a background worker process at low priority."""

from __future__ import annotations

import os
import signal

import pytest

from cdc_dagster.pipeline import background


def _where(_: int) -> tuple[int, int]:
    return os.getpid(), os.getpriority(os.PRIO_PROCESS, 0)


def _loaded(_: int) -> tuple[int, bool]:
    import sys

    return os.getpid(), all(
        m in sys.modules for m in ("deltalake", "cdc_dagster.sinks.delta", "pandas")
    )


def _die(_: int) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.fixture(autouse=True)
def _fresh_worker() -> object:
    background.shutdown()
    yield
    background.shutdown()


def test_bulk_work_runs_in_another_process_at_background_priority_in_order() -> None:
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    got = background.run_in_background(_where, [1, 2, 3])
    pids = {pid for pid, _ in got}
    assert len(got) == 3 and len(pids) == 1 and os.getpid() not in pids
    assert all(nice == max(mine, background.BULK_NICE) for _, nice in got)
    assert background.run_in_background(abs, [-4, 5, -6]) == [4, 5, 6]  # order kept
    # the worker is kept for the next phases
    assert {pid for pid, _ in background.run_in_background(_where, [1])} == pids
    assert background.run_in_background(abs, []) == []


def test_a_worker_that_dies_fails_that_phase_and_the_next_starts_a_new_one() -> None:
    (first,) = background.run_in_background(_where, [1])
    with pytest.raises(RuntimeError, match="background worker running bulk tick phases died"):
        background.run_in_background(_die, [1])
    (again,) = background.run_in_background(_where, [1])
    assert again[0] != first[0]


def test_warm_starts_the_worker_with_the_phases_modules_before_the_first_bulk_phase() -> None:
    """A capture's follow loop warms the worker as it begins: its first bulk phase (a
    backlog after a resume) found none and paid the start and imports before its work."""
    background.warm()  # returns at once: the worker starts beside the caller
    (got,) = background.run_in_background(_loaded, [1])
    assert got[1], "the worker had not loaded the phases' modules"
    assert got[0] != os.getpid()
    # the same worker serves the phases after it
    assert background.run_in_background(_where, [1])[0][0] == got[0]
