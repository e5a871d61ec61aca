"""The records every module shares: checkpoints, table states, table statuses, roles."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from scheduler_core.errors import InvalidMessageError
from scheduler_core.ts import MAX_TS


def check_ts(name: str, value: int) -> None:
    """Refuse ``value`` unless it is an int TS in [0, 2^63)."""
    if type(value) is not int or not 0 <= value <= MAX_TS:
        raise InvalidMessageError(f"{name} must be an int TS in [0, 2^63), got {value!r}")


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A table's progress: everything <= checkpoint_ts is downstream; nothing < resolved_ts is still to come."""

    checkpoint_ts: int
    resolved_ts: int

    def __post_init__(self) -> None:
        check_ts("checkpoint_ts", self.checkpoint_ts)
        check_ts("resolved_ts", self.resolved_ts)
        if self.checkpoint_ts > self.resolved_ts:
            raise InvalidMessageError(
                f"checkpoint_ts {self.checkpoint_ts} > resolved_ts {self.resolved_ts}: "
                "a table cannot have sunk changes it has not resolved"
            )

    def advanced(self, other: Checkpoint) -> Checkpoint:
        """The component-wise max of two checkpoints: progress never goes back."""
        if other.checkpoint_ts <= self.checkpoint_ts and other.resolved_ts <= self.resolved_ts:
            return self
        if other.checkpoint_ts >= self.checkpoint_ts and other.resolved_ts >= self.resolved_ts:
            return other
        return Checkpoint(
            max(self.checkpoint_ts, other.checkpoint_ts), max(self.resolved_ts, other.resolved_ts)
        )

    @staticmethod
    def at(ts: int) -> Checkpoint:
        """A checkpoint with both watermarks at ``ts``."""
        return Checkpoint(ts, ts)


class TableState(enum.IntEnum):
    """Processor-side state of one table on one capture."""

    ABSENT = 0  # the capture does not hold the table
    PREPARING = 1  # phase 1 running: pulling and sorting, not sinking
    PREPARED = 2  # phase 1 done: data buffered, ready to sink on command
    REPLICATING = 3  # sinking to the downstream
    STOPPING = 4  # asked to stop; may still be flushing
    STOPPED = 5  # stopped; its checkpoint is final


class ReplicationSetState(enum.IntEnum):
    """Owner-side state of one table's replication set."""

    ABSENT = 0  # no capture holds the table
    PREPARE = 1  # a secondary is preparing (add, or the first half of a move)
    COMMIT = 2  # a secondary is prepared; the primary (if any) is being stopped, then the secondary promoted
    REPLICATING = 3  # exactly one primary sinks; no secondary
    REMOVING = 4  # the table is being dropped from every capture


class Role(enum.IntEnum):
    """The role a capture plays in a replication set."""

    PRIMARY = 0  # sinks the table (at most one)
    SECONDARY = 1  # prepares the table, does not sink
    UNDETERMINED = 2  # reported Stopping after an owner switch: may still be writing


@dataclass(frozen=True, slots=True)
class TableStatus:
    """One capture's report about one table."""

    table_id: int
    state: TableState
    checkpoint: Checkpoint

    def __post_init__(self) -> None:
        if type(self.table_id) is not int or self.table_id < 0:
            raise InvalidMessageError(f"table_id must be an int >= 0, got {self.table_id!r}")
        if not isinstance(self.state, TableState):
            raise InvalidMessageError(f"state must be a TableState, got {self.state!r}")
        if not isinstance(self.checkpoint, Checkpoint):
            raise InvalidMessageError(f"checkpoint must be a Checkpoint, got {self.checkpoint!r}")
