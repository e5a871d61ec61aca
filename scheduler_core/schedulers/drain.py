"""Drain-capture scheduler: move every table off one capture (scale-in)."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from scheduler_core.errors import ConfigError
from scheduler_core.schedule_tasks import MoveTableTask, Task
from scheduler_core.schedulers.base import ScheduleContext, least_loaded

log = logging.getLogger(__name__)


class DrainCaptureScheduler:
    """Moves tables off a target capture, a bounded batch per tick, until it holds none."""

    name = "drain-capture"

    def __init__(self, *, batch_size: int = 10) -> None:
        self.batch_size = batch_size
        self.target: str | None = None
        # Drains that finished, kept until the capture leaves: it takes no table meanwhile.
        self.drained: set[str] = set()

    def drain(self, capture_id: str, ctx_captures: list[str]) -> None:
        """Start draining ``capture_id``; refuses an unknown or the last capture."""
        if capture_id not in ctx_captures:
            raise ConfigError(f"cannot drain {capture_id!r}: not an alive capture {ctx_captures}")
        others = [c for c in ctx_captures if c != capture_id]
        if not others:
            raise ConfigError(f"cannot drain {capture_id!r}: it is the last capture; add one first")
        if self.target is not None and self.target != capture_id:
            raise ConfigError(f"already draining {self.target!r}; wait for it to finish")
        self.target = capture_id
        self.drained.discard(capture_id)

    def forget_gone(self, captures: Iterable[str]) -> None:
        """Drained captures no longer among ``captures`` (removed): forgotten."""
        self.drained &= set(captures)

    def remaining(self, ctx: ScheduleContext) -> int:
        """Tables the drained capture still holds (0 when done or idle)."""
        if self.target is None:
            return 0
        return ctx.replications.table_counts([self.target])[self.target]

    def schedule(self, ctx: ScheduleContext) -> list[Task]:
        """Moves for up to ``batch_size`` of the target's replicating tables."""
        target = self.target
        if target is None:
            return []
        if target not in ctx.captures:
            log.info("drain of %s ends: the capture is gone", target)
            self.target = None
            return []
        dests = [c for c in ctx.schedulable() if c != target]
        if not dests:
            log.warning("drain of %s waits: no other capture can take tables", target)
            return []
        movable = ctx.replications.replicating_on(target)[: self.batch_size].tolist()
        if not movable and self.remaining(ctx) == 0:
            log.info("drain of %s done; it takes no table until it is removed", target)
            self.drained.add(target)
            self.target = None
            return []
        counts = ctx.replications.table_counts(dests)
        tasks: list[Task] = []
        for tid in movable:
            dest = least_loaded(counts)
            counts[dest] += 1
            tasks.append(MoveTableTask(tid, dest))
        return tasks
