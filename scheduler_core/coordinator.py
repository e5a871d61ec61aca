"""Coordinator: the owner side of one changefeed's scheduling, one tick at a time.

``tick`` = receive (drop wrong owner_rev / addressee / changefeed epoch) -> update captures
-> feed the replication sets -> (only once every alive capture has reported) run the
schedulers, first that yields tasks wins -> emit dispatches and heartbeats -> advance the
checkpoint. Nothing here does I/O: the adapter delivers the returned messages.

One table's error does not abort the tick (issue 10). When a table's replication set
raises (``MultiplePrimaryError``, an invariant error), that table is frozen and the
changefeed goes to an error state, as in TiCDC: ``TickResult.error`` carries the table and
the message from that tick on, the schedulers stop (nothing new is added or moved), the
other tables keep applying their reports, and the checkpoint stays below the failed table
(it counts as not replicating), so no DDL or syncpoint passes it. A new owner (the
changefeed resumed) rebuilds every set from the captures' reports.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from scheduler_core.captures import CaptureManager
from scheduler_core.checkpoint import advance_checkpoint
from scheduler_core.ddl import DDLEvent, DDLManager
from scheduler_core.errors import ConfigError, TableFailedError
from scheduler_core.messages import (
    Barrier,
    CaptureMessage,
    Dispatch,
    DispatchTableRequest,
    DispatchTableResponse,
    Header,
    Heartbeat,
    HeartbeatResponse,
    OwnerMessage,
)
from scheduler_core.model import Checkpoint
from scheduler_core.replication_manager import ReplicationManager
from scheduler_core.schedulers import (
    BalanceScheduler,
    BasicScheduler,
    DrainCaptureScheduler,
    MoveTableScheduler,
    RebalanceScheduler,
    ScheduleContext,
    Scheduler,
    TableCost,
    unit_cost,
)
from scheduler_core.ts import MAX_TS

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CoordinatorConfig:
    """Tunables; defaults follow TiCDC's scheduler v3."""

    max_task_concurrency: int = 10
    add_table_batch_size: int = 50
    # TiCDC's check-balance-interval. A capture-set change balances at once (scale-out).
    balance_interval_ms: int = 60_000
    drain_batch_size: int = 10
    table_cost: TableCost = unit_cost


@dataclass(frozen=True, slots=True)
class TickResult:
    """What one tick produced: messages to deliver and the changefeed's progress."""

    messages: list[OwnerMessage]
    checkpoint: Checkpoint
    barrier: Barrier
    scheduler: str | None = None  # which scheduler produced this tick's tasks
    dispatches: int = 0
    ready_ddls: tuple[DDLEvent, ...] = ()  # DDLs whose gate is open: execute, then ddl_done
    syncpoint_ts: int | None = None  # a syncpoint all tables reached: record, then syncpoint_done
    finished: bool = False  # the target ts was reached
    error: TableFailedError | None = None  # the changefeed is in error: a table's set failed


@dataclass(slots=True)
class _TableChange:
    barrier_ts: int
    add: np.ndarray
    remove: np.ndarray


@dataclass(slots=True)
class _Stats:
    dropped_stale_owner: int = 0
    dropped_wrong_addressee: int = 0
    dropped_wrong_changefeed: int = 0
    dropped_wrong_epoch: int = 0
    ticks: int = 0
    rebuilds: int = 0


class Coordinator:
    """The owner's scheduler for one changefeed."""

    def __init__(
        self,
        *,
        owner_id: str,
        owner_rev: int,
        changefeed_epoch: int,
        checkpoint: Checkpoint,
        tables: Iterable[int],
        rng: random.Random,
        config: CoordinatorConfig | None = None,
        ddl: DDLManager | None = None,
        seq_start: int = 0,
    ) -> None:
        """``seq_start``: the header seq to count up from. A coordinator rebuilt under the
        same ``owner_rev`` (a later process of the same owner) must start above every seq
        its predecessor sent, or agents drop its dispatches as older than one they took."""
        cfg = config or CoordinatorConfig()
        self.owner_id = owner_id
        self.owner_rev = owner_rev
        self.changefeed_epoch = changefeed_epoch
        self.checkpoint = checkpoint
        self.captures = CaptureManager()
        self.replications = ReplicationManager(max_task_concurrency=cfg.max_task_concurrency)
        self.drain = DrainCaptureScheduler(batch_size=cfg.drain_batch_size)
        self.move = MoveTableScheduler()
        self.rebalance = RebalanceScheduler(rng=rng, cost=cfg.table_cost)
        self.schedulers: list[Scheduler] = [
            BasicScheduler(add_table_batch_size=cfg.add_table_batch_size),
            self.drain,
            self.move,
            self.rebalance,
            BalanceScheduler(
                rng=rng,
                interval_ms=cfg.balance_interval_ms,
                max_moves=cfg.max_task_concurrency,
                cost=cfg.table_cost,
            ),
        ]
        self.current_tables = np.unique(np.fromiter(tables, np.int64))
        self.start_ts: dict[int, int] = {}
        self.ddl = ddl or DDLManager(checkpoint.checkpoint_ts)
        self.stats = _Stats()
        self._table_changes: list[_TableChange] = []
        self._rebuilt = False
        if type(seq_start) is not int or seq_start < 0:
            raise ConfigError(f"seq_start must be an int >= 0, got {seq_start!r}")
        self._seq = seq_start
        self._stopping = False

    # ------------------------------------------------------------------ admin
    def move_table(self, table_id: int, dest_capture_id: str) -> None:
        """Queue a manual move (validated again when applied)."""
        self.move.request(table_id, dest_capture_id)

    def drain_capture(self, capture_id: str) -> None:
        """Move every table off ``capture_id``; refuses the last capture."""
        self.drain.drain(capture_id, sorted(self.captures.captures))

    def request_rebalance(self) -> None:
        """Rebalance once every table replicates."""
        self.rebalance.request()

    def stop(self) -> None:
        """The changefeed is stopping: heartbeats tell captures to stop its tables."""
        self._stopping = True

    def change_tables(
        self, *, add: Iterable[int] = (), remove: Iterable[int] = (), barrier_ts: int
    ) -> None:
        """Change the table set at one barrier: new tables start at ``barrier_ts``.

        Every table is held at ``barrier_ts`` until the changefeed checkpoint reaches it;
        then, in that same tick, the set changes and the barrier lifts. No pause.

        ``barrier_ts`` must be one no sink has passed: with an open barrier a sink reading
        the DDL stream may be past the owner's last barrier, so in production table-set
        changes come from the DDL stream (or a pause), and this is for tests and the
        simulator, whose sinks keep to closed barriers.
        """
        if barrier_ts < self.checkpoint.checkpoint_ts:
            raise ConfigError(
                f"barrier_ts {barrier_ts} is below the checkpoint {self.checkpoint.checkpoint_ts}; "
                "a table change cannot start in the past"
            )
        change = _TableChange(
            barrier_ts,
            np.unique(np.fromiter(add, np.int64)),
            np.unique(np.fromiter(remove, np.int64)),
        )
        self._table_changes.append(change)

    # ------------------------------------------------------------------ the tick
    def tick(
        self,
        alive_captures: Mapping[str, str],
        messages: Iterable[CaptureMessage],
        *,
        now_ms: int | None = None,
    ) -> TickResult:
        """One owner tick; see the module docstring for the order of steps.

        ``now_ms``: the owner's clock (wall ms), for the periodic balance; without it the
        balance runs only when the capture set changed or its last round moved tables.
        """
        self.stats.ticks += 1
        accepted = [m for m in messages if self._accept(m)]
        changes = self.captures.update_alive(alive_captures)
        out: list[Dispatch] = []
        if self._rebuilt:
            for cid in changes.removed:
                out.extend(self.replications.handle_capture_removed(cid))
        out.extend(self._receive(accepted))
        scheduler = None
        if self.captures.all_initialized():
            if not self._rebuilt:
                self._rebuild()
            self._apply_table_changes()
            if self.error is None:
                scheduler, more = self._schedule(now_ms)
                out.extend(more)
        if self._rebuilt:
            self.replications.drop_removed(self.current_tables)
        barrier = self.barrier()
        self._advance_checkpoint(barrier)
        msgs = self._emit(out, barrier)
        ckpt = self.checkpoint.checkpoint_ts
        ready: tuple[DDLEvent, ...] = ()
        if self._rebuilt:
            ready = tuple(self.ddl.ready(self._table_checkpoint, ckpt))
        return TickResult(
            msgs,
            self.checkpoint,
            barrier,
            scheduler,
            len(out),
            ready,
            self.ddl.ready_syncpoint(ckpt),
            self.ddl.finished(ckpt),
            self.error,
        )

    @property
    def error(self) -> TableFailedError | None:
        """The first table failure: the changefeed is in error (see the module docstring)."""
        failures = self.replications.failures
        return next(iter(failures.values())) if failures else None

    def _table_checkpoint(self, table_id: int) -> int:
        # Only a replicating table's checkpoint says its data is downstream up to it: a
        # table being moved, stopped or re-added waits (its DDL with it).
        ts = self.replications.replicating_checkpoint(table_id)
        return 0 if ts is None else ts

    # ------------------------------------------------------------------ DDL
    def add_ddl(self, event: DDLEvent) -> bool:
        """Queue a DDL from the upstream's DDL stream (commit-ts order per table)."""
        return self.ddl.add_ddl(event)

    def advance_ddl_resolved(self, ts: int) -> None:
        """No DDL with a commit ts <= ``ts`` is still to come: the global barrier may reach it."""
        self.ddl.advance_ddl_resolved(ts)

    def ddl_done(self, event: DDLEvent) -> None:
        """A ready DDL ran downstream: lift its barrier and apply its table-set change."""
        change = self.ddl.ddl_done(event)
        add = np.asarray(change.added, np.int64)
        remove = np.asarray(change.removed, np.int64)
        if len(add) or len(remove):
            self.apply_table_set_change(add, remove, change.barrier_ts)

    def syncpoint_done(self, ts: int) -> None:
        """The syncpoint at ``ts`` was recorded downstream."""
        self.ddl.syncpoint_done(ts)

    def _accept(self, m: CaptureMessage) -> bool:
        if m.to != self.owner_id:
            self.stats.dropped_wrong_addressee += 1
            return False
        if m.header.owner_rev != self.owner_rev:
            self.stats.dropped_stale_owner += 1
            return False
        if m.header.changefeed_epoch != self.changefeed_epoch:
            self.stats.dropped_wrong_changefeed += 1
            return False
        return True

    def _receive(self, accepted: list[CaptureMessage]) -> list[Dispatch]:
        out: list[Dispatch] = []
        for m in accepted:
            if not self.captures.accept(m.sender, m.header.capture_epoch, m.header.seq):
                self.stats.dropped_wrong_epoch += 1
                continue
            if isinstance(m, HeartbeatResponse):
                if not self.captures.handle_response(m):
                    self.stats.dropped_wrong_epoch += 1
                    continue
                if self._rebuilt:
                    out.extend(self.replications.handle_batch(m.sender, m.tables))
            elif isinstance(m, DispatchTableResponse):
                if not self.captures.epoch_of(m.sender):
                    continue  # epochs are learnt from heartbeat responses only
                self.captures.note_seq(m.sender, m.header.seq)
                if self._rebuilt:
                    out.extend(self.replications.handle_statuses(m.sender, m.statuses))
        return out

    def _rebuild(self) -> None:
        reports = {cid: st.tables for cid, st in self.captures.captures.items() if st.tables}
        self.replications.rebuild(reports, self.checkpoint)  # type: ignore[arg-type]
        self._rebuilt = True
        self.stats.rebuilds += 1
        log.info(
            "owner %s rebuilt %d tables from %d captures",
            self.owner_id,
            len(self.replications),
            len(reports),
        )

    def _schedule(self, now_ms: int | None) -> tuple[str | None, list[Dispatch]]:
        self.drain.forget_gone(self.captures.captures)
        ctx = ScheduleContext(
            checkpoint_ts=self.checkpoint.checkpoint_ts,
            current_tables=self.current_tables,
            start_ts=self.start_ts,
            captures=self.captures.captures,
            replications=self.replications,
            now_ms=now_ms,
            draining=self.drain.target,
            drained=frozenset(self.drain.drained),
        )
        for sched in self.schedulers:
            tasks = sched.schedule(ctx)
            if tasks:
                return sched.name, self.replications.handle_tasks(tasks)
        return None, self.replications.handle_tasks([])

    def _apply_table_changes(self) -> None:
        # Not above an unrecorded syncpoint: its record lists the tables as they were there.
        due = [
            c
            for c in self._table_changes
            if self.checkpoint.checkpoint_ts >= c.barrier_ts
            and self.ddl.after_syncpoints(c.barrier_ts)
        ]
        for change in due:
            self._table_changes.remove(change)
            self.apply_table_set_change(change.add, change.remove, change.barrier_ts)

    def apply_table_set_change(self, add: np.ndarray, remove: np.ndarray, start_ts: int) -> None:
        """Add tables (starting at ``start_ts``) and drop tables, now."""
        for tid in add.tolist():
            self.start_ts[tid] = start_ts
        cur = np.union1d(self.current_tables, add)
        self.current_tables = np.setdiff1d(cur, remove, assume_unique=True)
        for tid in remove.tolist():
            self.start_ts.pop(tid, None)

    # ------------------------------------------------------------------ progress
    def barrier(self) -> Barrier:
        """The barriers sinks must respect this tick (open as the DDL manager's is, unless a
        table-set change or the rebuild holds the changefeed at or below it)."""
        changes = min((c.barrier_ts for c in self._table_changes), default=MAX_TS)
        table: dict[int, int] = {}
        b = self.ddl.barrier(_SortedIds(self.current_tables))
        global_ts = min(changes, b.global_barrier_ts)
        open_until = min(b.open_until_ts, changes) if changes > b.global_barrier_ts else 0
        for tid, ts in b.table_barriers.items():
            table[tid] = min(ts, table.get(tid, MAX_TS))
        if not self._rebuilt:
            # Until every capture reported, the owner cannot tell which held table left the
            # changefeed (a DROP that ran under the previous owner): nothing sinks further.
            global_ts = min(global_ts, self.checkpoint.checkpoint_ts)
            open_until = 0
        else:
            # A table that left (dropped, filtered out) is held where it is until its
            # capture removes it: without this it sank past its DROP until the remove came.
            ids, ckpts = self.replications.leaving(self.current_tables)
            for tid, ts in zip(ids.tolist(), ckpts.tolist(), strict=True):
                table[tid] = min(ts, table.get(tid, MAX_TS))
        return Barrier(global_ts, {t: ts for t, ts in table.items() if ts < global_ts}, open_until)

    def _advance_checkpoint(self, barrier: Barrier) -> None:
        if not self._rebuilt:
            return
        if not len(self.current_tables) and self.ddl.ddl_resolved_ts is None:
            # Nothing replicates and the DDL stream is not tracked: nothing says how far the
            # upstream has resolved, so a CREATE not yet added could be passed.
            return
        # With no table, a tracked DDL stream bounds the barrier (the global barrier never
        # passes its resolved ts): the checkpoint moves to the first CREATE (or syncpoint)
        # so it becomes ready (advance_checkpoint's empty case).
        rows = self.replications.rows(self.current_tables)
        cp = advance_checkpoint(*rows, barrier, len(self.current_tables), self.checkpoint)
        if cp is None:
            return
        self.checkpoint = cp
        # Table starts below the checkpoint are no longer needed.
        if self.start_ts:
            done = [t for t, ts in self.start_ts.items() if ts <= self.checkpoint.checkpoint_ts]
            for t in done:
                if t in self.replications:
                    del self.start_ts[t]

    # ------------------------------------------------------------------ output
    def _header(self, capture_id: str) -> Header:
        self._seq += 1
        epoch = self.captures.captures[capture_id].epoch
        return Header(self.owner_rev, epoch, self.changefeed_epoch, self._seq)

    def _emit(self, dispatches: list[Dispatch], barrier: Barrier) -> list[OwnerMessage]:
        by_capture: dict[str, list[Dispatch]] = {}
        for d in dispatches:
            if d.to in self.captures.captures:
                by_capture.setdefault(d.to, []).append(d)
        batches = self.replications.take_add_batches()
        msgs: list[OwnerMessage] = []
        for cid in sorted(self.captures.captures):
            reqs = by_capture.get(cid)
            adds = batches.get(cid)
            if reqs or adds is not None:
                header = self._header(cid)
                msgs.append(
                    DispatchTableRequest(header, self.owner_id, cid, tuple(reqs or ()), adds)
                )
            owned = self.replications.owned_tables(cid) if self._rebuilt else np.empty(0, np.int64)
            msgs.append(
                Heartbeat(self._header(cid), self.owner_id, cid, owned, self._stopping, barrier)
            )
        return msgs


class _SortedIds:
    """``in`` over a sorted id array without building a set of a million ints."""

    __slots__ = ("_ids",)

    def __init__(self, ids: np.ndarray) -> None:
        self._ids = ids

    def __contains__(self, table_id: object) -> bool:
        i = int(np.searchsorted(self._ids, table_id))
        return i < len(self._ids) and int(self._ids[i]) == table_id
