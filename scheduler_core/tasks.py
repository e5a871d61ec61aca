"""Schedule tasks: what a scheduler asks the ReplicationManager to do."""

from __future__ import annotations

from dataclasses import dataclass

from scheduler_core.errors import InvalidMessageError


def _check(table_id: int, capture_id: str) -> None:
    if type(table_id) is not int or table_id < 0:
        raise InvalidMessageError(f"table_id must be an int >= 0, got {table_id!r}")
    if not isinstance(capture_id, str) or not capture_id:
        raise InvalidMessageError(f"capture_id must be a non-empty str, got {capture_id!r}")


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


@dataclass(frozen=True, slots=True)
class BurstTask:
    """A batch from the basic scheduler: bypasses the concurrency cap (bounded by its own size)."""

    tasks: tuple[ScheduleTask, ...]


Task = ScheduleTask | BurstTask
