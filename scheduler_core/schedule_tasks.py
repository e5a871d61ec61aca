"""Schedule tasks: what a scheduler asks the ReplicationManager to do."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scheduler_core.errors import InvalidMessageError
from scheduler_core.messages import check_id, check_table_id


def _check(table_id: int, capture_id: str) -> None:
    check_table_id(table_id)
    check_id("capture_id", capture_id)


@dataclass(frozen=True, slots=True)
class AddTableTask:
    """Add a table that no capture holds to ``capture_id``, starting at ``checkpoint_ts``."""

    table_id: int
    capture_id: str
    checkpoint_ts: int

    def __post_init__(self) -> None:
        _check(self.table_id, self.capture_id)


@dataclass(frozen=True, slots=True)
class RemoveTableTask:
    """Remove a table from the changefeed (it was dropped or filtered out)."""

    table_id: int
    capture_id: str

    def __post_init__(self) -> None:
        _check(self.table_id, self.capture_id)


@dataclass(frozen=True, slots=True)
class MoveTableTask:
    """Move a replicating table to ``dest_capture_id`` (two-phase)."""

    table_id: int
    dest_capture_id: str

    def __post_init__(self) -> None:
        _check(self.table_id, self.dest_capture_id)


ScheduleTask = AddTableTask | RemoveTableTask | MoveTableTask


@dataclass(frozen=True, slots=True, eq=False)
class BurstAddTask:
    """The basic scheduler's adds in columns: table ``table_ids[i]`` goes to
    ``captures[capture_index[i]]`` starting at ``checkpoint_ts[i]``."""

    table_ids: np.ndarray
    captures: tuple[str, ...]
    capture_index: np.ndarray
    checkpoint_ts: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.table_ids)
        if len(self.capture_index) != n or len(self.checkpoint_ts) != n:
            raise InvalidMessageError("BurstAddTask columns must all have the same length")
        if n and (self.capture_index.min() < 0 or self.capture_index.max() >= len(self.captures)):
            raise InvalidMessageError("BurstAddTask.capture_index points outside captures")
        for cid in self.captures:
            _check(0, cid)

    def __len__(self) -> int:
        return len(self.table_ids)


@dataclass(frozen=True, slots=True)
class BurstTask:
    """A batch from the basic scheduler: bypasses the concurrency cap (bounded by its own size)."""

    tasks: tuple[ScheduleTask, ...]


Task = ScheduleTask | BurstTask | BurstAddTask
