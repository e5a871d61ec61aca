"""A tiny change log for runtime tests: tables created by DDL records, resolved marks moved."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from cdc_dagster.schema import ColumnSchema, DdlRecord, TableSchema
from cdc_dagster.testing.fake_runtime import FileDownstream
from cdc_dagster.upstream.changelog import ChangeLogWriter
from scheduler_core.ddl import DDLKind
from scheduler_core.ts import compose


def table(table_id: int, shards: int = 1) -> TableSchema:
    """A two-column table ``db.t<id>``."""
    cols = (ColumnSchema(1, "id", "int64", False), ColumnSchema(2, "v", "string", True))
    return TableSchema(table_id, "db", f"t{table_id}", cols, (1,), shards=shards)


class Upstream:
    """Writes create-table DDLs at ``t0`` and moves every table's resolved mark on demand."""

    def __init__(self, root: Path, tables: int, t0_ms: int | None = None) -> None:
        self.root = root
        self.writer = ChangeLogWriter(root)
        self.t0_ms = t0_ms if t0_ms is not None else int(time.time() * 1000) - 120_000
        self.table_ids = list(range(1, tables + 1))
        for tid in self.table_ids:
            self.create(tid, compose(self.t0_ms) + tid)
        self.resolved = compose(self.t0_ms) + 1000
        self.advance(self.resolved)

    @property
    def start_ts(self) -> int:
        """A changefeed start ts after every initial create."""
        return compose(self.t0_ms + 1)

    def create(self, table_id: int, commit_ts: int) -> DdlRecord:
        """A CREATE TABLE record for ``db.t<table_id>``."""
        schema = table(table_id)
        rec = DdlRecord(
            commit_ts,
            DDLKind.CREATE_TABLE,
            "create_table",
            f"CREATE TABLE db.t{table_id}",
            creates=(table_id,),
            tables={table_id: schema},
        )
        self.writer.write_ddl(rec)
        return rec

    def ts(self, ms: int) -> int:
        """The TS ``ms`` after t0."""
        return compose(self.t0_ms + ms)

    def advance(self, ts: int) -> None:
        """Every table (and the DDL stream) resolved up to ``ts``."""
        self.resolved = ts
        for tid in self.table_ids:
            self.writer.advance_resolved(tid, 0, ts)
        self.writer.advance_ddl_resolved(ts)


def change_rows(schema_version: int, changes: list[tuple[int, int, int, str | None]]) -> pa.Table:
    """Change-log rows of ``table()`` from ``(commit_ts, op, id, v)`` (op 1 insert, 2 update, 3 delete)."""
    n = len(changes)
    return pa.table(
        {
            "_commit_ts": pa.array([c[0] for c in changes], pa.int64()),
            "_seq": pa.array(range(n), pa.int32()),
            "_op": pa.array([c[1] for c in changes], pa.int8()),
            "_schema_version": pa.array([schema_version] * n, pa.int64()),
            "c1": pa.array([None if c[1] == 3 else c[2] for c in changes], pa.int64()),
            "c2": pa.array([None if c[1] == 3 else c[3] for c in changes], pa.string()),
            "b1": pa.array([c[2] if c[1] == 3 else None for c in changes], pa.int64()),
        }
    )


class RowUpstream(Upstream):
    """An Upstream that also writes rows each step, and an oracle of every table's content."""

    def __init__(self, root: Path, tables: int) -> None:
        super().__init__(root, tables)
        self.content: dict[int, dict[int, str]] = {t: {} for t in self.table_ids}
        self.step = 0

    def write_step(self) -> int:
        """One transaction per table: insert k, update k-1, delete k-3; resolved to it. Its ts."""
        self.step += 1
        k = self.step
        ts = self.ts(1000 + 500 * k)
        for tid in self.table_ids:
            rows = self.content[tid]
            changes: list[tuple[int, int, int, str | None]] = [(ts, 1, k, f"i{k}")]
            rows[k] = f"i{k}"
            if k - 1 in rows:
                changes.append((ts, 2, k - 1, f"u{k}"))
                rows[k - 1] = f"u{k}"
            if k - 3 in rows:
                changes.append((ts, 3, k - 3, None))
                del rows[k - 3]
            version = compose(self.t0_ms) + tid
            self.writer.write_rows(tid, 0, version, change_rows(version, changes))
        self.advance(ts)
        return ts


def check_downstream(sink_uri: str) -> dict[int, list[dict[str, Any]]]:
    """No double write: per table, accepted writes are contiguous, increasing, tokens non-decreasing."""
    ds = FileDownstream(sink_uri[len("file://") :])
    by_table: dict[int, list[dict[str, Any]]] = {}
    for w in ds.writes():
        by_table.setdefault(w["table_id"], []).append(w)
    for tid, writes in by_table.items():
        for a, b in itertools.pairwise(writes):
            assert b["start_ts"] == a["end_ts"], (tid, a, b)
            assert b["end_ts"] > a["end_ts"], (tid, a, b)
            assert b["token"] >= a["token"], (tid, a, b)
    return by_table
