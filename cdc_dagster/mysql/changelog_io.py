"""The puller's use of the change log: the writer, rows in its layout, and removing an
unfinished flush."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from cdc_dagster.schema import TableSchema, arrow_type
from cdc_dagster.upstream.changelog import ChangeLogWriter


def writer(root: str | Path) -> ChangeLogWriter:
    """The shared change-log writer for ``root``."""
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


def change_rows(t: TableSchema, version: int, rows: list[tuple]) -> pa.Table:
    """Rows ``(ts, seq, op, after, before)`` in the change-log column layout."""
    arrays: dict[str, pa.Array] = {
        "_commit_ts": pa.array([r[0] for r in rows], pa.int64()),
        "_seq": pa.array([r[1] for r in rows], pa.int32()),
        "_op": pa.array([r[2] for r in rows], pa.int8()),
        "_schema_version": pa.array([version] * len(rows), pa.int64()),
    }
    for c in t.columns:
        arrays[f"c{c.id}"] = pa.array(
            [r[3].get(c.id) if r[3] is not None else None for r in rows], arrow_type(c.type)
        )
    for cid in t.primary_key:
        c = t.column(cid)
        arrays[f"b{cid}"] = pa.array(
            [r[4].get(cid) if r[4] is not None else None for r in rows], arrow_type(c.type)
        )
    return pa.table(arrays)
