"""A plain writer and reader of change-log format v1 (docs/dataplane.md section 1) for tests.

Written from the format's documentation with pyarrow only, so the pipeline's tests do not
depend on the producer's code path; ``ChangeLog`` from ``cdc_dagster.upstream.changelog`` is
used instead when it is present (see ``conftest.changelog_reader``).
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from cdc_dagster.upstream.schema import DdlRecord, TableSchema
from scheduler_core.ts import MAX_TS


@dataclass(frozen=True, slots=True)
class DataFile:
    path: str
    table_id: int
    shard: int
    first_ts: int
    last_ts: int


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


class Reader:
    """The read side the pipeline uses (the documented subset of ``ChangeLog``)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def ddl_records(self, after_ts: int = 0, upto_ts: int = MAX_TS) -> list[DdlRecord]:
        out = []
        d = self.root / "ddl"
        for name in sorted(os.listdir(d)) if d.is_dir() else []:
            if name.startswith(".") or name == "resolved.json":
                continue
            ts = int(name.split("-")[0])
            if after_ts < ts <= upto_ts:
                out.append(DdlRecord.from_json(json.loads((d / name).read_text())))
        return out

    def schema_at(self, table_id: int, ts: int) -> TableSchema | None:
        schema = None
        for r in self.ddl_records(0, ts):
            if table_id in r.tables:
                schema = r.tables[table_id]
        return schema

    def table_resolved_ts(self, table_id: int) -> int:
        meta = json.loads((self.root / "tables" / str(table_id) / "meta.json").read_text())
        marks = []
        for shard in range(meta["shards"]):
            p = self.root / "tables" / str(table_id) / "resolved" / f"{shard}.json"
            marks.append(json.loads(p.read_text())["resolved_ts"] if p.exists() else 0)
        return min(marks)

    def data_files(self, table_id: int, after_ts: int, upto_ts: int) -> list[DataFile]:
        out = []
        base = self.root / "tables" / str(table_id) / "data"
        for dirpath, _dirs, names in os.walk(base):
            for name in names:
                if name.startswith(".") or not name.endswith(".parquet"):
                    continue
                first, last, shard = name.split("-")[:3]
                f = DataFile(
                    os.path.join(dirpath, name), table_id, int(shard[1:]), int(first), int(last)
                )
                if f.last_ts > after_ts and f.first_ts <= upto_ts:
                    out.append(f)
        return sorted(out, key=lambda f: (f.first_ts, f.shard, f.path))


def changelog_reader(root: str | os.PathLike[str]) -> Any:
    """The upstream's ChangeLog when it exists, else this module's plain reader of format v1."""
    try:
        from cdc_dagster.upstream.changelog import ChangeLog
    except ImportError:
        return Reader(root)
    return ChangeLog(str(root))
