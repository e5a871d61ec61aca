"""A capture run catching up on a backlog is not handed over midway (defs/handoff.py): it puts
its end off while its successor is not requested yet (``LoopEnd``), and a successor that
started anyway waits until it caught up (``HandOver(hold=...)``), each within its bound.
Which changefeed is catching up: ``behind`` (defs/capture/job.py)."""

from __future__ import annotations

import time

import pytest

from cdc_dagster.defs import handoff
from cdc_dagster.defs.capture.job import BEHIND_S, behind
from cdc_dagster.defs.handoff import (
    EXTEND_LEAD_S,
    EXTEND_MAX_S,
    EXTEND_STEP_S,
    HandOver,
    Lane,
    LoopEnd,
)
from cdc_dagster.runtime import TableProgress
from scheduler_core.ts import compose

NOW_MS = 1_800_000_000_000
LOOP_S = 300.0


def _table(state: str, lag_s: float | None, left: bool, table_id: int = 1) -> TableProgress:
    """A table whose checkpoint is ``lag_s`` old at NOW_MS (None: no checkpoint yet) and that
    has rows resolved past it when ``left``."""
    checkpoint = 0 if lag_s is None else compose(NOW_MS - int(lag_s * 1000))
    resolved = compose(NOW_MS - 500) if left or lag_s is None else checkpoint
    return TableProgress("cf", table_id, state, "capture-1", checkpoint, resolved, resolved,
                         name=f"db.t{table_id}")  # fmt: skip


def test_a_table_behind_with_rows_left_to_sink_is_why_the_run_catches_up() -> None:
    draining = [_table("replicating", 2, True), _table("replicating", 47, True, table_id=2)]
    assert behind("cf", draining, NOW_MS) == "db.t2 of cf 47 s behind"
    waiting = [_table("preparing", None, True, table_id=3)]
    assert behind("cf", waiting, NOW_MS) == "db.t3 of cf preparing, not replicating yet"
    resumed = [_table("prepared", 60, False)]  # added back after a pause: the backlog waits
    assert behind("cf", resumed, NOW_MS) == "db.t1 of cf 60 s behind"


def test_a_table_that_sank_all_the_change_log_holds_is_not_behind_however_old() -> None:
    keeping_up = [_table("replicating", BEHIND_S - 1, True)]
    assert behind("cf", keeping_up, NOW_MS) == ""
    # made-up timestamps years old, or an upstream whose clock is behind ours: nothing left
    sunk_all = [_table("replicating", 10**8, False), _table("stopping", 10**8, True, 2)]
    assert behind("cf", sunk_all, NOW_MS) == ""
    assert behind("cf", [], NOW_MS) == ""


def test_the_end_is_put_off_only_while_behind_before_the_successor_is_requested() -> None:
    start = 1000.0
    end = LoopEnd(start, LOOP_S)
    request_at = start + LOOP_S - handoff.handoff_s(LOOP_S)  # the sensor requests it then
    assert not end.put_off(request_at - EXTEND_LEAD_S - 1, "db.t1 of cf 47 s behind")  # early
    assert not end.put_off(request_at - 1, "")  # not behind
    assert end.until == start + LOOP_S
    assert end.put_off(request_at - 1, "db.t1 of cf 47 s behind")
    assert end.until == start + LOOP_S + EXTEND_STEP_S
    # once the sensor may have requested the successor it is on its way: no more
    late = LoopEnd(start, LOOP_S)
    assert not late.put_off(request_at + 0.1, "db.t1 of cf 47 s behind")
    assert late.until == start + LOOP_S


def test_the_end_is_put_off_at_most_extend_max_s_in_all() -> None:
    start = 0.0
    end = LoopEnd(start, LOOP_S)
    moves = 0
    now = start
    while now < start + LOOP_S + 2 * EXTEND_MAX_S:
        moves += end.put_off(now, "db.t1 of cf 47 s behind")
        now += 0.25  # the follow loop looks every POLL_S
    assert end.until == start + LOOP_S + EXTEND_MAX_S
    assert moves == int(EXTEND_MAX_S // EXTEND_STEP_S)
    # the wall-clock tag the sensor reads says the same end
    assert end.wall(now) == pytest.approx(time.time() + end.until - now, abs=0.05)


class _Lookups:
    """``successor_started`` and ``storage_id`` of defs/handoff.py, counted."""

    def __init__(self, successor: str) -> None:
        self.successor, self.calls = successor, 0

    def started(self, *_: object) -> str:
        self.calls += 1
        return self.successor


def _handover(monkeypatch: pytest.MonkeyPatch, until: float, hold: list[str]) -> HandOver:
    monkeypatch.setattr(handoff, "storage_id", lambda *_: 7)
    return HandOver(object(), Lane("capture_tick", "p", "capture-1", "capture capture-1"),  # type: ignore[arg-type]
                    "run-a", until, poll_s=0.0, max_s=60.0, hold=lambda: hold[0])  # fmt: skip


def test_a_started_successor_takes_over_only_once_the_run_caught_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lookups = _Lookups("run-b")
    monkeypatch.setattr(handoff, "successor_started", lookups.started)
    hold = ["db.t1 of cf 47 s behind"]
    over = _handover(monkeypatch, time.monotonic() - 1, hold)
    assert over() == "" and over.held == hold[0] and over.successor == "run-b"
    assert over() == ""
    assert lookups.calls == 1  # the successor is looked up once, not on every call
    hold[0] = ""
    assert over() == "time is up; handed over to run run-b"


def test_a_run_still_behind_hands_over_at_its_bound_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(handoff, "successor_started", _Lookups("run-b").started)
    hold = ["db.t1 of cf 47 s behind"]
    over = _handover(monkeypatch, time.monotonic() - 59.9, hold)
    assert over() == ""
    over.until -= 1  # past until + max_s
    assert over() == (
        "time is up; handed over to run run-b (60 s past its time, still db.t1 of cf 47 s behind)"
    )
    # with no successor at all, as before
    monkeypatch.setattr(handoff, "successor_started", _Lookups("").started)
    alone = _handover(monkeypatch, time.monotonic() - 61, hold)
    assert alone() == "time is up (no next run started within 60 s)"
    waiting = _handover(monkeypatch, time.monotonic() + 5, hold)
    assert waiting() == ""  # before its time it goes on, behind or not
