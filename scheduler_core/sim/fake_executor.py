"""FakeUpstream, FakeDownstream and FakeExecutor: an in-memory data plane.

A "change" is only its commit TS here: every table changes at every upstream tick
(:func:`change_ts`), each change writing one of :data:`KEYS` keys. A batch is
``(checkpoint, batch_end_ts]`` of one table, applied change by change; the downstream keeps
per table the committed checkpoint, the current sink fencing token and each key's version
(the commit TS that last wrote it). So content is checked, not bookkeeping: a replay that
writes an older version of a key over a newer one, or any write to a table after a DDL
dropped it, lands in :attr:`FakeDownstream.violations`; a write with an old token is
refused (no double write, see :attr:`FakeDownstream.log`).
"""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass

import numpy as np

from scheduler_core.ddl import syncpoints_between
from scheduler_core.errors import ExecutorContractError, InvalidMessageError
from scheduler_core.messages import Barrier, TableStatusBatch
from scheduler_core.model import Checkpoint, TableState, TableStatus, check_ts

log = logging.getLogger(__name__)

T = TableState

KEYS = 4  # keys per table: changes at consecutive ticks write different keys
TICK_PHYSICAL_MS = 10  # the simulator's tick: the upstream changes every table once per tick


def change_ts(n: int, start_ms: int) -> int:
    """Commit TS of the n-th upstream change (n >= 1) of every table."""
    return (start_ms + n * TICK_PHYSICAL_MS) << 18


def _changes(lo: int, hi: int, start_ms: int) -> range:
    """Indices n of the changes with commit TS in ``(lo, hi]``."""
    first = max(1, ((lo >> 18) - start_ms) // TICK_PHYSICAL_MS)
    while change_ts(first, start_ms) <= lo:
        first += 1
    last = ((hi >> 18) - start_ms) // TICK_PHYSICAL_MS
    while last >= first and change_ts(last, start_ms) > hi:
        last -= 1
    return range(first, last + 1)


class FakeUpstream:
    """The upstream's resolved TS (one global watermark the simulator moves forward) and its
    DDL stream (the commit TSs of the DDLs, which a sink reading the stream stops at)."""

    def __init__(self, resolved_ts: int = 0) -> None:
        check_ts("resolved_ts", resolved_ts)
        self._resolved_ts = resolved_ts
        self._ddl_ts: list[int] = []

    def add_ddl(self, commit_ts: int) -> None:
        """A DDL in the stream at ``commit_ts`` (above the resolved TS)."""
        check_ts("commit_ts", commit_ts)
        bisect.insort(self._ddl_ts, commit_ts)

    def stream_ts(self, after_ts: int) -> int:
        """How far a sink that reads the DDL stream may go past ``after_ts``: the first DDL
        above it, or the stream's resolved TS."""
        i = bisect.bisect_right(self._ddl_ts, after_ts)
        first = self._ddl_ts[i] if i < len(self._ddl_ts) else self._resolved_ts
        return min(first, self._resolved_ts)

    def advance(self, ts: int) -> None:
        """Move the global resolved TS to ``ts``; it never goes back."""
        check_ts("ts", ts)
        if ts < self._resolved_ts:
            raise InvalidMessageError(
                f"upstream resolved ts cannot go back from {self._resolved_ts} to {ts}"
            )
        self._resolved_ts = ts

    def resolved_ts(self, table_id: int) -> int:
        """No change of ``table_id`` with a smaller commit TS will still arrive."""
        return self._resolved_ts


@dataclass(frozen=True, slots=True)
class WriteRecord:
    """One write the downstream accepted."""

    table_id: int
    token: int
    holder: str
    batch_end_ts: int


class FakeDownstream:
    """Per-table committed checkpoint, guarded by a fencing token (the sink's conditional commit).

    A table the downstream has never seen reads as committed at ``initial_ts`` (the
    changefeed's start TS: its snapshot is assumed loaded); :meth:`create_table` sets
    another TS for a table created later (at its DDL's barrier).
    """

    def __init__(self, initial_ts: int = 0) -> None:
        check_ts("initial_ts", initial_ts)
        self._initial_ts = initial_ts
        self._start_ms = initial_ts >> 18
        self._versions: dict[int, list[int]] = {}  # per table, each key's commit TS
        self._dropped: dict[int, int] = {}  # table -> the DROP DDL's commit TS
        self.violations: list[str] = []  # content broken: older over newer, write after drop
        self.handoffs_below_committed: list[tuple[int, str, int, int]] = []
        self._committed: dict[int, int] = {}
        self._created: dict[int, int] = {}
        self._ends: dict[int, set[int]] = {}  # per table, every committed batch end
        self._token: dict[int, int] = {}
        self._token_holder: dict[tuple[int, int], str] = {}
        self.log: list[WriteRecord] = []
        self.refused_writes = 0

    def create_table(self, table_id: int, committed_ts: int) -> None:
        """Make a new table readable at ``committed_ts`` (it must not exist yet)."""
        check_ts("committed_ts", committed_ts)
        if table_id in self._committed:
            raise InvalidMessageError(f"table {table_id} already exists downstream")
        self._committed[table_id] = committed_ts
        self._created[table_id] = committed_ts

    def drop_table(self, table_id: int, drop_ts: int) -> None:
        """A DDL dropped the table at ``drop_ts``: any later write to it is a violation."""
        self._dropped[table_id] = drop_ts

    def version(self, table_id: int, key: int) -> int:
        """The commit TS of the change that last wrote ``key`` (0: never written)."""
        return self._versions.get(table_id, [0] * KEYS)[key]

    def note_handoff(self, table_id: int, holder: str, start_ts: int) -> None:
        """A new primary was told to start at ``start_ts``; below committed, it must skip."""
        if start_ts < self.committed(table_id):
            self.handoffs_below_committed.append(
                (table_id, holder, start_ts, self.committed(table_id))
            )

    def committed(self, table_id: int) -> int:
        """Every change of the table with commit TS <= this is in the downstream."""
        return self._committed.get(table_id, self._initial_ts)

    def current_token(self, table_id: int) -> int:
        """The table's current fencing token (0: never acquired)."""
        return self._token.get(table_id, 0)

    def acquire(self, table_id: int, holder: str) -> int:
        """A new, strictly larger token for the table; older tokens are refused from now on."""
        token = self.current_token(table_id) + 1
        self._token[table_id] = token
        self._token_holder[(table_id, token)] = holder
        return token

    def write(
        self, table_id: int, token: int, batch_end_ts: int, holder: str, from_ts: int | None = None
    ) -> bool:
        """Commit ``(from_ts, batch_end_ts]`` if ``token`` is current; False when fenced.

        ``from_ts`` defaults to the committed checkpoint. Changes apply in commit-TS order;
        one older than the version its key holds is a violation (a replay below what is
        already there). A batch ending at or below the committed checkpoint is otherwise a
        no-op that returns True without a log entry.
        """
        check_ts("batch_end_ts", batch_end_ts)
        if token != self.current_token(table_id):
            self.refused_writes += 1
            log.info(
                "downstream refused %s's write of table %s to %s: token %s is not current (%s)",
                holder,
                table_id,
                batch_end_ts,
                token,
                self.current_token(table_id),
            )
            return False
        if self._token_holder[(table_id, token)] != holder:
            raise ExecutorContractError(
                f"{holder!r} wrote table {table_id} with token {token} acquired by "
                f"{self._token_holder[(table_id, token)]!r}: tokens are not transferable"
            )
        self._apply_changes(table_id, holder, from_ts, batch_end_ts)
        if batch_end_ts <= self.committed(table_id):
            return True
        self._committed[table_id] = batch_end_ts
        self._ends.setdefault(table_id, set()).add(batch_end_ts)
        self.log.append(WriteRecord(table_id, token, holder, batch_end_ts))
        return True

    def has_version_at(self, table_id: int, ts: int) -> bool:
        """The downstream had the table exactly at ``ts``: a batch ended there, or the table
        was created (or started) there."""
        return ts in self._ends.get(table_id, ()) or ts == self._created_at(table_id)

    def _apply_changes(self, table_id: int, holder: str, from_ts: int | None, end: int) -> None:
        committed = self.committed(table_id)
        lo = committed if from_ts is None else from_ts
        dropped = self._dropped.get(table_id)
        if dropped is not None and end > dropped:
            self.violations.append(
                f"{holder} wrote table {table_id} up to {end} after a DDL dropped it at {dropped}"
            )
        versions = self._versions.setdefault(table_id, [0] * KEYS)
        for n in _changes(lo, end, self._start_ms):
            ts = change_ts(n, self._start_ms)
            if ts <= self._created_at(table_id):
                continue  # before the table existed downstream (its snapshot holds it)
            key = n % KEYS
            if ts < versions[key]:
                self.violations.append(
                    f"{holder} wrote table {table_id} key {key} version {ts} over the newer "
                    f"{versions[key]} (a replay from {lo} below committed {committed})"
                )
            versions[key] = max(versions[key], ts)

    def _created_at(self, table_id: int) -> int:
        return self._created.get(table_id, self._initial_ts)


class _Table:
    """Mutable per-table state of the fake executor."""

    __slots__ = ("checkpoint_ts", "countdown", "prepared_from", "resolved_ts", "state", "token")

    def __init__(self, state: TableState, checkpoint_ts: int, resolved_ts: int) -> None:
        self.state = state
        self.checkpoint_ts = checkpoint_ts
        self.resolved_ts = resolved_ts
        self.prepared_from = checkpoint_ts
        self.countdown = 0
        self.token = 0  # 0: holds no fencing token (not sinking)


class FakeExecutor:
    """An in-memory TableExecutor: prepares in ``prepare_ticks``, stops in ``stop_ticks``.

    Each :meth:`advance` raises every table's resolved TS to the upstream's, and each
    sinking table (REPLICATING, or STOPPING after it replicated: its last flush) writes up
    to ``min(resolved, barrier)``, one batch per syncpoint interval: a batch never spans a
    syncpoint TS. With ``reads_ddl_stream`` the barrier is taken open (the executor reads
    the upstream's DDL stream itself, as the Spark executor reads the change log's).
    A refused write means another capture took the
    table over: the table goes STOPPED at its last accepted checkpoint and
    ``fenced_writes`` counts it. Invariant: checkpoint_ts <= resolved_ts for every table.
    """

    def __init__(
        self,
        capture_id: str,
        downstream: FakeDownstream,
        upstream: FakeUpstream,
        prepare_ticks: int = 1,
        stop_ticks: int = 1,
        *,
        sync_point_interval_ms: int | None = None,
        reads_ddl_stream: bool = False,
    ) -> None:
        if prepare_ticks < 0 or stop_ticks < 0:
            raise InvalidMessageError(
                f"prepare_ticks and stop_ticks must be >= 0, got {prepare_ticks}, {stop_ticks}"
            )
        self.capture_id = capture_id
        self.downstream = downstream
        self.upstream = upstream
        self.prepare_ticks = prepare_ticks
        self.stop_ticks = stop_ticks
        self.barrier = Barrier(0)  # sink nothing until the owner says how far
        self.sync_point_interval_ms = sync_point_interval_ms
        self.reads_ddl_stream = reads_ddl_stream
        self.fenced_writes = 0
        self._tables: dict[int, _Table] = {}

    # ------------------------------------------------------------------ commands
    def prepare(self, table_id: int, checkpoint: Checkpoint) -> None:
        """Phase 1: pull from ``checkpoint.checkpoint_ts``; PREPARED after ``prepare_ticks``."""
        if table_id in self._tables:
            raise ExecutorContractError(
                f"prepare of table {table_id} on {self.capture_id}, which holds it in "
                f"{self._tables[table_id].state.name}: prepare only an ABSENT table"
            )
        start = checkpoint.checkpoint_ts
        resolved = max(start, self.upstream.resolved_ts(table_id))
        table = _Table(T.PREPARING, start, resolved)
        table.countdown = self.prepare_ticks
        if self.prepare_ticks == 0:
            table.state = T.PREPARED
        self._tables[table_id] = table

    def commit(self, table_id: int, checkpoint: Checkpoint) -> None:
        """Phase 2: check the data is readable, take the fencing token, sink from the checkpoint."""
        table = self._tables.get(table_id)
        if table is None or table.state != T.PREPARED:
            state = "ABSENT" if table is None else table.state.name
            raise ExecutorContractError(
                f"commit of table {table_id} on {self.capture_id} in {state}: "
                "commit only a PREPARED table"
            )
        start = checkpoint.checkpoint_ts
        if table.prepared_from > start:
            raise ExecutorContractError(
                f"table {table_id} on {self.capture_id} was prepared from {table.prepared_from} "
                f"> commit checkpoint {start}: sinking would skip the changes in between; "
                "prepare it again from the checkpoint"
            )
        committed = self.downstream.committed(table_id)
        if committed < start:
            raise ExecutorContractError(
                f"table {table_id} on {self.capture_id}: downstream committed {committed} < commit "
                f"checkpoint {start}: the previous primary's writes are not readable yet"
            )
        table.token = self.downstream.acquire(table_id, self.capture_id)
        self.downstream.note_handoff(table_id, self.capture_id, start)
        table.state = T.REPLICATING
        # DESIGN "Sink commits": a new primary starts after the downstream's committed ts,
        # never below it (below it only after a crash lost the old primary's last report).
        table.checkpoint_ts = max(start, committed)
        start = table.checkpoint_ts
        table.resolved_ts = max(table.resolved_ts, start)

    def remove(self, table_id: int) -> None:
        """Begin stopping (idempotent); STOPPED after ``stop_ticks`` advances."""
        table = self._tables.get(table_id)
        if table is None or table.state in (T.STOPPING, T.STOPPED):
            return
        table.state = T.STOPPING
        table.countdown = self.stop_ticks
        if self.stop_ticks == 0:
            self._stop(table)

    def forget(self, table_id: int) -> None:
        """Drop a STOPPED table (no-op for an ABSENT one)."""
        table = self._tables.get(table_id)
        if table is None:
            return
        if table.state != T.STOPPED:
            raise ExecutorContractError(
                f"forget of table {table_id} on {self.capture_id} in {table.state.name}: "
                "only a STOPPED table may be forgotten (remove it first)"
            )
        del self._tables[table_id]

    def set_barrier(self, barrier: Barrier) -> None:
        """Sinks will not pass ``barrier.barrier_ts(table_id)``."""
        self.barrier = barrier

    # ------------------------------------------------------------------ progress
    def advance(self) -> None:
        """One processor tick: pull up to the upstream's resolved TS, sink, finish phases."""
        for table_id, table in self._tables.items():
            if table.state == T.STOPPED:
                continue
            table.resolved_ts = max(table.resolved_ts, self.upstream.resolved_ts(table_id))
            if table.state == T.PREPARING:
                table.countdown -= 1
                if table.countdown <= 0:
                    table.state = T.PREPARED
            elif table.state == T.REPLICATING:
                self._sink(table_id, table)
            elif table.state == T.STOPPING:
                self._advance_stopping(table_id, table)
            assert table.checkpoint_ts <= table.resolved_ts, (table_id, self.capture_id)

    def _advance_stopping(self, table_id: int, table: _Table) -> None:
        if table.token and not self._sink(table_id, table):
            return  # fenced: already stopped
        table.countdown -= 1
        if table.countdown <= 0:
            self._stop(table)

    def sink_limit(self, table_id: int) -> int:
        """How far the table may sink under the barrier (open only when reading the stream)."""
        b = self.barrier
        if not self.reads_ddl_stream:
            return b.barrier_ts(table_id)
        return b.open_barrier_ts(table_id, self.upstream.stream_ts(b.global_barrier_ts))

    def _sink(self, table_id: int, table: _Table) -> bool:
        """Write up to the limit, a batch per syncpoint; on a refused write the table stops
        (False)."""
        target = min(table.resolved_ts, self.sink_limit(table_id))
        if target <= table.checkpoint_ts:
            return True
        cuts = syncpoints_between(table.checkpoint_ts, target, self.sync_point_interval_ms)
        for end in [*cuts, target]:
            if not self.downstream.write(
                table_id, table.token, end, self.capture_id, from_ts=table.checkpoint_ts
            ):
                log.warning(
                    "capture %s: write of table %s fenced at checkpoint %s: another capture "
                    "owns it",
                    self.capture_id,
                    table_id,
                    table.checkpoint_ts,
                )
                self.fenced_writes += 1
                self._stop(table)
                return False
            table.checkpoint_ts = end
        return True

    @staticmethod
    def _stop(table: _Table) -> None:
        table.state = T.STOPPED
        table.token = 0

    # ------------------------------------------------------------------ reports
    def status(self, table_id: int) -> TableStatus:
        """The table's status (ABSENT at checkpoint 0 if not held)."""
        table = self._tables.get(table_id)
        if table is None:
            return TableStatus(table_id, T.ABSENT, Checkpoint(0, 0))
        return TableStatus(
            table_id, table.state, Checkpoint(table.checkpoint_ts, table.resolved_ts)
        )

    def statuses(self) -> TableStatusBatch:
        """Every held table's status, in columns (insertion order)."""
        n = len(self._tables)
        tables = self._tables.values()
        return TableStatusBatch(
            np.fromiter(self._tables.keys(), np.int64, n),
            np.fromiter((int(t.state) for t in tables), np.int64, n),
            np.fromiter((t.checkpoint_ts for t in tables), np.int64, n),
            np.fromiter((t.resolved_ts for t in tables), np.int64, n),
        )

    def sinking(self) -> list[int]:
        """Tables this executor may still write: it holds their fencing token (REPLICATING,
        or STOPPING and still flushing)."""
        return [t for t, table in self._tables.items() if table.token]

    def held(self) -> int:
        """How many tables this executor holds."""
        return len(self._tables)
