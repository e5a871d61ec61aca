"""The changefeed checkpoint: min over every current table, capped by the barriers.

Columns in, one :class:`Checkpoint` out, vectorised with numpy so a million tables cost
a few milliseconds. Why each rule holds (correctness property 2, "no lost table"):

- The changefeed checkpoint claims every change <= it is downstream for *every* table,
  so it is the min over the current tables, and a table that is missing or not
  REPLICATING (adding, moving, stopping) has no trustworthy checkpoint: it cannot advance.
- Each table's own checkpoint is already <= its barrier (its sink stops there), so the
  min over tables is <= the global barrier and <= every table barrier (the DDL manager
  only makes table barriers for current tables). Capping by them changes nothing while
  sinks obey, and keeps a sink that overshoots from carrying the changefeed past a DDL
  or syncpoint that has not run yet.
- The resolved ts is a fact about the upstream, not about sinking, so it is the min
  resolved over tables and is not capped by barriers; the checkpoint is capped by it.
- Neither ever goes back: the result is the component-wise max with ``previous``.
"""

from __future__ import annotations

import numpy as np

from scheduler_core.errors import InvalidMessageError
from scheduler_core.messages import Barrier
from scheduler_core.model import Checkpoint, TableState
from scheduler_core.ts import MAX_TS

_COLUMNS = ("table_ids", "states", "checkpoint_ts", "resolved_ts")


def _column(name: str, values: np.ndarray) -> np.ndarray:
    arr = np.asarray(values, dtype=np.int64)  # no copy when already int64
    if arr.ndim != 1:
        raise InvalidMessageError(f"{name} must be one-dimensional, got shape {arr.shape}")
    return arr


def _check_args(
    columns: list[np.ndarray], barrier: Barrier, current_table_count: int, previous: Checkpoint
) -> None:
    n = len(columns[0])
    if any(len(col) != n for col in columns):
        lengths = {name: len(col) for name, col in zip(_COLUMNS, columns, strict=True)}
        raise InvalidMessageError(f"checkpoint columns must have the same length, got {lengths}")
    if type(current_table_count) is not int or current_table_count < 0:
        raise InvalidMessageError(
            f"current_table_count must be an int >= 0, got {current_table_count!r}"
        )
    if n > current_table_count:
        raise InvalidMessageError(
            f"{n} table rows for {current_table_count} current tables: pass one row per "
            "current table, and no rows for tables outside the changefeed"
        )
    if not isinstance(barrier, Barrier):
        raise InvalidMessageError(f"barrier must be a Barrier, got {barrier!r}")
    if not isinstance(previous, Checkpoint):
        raise InvalidMessageError(f"previous must be a Checkpoint, got {previous!r}")


def barrier_cap(barrier: Barrier) -> int:
    """The lowest TS any table may sink to under ``barrier``: min(global, every table barrier)."""
    return min(barrier.global_barrier_ts, min(barrier.table_barriers.values(), default=MAX_TS))


def advance_checkpoint(
    table_ids: np.ndarray,
    states: np.ndarray,
    checkpoint_ts: np.ndarray,
    resolved_ts: np.ndarray,
    barrier: Barrier,
    current_table_count: int,
    previous: Checkpoint,
) -> Checkpoint | None:
    """The changefeed's new checkpoint, or None when it cannot advance.

    One row per current table (int64 columns; ``states`` are :class:`TableState` values),
    ``current_table_count`` tables in the changefeed. Rows must be for distinct current
    tables (the caller's replication sets guarantee it; not re-checked, to stay O(n)
    without a sort). Fewer rows than current tables means a table is missing: None.
    """
    columns = [
        _column(name, col)
        for name, col in zip(_COLUMNS, (table_ids, states, checkpoint_ts, resolved_ts), strict=True)
    ]
    _check_args(columns, barrier, current_table_count, previous)
    _, states_col, checkpoint_col, resolved_col = columns
    if len(states_col) < current_table_count:
        return None  # a table with no row has no checkpoint at all
    cap = barrier_cap(barrier)
    if current_table_count == 0:
        # Nothing to wait for: an empty changefeed moves straight to its barrier, so the
        # create-table DDL (or syncpoint) there becomes ready. Unbounded: nothing to say.
        return None if cap == MAX_TS else previous.advanced(Checkpoint.at(cap))
    if not np.all(states_col == TableState.REPLICATING):
        return None
    resolved = int(resolved_col.min())
    checkpoint = min(int(checkpoint_col.min()), cap, resolved)
    return previous.advanced(Checkpoint(checkpoint, resolved))
