"""TableExecutor: what the data plane offers the Agent (TiCDC's two-phase TableExecutor).

The Agent decides *what* happens to a table; the executor makes it happen on the data
plane (puller -> sorter -> mounter -> sink) and reports where each table is. A table on
one capture goes::

    ABSENT --prepare--> PREPARING --(pulled, sorted)--> PREPARED --commit--> REPLICATING
    PREPARING | PREPARED | REPLICATING --remove--> STOPPING --(flushed)--> STOPPED
    STOPPED --forget--> ABSENT

The contract, both ways (breaking it raises :class:`~scheduler_core.errors.ExecutorContractError`,
never a silent fix-up, so a bug fails a test instead of corrupting a downstream):

- ``prepare`` is only called for an ABSENT table; ``commit`` only for a PREPARED one;
  ``forget`` only for a STOPPED (or ABSENT) one. ``remove`` may be called in any state and
  is idempotent.
- ``commit`` must refuse to start sinking when the data it must see is not readable:

  (a) the table was prepared from a TS greater than ``checkpoint.checkpoint_ts`` (the
      changes in between were never pulled: sinking would skip them), or
  (b) the downstream's committed checkpoint for the table is below
      ``checkpoint.checkpoint_ts`` (the previous primary's writes are not visible yet:
      the configuration change would not happen "in one barrier").

- ``commit`` takes the table's sink fencing token, so a previous primary (a zombie that
  lost its lease) has its later writes refused by the downstream. A refused write stops
  the table: it goes STOPPED with the last accepted checkpoint.
- Sinks never pass the last barrier given to ``set_barrier``: a table's checkpoint is
  ``<= barrier.barrier_ts(table_id)`` unless it started above it.
- Reported checkpoints never go back, and ``checkpoint_ts <= resolved_ts`` always.
- A STOPPED table keeps its final checkpoint until ``forget``; the Agent forgets it once
  it has reported it, so the next report says ABSENT (TiCDC drops it the same way).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from scheduler_core.messages import Barrier, TableStatusBatch
from scheduler_core.model import Checkpoint, TableStatus


@runtime_checkable
class TableExecutor(Protocol):
    """The data plane of one capture, as the Agent drives it (see the module docstring)."""

    def prepare(self, table_id: int, checkpoint: Checkpoint) -> None:
        """Phase 1: start pulling and sorting from ``checkpoint.checkpoint_ts``; do not sink."""
        ...

    def commit(self, table_id: int, checkpoint: Checkpoint) -> None:
        """Phase 2: take the fencing token and sink from ``checkpoint.checkpoint_ts``.

        Raises ExecutorContractError if the data it must see is not readable (cases a, b).
        """
        ...

    def remove(self, table_id: int) -> None:
        """Begin stopping the table: STOPPING, then STOPPED with its final checkpoint."""
        ...

    def status(self, table_id: int) -> TableStatus:
        """The table's status; ABSENT (checkpoint 0) for a table this executor does not hold."""
        ...

    def statuses(self) -> TableStatusBatch:
        """The status of every held table (any state but ABSENT), in columns."""
        ...

    def forget(self, table_id: int) -> None:
        """Drop a STOPPED table, so it reads ABSENT from now on."""
        ...

    def set_barrier(self, barrier: Barrier) -> None:
        """The TSs sinks must not pass from now on."""
        ...

    def advance(self) -> None:
        """One processor tick of data progress (a no-op for executors that progress on their own)."""
        ...
