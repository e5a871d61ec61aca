"""Basic scheduler: add tables no capture holds, remove tables the changefeed no longer has."""

from __future__ import annotations

import heapq
import logging

import numpy as np

from scheduler_core.schedulers.base import ScheduleContext
from scheduler_core.tasks import AddTableTask, BurstTask, RemoveTableTask, Task

log = logging.getLogger(__name__)


class BasicScheduler:
    """Adds missing tables in bounded bursts onto the least-loaded captures; removes extras."""

    name = "basic"

    def __init__(self, *, add_table_batch_size: int = 50) -> None:
        if add_table_batch_size < 1:
            raise ValueError(f"add_table_batch_size must be >= 1, got {add_table_batch_size}")
        self.add_table_batch_size = add_table_batch_size

    def schedule(self, ctx: ScheduleContext) -> list[Task]:
        """A burst of adds for missing tables and a burst of removes for extra ones."""
        tasks: list[Task] = []
        adds = self._adds(ctx)
        if adds:
            tasks.append(BurstTask(tuple(adds)))
        removes = self._removes(ctx)
        if removes:
            tasks.append(BurstTask(tuple(removes)))
        return tasks

    def _missing(self, ctx: ScheduleContext) -> np.ndarray:
        rm = ctx.replications
        missing = np.setdiff1d(ctx.current_tables, rm.table_ids, assume_unique=True)
        absent = np.intersect1d(rm.absent_tables(), ctx.current_tables, assume_unique=True)
        if len(rm.running_tasks):
            running = np.fromiter(rm.running_tasks, np.int64, len(rm.running_tasks))
            absent = np.setdiff1d(absent, running, assume_unique=True)
        return np.union1d(missing, absent)[: self.add_table_batch_size]

    def _adds(self, ctx: ScheduleContext) -> list[AddTableTask]:
        missing = self._missing(ctx)
        if not len(missing):
            return []
        targets = ctx.schedulable()
        if not targets:
            log.warning("%d tables wait: no capture can take tables", len(missing))
            return []
        counts = ctx.replications.table_counts(targets)
        heap = [(counts[c], c) for c in targets]
        heapq.heapify(heap)
        adds = []
        for tid in missing.tolist():
            n, cid = heapq.heappop(heap)
            start = ctx.start_ts.get(tid, ctx.checkpoint_ts)
            adds.append(AddTableTask(tid, cid, start))
            heapq.heappush(heap, (n + 1, cid))
        return adds

    def _removes(self, ctx: ScheduleContext) -> list[RemoveTableTask]:
        rm = ctx.replications
        out = []
        for tid in rm.extra_tables(ctx.current_tables).tolist():
            view = rm.view(tid)
            holder = view.primary or next(iter(view.captures), None)
            if holder is not None:
                out.append(RemoveTableTask(tid, holder))
        return out
