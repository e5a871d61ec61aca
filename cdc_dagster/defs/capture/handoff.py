"""A capture run hands its capture to the next run without a gap in ticks.

A capture run follows its mailbox for ``CDC_DAGSTER_CAPTURE_LOOP_S`` (300 s), then ends;
the runs of one capture are a lane of :mod:`cdc_dagster.defs.handoff` (runs of
``capture_tick`` tagged ``dagster/partition`` = the capture id): the owner requests the next
run shortly before the loop ends, the next run's first op (``receive``) waits while the
earlier one is in progress, and the ending run goes on ticking until the next one has
started. So a run never ticks beside another of its capture, and the gap is the time from
the last tick of one to the first of the next: its ``receive`` and first tick. A run whose
tables are behind (a backlog, a snapshot's rows) puts its end off and hands over once it
caught up (``LoopEnd``, ``HandOver(hold=...)``): not in the middle of a drain.
"""

from __future__ import annotations

import dagster as dg

from cdc_dagster.defs.handoff import (
    FOLLOW_UNTIL_TAG,
    HANDOFF_MAX_S,
    HANDOFF_S,
    HandOver,
    Lane,
    LaneRuns,
    LoopEnd,
    follow_until,
    handoff_s,
    lane_runs,
    wait_for_earlier_runs,
)
from cdc_dagster.defs.owner.plan import CAPTURE_JOB

PARTITION_TAG = "dagster/partition"
CaptureRuns = LaneRuns  # the captures by their unfinished capture runs


def capture_lane(capture_id: str) -> Lane:
    """The capture runs of ``capture_id``."""
    return Lane(CAPTURE_JOB, PARTITION_TAG, capture_id, f"capture {capture_id}")


def capture_runs(
    instance: dg.DagsterInstance, follow_s: float, now: float | None = None
) -> CaptureRuns:
    """Sort the captures by their unfinished capture runs (one run-storage query):
    ``queued`` hold the owner's messages, ``handoff`` are due their next run."""
    return lane_runs(instance, CAPTURE_JOB, PARTITION_TAG, follow_s, now)


__all__ = [
    "FOLLOW_UNTIL_TAG",
    "HANDOFF_MAX_S",
    "HANDOFF_S",
    "CaptureRuns",
    "HandOver",
    "LoopEnd",
    "capture_lane",
    "capture_runs",
    "follow_until",
    "handoff_s",
    "wait_for_earlier_runs",
]
