"""ReplicationManager: every table's replication set, the running tasks, and the checkpoint.

Scale is the design constraint (1M tables x 100 captures, a tick in a few hundred ms),
so a table lives in exactly one of three forms:

* **steady** -- REPLICATING with exactly one capture (the primary). Kept only as a row
  of numpy columns (id, primary capture index, checkpoint, resolved); per-tick checkpoint
  reports for these rows are applied vectorised.
* **active** -- anything else (being added, moved, removed, or with an Undetermined
  capture). Kept as a :class:`ReplicationSet` object in ``_active``; its checkpoint and
  state are mirrored into the columns for the checkpoint calculation.

* **adding** -- a new table on its way in, in one of the two shapes a plain add passes
  through: PREPARE with the capture as secondary, or COMMIT with it promoted. Also only
  columns (``_fast`` / ``_fcap``); a burst of adds and its Prepared / Replicating reports
  are applied vectorised, each step exactly what ``ReplicationSet.poll`` does for it.

A steady or adding row is turned into an object (``_materialize``) before any event the
vectorised steps do not cover, and an object that settles back into the steady shape is
folded into the columns again (``_settle``). So per-tick work is proportional to what changed plus the
number of captures; the ReplicationSet state machine stays the only place transitions
are decided.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from scheduler_core.errors import (
    ConfigError,
    InvalidMessageError,
    SchedulerError,
    TableFailedError,
)
from scheduler_core.messages import AddTableBatch, Dispatch, TableStatusBatch
from scheduler_core.model import (
    Checkpoint,
    ReplicationSetState,
    Role,
    TableState,
    TableStatus,
)
from scheduler_core.replication import ReplicationSet
from scheduler_core.schedule_tasks import (
    AddTableTask,
    BurstAddTask,
    BurstTask,
    MoveTableTask,
    RemoveTableTask,
    ScheduleTask,
    Task,
)

log = logging.getLogger(__name__)

S = ReplicationSetState
_NOT_STEADY = -1
_REPLICATING = int(TableState.REPLICATING)
_PREPARING = int(TableState.PREPARING)
_PREPARED = int(TableState.PREPARED)
_NOT_ADDING, _ADD_PREPARE, _ADD_COMMIT = 0, 1, 2  # values of the ``_fast`` column


@dataclass(frozen=True, slots=True)
class TableView:
    """A read-only snapshot of one table's replication set, for schedulers and tests."""

    table_id: int
    state: ReplicationSetState
    primary: str | None
    captures: Mapping[str, Role]
    checkpoint: Checkpoint


def _contains(sorted_ids: np.ndarray, table_id: int) -> bool:
    i = int(np.searchsorted(sorted_ids, table_id))
    return i < len(sorted_ids) and int(sorted_ids[i]) == table_id


class ReplicationManager:
    """Owns the replication sets of one changefeed and applies schedule tasks to them."""

    def __init__(self, *, max_task_concurrency: int = 10) -> None:
        if max_task_concurrency < 1:
            raise ConfigError(f"max_task_concurrency must be >= 1, got {max_task_concurrency}")
        self.max_task_concurrency = max_task_concurrency
        self._reset()

    def _reset(self) -> None:
        self._ids = np.empty(0, np.int64)  # sorted table ids: row index = slot
        self._primary = np.empty(0, np.int32)  # capture index when steady, else -1
        self._state = np.empty(0, np.int8)  # ReplicationSetState of every row
        self._ckpt = np.empty(0, np.int64)
        self._resolved = np.empty(0, np.int64)
        self._fast = np.empty(0, np.int8)  # _ADD_PREPARE / _ADD_COMMIT for adding rows
        self._fcap = np.empty(0, np.int32)  # the adding row's capture index
        self._adds: list[tuple[np.ndarray, ...]] = []  # columnar adds not yet taken
        self._version = getattr(self, "_version", 0) + 1  # bumps when rows are added/removed
        self._member_key: tuple | None = None
        self._slot_cache: dict[int, tuple[int, np.ndarray, np.ndarray, np.ndarray]] = {}
        self._active: dict[int, ReplicationSet] = {}
        self._running: dict[int, ScheduleTask] = {}
        self._cap_index: dict[str, int] = {}
        self._cap_names: list[str] = []
        self._owned_cache: dict[str, np.ndarray] | None = None
        # Tables whose set raised: frozen (no input, no task), never replicating for the
        # checkpoint. Survives only until the owner rebuilds (the changefeed is resumed).
        self.failures: dict[int, TableFailedError] = {}

    # ------------------------------------------------------------------ queries
    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, table_id: int) -> bool:
        return self._slot(table_id) is not None

    @property
    def table_ids(self) -> np.ndarray:
        """Every table the manager tracks (sorted, read-only view)."""
        view = self._ids.view()
        view.flags.writeable = False
        return view

    @property
    def running_tasks(self) -> Mapping[int, ScheduleTask]:
        """Tasks in flight, by table id."""
        return self._running

    def view(self, table_id: int) -> TableView:
        """A snapshot of one table's replication set."""
        s = self._slot(table_id)
        if s is None:
            raise KeyError(f"table {table_id} is not tracked by the replication manager")
        rs = self._active.get(table_id)
        if rs is not None:
            return TableView(table_id, rs.state, rs.primary, dict(rs.captures), rs.checkpoint)
        cp = Checkpoint(int(self._ckpt[s]), int(self._resolved[s]))
        if self._fast[s] == _ADD_PREPARE:
            cid = self._cap_names[self._fcap[s]]
            return TableView(table_id, S.PREPARE, None, {cid: Role.SECONDARY}, cp)
        if self._fast[s] == _ADD_COMMIT:
            cid = self._cap_names[self._fcap[s]]
            return TableView(table_id, S.COMMIT, cid, {cid: Role.PRIMARY}, cp)
        primary = self._cap_names[self._primary[s]]
        return TableView(table_id, S.REPLICATING, primary, {primary: Role.PRIMARY}, cp)

    def active(self) -> Mapping[int, ReplicationSet]:
        """Replication sets not in the steady shape (read them, don't change them)."""
        return self._active

    def all_replicating(self) -> bool:
        """Every tracked table is REPLICATING."""
        return bool((self._state == S.REPLICATING).all())

    def table_counts(self, captures: Iterable[str]) -> dict[str, int]:
        """Tables per capture (any role), for the balancing schedulers."""
        counts = dict.fromkeys(captures, 0)
        owner = self._column_owner()
        owner = owner[owner >= 0]
        per_idx = np.bincount(owner, minlength=len(self._cap_names)) if len(owner) else []
        for cid in counts:
            idx = self._cap_index.get(cid)
            if idx is not None and idx < len(per_idx):
                counts[cid] = int(per_idx[idx])
        for rs in self._active.values():
            for cid in rs.captures:
                if cid in counts:
                    counts[cid] += 1
        return counts

    def landing_loads(
        self, capture_ids: Iterable[str], cost: Callable[[np.ndarray], np.ndarray]
    ) -> dict[str, float]:
        """The load (sum of ``cost`` over table ids) each capture will carry once the tasks
        in flight are done.

        A steady table counts on its primary; a table being added or moved counts on the
        capture it goes to (the secondary, else the promoted primary), never on the one it
        leaves; a table being removed, or held by no capture, counts nowhere. So a balance
        planned while tasks run does not move tables twice for the same gap. O(tables) in
        numpy plus O(tables in flight).
        """
        owner = self._column_owner()
        held = owner >= 0
        per_idx = np.bincount(
            owner[held], weights=cost(self._ids[held]), minlength=len(self._cap_names)
        )
        extra: dict[str, list[int]] = {}
        for rs in self._active.values():
            if rs.state in (S.REMOVING, S.ABSENT) or rs.table_id in self.failures:
                continue
            dest = rs.secondary or rs.primary
            if dest is not None:
                extra.setdefault(dest, []).append(rs.table_id)
        out: dict[str, float] = {}
        for cid in capture_ids:
            idx = self._cap_index.get(cid)
            load = float(per_idx[idx]) if idx is not None else 0.0
            more = extra.get(cid)
            out[cid] = load + float(cost(np.asarray(more, np.int64)).sum()) if more else load
        return out

    def absent_tables(self) -> np.ndarray:
        """Ids of tables tracked but held by no capture (to be added again)."""
        return self._ids[self._state == S.ABSENT]

    def extra_tables(self, current: np.ndarray) -> np.ndarray:
        """Ids tracked but not in ``current`` (sorted) and not already being removed."""
        extra = self._membership(current)[2] & (self._state != S.REMOVING)
        return self._ids[extra]

    def leaving(self, current: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(ids, checkpoint ts) of tables tracked but not in ``current`` (sorted)."""
        extra = self._membership(current)[2]
        return self._ids[extra], self._ckpt[extra]

    def untracked(self, current: np.ndarray) -> np.ndarray:
        """Ids in ``current`` (sorted) that no replication set tracks yet."""
        return current[~self._membership(current)[1]]

    def _membership(self, current: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        # (slots of the tracked current tables, which of current are tracked, which rows
        # are extra). Cached until the table set or the rows change: a steady tick pays
        # nothing for it.
        key = self._member_key
        if key is not None and key[0] is current and key[1] == self._version:
            return key[2]
        slots = np.searchsorted(self._ids, current)
        found = slots < len(self._ids)
        found[found] = self._ids[slots[found]] == current[found]
        extra = np.ones(len(self._ids), bool)
        extra[slots[found]] = False
        value = (slots[found], found, extra)
        self._member_key = (current, self._version, value)
        return value

    def replicating_on(self, capture_id: str) -> np.ndarray:
        """Ids of tables REPLICATING with ``capture_id`` as their only capture (movable)."""
        idx = self._cap_index.get(capture_id)
        if idx is None:
            return np.empty(0, np.int64)
        return self._ids[self._primary == idx]

    def owned_tables(self, capture_id: str) -> np.ndarray:
        """Tables the owner thinks ``capture_id`` holds (any role): what its heartbeat lists."""
        if self._owned_cache is None:
            self._owned_cache = self._group_owned()
        return self._owned_cache.get(capture_id, np.empty(0, np.int64))

    def _column_owner(self) -> np.ndarray:
        # The one capture of a steady or adding row; -1 for rows kept as objects.
        return np.where(self._fast > 0, self._fcap, self._primary)

    def _group_owned(self) -> dict[str, np.ndarray]:
        owner = self._column_owner()
        steady = owner >= 0
        prim = owner[steady]
        ids = self._ids[steady]
        order = np.argsort(prim, kind="stable")
        bounds = np.searchsorted(prim[order], np.arange(len(self._cap_names) + 1))
        extra: dict[str, list[int]] = {}
        for rs in self._active.values():
            for cid in rs.captures:
                extra.setdefault(cid, []).append(rs.table_id)
        out: dict[str, np.ndarray] = {}
        for i, name in enumerate(self._cap_names):
            part = ids[order[bounds[i] : bounds[i + 1]]]
            if name in extra:
                part = np.concatenate([part, np.asarray(extra.pop(name), np.int64)])
            part.flags.writeable = False
            out[name] = part
        for name, more in extra.items():
            arr = np.asarray(more, np.int64)
            arr.flags.writeable = False
            out[name] = arr
        return out

    # ------------------------------------------------------------------ rebuild
    def rebuild(self, reports: Mapping[str, TableStatusBatch], checkpoint: Checkpoint) -> None:
        """Rebuild every replication set from the captures' reports (owner switch)."""
        self._reset()
        names = sorted(reports)
        for name in names:
            self._capture_index(name)
        parts = [(self._cap_index[n], reports[n]) for n in names]
        parts = [(ci, b) for ci, b in parts if len(b)]
        if not parts:
            return
        cap = np.concatenate([np.full(len(b), ci, np.int32) for ci, b in parts])
        ids = np.concatenate([b.table_ids for _, b in parts])
        states = np.concatenate([b.states for _, b in parts])
        ckpt = np.concatenate([b.checkpoint_ts for _, b in parts])
        resolved = np.concatenate([b.resolved_ts for _, b in parts])
        # Absent reports say nothing; a Stopped one only gives a final checkpoint (used when
        # the table has no primary), so steady rows are found among the others.
        known = states != int(TableState.ABSENT)
        cap, ids, states, ckpt, resolved = (
            cap[known],
            ids[known],
            states[known],
            ckpt[known],
            resolved[known],
        )
        held = states != int(TableState.STOPPED)
        uniq, first, counts = np.unique(ids[held], return_index=True, return_counts=True)
        first = np.flatnonzero(held)[first]
        steady = (counts == 1) & (states[first] == _REPLICATING)
        rows = first[steady]
        self._insert_rows(uniq[steady], S.REPLICATING)
        slots = np.searchsorted(self._ids, uniq[steady])
        self._primary[slots] = cap[rows]
        self._ckpt[slots] = np.maximum(ckpt[rows], checkpoint.checkpoint_ts)
        self._resolved[slots] = np.maximum(resolved[rows], self._ckpt[slots])
        others = np.setdiff1d(np.unique(ids), uniq[steady], assume_unique=True)
        self._rebuild_others(others, ids, cap, states, ckpt, resolved, checkpoint)

    def _rebuild_others(self, others, ids, cap, states, ckpt, resolved, checkpoint) -> None:
        if not len(others):
            return
        pick = np.isin(ids, others)
        grouped: dict[int, dict[str, TableStatus]] = {}
        for i in np.flatnonzero(pick):
            tid = int(ids[i])
            cp = Checkpoint(int(ckpt[i]), int(resolved[i]))
            status = TableStatus(tid, TableState(int(states[i])), cp)
            grouped.setdefault(tid, {})[self._cap_names[cap[i]]] = status
        self._insert_rows(np.asarray(sorted(grouped), np.int64), S.ABSENT)
        for tid, reps in grouped.items():
            try:
                rs = ReplicationSet.rebuild(tid, checkpoint, reps)
            except SchedulerError as exc:
                rs = ReplicationSet(tid, checkpoint)  # an empty stand-in: the table is frozen
                self._active[tid] = rs
                self._fail(self._slot(tid), rs, exc)  # type: ignore[arg-type]
                continue
            self._active[tid] = rs
            self._settle(self._slot(tid), rs)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ events
    def handle_batch(self, capture_id: str, batch: TableStatusBatch) -> list[Dispatch]:
        """Apply one capture's heartbeat report; steady rows are updated vectorised."""
        if not len(batch) or not len(self._ids):
            return []
        ci = self._capture_index(capture_id)
        slots_c, known = self._report_slots(ci, batch.table_ids)
        fast = known & (batch.states == _REPLICATING) & (self._primary[slots_c] == ci)
        self._advance_rows(slots_c[fast], batch.checkpoint_ts[fast], batch.resolved_ts[fast])
        fast |= self._adding_reports(ci, batch, slots_c, known)
        slow = np.flatnonzero(known & ~fast)
        if not len(slow):
            return []
        return self.handle_statuses(capture_id, (batch.status_at(int(i)) for i in slow))

    def _report_slots(self, ci: int, table_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # A capture reports the same tables tick after tick: reuse the lookup while the
        # rows are unchanged (array_equal on its ids costs far less than searchsorted).
        hit = self._slot_cache.get(ci)
        if hit is not None and hit[0] == self._version and np.array_equal(hit[1], table_ids):
            return hit[2], hit[3]
        slots = np.minimum(np.searchsorted(self._ids, table_ids), len(self._ids) - 1)
        known = self._ids[slots] == table_ids
        self._slot_cache[ci] = (self._version, table_ids, slots, known)
        return slots, known

    def _advance_rows(self, slots: np.ndarray, ckpt: np.ndarray, resolved: np.ndarray) -> None:
        # Slots are unique within a batch (TableStatusBatch rejects repeated ids).
        self._ckpt[slots] = np.maximum(self._ckpt[slots], ckpt)
        self._resolved[slots] = np.maximum(self._resolved[slots], resolved)

    def _adding_reports(
        self, ci: int, batch: TableStatusBatch, slots: np.ndarray, known: np.ndarray
    ) -> np.ndarray:
        """Vectorised ``poll`` for adding rows; returns the mask of report rows it handled.

        PREPARE + Preparing: nothing. PREPARE + Prepared: COMMIT, promote, send the commit.
        COMMIT + Prepared: the commit was lost, send it again. COMMIT + Replicating:
        REPLICATING (steady). Any other report goes the slow way.
        """
        kind = np.where(known & (self._fcap[slots] == ci), self._fast[slots], _NOT_ADDING)
        st = batch.states
        prep, commit = kind == _ADD_PREPARE, kind == _ADD_COMMIT
        promote = prep & (st == _PREPARED)
        resend = commit & (st == _PREPARED)
        done = commit & (st == _REPLICATING)
        ps = slots[promote]
        self._fast[ps] = _ADD_COMMIT
        self._state[ps] = S.COMMIT
        commit_slots = slots[promote | resend]
        self._queue_adds(ci, commit_slots, secondary=False)
        ds = slots[done]
        self._advance_rows(ds, batch.checkpoint_ts[done], batch.resolved_ts[done])
        self._fast[ds] = _NOT_ADDING
        self._state[ds] = S.REPLICATING
        self._primary[ds] = ci
        return (prep & (st == _PREPARING)) | promote | resend | done

    def _queue_adds(self, ci: int | np.ndarray, slots: np.ndarray, *, secondary: bool) -> None:
        if not len(slots):
            return
        caps = np.broadcast_to(np.asarray(ci, np.int32), slots.shape)
        sec = np.full(len(slots), int(secondary), np.int64)
        self._adds.append((caps, self._ids[slots], sec, self._ckpt[slots], self._resolved[slots]))

    def take_add_batches(self) -> dict[str, AddTableBatch]:
        """The columnar adds produced since the last call, per capture."""
        if not self._adds:
            return {}
        cols = [np.concatenate(c) for c in zip(*self._adds, strict=True)]
        self._adds = []
        order = np.argsort(cols[0], kind="stable")
        caps = cols[0][order]
        bounds = np.flatnonzero(np.diff(caps)) + 1
        out = {}
        for part in np.split(np.arange(len(order)), bounds):
            rows = order[part]
            name = self._cap_names[int(caps[part[0]])]
            out[name] = AddTableBatch(*(c[rows] for c in cols[1:]))
        return out

    def handle_statuses(self, capture_id: str, statuses: Iterable[TableStatus]) -> list[Dispatch]:
        """Feed statuses (dispatch responses, or the slow rows of a report) to their sets."""
        out: list[Dispatch] = []
        for status in statuses:
            s = self._slot(status.table_id)
            if s is None or status.table_id in self.failures:
                continue  # not ours (dropped long ago, or a stale report), or frozen: ignore
            rs = self._materialize(s)
            try:
                out.extend(rs.poll(status, capture_id))
            except SchedulerError as exc:
                self._fail(s, rs, exc)
                continue
            self._settle(s, rs)
        return out

    def _fail(self, s: int, rs: ReplicationSet, exc: SchedulerError) -> None:
        # One table's error must not stop every table's tick: freeze this one, record why.
        err = TableFailedError(rs.table_id, exc)
        log.error("%s", err)
        self.failures[rs.table_id] = err
        self._running.pop(rs.table_id, None)
        self._state[s] = rs.state
        self._owned_cache = None

    def handle_capture_removed(self, capture_id: str) -> list[Dispatch]:
        """A capture left: every table it held is treated as Stopped there."""
        idx = self._cap_index.get(capture_id)
        out: list[Dispatch] = []
        if idx is not None:
            for s in np.flatnonzero(self._column_owner() == idx):
                self._materialize(int(s))
        for tid, rs in list(self._active.items()):
            if tid in self.failures:
                continue
            try:
                msgs, affected = rs.handle_capture_shutdown(capture_id)
            except SchedulerError as exc:
                self._fail(self._slot(tid), rs, exc)  # type: ignore[arg-type]
                continue
            if affected:
                out.extend(msgs)
                self._settle(self._slot(tid), rs)  # type: ignore[arg-type]
        self._owned_cache = None
        return out

    # ------------------------------------------------------------------ tasks
    def handle_tasks(self, tasks: Iterable[Task]) -> list[Dispatch]:
        """Apply schedule tasks: one task per table at a time, capped concurrency except bursts."""
        self._collect_finished()
        out: list[Dispatch] = []
        for task in tasks:
            if isinstance(task, BurstTask):
                out.extend(self._apply_burst(task.tasks))
                continue
            if isinstance(task, BurstAddTask):
                out.extend(self._apply_burst_add(task))
                continue
            if len(self._running) >= self.max_task_concurrency:
                continue  # not break: a later burst task may still apply
            out.extend(self._apply(task))
        return out

    def _apply_burst(self, tasks: tuple[ScheduleTask, ...]) -> list[Dispatch]:
        # Bursts of moves and removes (adds come as a columnar BurstAddTask).
        out: list[Dispatch] = []
        for task in tasks:
            out.extend(self._apply(task))
        return out

    def _apply_burst_add(self, task: BurstAddTask) -> list[Dispatch]:
        """New tables go straight into the adding columns; known ones take the slow way."""
        if len(np.unique(task.table_ids)) != len(task.table_ids):
            # Checked before anything changes: a bad task leaves no half-applied burst.
            ids, counts = np.unique(task.table_ids, return_counts=True)
            raise InvalidMessageError(
                f"BurstAddTask lists tables {ids[counts > 1].tolist()} more than once; "
                "a burst adds each table once"
            )
        idx = np.asarray([self._capture_index(c) for c in task.captures], np.int32)
        caps = idx[task.capture_index]
        new = ~np.isin(task.table_ids, self._ids)
        ids = task.table_ids[new]
        if len(ids):
            self._insert_rows(ids, S.PREPARE)
            slots = np.searchsorted(self._ids, ids)
            self._fast[slots] = _ADD_PREPARE
            self._fcap[slots] = caps[new]
            self._ckpt[slots] = task.checkpoint_ts[new]
            self._resolved[slots] = task.checkpoint_ts[new]
            self._queue_adds(caps[new], slots, secondary=True)
        out: list[Dispatch] = []
        for i in np.flatnonzero(~new).tolist():
            cid = task.captures[int(task.capture_index[i])]
            tid, ts = int(task.table_ids[i]), int(task.checkpoint_ts[i])
            out.extend(self._apply(AddTableTask(tid, cid, ts)))
        return out

    def _apply(self, task: ScheduleTask) -> list[Dispatch]:
        tid = task.table_id
        if tid in self.failures:
            log.debug("ignore %s: table %s failed", task, tid)
            return []
        if tid in self._running:
            log.debug("ignore %s: table %s has a task running", task, tid)
            return []
        s = self._slot(tid)
        if s is None:
            if not isinstance(task, AddTableTask):
                log.debug("ignore %s: table %s not found", task, tid)
                return []
            self._insert_rows(np.asarray([tid], np.int64), S.ABSENT)
            s = self._slot(tid)
        assert s is not None
        fresh = tid not in self._active and self._primary[s] < 0 and self._fast[s] == _NOT_ADDING
        if isinstance(task, AddTableTask) and fresh:
            self._active[tid] = ReplicationSet(tid, Checkpoint.at(task.checkpoint_ts))
        rs = self._materialize(s)
        if isinstance(task, AddTableTask):
            msgs = rs.handle_add_table(task.capture_id)
        elif isinstance(task, MoveTableTask):
            msgs = rs.handle_move_table(task.dest_capture_id)
        else:
            msgs = rs.handle_remove_table()
        if msgs:
            self._running[tid] = task
        self._settle(s, rs)
        return msgs

    def _collect_finished(self) -> None:
        done = []
        for tid, task in self._running.items():
            view_state = self._state_of(tid)
            if (
                view_state is None
                or view_state in (S.REPLICATING, S.ABSENT)
                or (isinstance(task, RemoveTableTask) and self._active[tid].removed)
            ):
                done.append(tid)
        for tid in done:
            del self._running[tid]

    def drop_removed(self, current: np.ndarray) -> list[int]:
        """Forget sets that finished removing, and Absent ones no longer wanted; returns ids."""
        gone = [
            tid
            for tid, rs in self._active.items()
            if rs.removed or (rs.state == S.ABSENT and not _contains(current, tid))
        ]
        if gone:
            for tid in gone:
                del self._active[tid]
                self._running.pop(tid, None)
            keep = ~np.isin(self._ids, np.asarray(gone, np.int64))
            self._take(keep)
        return gone

    # ------------------------------------------------------------------ checkpoint
    def rows(self, current: np.ndarray) -> tuple[np.ndarray, ...]:
        """Columns (ids, TableState values, checkpoint, resolved) of the ``current`` tables we track.

        A table that is not REPLICATING here reads as ABSENT, so the checkpoint calculation
        treats anything in transit as "cannot advance".
        """
        slots = self._membership(current)[0]
        replicating = self._state[slots] == S.REPLICATING
        if self.failures:
            replicating &= ~np.isin(self._ids[slots], np.fromiter(self.failures, np.int64))
        states = np.where(replicating, int(TableState.REPLICATING), int(TableState.ABSENT))
        return self._ids[slots], states, self._ckpt[slots], self._resolved[slots]

    def table_checkpoint(self, table_id: int) -> int | None:
        """One table's checkpoint ts, if tracked."""
        s = self._slot(table_id)
        return None if s is None else int(self._ckpt[s])

    def replicating_checkpoint(self, table_id: int) -> int | None:
        """One table's checkpoint ts if it is REPLICATING (a table-DDL gate counts only that)."""
        s = self._slot(table_id)
        if s is None or self._state[s] != S.REPLICATING:
            return None
        return int(self._ckpt[s])

    # ------------------------------------------------------------------ internals
    def _slot(self, table_id: int) -> int | None:
        s = int(np.searchsorted(self._ids, table_id))
        if s < len(self._ids) and self._ids[s] == table_id:
            return s
        return None

    def _state_of(self, table_id: int) -> ReplicationSetState | None:
        s = self._slot(table_id)
        return None if s is None else S(int(self._state[s]))

    def _capture_index(self, capture_id: str) -> int:
        idx = self._cap_index.get(capture_id)
        if idx is None:
            idx = self._cap_index[capture_id] = len(self._cap_names)
            self._cap_names.append(capture_id)
        return idx

    def _materialize(self, s: int) -> ReplicationSet:
        tid = int(self._ids[s])
        rs = self._active.get(tid)
        if rs is not None:
            return rs
        cp = Checkpoint(int(self._ckpt[s]), int(self._resolved[s]))
        kind = int(self._fast[s])
        if kind == _ADD_PREPARE:
            cid = self._cap_names[self._fcap[s]]
            rs = ReplicationSet.rebuild(tid, cp, {cid: TableStatus(tid, TableState.PREPARING, cp)})
        elif kind == _ADD_COMMIT:
            rs = ReplicationSet.committing(tid, self._cap_names[self._fcap[s]], cp)
        else:
            assert self._primary[s] >= 0, f"table {tid} is neither steady, adding nor active"
            primary = self._cap_names[self._primary[s]]
            rs = ReplicationSet.rebuild(
                tid, cp, {primary: TableStatus(tid, TableState.REPLICATING, cp)}
            )
        self._active[tid] = rs
        self._primary[s] = _NOT_STEADY
        self._fast[s] = _NOT_ADDING
        return rs

    def _settle(self, s: int, rs: ReplicationSet) -> None:
        cp = rs.checkpoint
        self._ckpt[s] = cp.checkpoint_ts
        self._resolved[s] = cp.resolved_ts
        self._state[s] = rs.state
        if rs.state == S.REPLICATING and len(rs.captures) == 1:
            self._primary[s] = self._capture_index(rs.primary)  # type: ignore[arg-type]
            del self._active[rs.table_id]
        self._owned_cache = None

    def _insert_rows(self, ids: np.ndarray, state: ReplicationSetState) -> None:
        ids = np.setdiff1d(ids, self._ids)
        if not len(ids):
            return
        pos = np.searchsorted(self._ids, ids)
        self._ids = np.insert(self._ids, pos, ids)
        self._primary = np.insert(self._primary, pos, _NOT_STEADY)
        self._state = np.insert(self._state, pos, int(state))
        self._ckpt = np.insert(self._ckpt, pos, 0)
        self._resolved = np.insert(self._resolved, pos, 0)
        self._fast = np.insert(self._fast, pos, _NOT_ADDING)
        self._fcap = np.insert(self._fcap, pos, -1)
        self._version += 1
        self._owned_cache = None

    def _take(self, keep: np.ndarray) -> None:
        self._ids = self._ids[keep]
        self._primary = self._primary[keep]
        self._state = self._state[keep]
        self._ckpt = self._ckpt[keep]
        self._resolved = self._resolved[keep]
        self._fast = self._fast[keep]
        self._fcap = self._fcap[keep]
        self._version += 1
        self._owned_cache = None
