"""Small oracles the simulator runs after every step (CockroachDB cdctest style).

Each validator notes what it sees and raises :class:`InvariantViolation` with the step
and the evidence. They compose: the simulator runs all of them.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from scheduler_core.errors import SchedulerError
from scheduler_core.model import ReplicationSetState, TableState

if TYPE_CHECKING:
    from scheduler_core.sim.simulator import Simulator


class InvariantViolation(SchedulerError, AssertionError):
    """A correctness property broke; the message names the property, step and evidence."""


class NoDoubleWrite:
    """At most one capture that may still write (not crashed, not a fenced zombie) sinks a table."""

    name = "no-double-write"

    def check(self, sim: Simulator) -> None:
        sinking: Counter[int] = Counter()
        for cap in sim.writers():
            batch = cap.executor.statuses()
            for tid in batch.table_ids[batch.states == TableState.REPLICATING].tolist():
                sinking[tid] += 1
        doubled = {t: n for t, n in sinking.items() if n > 1}
        if doubled:
            raise InvariantViolation(f"step {sim.now}: tables sunk by several captures {doubled}")


class NoLostTable:
    """The changefeed checkpoint never passes a table's downstream progress or a non-replicating table."""

    name = "no-lost-table"

    def __init__(self) -> None:
        self._last = -1

    def check(self, sim: Simulator) -> None:
        owner = sim.owner
        if owner is None:
            return
        cp = sim.persisted.checkpoint_ts
        for tid in owner.current_tables.tolist():
            committed = sim.downstream.committed(tid)
            if cp > committed:
                raise InvariantViolation(
                    f"step {sim.now}: changefeed checkpoint {cp} passed table {tid}, "
                    f"whose downstream holds only up to {committed}"
                )
        if cp > self._last and self._last >= 0:
            rm = owner.replications
            for tid in owner.current_tables.tolist():
                if owner.start_ts.get(tid, -1) >= cp:
                    continue  # starts at or above the checkpoint (created at this barrier)
                view = rm.view(tid) if tid in rm else None
                if view is None or view.state != ReplicationSetState.REPLICATING:
                    raise InvariantViolation(
                        f"step {sim.now}: checkpoint advanced to {cp} while table {tid} is "
                        f"{'missing' if view is None else view.state.name}"
                    )
                if view.checkpoint.checkpoint_ts < cp:
                    raise InvariantViolation(
                        f"step {sim.now}: checkpoint {cp} > table {tid} checkpoint {view.checkpoint}"
                    )
        self._last = cp


class Monotonic:
    """Checkpoints and resolved ts never go back; checkpoint <= resolved."""

    name = "monotonic"

    def __init__(self) -> None:
        self._cf = (0, 0)
        self._tables: dict[int, tuple[int, int]] = {}

    def check(self, sim: Simulator) -> None:
        cp = sim.persisted
        if cp.checkpoint_ts > cp.resolved_ts:
            raise InvariantViolation(f"step {sim.now}: changefeed checkpoint > resolved: {cp}")
        now = (cp.checkpoint_ts, cp.resolved_ts)
        if now[0] < self._cf[0] or now[1] < self._cf[1]:
            raise InvariantViolation(f"step {sim.now}: changefeed went back {self._cf} -> {now}")
        self._cf = now
        owner = sim.owner
        if owner is None:
            return
        rm = owner.replications
        tracked = rm.table_ids.tolist()
        # A table the owner stopped tracking (removed, or forgotten and added again later)
        # starts a new replication set: monotonic holds per incarnation. Seed 5110: a
        # zombie owner's add was removed by its successor, then added at its barrier.
        for gone in self._tables.keys() - set(tracked):
            del self._tables[gone]
        for tid in tracked:
            c = rm.view(tid).checkpoint
            prev = self._tables.get(tid, (0, 0))
            if c.checkpoint_ts < prev[0] or c.resolved_ts < prev[1]:
                raise InvariantViolation(
                    f"step {sim.now}: table {tid} checkpoint went back {prev} -> {c}"
                )
            self._tables[tid] = (c.checkpoint_ts, c.resolved_ts)

    def owner_changed(self) -> None:
        """A new owner rebuilds from reports; per-table memory restarts with it."""
        self._tables.clear()


class ReplicationSetShape:
    """Every replication set is in a shape its state allows (beyond poll's own checks)."""

    name = "replication-set-shape"

    def check(self, sim: Simulator) -> None:
        owner = sim.owner
        if owner is None:
            return
        for tid, rs in owner.replications.active().items():
            if rs.checkpoint.checkpoint_ts > rs.checkpoint.resolved_ts:
                raise InvariantViolation(f"step {sim.now}: table {tid} checkpoint > resolved")
            if rs.state == ReplicationSetState.REPLICATING and rs.primary is None:
                raise InvariantViolation(f"step {sim.now}: table {tid} replicating, no primary")


def default_validators() -> list:
    """The validators every fault-injecting test runs."""
    return [NoDoubleWrite(), NoLostTable(), Monotonic(), ReplicationSetShape()]
