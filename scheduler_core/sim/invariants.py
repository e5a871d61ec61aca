"""Small oracles the simulator runs after every step (CockroachDB cdctest style).

Each validator notes what it sees and raises :class:`InvariantViolation` with the step
and the evidence. They compose: the simulator runs all of them.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from scheduler_core.errors import SchedulerError
from scheduler_core.model import ReplicationSetState, Role, TableState

if TYPE_CHECKING:
    from scheduler_core.sim.simulator import Simulator


class InvariantViolation(SchedulerError, AssertionError):
    """A correctness property broke; the message names the property, step and evidence."""


class NoDoubleWrite:
    """At most one capture that may still write (not crashed, not a fenced zombie) sinks a table.

    A capture sinks a table while it holds its fencing token: REPLICATING, or STOPPING and
    still flushing its last batches.
    """

    name = "no-double-write"

    def check(self, sim: Simulator) -> None:
        sinking: Counter[int] = Counter()
        for cap in sim.writers():
            for tid in cap.executor.sinking():
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


class DownstreamContent:
    """What the downstream holds is right: no key rewritten with an older version, no write
    to a dropped table (the fake downstream records each as it happens)."""

    name = "downstream-content"

    def check(self, sim: Simulator) -> None:
        if sim.downstream.violations:
            raise InvariantViolation(f"step {sim.now}: {sim.downstream.violations[0]}")


class ExactHandoff:
    """Where every final checkpoint reaches the owner (no loss, no crash, no reorder), a new
    primary starts exactly at the old one's final checkpoint: never below what is downstream."""

    name = "exact-handoff"

    def check(self, sim: Simulator) -> None:
        if sim.cfg.exact_handoff and sim.downstream.handoffs_below_committed:
            tid, holder, start, committed = sim.downstream.handoffs_below_committed[0]
            raise InvariantViolation(
                f"step {sim.now}: {holder} was told to start table {tid} at {start}, below its "
                f"downstream committed {committed}: a replay the sink had to skip"
            )


class DDLSafeCheckpoint:
    """The persisted checkpoint never passes a DDL that has not run (a new owner resumes
    from it and would never run that DDL)."""

    name = "ddl-safe-checkpoint"

    def check(self, sim: Simulator) -> None:
        cp = sim.persisted.checkpoint_ts
        for ev in sim.pending_ddls:
            if cp > ev.commit_ts:
                raise InvariantViolation(f"step {sim.now}: checkpoint {cp} passed pending {ev}")


class IdleCaptureGetsTables:
    """Liveness of scale-out: a capture that may take tables does not sit idle for long
    while another holds two or more (issue 17: a capture added under load held nothing).

    Counted in owner ticks while the same owner is up and the capture stays schedulable;
    any role counts (a move to it was dispatched). ``patience`` is generous enough for a
    lossy bus; the old balance (only once every table replicated) missed it under DDL load.
    """

    name = "idle-capture-gets-tables"

    def __init__(self, patience: int = 25) -> None:
        self.patience = patience
        self._owner: object = None
        self._idle_since: dict[str, int] = {}

    def check(self, sim: Simulator) -> None:
        owner = sim.owner
        if owner is not self._owner:
            self._owner, self._idle_since = owner, {}
        if owner is None or owner.error is not None:
            return
        schedulable = [c for c, st in owner.captures.captures.items() if st.schedulable]
        counts = owner.replications.table_counts(schedulable)
        if not schedulable or max(counts.values()) < 2:
            self._idle_since = {}
            return
        for cid in schedulable:
            if counts[cid]:
                self._idle_since.pop(cid, None)
                continue
            since = self._idle_since.setdefault(cid, sim.now)
            if sim.now - since > self.patience:
                raise InvariantViolation(
                    f"step {sim.now}: capture {cid} holds no table since step {since} while "
                    f"others hold {counts} (scale-out never balanced)"
                )
        for cid in list(self._idle_since):
            if cid not in schedulable:
                del self._idle_since[cid]


class Coverage:
    """Not a check: notes which table states, set states and roles the schedule reached."""

    name = "coverage"

    def __init__(self) -> None:
        self.table_states: set[TableState] = set()
        self.set_states: set[ReplicationSetState] = set()
        self.roles: set[Role] = set()

    def check(self, sim: Simulator) -> None:
        for cap in sim.captures.values():
            if not cap.crashed:
                self.table_states.update(TableState(int(s)) for s in cap.executor.statuses().states)
        owner = sim.owner
        if owner is None:
            return
        for rs in owner.replications.active().values():
            self.set_states.add(rs.state)
            self.roles.update(rs.captures.values())
        if len(owner.replications) > len(owner.replications.active()):
            self.set_states.add(ReplicationSetState.REPLICATING)  # steady rows
            self.roles.add(Role.PRIMARY)

    def merge(self, other: Coverage) -> None:
        """Add what another schedule reached."""
        self.table_states |= other.table_states
        self.set_states |= other.set_states
        self.roles |= other.roles

    def missing(self) -> list[str]:
        """What no schedule reached yet (ABSENT is what a capture reports for what it lacks)."""
        out = [
            f"table state {s.name}"
            for s in TableState
            if s not in self.table_states | {TableState.ABSENT}
        ]
        out += [f"set state {s.name}" for s in ReplicationSetState if s not in self.set_states]
        out += [f"role {r.name}" for r in Role if r not in self.roles]
        return out


def default_validators() -> list:
    """The validators every fault-injecting test runs (Coverage last: it only records)."""
    return [
        NoDoubleWrite(),
        NoLostTable(),
        Monotonic(),
        ReplicationSetShape(),
        DownstreamContent(),
        ExactHandoff(),
        DDLSafeCheckpoint(),
        IdleCaptureGetsTables(),
        Coverage(),
    ]
