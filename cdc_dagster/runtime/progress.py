"""One table's progress: the one record the runtime hands the control plane about a table.

The owner tick makes one per table from its replication sets (its view: state and primary)
and the rows applied its primary reports in its task status; a capture's commit half makes
one per table it holds (its view: what it wrote, the barrier it may not pass, rows applied). The Dagster side renders them (asset metadata, run logs, the
DDL gate) and never re-shapes or re-parses them.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler_core.ts import physical_ms

MISSING = "missing"  # the owner has no replication set for the table yet


@dataclass(frozen=True, slots=True)
class TableProgress:
    """Where one table of a changefeed is."""

    changefeed_id: str
    table_id: int
    state: str  # lower case: a replication-set state (owner) or a table state (capture)
    capture_id: str  # the capture holding it (the owner's view: its primary); "" none
    checkpoint_ts: int  # every change at or below it is in the downstream
    resolved_ts: int
    barrier_ts: int  # the sink may not pass it (DDL, syncpoint)
    # rows the sink wrote for it since this capture (the owner's view: its primary) took
    # it; a counter: a capture registered anew starts again from 0
    rows_applied: int = 0
    name: str = ""  # database.table, when known
    note: str = ""  # what the tick did to it, or its error

    def __post_init__(self) -> None:
        if self.state != self.state.lower():
            raise ValueError(f"table progress state {self.state!r} must be lower case")

    @property
    def replicating(self) -> bool:
        """The table is replicating (its checkpoint is the downstream's)."""
        return self.state == "replicating"

    def lag_s(self, now_ms: int) -> float:
        """Seconds from the checkpoint's wall time to ``now_ms`` (infinite with no checkpoint)."""
        if not self.checkpoint_ts:
            return float("inf")
        return max(0.0, (now_ms - physical_ms(self.checkpoint_ts)) / 1000.0)

    def line(self) -> str:
        """One run-log line."""
        note = f": {self.note}" if self.note else ""
        return (
            f"table {self.table_id} {self.state} checkpoint {self.checkpoint_ts} "
            f"resolved {self.resolved_ts} barrier {self.barrier_ts} "
            f"rows_applied {self.rows_applied}{note}"
        )
