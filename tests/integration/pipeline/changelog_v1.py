"""A plain writer of change-log format v1 (docs/dataplane.md section 1) for tests.

Written from the format's documentation with pyarrow only: the pipeline's tests do not go
through the producer's writer (which refuses the damaged files the bad-input tests need),
and the upstream's ``ChangeLog`` reading what it wrote cross-checks the format.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from cdc_dagster.schema import DdlRecord
from cdc_dagster.upstream.changelog import ChangeLog


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.write_bytes(data)
    os.replace(tmp, path)


class Writer:
    """The write side of the format (what a producer does)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        _atomic_write(self.root / "FORMAT", b'{"format": "cdc-dagster-changelog", "version": 1}')
        self._n: dict[int, int] = {}

    def write_ddl(self, record: DdlRecord) -> None:
        n = self._n.get(record.commit_ts, 0)
        self._n[record.commit_ts] = n + 1
        for t in record.creates:
            schema = record.tables[t]
            meta = json.dumps({"table_id": t, "shards": schema.shards}).encode()
            _atomic_write(self.root / "tables" / str(t) / "meta.json", meta)
        name = f"{record.commit_ts:020d}-{n:04d}.json"
        _atomic_write(self.root / "ddl" / name, record.dumps().encode())

    def write_rows(self, table_id: int, shard: int, schema_version: int, rows: pa.Table) -> str:
        ts = rows.column("_commit_ts").to_pylist()
        first, last = min(ts), max(ts)
        minute = (first >> 18) // 60000
        d = self.root / "tables" / str(table_id) / "data" / f"minute={minute}"
        d.mkdir(parents=True, exist_ok=True)
        rows = rows.append_column(
            "_schema_version", pa.array([schema_version] * rows.num_rows, pa.int64())
        )
        path = d / f"{first:020d}-{last:020d}-s{shard}-{uuid.uuid4().hex[:8]}.parquet"
        tmp = d / f".{path.name}.tmp-x"
        pq.write_table(rows, tmp)
        os.replace(tmp, path)
        return str(path)

    def advance_resolved(self, table_id: int, shard: int, ts: int) -> None:
        path = self.root / "tables" / str(table_id) / "resolved" / f"{shard}.json"
        _atomic_write(path, json.dumps({"resolved_ts": ts}).encode())

    def advance_ddl_resolved(self, ts: int) -> None:
        _atomic_write(self.root / "ddl" / "resolved.json", json.dumps({"resolved_ts": ts}).encode())


def changelog_reader(root: str | os.PathLike[str]) -> ChangeLog:
    """The upstream's reader over what this writer wrote (a cross-check of the format)."""
    return ChangeLog(root)
