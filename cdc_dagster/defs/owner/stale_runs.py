"""Capture runs of an expired registration: retired, so their capture gets a run again.

One run of a capture ticks at a time (the next waits for it in its first op, and a third in
the run queue: cdc_dagster/defs/capture/handoff.py), and a run that follows its mailbox is
in progress for minutes. A run whose capture's lease expired
(frozen, hung in a call, cut off from etcd) belongs to a dead epoch: the sink fences its
writes, but while it stays in progress no run of the re-registered capture can start, and
the capture's tables replicate nothing until its ``dagster/max_runtime`` (30 min). So when
the owner registers a capture again, its runs of the expired registration (each run tags
itself with the registration it attached to: :data:`REGISTRATION_TAG`) are marked
canceling: one that can still run stops by itself (its follow loop sees its run canceling,
or its capture registered again under another epoch) and one that does not within
:data:`FORCE_CANCEL_S` is marked canceled, as the UI's force termination does (the fence
keeps refusing whatever it still tries to write, and it stages in its own registration's
area).

The run launcher's ``terminate`` is not asked: Dagster's default launcher sets the run's
termination event (a ``multiprocessing.Event``) in the code server, and ``Event.set`` waits
for every process sleeping on it to wake; a frozen run (SIGSTOP, a stalled VM) never does,
and the code server hung with it (the owner's sensor, every run launch) until it thawed.
Under :class:`~cdc_dagster.services.run_launcher.WarmRunLauncher` (what ``server start``
and ``demo`` configure) a hung run's worker process is killed (SIGKILL works on a frozen
process too) when it is marked canceled, so it cannot come back at all.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

import dagster as dg

from cdc_dagster.defs.owner.plan import CAPTURE_JOB

log = logging.getLogger(__name__)

FORCE_CANCEL_S = 30.0  # a stale capture run still canceling after this long is hung
# A started run that has not attached to a registration after this long is hung before it
# (a run attaches in its first op, seconds after it starts).
UNATTACHED_S = 300.0
# The registration (lease epoch) a capture run attached to, set by the run itself.
REGISTRATION_TAG = "cdc/registration"


def is_stale(run: dg.DagsterRun, started_s: float | None, current: str, now_s: float) -> bool:
    """Whether a started capture run belongs to an expired registration: it attached to
    another one than ``current``, or it never attached for :data:`UNATTACHED_S`.

    A run that has not attached yet holds no registration, so it is not stale: it attaches
    to the current one. (Cancelling runs still starting, as before, under a loaded machine
    where launches take most of a lease, retired the very runs that would have renewed the
    new registration: each lease expired again, and so on.) A run marked canceling by
    mistake would be force-cancelled while it still ticks, beside its successor."""
    tag = run.tags.get(REGISTRATION_TAG)
    if tag:
        return tag != current
    return started_s is not None and now_s - started_s > UNATTACHED_S


def cancel_expired_runs(
    instance: dg.DagsterInstance, registered: Mapping[str, str], now_s: float | None = None
) -> list[str]:
    """Mark canceling the started capture runs of the captures in ``registered`` (registered
    again this tick, capture -> its new registration) that belong to the expired
    registration; one line per run for the log."""
    wanted = sorted(registered)
    if not wanted:
        return []
    now_s = time.time() if now_s is None else now_s
    records = instance.get_run_records(
        dg.RunsFilter(
            job_name=CAPTURE_JOB,
            statuses=[dg.DagsterRunStatus.STARTED],
            tags={"dagster/partition": wanted},
        ),
        limit=100,
    )
    lines = []
    for record in records:
        run = record.dagster_run
        capture = run.tags.get("dagster/partition", "?")
        if not is_stale(run, record.start_time, registered.get(capture, ""), now_s):
            continue
        now = instance.get_run_by_id(run.run_id)
        if now is not None and now.status == dg.DagsterRunStatus.STARTED:
            instance.report_run_canceling(
                now, message=f"capture {capture} was registered again: this run is stale"
            )
        lines.append(
            f"capture {capture}: its lease had expired; canceling its run {run.run_id} of "
            "the expired registration (it stops by itself, or is marked canceled if hung)"
        )
    return lines


def force_cancel_hung_runs(
    instance: dg.DagsterInstance, now_s: float | None = None, grace_s: float = FORCE_CANCEL_S
) -> list[str]:
    """Mark canceled the capture runs canceling for longer than ``grace_s`` (a frozen or hung
    process that did not stop by itself), freeing their capture's slot."""
    now_s = time.time() if now_s is None else now_s
    records = instance.get_run_records(
        dg.RunsFilter(job_name=CAPTURE_JOB, statuses=[dg.DagsterRunStatus.CANCELING]),
        limit=100,
    )
    lines = []
    for record in records:
        if now_s - record.update_timestamp.timestamp() < grace_s:
            continue
        run = record.dagster_run
        capture = run.tags.get("dagster/partition", "?")
        # WarmRunLauncher (cdc_dagster.services.run_launcher) can kill the run's worker
        kill_worker = getattr(instance.run_launcher, "kill_worker", None)
        warm = callable(kill_worker)
        instance.report_run_canceled(  # first: the worker's end then finds the run over
            run,
            message=(
                f"capture run of {capture} did not stop within {grace_s:.0f} s of its "
                f"termination: marked canceled{', its run worker killed' if warm else ''} "
                "(the sink's fence refuses any late write of it)"
            ),
        )
        killed = kill_worker(run) if kill_worker is not None else ""
        lines.append(
            f"capture {capture}: run {run.run_id} hung after termination; canceled"
            + (f", {killed}" if killed else "")
        )
    return lines
