"""A run waiting for its lane's earlier run looks slowly until that run's follow loop is
about to end, then every WAIT_POLL_S (defs/handoff.py ``wait_for_earlier_runs``)."""

from __future__ import annotations

from typing import Any

import dagster as dg
import pytest

from cdc_dagster.defs import handoff
from cdc_dagster.defs.handoff import (
    FOLLOW_UNTIL_TAG,
    WAIT_FAST_BEFORE_S,
    WAIT_POLL_S,
    WAIT_SLOW_POLL_S,
    Lane,
    _wait_poll_s,
    wait_for_earlier_runs,
)

NOW = 1_800_000_000.0
LANE = Lane("capture_tick", "cdc/capture", "capture-1", "capture capture-1")


def _run(until: float | None) -> dg.DagsterRun:
    tags = {} if until is None else {FOLLOW_UNTIL_TAG: f"{until:.3f}"}
    return dg.DagsterRun(job_name="capture_tick", run_id=f"r{until}", tags=tags)


def test_it_looks_slowly_until_the_earlier_loop_is_about_to_end() -> None:
    assert _wait_poll_s([_run(NOW + 17)], NOW) == WAIT_SLOW_POLL_S
    assert _wait_poll_s([_run(NOW + WAIT_FAST_BEFORE_S + 0.4)], NOW) == pytest.approx(0.4)
    assert _wait_poll_s([_run(NOW + WAIT_FAST_BEFORE_S)], NOW) == WAIT_POLL_S
    assert _wait_poll_s([_run(NOW - 5)], NOW) == WAIT_POLL_S  # past its end (catching up)
    assert _wait_poll_s([_run(NOW + 2), _run(NOW + 30)], NOW) == WAIT_SLOW_POLL_S  # the last


def test_an_earlier_run_that_does_not_say_when_it_ends_is_looked_at_often() -> None:
    assert _wait_poll_s([_run(None)], NOW) == WAIT_POLL_S
    assert _wait_poll_s([_run(NOW + 30), _run(None)], NOW) == WAIT_POLL_S
    assert _wait_poll_s([], NOW) == WAIT_POLL_S


def test_the_wait_sleeps_by_it_and_ends_when_the_earlier_run_ended(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [NOW]
    slept: list[float] = []
    earlier = _run(NOW + 4)  # its loop ends in 4 s, and the run right after

    def others(*_: Any) -> tuple[list[dg.DagsterRun], list[dg.DagsterRun]]:
        return ([earlier] if clock[0] < NOW + 4.2 else []), []

    def sleep(s: float) -> None:
        slept.append(round(s, 3))
        clock[0] += s

    monkeypatch.setattr(handoff, "_others", others)
    monkeypatch.setattr(handoff, "storage_id", lambda *_: 7)
    monkeypatch.setattr(handoff.time, "time", lambda: clock[0])
    monkeypatch.setattr(handoff.time, "sleep", sleep)
    instance = type("I", (), {"get_run_by_id": lambda self, _: None})()
    said: list[str] = []
    wait_for_earlier_runs(instance, LANE, "mine", said.append)
    assert slept[:3] == [WAIT_SLOW_POLL_S] * 3  # 4 s ahead: once a second
    assert set(slept[4:]) == {WAIT_POLL_S}  # from 1 s before its end: every WAIT_POLL_S
    assert len(slept) < 20  # not 42 looks every 0.1 s
    assert "waiting for its earlier run" in said[0] and "ended; taking over" in said[-1]
