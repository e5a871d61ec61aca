"""A long-running run hands its work to the next run of its lane without a gap.

Capture runs (``capture_tick``, one lane per capture) and binlog puller runs
(``mysql_puller``, one lane per upstream and server id) each follow for a while (300 s,
600 s) and end; the next one used to be requested only once the last had ended: the
owner's sensor noticed, the run queue launched it, the run worker started it (a warm one
~1-2 s, a cold one 6-35 s under load), and only then did it tick or reconnect to the
binlog -- a lag spike in every changefeed of the lane, every few minutes.

Now the runs of a lane overlap by a few seconds, and only one of them works at a time:

- a run tags itself with the wall-clock time its follow loop ends (:data:`FOLLOW_UNTIL_TAG`);
- the owner's sensor requests the lane's next run once that time is less than
  :func:`handoff_s` away (:func:`lane_runs`: its ``handoff`` set);
- the next run's first op waits while an earlier run of its lane is in progress
  (:func:`wait_for_earlier_runs`): what a run-queue limit of one run per lane did, done by
  the run itself -- it waits already launched, imported and connected;
- the ending run goes on past its time until the next run has started (at most
  :data:`HANDOFF_MAX_S` more, :func:`successor_started`), then stops; the next run's wait
  ends at once and it takes over.

A run catching up on a backlog (a capture run whose tables are behind: ``changefeed resume``
after a pause, a snapshot's rows) puts that off: its loop's end moves :data:`EXTEND_STEP_S`
later each time the next run would be requested meanwhile, at most :data:`EXTEND_MAX_S` in
all (:class:`LoopEnd`), and a next run that started anyway waits until it caught up, at most
:data:`HANDOFF_MAX_S` past its time (``HandOver(hold=...)``). The next run's launch and first
tick, a new process's first sink commits and workers, fell in the backlog's drain otherwise
(8-13 s readable against 3-5 s: throughput bench).

So two runs of a lane never work at once (the next starts once the earlier is no longer in
progress, as the queue's limit had it), and the gap is the time from the last work of one
to the first of the next. (A ``dagster.yaml`` that still allows one run per lane keeps the
next run queued: the ending run goes on :data:`HANDOFF_MAX_S` longer, then the queue starts
the next, as before.)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import dagster as dg
from dagster._core.storage.dagster_run import IN_PROGRESS_RUN_STATUSES

# When the run's follow loop ends (wall clock, seconds since the epoch), set by the run.
FOLLOW_UNTIL_TAG = "cdc/follow_until"
# On a lane's next run, requested ahead of its need (it waits for the run it follows):
# the warm run launcher (services/run_launcher.py, its own copy of the name) gives it the
# newest warm worker, which may still be importing, and keeps the readiest for runs that
# are awaited (a new changefeed's puller and snapshot, a capture's first run).
AHEAD_TAG = "cdc/ahead"
HANDOFF_S = 20.0  # the next run is requested this long before the follow loop ends
HANDOFF_MAX_S = 60.0  # an ending run goes on at most this long past its time for the next
# A run catching up puts its end off by this much at a time (its successor not requested
# yet), at most EXTEND_MAX_S in all; EXTEND_LEAD_S before the sensor would request it.
EXTEND_STEP_S = 10.0
EXTEND_MAX_S = 120.0
EXTEND_LEAD_S = 3.0
# The next run waits at most this long for the earlier one to end (less than
# stale_runs.UNATTACHED_S: a capture run that never attaches is retired as hung after that).
WAIT_MAX_S = 240.0
WAIT_POLL_S = 0.1
# ... until this long before the earlier run's follow loop ends (its FOLLOW_UNTIL_TAG), a
# waiting run looks only every WAIT_SLOW_POLL_S: it is requested HANDOFF_S ahead and waited
# ~17 s, and two queries every 0.1 s took 0.1-0.2 of a core per waiting run (two captures'
# next runs, every CDC_DAGSTER_CAPTURE_LOOP_S: a backlog drained meanwhile had that much less
# CPU; throughput bench). A run that ends early is seen within WAIT_SLOW_POLL_S.
WAIT_FAST_BEFORE_S = 1.0
WAIT_SLOW_POLL_S = 1.0
NOT_STARTED = (dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED)
# A canceling run does not hold its lane: the lane's next run is requested (it waits for the
# canceling one in the run queue, or in its first op).
SENSOR_IN_PROGRESS = (dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED)


@dataclass(frozen=True, slots=True)
class Lane:
    """The runs of ``job`` tagged ``tag`` = ``value``: one works at a time.
    ``what`` names the lane in log lines ("capture capture-1")."""

    job: str
    tag: str
    value: str
    what: str


@dataclass
class LaneRuns:
    """The lanes (tag values) by their unfinished runs, as the owner's sensor sorts them."""

    # a run not started yet, or one in progress that is not ending: the lane is busy
    queued: set[str] = field(default_factory=set)
    following: set[str] = field(default_factory=set)  # a run started (takes its mailbox)
    # its one run in progress ends within handoff_s: request the next one now
    handoff: set[str] = field(default_factory=set)


def follow_until(run: dg.DagsterRun) -> float | None:
    """When the run's follow loop ends (None: not following yet, or not told)."""
    try:
        return float(run.tags[FOLLOW_UNTIL_TAG])
    except (KeyError, ValueError):
        return None


def handoff_s(follow_s: float) -> float:
    """How long before a run's follow loop ends its successor is requested: HANDOFF_S, or a
    quarter of a short loop."""
    return min(HANDOFF_S, follow_s / 4)


def lane_runs(
    instance: dg.DagsterInstance, job: str, tag: str, follow_s: float, now: float | None = None
) -> LaneRuns:
    """Sort the lanes (values of ``tag``) by their unfinished runs of ``job`` (one query).

    Without a follow loop (``follow_s`` 0: a run per tick) only a run not started yet holds
    its lane (no started run is asked for: none is ``following``). With one, a run in
    progress does too, unless it is the lane's only unfinished run and its follow loop ends
    within :func:`handoff_s`: then the lane is due its next run (``handoff``)."""
    now = time.time() if now is None else now
    follow = follow_s > 0
    statuses = [*NOT_STARTED, *(SENSOR_IN_PROGRESS if follow else ())]
    records = instance.get_run_records(dg.RunsFilter(job_name=job, statuses=statuses), limit=1000)
    runs: dict[str, list[dg.DagsterRun]] = {}
    for r in records:
        if value := r.dagster_run.tags.get(tag):
            runs.setdefault(value, []).append(r.dagster_run)
    out = LaneRuns()
    for value, mine in runs.items():
        if any(r.status == dg.DagsterRunStatus.STARTED for r in mine):
            out.following.add(value)
        until = follow_until(mine[0]) if len(mine) == 1 else None
        ending = (
            until is not None
            and mine[0].status == dg.DagsterRunStatus.STARTED
            and until - now < handoff_s(follow_s)
        )
        (out.handoff if ending else out.queued).add(value)
    return out


def storage_id(instance: dg.DagsterInstance, run_id: str) -> int | None:
    """The run's place in the run storage's order (None: not found); it never changes."""
    record = instance.get_run_record_by_id(run_id)
    return None if record is None else record.storage_id


def _others(
    instance: dg.DagsterInstance, lane: Lane, mine: int | None, statuses: list[Any]
) -> tuple[list[dg.DagsterRun], list[dg.DagsterRun]]:
    """The lane's other runs in ``statuses``: created before the run at storage id ``mine``,
    and after (none when it is not known)."""
    if mine is None:
        return [], []
    records = instance.get_run_records(
        dg.RunsFilter(job_name=lane.job, statuses=statuses, tags={lane.tag: lane.value}),
        limit=20,
    )
    before = [r.dagster_run for r in records if r.storage_id < mine]
    after = [r.dagster_run for r in records if r.storage_id > mine]
    return before, after


def wait_for_earlier_runs(
    instance: dg.DagsterInstance,
    lane: Lane,
    run_id: str,
    log: Callable[[str], None],
    max_s: float = WAIT_MAX_S,
) -> float:
    """Wait while an earlier run of the lane is in progress; seconds waited. Raises
    ``dg.Failure`` after ``max_s`` or when this run is marked canceling meanwhile."""
    started = time.monotonic()
    said = ""
    mine = storage_id(instance, run_id)  # read once: each poll is one query
    while True:
        earlier = _others(instance, lane, mine, list(IN_PROGRESS_RUN_STATUSES))[0]
        if not earlier:
            waited = time.monotonic() - started
            if said:
                log(f"{lane.what}: run {said} ended; taking over after {waited:.2f} s")
            return waited
        names = ", ".join(r.run_id for r in earlier)
        if not said:
            said = names
            log(
                f"{lane.what}: waiting for its earlier run {names} to end (it goes on until "
                "this run has started, then hands over)"
            )
        own = instance.get_run_by_id(run_id)
        if own is not None and own.status == dg.DagsterRunStatus.CANCELING:
            raise dg.Failure(f"{lane.what}: canceled while waiting for run {names}")
        if time.monotonic() - started > max_s:
            raise dg.Failure(
                f"{lane.what}: its earlier run {names} was still in progress after "
                f"{max_s:.0f} s; this run did nothing. The owner requests another run once "
                "that one ends (a hung run is failed by run monitoring or retired by the "
                "owner: cdc_dagster/defs/owner/stale_runs.py)",
                allow_retries=False,
            )
        time.sleep(_wait_poll_s(earlier))


def _wait_poll_s(earlier: Sequence[dg.DagsterRun], now: float | None = None) -> float:
    """How long a waiting run sleeps before it looks again: WAIT_POLL_S from
    WAIT_FAST_BEFORE_S before the last of the ``earlier`` runs' follow loops ends (or where
    one does not say when), WAIT_SLOW_POLL_S at most before."""
    ends = [follow_until(r) for r in earlier]
    if not ends or any(e is None for e in ends):
        return WAIT_POLL_S
    now = time.time() if now is None else now
    ahead = max(e for e in ends if e is not None) - WAIT_FAST_BEFORE_S - now
    return max(WAIT_POLL_S, min(WAIT_SLOW_POLL_S, ahead))


def successor_started(instance: dg.DagsterInstance, lane: Lane, mine: int | None) -> str:
    """The id of a run of the lane created after the run at storage id ``mine`` that has
    started (waiting for that one to end), or ""."""
    later = _others(instance, lane, mine, [dg.DagsterRunStatus.STARTED])[1]
    return later[0].run_id if later else ""


class LoopEnd:
    """When a follow loop of ``seconds`` begun at ``started`` (monotonic) ends: ``until``,
    put off by :data:`EXTEND_STEP_S` each time the run is behind (:meth:`put_off`) as the
    sensor is about to request its successor (:func:`handoff_s` + :data:`EXTEND_LEAD_S`
    before ``until``, not later: a successor requested is launched), at most
    :data:`EXTEND_MAX_S` in all."""

    def __init__(
        self,
        started: float,
        seconds: float,
        step_s: float | None = None,
        max_s: float | None = None,
        lead_s: float | None = None,
    ) -> None:
        self.until = self.planned = started + seconds
        self.handoff_s = handoff_s(seconds)
        self.step_s = EXTEND_STEP_S if step_s is None else step_s
        self.max_s = EXTEND_MAX_S if max_s is None else max_s
        self.lead_s = EXTEND_LEAD_S if lead_s is None else lead_s

    def put_off(self, now: float, behind: str) -> bool:
        """Move ``until`` later when ``behind`` (why the run is catching up, "" when it is
        not) in the window before its successor would be requested; whether it moved."""
        if not behind or not self.until - self.handoff_s - self.lead_s <= now:
            return False
        if now >= self.until - self.handoff_s:
            return False  # the sensor may have requested the next run: it is on its way
        step = min(self.step_s, self.planned + self.max_s - self.until)
        if step <= 0:
            return False
        self.until += step
        return True

    def wall(self, now: float | None = None) -> float:
        """``until`` in wall-clock seconds (:data:`FOLLOW_UNTIL_TAG`)."""
        return time.time() + self.until - (time.monotonic() if now is None else now)


class HandOver:
    """When an ending run stops: past its time (``until``, monotonic) it goes on until the
    lane's next run has started (looked up at most once per ``poll_s``) and ``hold()`` says
    nothing (why the run should not hand over yet: it is catching up), at most ``max_s``
    (:data:`HANDOFF_MAX_S`) more. Calling it says why it stops ("" while it goes on)."""

    TIME_UP = "time is up"

    def __init__(
        self,
        instance: dg.DagsterInstance,
        lane: Lane,
        run_id: str,
        until: float,
        poll_s: float,
        max_s: float = HANDOFF_MAX_S,
        hold: Callable[[], str] = lambda: "",
    ) -> None:
        self.instance, self.lane, self.until, self.poll_s = instance, lane, until, poll_s
        self.max_s, self.hold = max_s, hold
        self.mine = storage_id(instance, run_id)
        self.checked = 0.0
        self.successor = ""
        self.held = ""  # why it goes on with its successor started ("" when it does not)

    def __call__(self) -> str:
        now = time.monotonic()
        if now < self.until:
            return ""
        if now >= self.until + self.max_s:
            if self.successor:
                return (
                    f"{self.TIME_UP}; handed over to run {self.successor} "
                    f"({self.max_s:.0f} s past its time, still {self.held})"
                )
            return f"{self.TIME_UP} (no next run started within {self.max_s:.0f} s)"
        if not self.successor and now - self.checked >= self.poll_s:
            self.checked = now
            self.successor = successor_started(self.instance, self.lane, self.mine)
        if not self.successor:
            return ""
        self.held = self.hold()
        if self.held:
            return ""
        return f"{self.TIME_UP}; handed over to run {self.successor}"


__all__ = [
    "AHEAD_TAG",
    "EXTEND_LEAD_S",
    "EXTEND_MAX_S",
    "EXTEND_STEP_S",
    "FOLLOW_UNTIL_TAG",
    "HANDOFF_MAX_S",
    "HANDOFF_S",
    "HandOver",
    "Lane",
    "LaneRuns",
    "LoopEnd",
    "follow_until",
    "handoff_s",
    "lane_runs",
    "storage_id",
    "successor_started",
    "wait_for_earlier_runs",
]
