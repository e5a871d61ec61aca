"""What every scheduler sees and returns."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from scheduler_core.captures import CaptureStatus
from scheduler_core.replication_manager import ReplicationManager
from scheduler_core.schedule_tasks import Task


@dataclass(frozen=True, slots=True)
class ScheduleContext:
    """One tick's inputs to the schedulers."""

    checkpoint_ts: int  # where a table with no start ts of its own starts
    current_tables: np.ndarray  # sorted ids of the tables the changefeed should replicate
    start_ts: Mapping[int, int]  # tables that must start elsewhere (created at a barrier)
    captures: Mapping[str, CaptureStatus]
    replications: ReplicationManager
    now_ms: int | None = None  # the owner's clock (None: the caller keeps no time)
    draining: str | None = None  # the capture being drained: it receives no table
    # Captures whose drain finished: they receive no table until they leave (the user
    # drains to remove; a balance would otherwise hand the emptied capture tables again).
    drained: frozenset[str] = frozenset()

    def schedulable(self) -> list[str]:
        """Captures that may receive tables, sorted."""
        return sorted(
            cid
            for cid, st in self.captures.items()
            if st.schedulable and cid != self.draining and cid not in self.drained
        )


class Scheduler(Protocol):
    """A scheduling policy: returns tasks, or [] to let a lower-priority policy run."""

    name: str

    def schedule(self, ctx: ScheduleContext) -> list[Task]:
        """Tasks for this tick."""
        ...


def least_loaded(counts: dict[str, int]) -> str:
    """The capture with the fewest tables (ties by id)."""
    return min(counts, key=lambda c: (counts[c], c))
