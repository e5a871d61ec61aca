"""A durable fake data plane: the simulator's fake executor with its state in files.

``FileDownstream`` is :class:`scheduler_core.sim.fake_executor.FakeDownstream` kept in a
JSON file under an exclusive ``flock`` (captures in several processes share it), with an
append-only log of accepted writes for the validators. ``DurableFakeExecutor`` is the
simulator's ``FakeExecutor`` split into ``pull_phase`` / ``sink_phase`` whose table states
live in ``<staging>/manifest.json``, so a fresh process carries on where the last one
stopped. The upstream is a real change log (its per-table resolved marks); no rows move.
``FakeSink`` gives the owner's DDL and syncpoint steps a downstream to act on.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cdc_dagster.runtime.spec import ExecutorSpec, atomic_write_json
from cdc_dagster.runtime.wire import decode_barrier, encode_barrier
from cdc_dagster.schema import DdlRecord, TableSchema
from cdc_dagster.sinks.base import Committed, SyncpointRecord
from cdc_dagster.sinks.uri import InvalidSinkUriError, SinkScheme, register_sink_scheme
from cdc_dagster.upstream.changelog import ChangeLog, ChangeLogError
from cdc_dagster.upstream.uri import changelog_path
from scheduler_core.errors import ExecutorContractError
from scheduler_core.messages import Barrier, TableStatusBatch
from scheduler_core.model import Checkpoint, TableState, TableStatus

log = logging.getLogger(__name__)
T = TableState


class FileDownstream:
    """Per-table committed ts and fencing token in ``<root>/state.json``; writes in ``writes.jsonl``.

    A table never seen reads as committed at ``initial_ts`` (the changefeed's start: its
    snapshot is assumed loaded); a table created by a DDL is committed at the DDL's ts.
    """

    def __init__(self, root: str | os.PathLike[str], initial_ts: int | None = None) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        if initial_ts is not None:  # the first executor of the changefeed sets it
            with self._locked() as state:
                state.setdefault("initial_ts", initial_ts)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        with open(self.root / "lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            path = self.root / "state.json"
            state = json.loads(path.read_text()) if path.exists() else {}
            before = json.dumps(state, sort_keys=True)
            state.setdefault("tables", {})
            yield state
            if json.dumps(state, sort_keys=True) != before:
                atomic_write_json(path, state)

    def state(self) -> dict[str, Any]:
        """The whole state (a copy), for validators."""
        with self._locked() as state:
            return json.loads(json.dumps(state))

    def writes(self) -> list[dict[str, Any]]:
        """Every accepted write, in order."""
        path = self.root / "writes.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def committed(self, table_id: int) -> int:
        """Every change of the table with commit ts <= this is downstream."""
        with self._locked() as state:
            return _committed(state, table_id)

    def current_token(self, table_id: int) -> int:
        """The table's current fencing token (0: never acquired)."""
        with self._locked() as state:
            return int(state["tables"].get(str(table_id), {}).get("token", 0))

    def create_table(self, table_id: int, committed_ts: int) -> None:
        """Make a table (created by a DDL) readable at ``committed_ts``; idempotent."""
        with self._locked() as state:
            state["tables"].setdefault(str(table_id), {"committed": committed_ts, "token": 0})

    def acquire(self, table_id: int, holder: str) -> int:
        """A new, larger token for the table; older ones are refused from now on."""
        with self._locked() as state:
            row = _row(state, table_id)
            row["token"] = int(row.get("token", 0)) + 1
            row.setdefault("holders", {})[str(row["token"])] = holder
            return int(row["token"])

    def write(self, table_id: int, token: int, end_ts: int, holder: str) -> bool:
        """Commit ``(committed, end_ts]`` if ``token`` is current (False when fenced); replays no-op."""
        with self._locked() as state:
            row = _row(state, table_id)
            if token != int(row.get("token", 0)):
                state["refused"] = int(state.get("refused", 0)) + 1
                return False
            if row["holders"][str(token)] != holder:
                raise ExecutorContractError(f"{holder} wrote table {table_id} with another's token")
            start = int(row["committed"])
            if end_ts <= start:
                return True
            row["committed"] = end_ts
            rec = {"table_id": table_id, "token": token, "holder": holder}
            rec |= {"start_ts": start, "end_ts": end_ts}
            with open(self.root / "writes.jsonl", "a") as f:
                f.write(json.dumps(rec) + "\n")
                f.flush()
                os.fsync(f.fileno())
            return True


def _committed(state: dict[str, Any], table_id: int) -> int:
    row = state["tables"].get(str(table_id))
    return int(row["committed"]) if row else int(state.get("initial_ts", 0))


def _row(state: dict[str, Any], table_id: int) -> dict[str, Any]:
    key = str(table_id)
    if key not in state["tables"]:
        state["tables"][key] = {"committed": int(state.get("initial_ts", 0)), "token": 0}
    return state["tables"][key]


class FakeSink:
    """The owner-side steps of the sink contract on a :class:`FileDownstream` (``file://`` URIs)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.downstream = FileDownstream(root)

    def committed(self, changefeed_id: str, table: TableSchema) -> Committed:
        """(committed ts, token) of the table."""
        ds = self.downstream
        return Committed(ds.committed(table.table_id), ds.current_token(table.table_id))

    def apply_ddl(
        self, changefeed_id: str, record: DdlRecord, before: Mapping[int, TableSchema | None]
    ) -> None:
        """Create the tables a DDL creates; remember it ran (a second run is skipped)."""
        with self.downstream._locked() as state:
            done = state.setdefault("ddls", [])
            key = [record.commit_ts, record.query]
            if key in done:
                return
            for table_id in record.creates:
                state["tables"].setdefault(
                    str(table_id), {"committed": record.commit_ts, "token": 0}
                )
            done.append(key)

    def record_syncpoint(
        self, changefeed_id: str, ts: int, tables: Sequence[TableSchema]
    ) -> SyncpointRecord:
        """Note a syncpoint: every table's committed ts is >= ``ts``."""
        with self.downstream._locked() as state:
            versions = {t.table_id: _committed(state, t.table_id) for t in tables}
            points = state.setdefault("syncpoints", [])
            if ts not in [p["ts"] for p in points]:
                points.append({"ts": ts, "tables": sorted(versions)})
        return SyncpointRecord(changefeed_id, ts, versions, {t: "" for t in versions})


class _Table:
    __slots__ = (
        "checkpoint_ts",
        "countdown",
        "prepared_from",
        "resolved_ts",
        "state",
        "token",
        "writes",
    )

    def __init__(self, **kw: int) -> None:
        for k in self.__slots__:
            setattr(self, k, int(kw.get(k, 0)))

    def to_json(self) -> dict[str, int]:
        return {k: int(getattr(self, k)) for k in self.__slots__}


class DurableFakeExecutor:
    """The simulator's FakeExecutor as two phases with a manifest; see the module docstring."""

    def __init__(self, spec: ExecutorSpec, prepare_ticks: int = 1, stop_ticks: int = 1) -> None:
        self.spec = spec
        self.capture_id = spec.capture_id
        self.downstream = FileDownstream(_file_path(spec.sink_uri), spec.start_ts)
        self.changelog = ChangeLog(changelog_path(spec.upstream_uri))
        self.prepare_ticks = prepare_ticks
        self.stop_ticks = stop_ticks
        self.barrier = Barrier(0)  # sink nothing until the owner says how far
        self.fenced_writes = 0
        self.tables: dict[int, _Table] = {}
        self.manifest = Path(spec.staging_dir) / "manifest.json"
        self.last_phase: dict[int, str] = {}  # what the last phase did per table (for logs)

    # ------------------------------------------------------------------ durability
    def load(self) -> None:
        """Read the manifest (if any); a sinking table's checkpoint catches up with the sink."""
        if not self.manifest.exists():
            return
        raw = json.loads(self.manifest.read_text())
        self.barrier = decode_barrier(raw["barrier"])
        self.fenced_writes = int(raw.get("fenced_writes", 0))
        self.tables = {int(t): _Table(**row) for t, row in raw["tables"].items()}
        for table_id, table in self.tables.items():
            if table.token and self.downstream.current_token(table_id) == table.token:
                # The sink's committed ts is the truth: a write landed before a crash.
                committed = self.downstream.committed(table_id)
                if committed > table.checkpoint_ts:
                    table.checkpoint_ts = committed
                    table.resolved_ts = max(table.resolved_ts, committed)

    def save(self) -> None:
        """Write the manifest atomically."""
        atomic_write_json(
            self.manifest,
            {
                "barrier": encode_barrier(self.barrier),
                "fenced_writes": self.fenced_writes,
                "tables": {str(t): row.to_json() for t, row in self.tables.items()},
            },
        )

    def errors(self) -> Mapping[int, str]:
        """Tables in an error state (never, for the fake)."""
        return {}

    def rows_applied(self) -> Mapping[int, int]:
        """The fake moves no rows: one per table and write, so reports carry a count."""
        return {t: row.writes for t, row in self.tables.items()}

    # ------------------------------------------------------------------ commands
    def prepare(self, table_id: int, checkpoint: Checkpoint) -> None:
        """Phase 1 starts: PREPARED after ``prepare_ticks`` pull phases."""
        if table_id in self.tables:
            raise ExecutorContractError(f"prepare of table {table_id}, which is held")
        start = checkpoint.checkpoint_ts
        table = _Table(state=int(T.PREPARING), checkpoint_ts=start, prepared_from=start)
        table.resolved_ts = max(start, self._upstream_resolved(table_id))
        table.countdown = self.prepare_ticks
        if self.prepare_ticks == 0:
            table.state = int(T.PREPARED)
        self.tables[table_id] = table

    def commit(self, table_id: int, checkpoint: Checkpoint) -> None:
        """Check the data is readable, take the fencing token, sink from the checkpoint."""
        table = self.tables.get(table_id)
        if table is None or table.state != T.PREPARED:
            raise ExecutorContractError(f"commit of table {table_id}: not PREPARED")
        start = checkpoint.checkpoint_ts
        if table.prepared_from > start:
            raise ExecutorContractError(
                f"table {table_id} prepared from {table.prepared_from} > commit checkpoint {start}"
            )
        committed = self.downstream.committed(table_id)
        if committed < start:
            raise ExecutorContractError(
                f"table {table_id}: downstream committed {committed} < commit checkpoint {start}"
            )
        table.token = self.downstream.acquire(table_id, self.capture_id)
        table.state = int(T.REPLICATING)
        # Never below what the downstream holds: a replay would rewrite newer rows.
        table.checkpoint_ts = max(start, committed)
        table.resolved_ts = max(table.resolved_ts, table.checkpoint_ts)

    def remove(self, table_id: int) -> None:
        """Begin stopping (idempotent)."""
        table = self.tables.get(table_id)
        if table is None or table.state in (T.STOPPING, T.STOPPED):
            return
        table.state = int(T.STOPPING)
        table.countdown = self.stop_ticks
        if self.stop_ticks == 0:
            table.state, table.token = int(T.STOPPED), 0

    def forget(self, table_id: int) -> None:
        """Drop a STOPPED table."""
        table = self.tables.get(table_id)
        if table is not None and table.state != T.STOPPED:
            raise ExecutorContractError(f"forget of table {table_id} in {T(table.state).name}")
        self.tables.pop(table_id, None)

    def set_barrier(self, barrier: Barrier) -> None:
        """Sinks will not pass ``barrier.barrier_ts(table_id)``."""
        self.barrier = barrier

    # ------------------------------------------------------------------ phases
    def _upstream_resolved(self, table_id: int) -> int:
        try:
            return self.changelog.table_resolved_ts(table_id)
        except ChangeLogError:
            return 0

    def pull_phase(self) -> None:
        """Phase 1 for every table: resolved ts from the change log; PREPARING -> PREPARED."""
        self.last_phase = {}
        for table_id, table in self.tables.items():
            if table.state == T.STOPPED:
                continue
            table.resolved_ts = max(table.resolved_ts, self._upstream_resolved(table_id))
            if table.state == T.PREPARING:
                table.countdown -= 1
                if table.countdown <= 0:
                    table.state = int(T.PREPARED)
            self.last_phase[table_id] = f"pulled to {table.resolved_ts}"

    def sink_phase(self) -> None:
        """Phase 2: sink up to min(resolved, barrier); STOPPING tables flush and stop."""
        self.last_phase = {}
        for table_id, table in self.tables.items():
            before = table.checkpoint_ts
            if table.state == T.REPLICATING:
                self._sink(table_id, table)
            elif table.state == T.STOPPING and (not table.token or self._sink(table_id, table)):
                table.countdown -= 1
                if table.countdown <= 0:
                    table.state, table.token = int(T.STOPPED), 0
            if table.checkpoint_ts != before:
                self.last_phase[table_id] = f"sank ({before}, {table.checkpoint_ts}]"
            assert table.checkpoint_ts <= table.resolved_ts, (table_id, self.capture_id)

    def advance(self) -> None:
        """Both phases (the TableExecutor interface)."""
        self.pull_phase()
        self.sink_phase()

    def _sink(self, table_id: int, table: _Table) -> bool:
        target = min(table.resolved_ts, self.barrier.barrier_ts(table_id))
        if target <= table.checkpoint_ts:
            return True
        if not self.downstream.write(table_id, table.token, target, self.capture_id):
            log.warning("capture %s: write of table %s fenced", self.capture_id, table_id)
            self.fenced_writes += 1
            table.state, table.token = int(T.STOPPED), 0
            return False
        table.checkpoint_ts = target
        table.writes += 1
        return True

    # ------------------------------------------------------------------ reports
    def status(self, table_id: int) -> TableStatus:
        """The table's status (ABSENT at 0 if not held)."""
        t = self.tables.get(table_id)
        if t is None:
            return TableStatus(table_id, T.ABSENT, Checkpoint(0, 0))
        return TableStatus(table_id, T(t.state), Checkpoint(t.checkpoint_ts, t.resolved_ts))

    def statuses(self) -> TableStatusBatch:
        """Every held table's status, in columns."""
        n = len(self.tables)
        rows = list(self.tables.values())
        return TableStatusBatch(
            np.fromiter(self.tables.keys(), np.int64, n),
            np.fromiter((t.state for t in rows), np.int64, n),
            np.fromiter((t.checkpoint_ts for t in rows), np.int64, n),
            np.fromiter((t.resolved_ts for t in rows), np.int64, n),
        )


def _file_path(uri: str) -> str:
    if not uri.startswith("file://"):
        raise ValueError(f"the fake downstream needs a file:///abs/path sink URI, got {uri!r}")
    return uri[len("file://") :]


def fake_executor_factory(spec: ExecutorSpec) -> DurableFakeExecutor:
    """The default factory for tests: a loaded DurableFakeExecutor (prepare, stop in one tick)."""
    ex = DurableFakeExecutor(spec)
    ex.load()
    return ex


def _check_file_uri(uri: str, parts: urllib.parse.SplitResult) -> None:
    if parts.netloc or not parts.path.startswith("/") or not parts.path.strip("/"):
        raise InvalidSinkUriError(f"the fake downstream needs file:///abs/path, got {uri!r}")


# The fake downstream's scheme, for changefeeds of tests that import this module.
register_sink_scheme(
    SinkScheme(
        ("file",), "file:///tmp/fake-downstream", _check_file_uri, lambda u: FakeSink(_file_path(u))
    )
)
