"""A capture run hands its capture to the next run without a gap in ticks.

A capture run follows its mailbox for ``CDC_DAGSTER_CAPTURE_LOOP_S`` (300 s), then ends,
and the next one used to be requested only once it had ended: the sensor noticed, the run
queue launched it, the run worker started it, and its first tick ran -- 2-3 s on an idle
machine, 5-7 s under load, every 300 s, without a tick on that capture (a lag spike in
every changefeed it serves).

Now the runs overlap by a few seconds, and only one of them ticks at a time:

- the follow op tags its run with the wall-clock time its loop ends (:data:`FOLLOW_UNTIL_TAG`);
- the owner's sensor requests the capture's next run (no messages: they wait in the
  mailbox) once that time is less than :data:`HANDOFF_S` away (:func:`capture_runs`);
- the next run's first op (``receive``) waits while an earlier capture run of its capture is
  in progress (:func:`wait_for_earlier_runs`): what the run queue's limit of one run per
  capture did, done by the run itself -- it waits already launched, imported and connected;
- the ending run goes on ticking past its time until the next run has started (at most
  :data:`HANDOFF_MAX_S` more, :func:`successor_started`), then stops; the next run's wait
  ends at once and it takes the mailbox and ticks.

So a run never ticks beside another of its capture (the next one starts ticking after the
earlier one is no longer in progress, as the queue's limit had it), and the gap is the time
from the last tick of one to the first of the next: its ``receive`` and first tick.
(A ``dagster.yaml`` that still allows one run per capture keeps the next run queued: the
ending run ticks :data:`HANDOFF_MAX_S` longer, then the queue starts it, as before.)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import dagster as dg
from dagster._core.storage.dagster_run import IN_PROGRESS_RUN_STATUSES

from cdc_dagster.defs.owner.plan import CAPTURE_JOB

# When the run's follow loop ends (wall clock, seconds since the epoch), set by the run.
FOLLOW_UNTIL_TAG = "cdc/follow_until"
HANDOFF_S = 20.0  # the next run is requested this long before the follow loop ends
HANDOFF_MAX_S = 60.0  # an ending run ticks at most this long past its time for the next
# The next run waits at most this long for the earlier one to end (less than
# stale_runs.UNATTACHED_S: a run that never attaches is retired as hung after that).
WAIT_MAX_S = 240.0
WAIT_POLL_S = 0.1
NOT_STARTED = (dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED)
# A canceling run does not hold the owner's messages: the capture's next run is requested
# (it waits for the canceling one in the run queue, or in receive).
SENSOR_IN_PROGRESS = (dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED)


@dataclass
class CaptureRuns:
    """The capture runs not finished, per capture, as the owner's sensor sorts them."""

    # a run not started yet, or one in progress that is not ending: messages wait for it
    queued: set[str] = field(default_factory=set)
    following: set[str] = field(default_factory=set)  # a run started (takes its mailbox)
    # its one run in progress ends within HANDOFF_S: request the next one now
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


def capture_runs(
    instance: dg.DagsterInstance, follow_s: float, now: float | None = None
) -> CaptureRuns:
    """Sort the captures by their unfinished capture runs (one run-storage query).

    Without a follow loop (``follow_s`` 0: a run per tick) only a run not started yet holds
    messages (no started run is asked for: none is ``following``). With one, a run in
    progress does too (it takes them from its mailbox), unless it is the capture's only
    unfinished run and its follow loop ends within :func:`handoff_s`: then the capture is
    due its next run (``handoff``)."""
    now = time.time() if now is None else now
    follow = follow_s > 0
    statuses = [*NOT_STARTED, *(SENSOR_IN_PROGRESS if follow else ())]
    records = instance.get_run_records(
        dg.RunsFilter(job_name=CAPTURE_JOB, statuses=statuses), limit=1000
    )
    runs: dict[str, list[dg.DagsterRun]] = {}
    for r in records:
        if capture := r.dagster_run.tags.get("dagster/partition"):
            runs.setdefault(capture, []).append(r.dagster_run)
    out = CaptureRuns()
    for capture, mine in runs.items():
        if any(r.status == dg.DagsterRunStatus.STARTED for r in mine):
            out.following.add(capture)
        until = follow_until(mine[0]) if len(mine) == 1 else None
        ending = (
            until is not None
            and mine[0].status == dg.DagsterRunStatus.STARTED
            and until - now < handoff_s(follow_s)
        )
        (out.handoff if ending else out.queued).add(capture)
    return out


def storage_id(instance: dg.DagsterInstance, run_id: str) -> int | None:
    """The run's place in the run storage's order (None: not found); it never changes."""
    record = instance.get_run_record_by_id(run_id)
    return None if record is None else record.storage_id


def _others(
    instance: dg.DagsterInstance, capture_id: str, mine: int | None, statuses: list[Any]
) -> tuple[list[dg.DagsterRun], list[dg.DagsterRun]]:
    """The capture's other runs in ``statuses``: created before the run at storage id
    ``mine``, and after (none when it is not known)."""
    if mine is None:
        return [], []
    records = instance.get_run_records(
        dg.RunsFilter(
            job_name=CAPTURE_JOB, statuses=statuses, tags={"dagster/partition": capture_id}
        ),
        limit=20,
    )
    before = [r.dagster_run for r in records if r.storage_id < mine]
    after = [r.dagster_run for r in records if r.storage_id > mine]
    return before, after


def wait_for_earlier_runs(
    instance: dg.DagsterInstance,
    capture_id: str,
    run_id: str,
    log: Callable[[str], None],
    max_s: float = WAIT_MAX_S,
) -> float:
    """Wait while an earlier run of the capture is in progress; seconds waited. Raises
    ``dg.Failure`` after ``max_s`` or when this run is marked canceling meanwhile."""
    started = time.monotonic()
    said = ""
    mine = storage_id(instance, run_id)  # read once: each poll is one query
    while True:
        earlier = _others(instance, capture_id, mine, list(IN_PROGRESS_RUN_STATUSES))[0]
        if not earlier:
            waited = time.monotonic() - started
            if said:
                log(f"capture {capture_id}: run {said} ended; taking over after {waited:.2f} s")
            return waited
        names = ", ".join(r.run_id for r in earlier)
        if not said:
            said = names
            log(
                f"capture {capture_id}: waiting for its earlier run {names} to end (it ticks "
                "until this run has started, then hands over)"
            )
        own = instance.get_run_by_id(run_id)
        if own is not None and own.status == dg.DagsterRunStatus.CANCELING:
            raise dg.Failure(f"capture {capture_id}: canceled while waiting for run {names}")
        if time.monotonic() - started > max_s:
            raise dg.Failure(
                f"capture {capture_id}: its earlier run {names} was still in progress after "
                f"{max_s:.0f} s; this run did nothing. The owner requests another run once "
                "that one ends (a hung run is failed by run monitoring or retired by the "
                "owner: cdc_dagster/defs/owner/stale_runs.py)",
                allow_retries=False,
            )
        time.sleep(WAIT_POLL_S)


def successor_started(instance: dg.DagsterInstance, capture_id: str, mine: int | None) -> str:
    """The id of a capture run of ``capture_id`` created after the run at storage id ``mine``
    that has started (waiting for that one to end), or ""."""
    later = _others(instance, capture_id, mine, [dg.DagsterRunStatus.STARTED])[1]
    return later[0].run_id if later else ""


__all__ = [
    "FOLLOW_UNTIL_TAG",
    "HANDOFF_MAX_S",
    "HANDOFF_S",
    "CaptureRuns",
    "capture_runs",
    "follow_until",
    "handoff_s",
    "storage_id",
    "successor_started",
    "wait_for_earlier_runs",
]
