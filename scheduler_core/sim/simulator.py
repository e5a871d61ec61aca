"""A fault-injecting simulator: an owner and N captures on a lossy bus.

Faults: message delay / drop / duplicate / reorder; capture crash and restart (new epoch);
a partitioned capture that keeps writing after its lease expired (a zombie, stopped by
the sink's fencing token); owner crash and re-election with a higher owner_rev; a zombie
owner that keeps sending; tables added and dropped at a barrier; DDLs on one or several
tables, dropping tables; syncpoints (sinks split their batches at them, the owner records
each once the checkpoint passed it, listing the tables that existed at its TS); sinks that
read the DDL stream themselves and go past an open barrier. After every step the
validators in :mod:`scheduler_core.sim.invariants` run, and each DDL and syncpoint is
checked against the downstream when it runs.

:data:`PROFILES` are the configurations the soak runs: the default timing, prepare and
stop taking several ticks (so Preparing / Stopping are reported and an owner switch finds
Undetermined captures), permanent capture loss, DDL-heavy schedules with multi-table DDLs
and dropped tables, and a lossless network where every hand-over must be exact.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import os
import random
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

from scheduler_core.agent import Agent
from scheduler_core.coordinator import Coordinator, CoordinatorConfig
from scheduler_core.ddl import DDLEvent, DDLKind, DDLManager
from scheduler_core.model import Checkpoint, ReplicationSetState
from scheduler_core.sim.bus import Bus, Faults
from scheduler_core.sim.fake_executor import FakeDownstream, FakeExecutor, FakeUpstream
from scheduler_core.sim.invariants import (
    Coverage,
    InvariantViolation,
    Monotonic,
    default_validators,
)
from scheduler_core.ts import compose

log = logging.getLogger(__name__)

START_MS = 1_000_000
TICK_MS = 10


@dataclass(slots=True)
class SimCapture:
    """One capture process as the simulator sees it."""

    capture_id: str
    agent: Agent
    executor: FakeExecutor
    registration: str
    crashed: bool = False
    partitioned: bool = False
    lost: bool = False  # crashed for good: never restarted
    renewed_at: int = 0


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Sizes and timings of a simulated cluster."""

    captures: int = 3
    tables: int = 8
    lease_ticks: int = 3  # a capture that has not renewed for this long is gone
    election_ticks: int = 2  # ticks between an owner crash and the next owner
    prepare_ticks: int = 1
    stop_ticks: int = 1
    exact_handoff: bool = False  # no loss or crash: a new primary must start at committed
    sync_point_interval_ms: int | None = None  # syncpoints every this many ms of commit ts
    reads_ddl_stream: bool = False  # sinks go past an open barrier to the stream's next DDL
    coordinator: CoordinatorConfig = field(
        default_factory=lambda: CoordinatorConfig(balance_interval_ms=10 * TICK_MS)
    )


class Simulator:
    """Drives Coordinator and Agents through ticks; fault methods change the world."""

    def __init__(self, seed: int, config: SimConfig | None = None, faults: Faults | None = None):
        self.cfg = config or SimConfig()
        self.rng = random.Random(seed)
        self.bus = Bus(random.Random(self.rng.getrandbits(32)), faults or Faults())
        self.now = 0
        start = compose(START_MS)
        self.upstream = FakeUpstream(start)
        self.downstream = FakeDownstream(start)
        self.persisted = Checkpoint.at(start)
        self.tables: set[int] = set(range(1, self.cfg.tables + 1))
        self._next_table = self.cfg.tables + 1
        self.start_ts: dict[int, int] = {}
        self.pending_changes: list[tuple[set[int], set[int], int]] = []
        self.pending_ddls: list[DDLEvent] = []  # what etcd would hold: DDLs not yet done
        self.ddls_done = 0
        self.last_syncpoint_ts = 0  # what etcd would hold: the last syncpoint recorded
        self.syncpoints: list[int] = []
        self._ids = itertools.count(1)
        self.captures: dict[str, SimCapture] = {}
        for i in range(self.cfg.captures):
            self._start_capture(f"capture-{i}")
        self.owner_rev = 0
        self.owner: Coordinator | None = None
        self.zombies: list[Coordinator] = []
        self.owner_down_until = 0
        self.validators = default_validators()
        self.quiesced_in = 0
        self._elect()

    # ------------------------------------------------------------------ world
    def _epoch(self) -> str:
        return f"e{next(self._ids)}"

    def _start_capture(self, cid: str) -> None:
        ex = FakeExecutor(
            cid,
            self.downstream,
            self.upstream,
            self.cfg.prepare_ticks,
            self.cfg.stop_ticks,
            sync_point_interval_ms=self.cfg.sync_point_interval_ms,
            reads_ddl_stream=self.cfg.reads_ddl_stream,
        )
        registration = f"r{next(self._ids)}"
        agent = Agent(cid, ex, self._epoch, registration)
        self.captures[cid] = SimCapture(cid, agent, ex, registration, renewed_at=self.now)

    def _elect(self) -> None:
        self.owner_rev += 1
        owner = Coordinator(
            owner_id=f"owner-{self.owner_rev}",
            owner_rev=self.owner_rev,
            changefeed_epoch=1,
            checkpoint=self.persisted,
            tables=sorted(self.tables),
            rng=random.Random(self.rng.getrandbits(32)),
            config=self.cfg.coordinator,
            # One below the checkpoint: a DDL exactly at it may not have run yet.
            ddl=DDLManager(
                self.persisted.checkpoint_ts - 1,
                ddl_resolved_ts=self.persisted.checkpoint_ts - 1,
                sync_point_interval_ms=self.cfg.sync_point_interval_ms,
                last_syncpoint_ts=self.last_syncpoint_ts,
            ),
        )
        for ev in self.pending_ddls:
            owner.add_ddl(ev)
        owner.start_ts.update(
            {t: ts for t, ts in self.start_ts.items() if ts > self.persisted.checkpoint_ts}
        )
        for add, remove, ts in self.pending_changes:
            owner.change_tables(add=add, remove=remove, barrier_ts=ts)
        self.owner = owner
        for v in self.validators:
            if isinstance(v, Monotonic):
                v.owner_changed()

    def alive(self) -> dict[str, str]:
        """The registry: captures whose lease has not expired."""
        return {
            c.capture_id: c.registration
            for c in self.captures.values()
            if not c.crashed and self.now - c.renewed_at <= self.cfg.lease_ticks
        }

    def writers(self) -> list[SimCapture]:
        """Captures that may still write without being fenced: running and holding a lease."""
        alive = self.alive()
        return [c for c in self.captures.values() if c.capture_id in alive]

    # ------------------------------------------------------------------ faults
    def crash_capture(self, cid: str, *, permanent: bool = False) -> None:
        """The process dies: no more writes, no more messages; its lease runs out.

        ``permanent``: the machine is gone; the capture never comes back (at least one
        capture always stays, or nothing could replicate).
        """
        cap = self.captures[cid]
        if permanent and sum(not c.lost for c in self.captures.values()) <= 1:
            permanent = False
        cap.crashed = True
        cap.lost = cap.lost or permanent
        self.bus.drop_for(cid)

    def add_capture(self) -> str:
        """Scale out: a capture with a new id joins (its lease registered, nothing held)."""
        cid = f"capture-{len(self.captures)}"
        self._start_capture(cid)
        return cid

    def restart_capture(self, cid: str) -> None:
        """A crashed or partitioned capture comes back as a new process (new epoch)."""
        cap = self.captures[cid]
        if cap.lost or not (cap.crashed or cap.partitioned):
            return
        self.bus.drop_for(cid)
        self._start_capture(cid)

    def partition_capture(self, cid: str) -> None:
        """Cut a capture off: it keeps writing (a zombie once its lease expires)."""
        self.captures[cid].partitioned = True

    def crash_owner(self, *, zombie: bool = False) -> None:
        """The owner dies (or, with ``zombie``, loses its lease but keeps sending)."""
        if self.owner is None:
            return
        if zombie:
            self.zombies.append(self.owner)
        self.owner = None
        self.owner_down_until = self.now + self.cfg.election_ticks

    def add_table(self) -> int:
        """A new table at a barrier ts (the upstream's resolved ts now)."""
        tid = self._next_table
        self._next_table += 1
        ts = self.upstream.resolved_ts(tid)
        self.downstream.create_table(tid, ts)
        self._change({tid}, set(), ts)
        return tid

    def drop_table(self, tid: int) -> None:
        """Remove a table from the changefeed at a barrier."""
        self._change(set(), {tid}, self.upstream.resolved_ts(tid))

    def alter_table(self, tid: int) -> DDLEvent:
        """A DDL on one table, committed just after everything resolved so far."""
        ts = self.upstream.resolved_ts(tid) + 1
        return self._ddl(DDLEvent(ts, DDLKind.ALTER_TABLE, f"ALTER TABLE t{tid}", table_ids=(tid,)))

    def create_table_ddl(self) -> DDLEvent:
        """CREATE TABLE: a global barrier; the table starts at the DDL's commit ts."""
        tid = self._next_table
        self._next_table += 1
        ts = self.upstream.resolved_ts(tid) + 1
        return self._ddl(DDLEvent(ts, DDLKind.CREATE_TABLE, f"CREATE TABLE t{tid}", creates=(tid,)))

    def ddl_tables(self) -> list[int]:
        """Tables a new DDL may touch: current, not on their way out."""
        going = {t for ev in self.pending_ddls for t in ev.drops}
        going |= {t for _, remove, _ in self.pending_changes for t in remove}
        return sorted(self.tables - going)

    def drop_tables_ddl(self, tids: list[int]) -> DDLEvent:
        """DROP TABLE of one or several tables: the dropped tables leave at its commit ts."""
        ts = self.upstream.resolved_ts(0) + 1
        names = ", ".join(f"t{t}" for t in tids)
        return self._ddl(
            DDLEvent(ts, DDLKind.DROP_TABLE, f"DROP TABLE {names}", table_ids=tuple(tids))
        )

    def multi_table_ddl(self, tids: list[int]) -> DDLEvent:
        """A DDL touching several tables (a global barrier)."""
        ts = self.upstream.resolved_ts(0) + 1
        names = ", ".join(f"t{t}" for t in tids)
        return self._ddl(
            DDLEvent(ts, DDLKind.MULTI_TABLE, f"ALTER TABLES {names}", table_ids=tuple(tids))
        )

    def _ddl(self, ev: DDLEvent) -> DDLEvent:
        if any((p.commit_ts, p.query) == (ev.commit_ts, ev.query) for p in self.pending_ddls):
            return ev  # the same DDL twice from the stream: the manager ignores it too
        self.pending_ddls.append(ev)
        self.upstream.add_ddl(ev.commit_ts)
        # Every owner process, zombies included, reads the same upstream DDL stream: a
        # zombie's DDL resolved ts only moves past DDLs it has also seen.
        for owner in [*self.zombies, self.owner]:
            if owner is not None:
                owner.add_ddl(ev)
        return ev

    def _execute_ddls(self, owner: Coordinator, ready: tuple[DDLEvent, ...]) -> None:
        for ev in ready:
            for tid in ev.touched:
                if tid in owner.current_tables and self.downstream.committed(tid) != ev.commit_ts:
                    raise InvariantViolation(
                        f"step {self.now}: order: DDL {ev} ran with table {tid} downstream "
                        f"at {self.downstream.committed(tid)}, not exactly its commit ts"
                    )
            for tid in ev.creates:
                self.downstream.create_table(tid, ev.commit_ts)
                self.start_ts[tid] = ev.commit_ts
            for tid in ev.drops:
                self.downstream.drop_table(tid, ev.commit_ts)
            owner.ddl_done(ev)
            self.pending_ddls.remove(ev)
            self.ddls_done += 1
            self.tables = (self.tables | set(ev.creates)) - set(ev.drops)

    def _change(self, add: set[int], remove: set[int], ts: int) -> None:
        self.pending_changes.append((add, remove, ts))
        if self.owner is not None:
            self.owner.change_tables(add=add, remove=remove, barrier_ts=ts)

    # ------------------------------------------------------------------ the step
    def step(self) -> None:
        """One tick of the world, then every validator."""
        self.now += 1
        self.upstream.advance(compose(START_MS + self.now * TICK_MS))
        for cap in list(self.captures.values()):
            self._capture_tick(cap)
        if self.owner is None and self.now >= self.owner_down_until:
            self._elect()
        for owner in [*self.zombies, self.owner]:
            if owner is not None:
                self._owner_tick(owner)
        for v in self.validators:
            v.check(self)

    def _capture_tick(self, cap: SimCapture) -> None:
        if cap.crashed:
            return
        if not cap.partitioned:
            # Renewing its lease, the capture also reads the elected owner's rev from etcd.
            cap.agent.observe_owner_rev(self.owner_rev)
            cap.agent.handle(self.bus.deliver(self.now, cap.capture_id))
            cap.renewed_at = self.now
        out = cap.agent.tick()  # drives the executor's data progress too
        if not cap.partitioned:
            for m in out:
                self.bus.send(self.now, m)

    def _owner_tick(self, owner: Coordinator) -> None:
        inbox = self.bus.deliver(self.now, owner.owner_id)
        # The simulator is the DDL puller: every DDL up to now has been queued.
        owner.advance_ddl_resolved(self.upstream.resolved_ts(0))
        result = owner.tick(self.alive(), inbox, now_ms=START_MS + self.now * TICK_MS)
        for m in result.messages:
            self.bus.send(self.now, m)
        if owner is self.owner:
            self.persisted = result.checkpoint
            self._execute_ddls(owner, result.ready_ddls)
            if result.syncpoint_ts is not None:
                self._record_syncpoint(owner, result.syncpoint_ts)
            self._note_applied_changes(owner)

    def _record_syncpoint(self, owner: Coordinator, ts: int) -> None:
        """Record the syncpoint: every table of the set has a downstream version exactly at
        ``ts`` (its sink split there), and none of them started after ``ts``."""
        for tid in owner.current_tables.tolist():
            started = self.start_ts.get(tid, 0)
            if started > ts:
                raise InvariantViolation(
                    f"step {self.now}: syncpoint {ts} lists table {tid}, which started at "
                    f"{started}, after it (the table set changed before the syncpoint's record)"
                )
            if not self.downstream.has_version_at(tid, ts):
                raise InvariantViolation(
                    f"step {self.now}: syncpoint {ts}: table {tid} has no downstream version at "
                    f"exactly {ts} (a batch spanned it); committed {self.downstream.committed(tid)}"
                )
        owner.syncpoint_done(ts)
        self.last_syncpoint_ts = ts
        self.syncpoints.append(ts)

    def _note_applied_changes(self, owner: Coordinator) -> None:
        current = set(owner.current_tables.tolist())
        for change in list(self.pending_changes):
            add, remove, ts = change
            if add <= current and not (remove & current):
                self.pending_changes.remove(change)
                self.tables = (self.tables | add) - remove
                self.start_ts.update(dict.fromkeys(add, ts))

    # ------------------------------------------------------------------ liveness
    def converged(self) -> bool:
        """Every current table replicates and the checkpoint is near the upstream."""
        owner = self.owner
        if owner is None or self.pending_changes or self.pending_ddls:
            return False
        rm = owner.replications
        for tid in owner.current_tables.tolist():
            if tid not in rm or rm.view(tid).state != ReplicationSetState.REPLICATING:
                return False
        lag_ms = (self.upstream.resolved_ts(0) - self.persisted.checkpoint_ts) >> 18
        return lag_ms <= 5 * TICK_MS

    def quiesce(self, max_ticks: int) -> int:
        """Stop all faults, bring every capture back; ticks until converged (raises if not)."""
        self.bus.faults = Faults()
        for cap in list(self.captures.values()):
            if cap.partitioned and cap.lost:
                cap.crashed = True  # a lost machine's zombie dies with it
            if cap.crashed or cap.partitioned:
                self.restart_capture(cap.capture_id)
        for n in range(1, max_ticks + 1):
            self.step()
            if self.converged():
                return n
        raise InvariantViolation(
            f"liveness: not converged {max_ticks} ticks after faults stopped: "
            f"checkpoint {self.persisted}, upstream {self.upstream.resolved_ts(0)}, "
            f"tables {self._table_states()}"
        )

    def _table_states(self) -> dict[int, str]:
        owner = self.owner
        if owner is None:
            return {}
        rm = owner.replications
        return {
            t: (rm.view(t).state.name if t in rm else "MISSING")
            for t in owner.current_tables.tolist()
        }


@dataclass(frozen=True, slots=True)
class Profile:
    """One soak configuration: cluster timing and which faults and workloads to draw."""

    config: SimConfig
    lossy: bool = True  # message drop / duplicate / delay, crashes, partitions, owner loss
    permanent_loss: float = 0.0  # of capture crashes, the share that never come back
    ddl_heavy: bool = False  # multi-table DDLs and DROP TABLE DDLs, more often
    moves: float = 0.01  # chance per step of a manual move
    owner_churn: float = 0.0  # extra chance per step of an owner crash
    quick_restarts: float = 0.0  # chance per step a capture process restarts at once
    max_delay: int = 3  # the largest message delay drawn, in ticks
    faults: Faults | None = None  # fixed network faults instead of drawn ones
    # Tables come and go by DDL only (CREATE / DROP in the stream): with sinks that read the
    # stream past an open barrier, a table-set change the owner decides alone could be at a
    # TS a sink already passed (Coordinator.change_tables).
    changes_by_ddl: bool = False
    scale_out: float = 0.0  # chance per step a capture is added (up to MAX_CAPTURES)


def _slow(prepare: int, stop: int, **kw) -> SimConfig:
    return SimConfig(prepare_ticks=prepare, stop_ticks=stop, **kw)


MAX_CAPTURES = 6  # scale-out adds captures up to this many (lost ones count)


def _scaling(**kw) -> SimConfig:
    # The periodic balance never comes in a schedule: a capture added gets tables only from
    # the round its join sets off, while DDLs create and drop tables and moves run.
    balance = CoordinatorConfig(balance_interval_ms=60_000)
    return _slow(2, 2, captures=2, tables=10, coordinator=balance, **kw)


PROFILES: dict[str, Profile] = {
    "default": Profile(SimConfig()),
    "slow_phases": Profile(_slow(3, 3)),
    "slow_stop_owner_churn": Profile(_slow(2, 8, captures=4), moves=0.05, owner_churn=0.04),
    "capture_loss": Profile(_slow(3, 3, captures=4), permanent_loss=0.5),
    "ddl_heavy": Profile(_slow(2, 2), ddl_heavy=True),
    "lossless_moves": Profile(_slow(3, 3, exact_handoff=True), lossy=False, moves=0.08),
    # A process restarts while its last reports are still on the wire: they carry the
    # previous capture epoch and must not count.
    "stale_reports": Profile(
        SimConfig(captures=2, tables=4),
        quick_restarts=0.1,
        moves=0.05,
        faults=Faults(drop=0.3, max_delay=10),
    ),
    "quick_restarts": Profile(
        SimConfig(), quick_restarts=0.06, moves=0.04, faults=Faults(drop=0.2, max_delay=8)
    ),
    # Syncpoints every 5 ticks, sinks past open barriers, tables created and dropped by DDL.
    "syncpoints": Profile(
        SimConfig(sync_point_interval_ms=5 * TICK_MS), ddl_heavy=True, moves=0.03
    ),
    # Captures join under a DDL-heavy load with moves, and some leave for good (scale in).
    "scale_out": Profile(
        _scaling(), ddl_heavy=True, moves=0.03, permanent_loss=0.5, scale_out=0.03
    ),
    "open_barriers": Profile(
        _slow(2, 2, reads_ddl_stream=True, sync_point_interval_ms=3 * TICK_MS),
        ddl_heavy=True,
        changes_by_ddl=True,
        owner_churn=0.02,
    ),
}


def run_schedule(
    seed: int, steps: int = 150, config: SimConfig | None = None, profile: str = "default"
) -> Simulator:
    """A random fault schedule for ``seed`` under ``profile``; liveness checked at the end.

    Returns the simulator (``sim.quiesced_in``: the ticks liveness took).
    """
    prof = PROFILES[profile]
    rng = random.Random(seed ^ 0x5EED)
    faults = Faults(
        drop=rng.choice([0.0, 0.05, 0.2]),
        duplicate=rng.choice([0.0, 0.05, 0.2]),
        max_delay=rng.choice([0, 1, prof.max_delay]),
    )
    if not prof.lossy:
        faults = Faults(duplicate=faults.duplicate)
    elif prof.faults is not None:
        faults = prof.faults
    sim = Simulator(seed, config or prof.config, faults)
    for _ in range(steps):
        _random_fault(sim, rng, prof)
        sim.step()
    sim.quiesced_in = sim.quiesce(max_ticks=200)
    return sim


def schedule_outcome(job: tuple[int, str]) -> tuple[int, Coverage]:
    """Run the schedule ``(seed, profile)``: the ticks liveness took and what it covered."""
    seed, profile = job
    sim = run_schedule(seed, profile=profile)
    return sim.quiesced_in, next(v for v in sim.validators if isinstance(v, Coverage))


def run_schedules(
    jobs: Iterable[tuple[int, str]], workers: int | None = None
) -> Iterator[tuple[int, Coverage]]:
    """:func:`schedule_outcome` of each job, in order, on one process per core.

    Schedules are independent and CPU-bound, so thousands of them take a core each; a
    violation in any of them is raised here, with its message. Workers are spawned (not
    forked): the caller may hold threads (gRPC, a JVM) that a fork would copy half-held.
    """
    jobs = list(jobs)
    workers = workers or min(os.cpu_count() or 1, 8)
    if workers == 1 or len(jobs) < 2 * workers:
        yield from map(schedule_outcome, jobs)
        return
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        yield from pool.map(schedule_outcome, jobs, chunksize=max(1, len(jobs) // (workers * 8)))


def _random_fault(sim: Simulator, rng: random.Random, prof: Profile) -> None:
    r = rng.random()
    cids = sorted(sim.captures)
    cid = rng.choice(cids)
    cap = sim.captures[cid]
    # (No draw when the profile does not scale: the other profiles keep their schedules.)
    if prof.scale_out and rng.random() < prof.scale_out and len(sim.captures) < MAX_CAPTURES:
        sim.add_capture()
        return
    if prof.ddl_heavy and rng.random() < 0.06:
        _random_ddl(sim, rng)
        return
    if rng.random() < prof.moves and sim.owner is not None and sim.tables:
        sim.owner.move_table(rng.choice(sorted(sim.tables)), rng.choice(cids))
        return
    if not prof.lossy and r < 0.07:
        return  # no crash, partition or owner loss
    if rng.random() < prof.quick_restarts and not cap.crashed:
        sim.crash_capture(cid)
        sim.restart_capture(cid)
        return
    if rng.random() < prof.owner_churn:
        sim.crash_owner(zombie=rng.random() < 0.3)
        return
    if r < 0.02:
        sim.crash_capture(cid, permanent=rng.random() < prof.permanent_loss)
    elif r < 0.05 and (cap.crashed or cap.partitioned):
        sim.restart_capture(cid)
    elif r < 0.06:
        sim.partition_capture(cid)
    elif r < 0.07:
        sim.crash_owner(zombie=rng.random() < 0.5)
    elif r < 0.09:
        sim.create_table_ddl() if prof.changes_by_ddl else sim.add_table()
    elif r < 0.10 and len(sim.ddl_tables()) > 1:
        # Never the last table not already on its way out (DROP DDLs pending count too).
        tid = rng.choice(sim.ddl_tables())
        sim.drop_tables_ddl([tid]) if prof.changes_by_ddl else sim.drop_table(tid)
    elif r < 0.105 and sim.ddl_tables():
        sim.alter_table(rng.choice(sim.ddl_tables()))
    elif r < 0.108:
        sim.create_table_ddl()
    elif r < 0.11 and sim.owner is not None:
        sim.owner.request_rebalance()
    elif r < 0.12 and sim.owner is not None and sim.tables:
        tid = rng.choice(sorted(sim.tables))
        sim.owner.move_table(tid, rng.choice(cids))


def _random_ddl(sim: Simulator, rng: random.Random) -> None:
    tables = sim.ddl_tables()
    r = rng.random()
    if r < 0.3 and len(tables) >= 2:
        sim.multi_table_ddl(rng.sample(tables, 2))
    elif r < 0.55 and len(tables) >= 3:
        sim.drop_tables_ddl(sorted(rng.sample(tables, rng.choice([1, 2]))))
    elif r < 0.8 and tables:
        sim.alter_table(rng.choice(tables))
    else:
        sim.create_table_ddl()


__all__ = ["PROFILES", "Profile", "SimCapture", "SimConfig", "Simulator", "run_schedule"]
