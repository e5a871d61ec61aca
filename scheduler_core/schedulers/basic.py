"""Basic scheduler: add tables no capture holds, remove tables the changefeed no longer has."""

from __future__ import annotations

import logging

import numpy as np

from scheduler_core.errors import ConfigError
from scheduler_core.schedule_tasks import BurstAddTask, BurstTask, RemoveTableTask, Task
from scheduler_core.schedulers.base import ScheduleContext

log = logging.getLogger(__name__)


class BasicScheduler:
    """Adds missing tables in bounded bursts onto the least-loaded captures; removes extras."""

    name = "basic"

    def __init__(self, *, add_table_batch_size: int = 50) -> None:
        if add_table_batch_size < 1:
            raise ConfigError(f"add_table_batch_size must be >= 1, got {add_table_batch_size}")
        self.add_table_batch_size = add_table_batch_size

    def schedule(self, ctx: ScheduleContext) -> list[Task]:
        """A burst of adds for missing tables and a burst of removes for extra ones."""
        tasks: list[Task] = list(self._adds(ctx))
        removes = self._removes(ctx)
        if removes:
            tasks.append(BurstTask(tuple(removes)))
        return tasks

    def _missing(self, ctx: ScheduleContext) -> np.ndarray:
        rm = ctx.replications
        missing = rm.untracked(ctx.current_tables)
        absent = np.intersect1d(rm.absent_tables(), ctx.current_tables, assume_unique=True)
        if len(rm.running_tasks):
            running = np.fromiter(rm.running_tasks, np.int64, len(rm.running_tasks))
            absent = np.setdiff1d(absent, running, assume_unique=True)
        return np.union1d(missing, absent)[: self.add_table_batch_size]

    def _adds(self, ctx: ScheduleContext) -> list[BurstAddTask]:
        missing = self._missing(ctx)
        if not len(missing):
            return []
        targets = ctx.schedulable()
        if not targets:
            log.warning("%d tables wait: no capture can take tables", len(missing))
            return []
        counts = ctx.replications.table_counts(targets)
        quota = fill_evenly(np.asarray([counts[c] for c in targets], np.int64), len(missing))
        capture_index = np.repeat(np.arange(len(targets), dtype=np.int64), quota)
        start = np.full(len(missing), ctx.checkpoint_ts, np.int64)
        if ctx.start_ts:
            for i, tid in enumerate(missing.tolist()):
                start[i] = ctx.start_ts.get(tid, ctx.checkpoint_ts)
        return [BurstAddTask(missing, tuple(targets), capture_index, start)]

    def _removes(self, ctx: ScheduleContext) -> list[RemoveTableTask]:
        rm = ctx.replications
        out = []
        for tid in rm.extra_tables(ctx.current_tables).tolist():
            view = rm.view(tid)
            holder = view.primary or next(iter(view.captures), None)
            if holder is not None:
                out.append(RemoveTableTask(tid, holder))
        return out


def fill_evenly(counts: np.ndarray, k: int) -> np.ndarray:
    """How many of ``k`` new tables each capture gets so loads end as even as possible.

    Water filling: raise the lowest loads to a common level L, then hand the remainder
    one each to captures at L (earliest first). Vectorised: O(captures x log k).
    """
    lo, hi = int(counts.min()), int(counts.min()) + k
    while lo < hi:  # the highest level whose fill needs no more than k tables
        mid = (lo + hi + 1) // 2
        if int(np.maximum(mid - counts, 0).sum()) <= k:
            lo = mid
        else:
            hi = mid - 1
    quota = np.maximum(lo - counts, 0)
    rest = k - int(quota.sum())
    at_level = np.flatnonzero(counts + quota == lo)
    quota[at_level[:rest]] += 1
    return quota
