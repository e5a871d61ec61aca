"""The puller's use of the change log: the shared writer, and removing an unfinished flush."""

from __future__ import annotations

from pathlib import Path

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
