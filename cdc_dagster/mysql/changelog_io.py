"""The change-log writer the puller uses: ``cdc_dagster.upstream.changelog`` when present.

Until the shared writer lands, ``MiniWriter`` writes format version 1 itself (the same
paths, atomic renames and fsyncs as docs/dataplane.md section 1), so the puller and its
tests do not wait on it. Only the writer's documented methods are used either way.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from cdc_dagster.upstream.schema import DdlRecord
from scheduler_core.ts import physical_ms


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex}"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class MiniWriter:
    """Format-v1 writer (data files, DDL records, resolved marks), atomic and fsynced."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        fmt = self.root / "FORMAT"
        if not fmt.exists():
            _atomic_write(
                fmt, json.dumps({"format": "cdc-dagster-changelog", "version": 1}).encode()
            )

    def write_ddl(self, record: DdlRecord) -> None:
        ddl_dir = self.root / "ddl"
        n = 0
        if ddl_dir.exists():
            n = len(list(ddl_dir.glob(f"{record.commit_ts:020d}-*.json")))
        for table_id in record.creates:
            schema = record.tables[table_id]
            meta = self.root / "tables" / str(table_id) / "meta.json"
            if not meta.exists():
                _atomic_write(
                    meta, json.dumps({"table_id": table_id, "shards": schema.shards}).encode()
                )
        _atomic_write(ddl_dir / f"{record.commit_ts:020d}-{n:04d}.json", record.dumps().encode())

    def write_rows(self, table_id: int, shard: int, schema_version: int, rows: pa.Table) -> None:
        if rows.num_rows == 0:
            return
        ts = rows.column("_commit_ts")
        first, last = pa.compute.min(ts).as_py(), pa.compute.max(ts).as_py()
        d = self.root / "tables" / str(table_id) / "data" / f"minute={physical_ms(first) // 60000}"
        d.mkdir(parents=True, exist_ok=True)
        name = f"{first:020d}-{last:020d}-s{shard}-{uuid.uuid4().hex[:8]}.parquet"
        tmp = d / f".{name}.tmp-{uuid.uuid4().hex}"
        pq.write_table(rows, tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, d / name)
        _fsync_dir(d)

    def advance_resolved(self, table_id: int, shard: int, ts: int) -> None:
        path = self.root / "tables" / str(table_id) / "resolved" / f"{shard}.json"
        if path.exists() and json.loads(path.read_text())["resolved_ts"] >= ts:
            return
        _atomic_write(path, json.dumps({"resolved_ts": ts}).encode())

    def advance_ddl_resolved(self, ts: int) -> None:
        path = self.root / "ddl" / "resolved.json"
        if path.exists() and json.loads(path.read_text())["resolved_ts"] >= ts:
            return
        _atomic_write(path, json.dumps({"resolved_ts": ts}).encode())


def writer(root: str | Path):
    """The shared ``ChangeLogWriter`` if it exists in this checkout, else ``MiniWriter``."""
    try:
        from cdc_dagster.upstream.changelog import ChangeLogWriter  # type: ignore[import-not-found]
    except ImportError:
        return MiniWriter(root)
    return ChangeLogWriter(root)


def data_file_last_ts(path: Path) -> int | None:
    """The ``last_ts`` in a data file's name (``<first>-<last>-s<shard>-<uuid>.parquet``)."""
    parts = path.name.split("-")
    try:
        return int(parts[1])
    except (IndexError, ValueError):
        return None


def truncate_above(root: str | Path, ts: int) -> int:
    """Remove data files and DDL records above ``ts`` (written by a flush whose position was
    never persisted: they will be written again). Nothing at or below ``ts`` is touched."""
    root = Path(root)
    removed = 0
    for f in root.glob("tables/*/data/*/*.parquet"):
        last = data_file_last_ts(f)
        first = int(f.name.split("-")[0]) if f.name[0].isdigit() else None
        if last is not None and first is not None and first > ts:
            f.unlink()
            removed += 1
    for f in root.glob("ddl/[0-9]*.json"):
        if int(f.name.split("-")[0]) > ts:
            f.unlink()
            removed += 1
    return removed
