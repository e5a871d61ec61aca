"""The change log, format version 2 (docs/dataplane.md sections 1-2): reader, writer, GC.

A directory tree of Parquet data files, resolved marks and DDL records. Every file is
written under a dot-prefixed temporary name in its own directory, fsynced, then renamed
into place, so a reader never sees a partial file. Readers validate what they read: a
malformed or vanished file is a typed ``ChangeLogError`` naming the file and what to do.

Data files come in two kinds: rows in the data-file layout (``.parquet``), and binlog row
events as a thin puller read them (``.binlog.parquet``, version 2), which
``read_data_file`` mounts into the same layout (``upstream.binlog_rows``). A version 1 log
(rows only) is read as it is; a writer moves it to version 2 with its first event file.
"""

from __future__ import annotations

import bisect
import datetime as dt
import fcntl
import gc
import io
import itertools
import json
import os
import re
import socket
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from cdc_dagster.schema import (
    ColumnSchema,
    DdlRecord,
    IndexSchema,
    SchemaError,
    TableSchema,
    arrow_type,
)
from cdc_dagster.text import shorten
from cdc_dagster.upstream.binlog_rows import (
    EVENT_SCHEMA,
    FLAVOR_KEY,
    FLAVORS,
    BinlogRowsError,
    mount_events,
)
from scheduler_core.ts import LOGICAL_BITS, MAX_TS, physical_ms

__all__ = [
    "CHUNKS_WRITTEN",
    "OP_DELETE",
    "OP_INSERT",
    "OP_UPDATE",
    "READING_S",
    "ChangeLog",
    "ChangeLogError",
    "ChangeLogLockedError",
    "ChangeLogWriter",
    "ColumnSchema",
    "CorruptChangeLogError",
    "DataFile",
    "DdlOrderError",
    "DdlRecord",
    "IndexSchema",
    "MissingChangeLogFileError",
    "ResolvedRegressionError",
    "RowSchemaMismatchError",
    "TableSchema",
    "UnknownTableError",
    "arrow_type",
    "data_file_schema",
    "fsync_path",
    "snapshot_bell",
    "snapshot_reading",
    "write_json",
]

FORMAT_NAME = "cdc-dagster-changelog"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
OP_INSERT, OP_UPDATE, OP_DELETE = 1, 2, 3
_MINUTE_MS = 60_000
_DDL_NAME = re.compile(r"(\d{20})-(\d{4})\.json")
_DATA_NAME = re.compile(r"(\d{20})-(\d{20})-s(\d+)-([0-9a-f]{8})(\.binlog)?\.parquet")
BINLOG_SUFFIX = ".binlog.parquet"
# How binlog event files are written: lz4, dictionaries only where values repeat (a table
# map, an op). pyarrow's defaults (snappy, a dictionary tried on every column, on the row
# images too) took up to twice the time to write and 2-4x to read: 117k sysbench events,
# four files, 146-155 ms to write and 130-210 ms to read against 74-117 and 42-65 (23 MB
# against 20); the puller's flush stops its reading, and the captures read every file.
BINLOG_WRITE_OPTIONS: dict[str, Any] = {
    "compression": "lz4",
    "use_dictionary": ["_table_map", "_op", "_schema_version"],
}
_MINUTE_DIR = re.compile(r"minute=(\d+)")
_TAG = re.compile(r"[0-9a-f]{8}")
_TEMP_NAME = re.compile(r"\..+\.tmp-[0-9a-f]{32}")
LOCK_NAME = ".writer.lock"
_META_COLUMNS: tuple[tuple[str, pa.DataType], ...] = (
    ("_commit_ts", pa.int64()),
    ("_seq", pa.int32()),
    ("_op", pa.int8()),
    ("_schema_version", pa.int64()),
)


# ----------------------------------------------------------------------------- errors
class ChangeLogError(Exception):
    """Base of the change log's errors; the message names the file or table and what to do."""


class CorruptChangeLogError(ChangeLogError):
    """A change-log file exists but cannot be read or breaks the format."""


class MissingChangeLogFileError(ChangeLogError):
    """A change-log file that must exist is gone (not written yet, deleted, or GC'd)."""


class UnknownTableError(ChangeLogError):
    """The table has no ``meta.json``: no create_table DDL for it was written."""


class ResolvedRegressionError(ChangeLogError):
    """A resolved mark would go back."""


class RowSchemaMismatchError(ChangeLogError):
    """Rows handed to the writer do not fit the declared schema version."""


class DdlOrderError(ChangeLogError):
    """A DDL record arrives at or below what the log already promised for its tables."""


class ChangeLogLockedError(ChangeLogError):
    """Another writer holds the log's writer lock (one writer per change log)."""


# ----------------------------------------------------------------------------- records
@dataclass(frozen=True, slots=True)
class DataFile:
    """One data file: rows of one table, shard and schema version with first_ts..last_ts
    (``kind``: "rows" in the data-file layout, or "binlog" row events to mount)."""

    path: str
    table_id: int
    shard: int
    first_ts: int
    last_ts: int

    @property
    def kind(self) -> str:
        return "binlog" if self.path.endswith(BINLOG_SUFFIX) else "rows"


def data_file_schema(table: TableSchema) -> pa.Schema:
    """The exact Arrow schema of a data file for ``table`` (meta, ``c<id>``, ``b<pk id>``)."""
    fields = [pa.field(name, typ, nullable=False) for name, typ in _META_COLUMNS]
    fields += [pa.field(f"c{c.id}", c.arrow) for c in table.columns]
    fields += [pa.field(f"b{c.id}", c.arrow) for c in table.key_columns]
    return pa.schema(fields)


# ----------------------------------------------------------------------------- file helpers
def _atomic_write(path: Path, data: bytes, *, fsync: bool = True) -> None:
    """Write ``data`` to ``path`` so that a reader sees the old file, the new one, or none.

    ``fsync=False`` keeps the atomic rename but skips the flushes to disk: for tests and
    benchmarks, where a machine crash need not be survived.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if fsync:
        fsync_path(path.parent)


def fsync_path(path: str | os.PathLike[str]) -> None:
    """Flush a file's or a directory's data and metadata to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json(path: Path, obj: Any, *, fsync: bool = True) -> None:
    """Write ``obj`` as JSON to ``path`` atomically (temp name, rename; fsync unless told not)."""
    data = json.dumps(obj, ensure_ascii=False, sort_keys=True).encode()
    _atomic_write(path, data, fsync=fsync)


def _read_json(path: Path, *, missing_ok: bool = False) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if missing_ok:
            return None
        raise MissingChangeLogFileError(
            f"change-log file {path} is missing; check the producer wrote it and nothing deleted it"
        ) from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise CorruptChangeLogError(
            f"change-log file {path} is not valid JSON ({exc}); restore it from the producer "
            "or rewrite it (the format is in docs/dataplane.md section 1)"
        ) from exc


def _read_ts_mark(path: Path) -> int:
    obj = _read_json(path, missing_ok=True)
    if obj is None:
        return 0
    ts = obj.get("resolved_ts") if isinstance(obj, dict) else None
    if type(ts) is not int or not 0 <= ts <= MAX_TS:
        raise CorruptChangeLogError(
            f"resolved mark {path} holds {obj!r}, expected {{'resolved_ts': <int TS>}}; "
            "rewrite it with the producer's last durable resolved ts"
        )
    return ts


def _check_ts_arg(name: str, value: int) -> None:
    if type(value) is not int or not 0 <= value <= MAX_TS:
        raise ValueError(f"{name} must be an int TS in [0, 2^63), got {value!r}")


def _scandir(path: Path) -> Iterator[os.DirEntry[str]]:
    try:
        with os.scandir(path) as it:
            yield from (e for e in it if not e.name.startswith("."))
    except FileNotFoundError:
        return


# ----------------------------------------------------------------------------- reader
class ChangeLog:
    """Read side of the change log at ``root``; also GC. Caches parsed DDL records."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self._check_format()
        self._ddl_names: frozenset[str] = frozenset()
        self._ddl_cache: dict[str, DdlRecord] = {}
        self._records: list[DdlRecord] = []
        # table id -> (commit ts list, schema-after list), ascending: the schema history.
        self._history: dict[int, tuple[list[int], list[TableSchema | None]]] = {}
        # Set by the one ChangeLogWriter of this log: it tells us of every DDL it writes,
        # so the directory need not be listed again on each call.
        self._sole_writer = False

    def _check_format(self) -> None:
        path = self.root / "FORMAT"
        obj = _read_json(path)
        if not (
            isinstance(obj, dict)
            and obj.get("format") == FORMAT_NAME
            and obj.get("version") in READABLE_VERSIONS
            and len(obj) == 2
        ):
            raise CorruptChangeLogError(
                f"{path} holds {obj!r}, expected {{'format': {FORMAT_NAME!r}, 'version': 1 or "
                f"2}}: {self.root} is not a change log of format version 1 or 2; point the "
                "reader at the right directory (or upgrade the reader)"
            )
        self.version = obj["version"]

    # ------------------------------------------------------------------ DDL log
    def ddl_records(self, after_ts: int = 0, upto_ts: int = MAX_TS) -> list[DdlRecord]:
        """DDL records with commit_ts in (after_ts, upto_ts], in log order."""
        records = self._refresh_ddl()
        keys = [r.commit_ts for r in records]
        return records[bisect.bisect_right(keys, after_ts) : bisect.bisect_right(keys, upto_ts)]

    def ddl_resolved_ts(self) -> int:
        """No DDL with commit_ts <= this is still to come (0 when no mark was written)."""
        return _read_ts_mark(self.root / "ddl" / "resolved.json")

    def schema_at(self, table_id: int, ts: int) -> TableSchema | None:
        """Table ``table_id``'s schema valid at ``ts``; None when it does not exist then."""
        entry = self._history_entry(table_id, ts)
        return None if entry is None else entry[1]

    def schema_version_at(self, table_id: int, ts: int) -> int | None:
        """The commit ts of the DDL record giving the schema at ``ts`` (None: no table then)."""
        entry = self._history_entry(table_id, ts)
        return None if entry is None or entry[1] is None else entry[0]

    def tables_at(self, ts: int) -> dict[int, TableSchema]:
        """Every table existing at ``ts`` with its schema then."""
        self._refresh_ddl()
        out: dict[int, TableSchema] = {}
        for table_id in self._history:
            schema = self.schema_at(table_id, ts)
            if schema is not None:
                out[table_id] = schema
        return out

    def _history_entry(self, table_id: int, ts: int) -> tuple[int, TableSchema | None] | None:
        self._refresh_ddl()
        hist = self._history.get(table_id)
        if hist is None:
            return None
        i = bisect.bisect_right(hist[0], ts) - 1
        return None if i < 0 else (hist[0][i], hist[1][i])

    def _refresh_ddl(self) -> list[DdlRecord]:
        # Listing the directory is cheap; only names not seen before are parsed.
        if self._sole_writer:
            return self._records
        ddl_dir = self.root / "ddl"
        names = frozenset(e.name for e in _scandir(ddl_dir) if _DDL_NAME.fullmatch(e.name))
        if names == self._ddl_names:
            return self._records
        for name in names - self._ddl_cache.keys():
            self._ddl_cache[name] = self._parse_ddl(ddl_dir / name)
        for name in self._ddl_cache.keys() - names:
            del self._ddl_cache[name]
        self._ddl_names = names
        self._records = [self._ddl_cache[n] for n in sorted(names)]
        self._history = {}
        for rec in self._records:
            for table_id, schema in rec.tables.items():
                ts_list, schemas = self._history.setdefault(table_id, ([], []))
                ts_list.append(rec.commit_ts)
                schemas.append(schema)
        return self._records

    def _written(self, name: str, record: DdlRecord) -> None:
        """The writer renamed ``name`` into place: add it without listing the directory."""
        self._ddl_names = self._ddl_names | {name}
        self._ddl_cache[name] = record
        self._records.append(record)  # the writer appends in commit-ts order only
        for table_id, schema in record.tables.items():
            ts_list, schemas = self._history.setdefault(table_id, ([], []))
            ts_list.append(record.commit_ts)
            schemas.append(schema)

    @staticmethod
    def _parse_ddl(path: Path) -> DdlRecord:
        obj = _read_json(path)
        try:
            record = DdlRecord.from_json(obj)
        except (SchemaError, ValueError) as exc:
            raise CorruptChangeLogError(
                f"DDL record {path} is malformed ({exc}); fix or rewrite it from the producer"
            ) from exc
        m = _DDL_NAME.fullmatch(path.name)
        if m is None or int(m.group(1)) != record.commit_ts:
            raise CorruptChangeLogError(
                f"DDL record {path} holds commit_ts {record.commit_ts}, but its name says "
                f"{m.group(1) if m else '?'}; rename or rewrite it"
            )
        return record

    # ------------------------------------------------------------------ resolved marks
    def shards(self, table_id: int) -> int:
        """The table's shard count from ``meta.json``."""
        path = self.root / "tables" / str(table_id) / "meta.json"
        if not path.exists():
            raise UnknownTableError(
                f"table {table_id} has no {path}: no create_table DDL was written for it; "
                "write its create_table record first"
            )
        obj = _read_json(path)
        shards = obj.get("shards") if isinstance(obj, dict) else None
        if type(shards) is not int or shards < 1 or obj.get("table_id") != table_id:
            raise CorruptChangeLogError(
                f"{path} holds {obj!r}, expected {{'table_id': {table_id}, 'shards': <int >= 1>}}"
            )
        return shards

    def shard_resolved_ts(self, table_id: int, shard: int) -> int:
        """Resolved ts of one shard (0 when it has no mark yet)."""
        return _read_ts_mark(self._resolved_path(table_id, shard))

    def table_resolved_ts(self, table_id: int) -> int:
        """The table's resolved ts: the min over its shards (a missing mark counts as 0)."""
        return min(self.shard_resolved_ts(table_id, s) for s in range(self.shards(table_id)))

    def _resolved_path(self, table_id: int, shard: int) -> Path:
        return self.root / "tables" / str(table_id) / "resolved" / f"{shard}.json"

    # ------------------------------------------------------------------ data files
    def data_files(self, table_id: int, after_ts: int, upto_ts: int) -> list[DataFile]:
        """Data files that may hold rows with commit_ts in (after_ts, upto_ts], by first_ts."""
        _check_ts_arg("after_ts", after_ts)
        _check_ts_arg("upto_ts", upto_ts)
        if upto_ts <= after_ts:
            return []
        # A file never spans a minute boundary, so the minute prunes both ends.
        lo, hi = physical_ms(after_ts) // _MINUTE_MS, physical_ms(upto_ts) // _MINUTE_MS
        files = [
            f
            for f in self._all_files(table_id, lo, hi)
            if f.last_ts > after_ts and f.first_ts <= upto_ts
        ]
        return sorted(files, key=lambda f: (f.first_ts, f.shard, f.path))

    def _all_files(self, table_id: int, lo_minute: int, hi_minute: int) -> Iterator[DataFile]:
        data_dir = self.root / "tables" / str(table_id) / "data"
        for d in _scandir(data_dir):
            m = _MINUTE_DIR.fullmatch(d.name)
            if m is None:
                raise CorruptChangeLogError(
                    f"unexpected entry {d.path} in a data directory (want minute=<n>); move it away"
                )
            if lo_minute <= int(m.group(1)) <= hi_minute:
                yield from (self._parse_name(table_id, f.path) for f in _scandir(Path(d.path)))

    @staticmethod
    def _parse_name(table_id: int, path: str) -> DataFile:
        m = _DATA_NAME.fullmatch(os.path.basename(path))
        if m is None or int(m.group(1)) > int(m.group(2)):
            raise CorruptChangeLogError(
                f"unexpected file {path} in a data directory (want "
                "<first_ts:020d>-<last_ts:020d>-s<shard>-<uuid8>[.binlog].parquet); move it away"
            )
        return DataFile(path, table_id, int(m.group(3)), int(m.group(1)), int(m.group(2)))

    def read_data_file(self, file: DataFile) -> pa.Table:
        """The rows of ``file`` in the data-file layout, validated against its name and the
        format's meta columns (binlog event files are mounted here)."""
        if file.kind == "binlog":
            events, flavor = self.read_binlog_events(file)
            table = self._mount(file, events, flavor)
        else:
            table = _read_parquet(file)
            if "_commit_ts" not in table.column_names and file.first_ts == file.last_ts:
                # a file adopted at one ts (a snapshot chunk): its name says the rows' ts
                ts = pa.array(np.full(table.num_rows, file.first_ts, np.int64))
                table = table.add_column(0, "_commit_ts", ts)
        _check_data_file(file, table)
        return table

    def read_binlog_events(self, file: DataFile) -> tuple[pa.Table, str]:
        """The binlog row events of a ``.binlog.parquet`` file as written, and the upstream's
        flavor ("mariadb" / "mysql"), validated against the event layout and its name."""
        table = _read_parquet(file)
        meta = table.schema.metadata or {}
        flavor = meta.get(FLAVOR_KEY, b"").decode()
        if table.schema.remove_metadata() != EVENT_SCHEMA or flavor not in FLAVORS:
            raise CorruptChangeLogError(
                f"binlog event file {file.path} of table {file.table_id} has columns "
                f"{table.schema.names} (flavor {flavor!r}), expected {EVENT_SCHEMA.names} and "
                f"a flavor of {FLAVORS}; restore it from the producer or rewrite that range"
            )
        _check_ts_range(file, table)
        return table, flavor

    def _mount(self, file: DataFile, events: pa.Table, flavor: str) -> pa.Table:
        versions = pc.unique(events["_schema_version"]).to_pylist()
        schema = self.schema_at(file.table_id, versions[0]) if len(versions) == 1 else None
        if schema is None or self.schema_version_at(file.table_id, versions[0]) != versions[0]:
            raise CorruptChangeLogError(
                f"binlog event file {file.path} of table {file.table_id}: schema versions "
                f"{versions} are not one DDL record's commit ts of that table; rewrite the file"
            )
        try:
            return mount_events(events, schema, flavor)
        except BinlogRowsError as exc:
            raise CorruptChangeLogError(
                f"binlog event file {file.path}: {exc}; fix the schema history or rewrite "
                "that commit-ts range"
            ) from exc

    # ------------------------------------------------------------------ GC
    def gc_safepoint(self) -> int:
        """The highest safepoint ``gc`` was called with (0: never): history below it may be gone."""
        obj = _read_json(self.root / "gc.json", missing_ok=True)
        ts = obj.get("safepoint_ts") if isinstance(obj, dict) else 0 if obj is None else None
        if type(ts) is not int or ts < 0:
            raise CorruptChangeLogError(
                f"{self.root / 'gc.json'} holds {obj!r}, expected {{'safepoint_ts': <int TS>}}"
            )
        return ts

    def gc(self, safepoint_ts: int) -> int:
        """Delete data files with last_ts <= ``safepoint_ts`` (nothing else); how many went."""
        _check_ts_arg("safepoint_ts", safepoint_ts)
        if safepoint_ts > self.gc_safepoint():  # recorded first: a crash mid-GC still says so
            write_json(self.root / "gc.json", {"safepoint_ts": safepoint_ts})
        hi = physical_ms(safepoint_ts) // _MINUTE_MS
        deleted = 0
        for t in _scandir(self.root / "tables"):
            if not t.name.isdigit():
                continue
            for f in list(self._all_files(int(t.name), 0, hi)):
                if f.last_ts <= safepoint_ts:
                    Path(f.path).unlink(missing_ok=True)
                    deleted += 1
        return deleted


def _read_parquet(file: DataFile) -> pa.Table:
    try:
        # ParquetFile, not read_table: no dataset discovery, ~4x faster on small files.
        with pq.ParquetFile(file.path) as f:
            return f.read(use_threads=False)
    except FileNotFoundError:
        raise MissingChangeLogFileError(
            f"data file {file.path} of table {file.table_id} is missing (deleted or GC'd "
            "below a checkpoint that still needs it); restore it or restart the changefeed "
            "above the GC safepoint"
        ) from None
    except (pa.ArrowException, OSError) as exc:
        raise CorruptChangeLogError(
            f"data file {file.path} of table {file.table_id} cannot be read ({shorten(exc)}); "
            "restore it from the producer or rewrite that commit-ts range"
        ) from exc


def _column_range(meta: pq.FileMetaData, name: str) -> tuple[Any, Any] | None:
    """(min, max) of a column from a Parquet file's statistics (None: not recorded)."""
    i = meta.schema.names.index(name)
    lo = hi = None
    for g in range(meta.num_row_groups):
        st = meta.row_group(g).column(i).statistics
        if st is None or not st.has_min_max:
            return None
        lo = st.min if lo is None else min(lo, st.min)
        hi = st.max if hi is None else max(hi, st.max)
    return lo, hi


def _check_ts_range(file: DataFile, table: pa.Table) -> None:
    if table.num_rows == 0 or table["_commit_ts"].null_count:
        raise CorruptChangeLogError(
            f"data file {file.path} of table {file.table_id}: no rows, or a null _commit_ts; "
            "restore it from the producer or rewrite that commit-ts range"
        )
    lo, hi = pc.min_max(table["_commit_ts"]).values()
    if lo.as_py() < file.first_ts or hi.as_py() > file.last_ts:
        raise CorruptChangeLogError(
            f"data file {file.path} of table {file.table_id}: _commit_ts spans "
            f"{lo.as_py()}..{hi.as_py()}, outside its name's {file.first_ts}..{file.last_ts}; "
            "restore it from the producer or rewrite that commit-ts range"
        )


def _check_data_file(file: DataFile, table: pa.Table) -> None:
    def corrupt(what: str) -> CorruptChangeLogError:
        return CorruptChangeLogError(
            f"data file {file.path} of table {file.table_id}: {what}; restore it from the "
            "producer or rewrite that commit-ts range"
        )

    for name, typ in _META_COLUMNS:
        if name not in table.column_names or table.schema.field(name).type != typ:
            raise corrupt(f"column {name} missing or not {typ}")
        if table[name].null_count:
            raise corrupt(f"column {name} has nulls")
    _check_ts_range(file, table)


# ----------------------------------------------------------------------------- writer
META_WRITERS = 8  # threads writing many created tables' meta files (``write_ddls``)


class ChangeLogWriter:
    """Write side (generator, binlog puller): DDL records, data files, resolved marks.

    One writer per change log at a time: it holds ``<root>/.writer.lock`` (an exclusive
    ``flock``, released by ``close()`` or when its process dies, SIGKILL included), and a
    second writer gets ``ChangeLogLockedError`` naming the holder. Holding the lock, it
    deletes temp files a killed writer left (``.<name>.tmp-<uuid>``; never data files).
    It refuses what would break a reader's assumptions: rows not fitting their schema
    version, rows at or below a shard's resolved mark, a DDL at or below what was
    promised, a resolved mark going back.
    """

    def __init__(self, root: str | os.PathLike[str], *, fsync: bool = True) -> None:
        self.root = Path(root)
        self.fsync = fsync
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = _acquire_lock(self.root)
        try:
            self._open()
        except BaseException:
            self.close()
            raise

    def _open(self) -> None:
        self.temp_files_removed = _remove_temp_files(self.root)
        fmt = self.root / "FORMAT"
        if not fmt.exists():
            write_json(fmt, {"format": FORMAT_NAME, "version": FORMAT_VERSION})
        (self.root / "ddl").mkdir(parents=True, exist_ok=True)
        (self.root / "tables").mkdir(parents=True, exist_ok=True)
        self.log = ChangeLog(self.root)
        self.log.ddl_records()
        self.log._sole_writer = True
        self._max_row_ts: dict[int, int] = {}

    def close(self) -> None:
        """Release the writer lock; the writer must not be used after this."""
        lock, self._lock = getattr(self, "_lock", None), None
        if lock is not None:
            lock.close()  # closing the descriptor releases the flock

    def __enter__(self) -> ChangeLogWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ restart
    def resolved_frontier(self) -> int:
        """The max over the DDL mark and every shard mark: what a producer promised last."""
        top = self.log.ddl_resolved_ts()
        for t in _scandir(self.root / "tables"):
            for e in _scandir(Path(t.path) / "resolved"):
                top = max(top, _read_ts_mark(Path(e.path)))
        return top

    def discard_above(self, ts: int) -> int:
        """Delete every row with commit_ts > ``ts``; the highest commit ts removed (0: none).

        For a producer restarting after a crash: rows above every resolved mark were never
        promised to a reader, and may belong to transactions it wrote only in part. A file
        holding rows on both sides is rewritten with the rows <= ``ts`` first (equal rows,
        allowed by the format), then removed. DDL records are kept (each is whole).
        """
        frontier = self.resolved_frontier()
        if ts < frontier:
            raise ResolvedRegressionError(
                f"{self.root}: cannot discard rows above {ts}: a resolved mark is at "
                f"{frontier}; rows at or below a mark are promised, pass ts >= {frontier}"
            )
        top_minute = physical_ms(MAX_TS) // _MINUTE_MS
        removed = 0
        for t in _scandir(self.root / "tables"):
            if not t.name.isdigit():
                continue
            files = self.log._all_files(int(t.name), physical_ms(ts) // _MINUTE_MS, top_minute)
            for f in [f for f in files if f.last_ts > ts]:
                if f.first_ts <= ts and f.kind == "binlog":
                    events, flavor = self.log.read_binlog_events(f)
                    keep = events.filter(pc.less_equal(events["_commit_ts"], ts))
                    self._write_file(f.table_id, f.shard, keep, flavor)
                elif f.first_ts <= ts:
                    rows = self.log.read_data_file(f)
                    keep = rows.filter(pc.less_equal(rows["_commit_ts"], ts))
                    self._write_file(f.table_id, f.shard, keep)
                Path(f.path).unlink()
                removed = max(removed, f.last_ts)
        return removed

    # ------------------------------------------------------------------ DDL
    def write_ddl(self, record: DdlRecord) -> Path:
        """Append a DDL record (idempotent for an identical record); create tables' meta.json."""
        return self._write_ddl(record, check=True)

    def _write_ddl(self, record: DdlRecord, check: bool) -> Path:
        """``write_ddl``; ``check``: its order checked here (False: checked by the caller)."""
        same_ts = self.log.ddl_records(record.commit_ts - 1, record.commit_ts)
        if record in same_ts:
            return self.root / "ddl" / _ddl_name(record.commit_ts, same_ts.index(record))
        if check:
            self._check_ddl_order(record)
        for table_id in record.creates:
            self._write_meta(record, table_id)
        path = self.root / "ddl" / _ddl_name(record.commit_ts, len(same_ts))
        _atomic_write(path, record.dumps().encode(), fsync=self.fsync)
        self.log._written(path.name, record)
        return path

    def write_ddls(self, records: list[DdlRecord]) -> list[Path]:
        """``write_ddl`` of each record, in order, for records that create many tables at
        once (a changefeed's start): once every record is checked, the created tables'
        ``meta.json`` files are written by a few threads first (two fsyncs each, one after
        another most of a 100-table start under load), then the records."""
        for before, record in itertools.pairwise(records):
            if record.commit_ts < before.commit_ts:
                raise DdlOrderError(
                    f"DDL {record.query!r} at commit_ts {record.commit_ts} is below the one "
                    f"before it ({before.commit_ts}); write DDLs in commit-ts order"
                )
        for record in records:
            if record not in self.log.ddl_records(record.commit_ts - 1, record.commit_ts):
                self._check_ddl_order(record)  # (one written already: ``write_ddl`` skips it)
        creates = [(r, tid) for r in records for tid in r.creates]
        if len(creates) > 1:
            with ThreadPoolExecutor(min(META_WRITERS, len(creates))) as pool:
                list(pool.map(lambda c: self._write_meta(*c), creates))
        return [self._write_ddl(record, check=False) for record in records]

    def _write_meta(self, record: DdlRecord, table_id: int) -> None:
        """A created table's ``meta.json`` (its shards), unless it has one."""
        schema = record.tables[table_id]
        assert schema is not None  # DdlRecord checks a created table has a schema
        meta = self.root / "tables" / str(table_id) / "meta.json"
        if not meta.exists():
            write_json(meta, {"table_id": table_id, "shards": schema.shards}, fsync=self.fsync)

    def _check_ddl_order(self, record: DdlRecord) -> None:
        ddl_resolved = self.log.ddl_resolved_ts()
        if record.commit_ts <= ddl_resolved:
            raise DdlOrderError(
                f"DDL {record.query!r} at commit_ts {record.commit_ts} is at or below the DDL "
                f"log's resolved ts {ddl_resolved}; a producer must write DDLs before resolving"
            )
        last = self.log.ddl_records()[-1:]
        if last and record.commit_ts < last[0].commit_ts:
            raise DdlOrderError(
                f"DDL {record.query!r} at commit_ts {record.commit_ts} is below the last DDL "
                f"record ({last[0].commit_ts}); write DDLs in commit-ts order"
            )
        for table_id in (*record.table_ids, *record.creates):
            floor = self._table_floor(table_id)
            if record.commit_ts <= floor:
                raise DdlOrderError(
                    f"DDL {record.query!r} at commit_ts {record.commit_ts} touches table "
                    f"{table_id}, which already has rows or a resolved mark at {floor}; write "
                    "each DDL before any row or resolved mark above it"
                )

    def _table_floor(self, table_id: int) -> int:
        floor = self._max_row_ts.get(table_id, 0)
        resolved_dir = self.root / "tables" / str(table_id) / "resolved"
        for e in _scandir(resolved_dir):
            floor = max(floor, _read_ts_mark(Path(e.path)))
        return floor

    def advance_ddl_resolved(self, ts: int) -> None:
        """Promise no DDL with commit_ts <= ``ts`` is still to come."""
        self._advance_mark(self.root / "ddl" / "resolved.json", ts, "the DDL log", self.fsync)

    # ------------------------------------------------------------------ rows
    def write_rows(
        self, table_id: int, shard: int, schema_version: int, rows: pa.Table
    ) -> list[DataFile]:
        """Write rows of one table, shard and schema version (one file per minute touched)."""
        if rows.num_rows == 0:
            return []
        schema = self._check_target(table_id, shard, schema_version)
        rows = _conform(schema, schema_version, rows)
        self._check_rows_in_version(schema, shard, schema_version, rows)
        rows = rows.sort_by([("_commit_ts", "ascending"), ("_seq", "ascending")])
        out = [self._write_file(table_id, shard, part) for part in _split_by_minute(rows)]
        hi = out[-1].last_ts
        self._max_row_ts[table_id] = max(self._max_row_ts.get(table_id, 0), hi)
        return out

    def write_binlog_events(
        self, table_id: int, shard: int, schema_version: int, events: pa.Table, flavor: str
    ) -> list[DataFile]:
        """Write binlog row events of one table, shard and schema version as they were read
        (``binlog_rows.EVENT_SCHEMA``; one ``.binlog.parquet`` file per minute touched);
        readers mount them. Moves a version 1 log to version 2 first."""
        if events.num_rows == 0:
            return []
        schema = self._check_target(table_id, shard, schema_version)
        where = f"table {schema.qualified_name} (id {table_id}) binlog events"
        if events.schema.remove_metadata() != EVENT_SCHEMA or flavor not in FLAVORS:
            raise RowSchemaMismatchError(
                f"{where}: columns {events.schema}, flavor {flavor!r}; expected "
                f"{EVENT_SCHEMA} and one of {FLAVORS}"
            )
        if not pc.all(pc.equal(events["_schema_version"], schema_version)).as_py():
            raise RowSchemaMismatchError(f"{where}: _schema_version differs from {schema_version}")
        self._check_rows_in_version(schema, shard, schema_version, events)
        self._upgrade_format()
        events = events.sort_by([("_commit_ts", "ascending"), ("_seq", "ascending")])
        out = [self._write_file(table_id, shard, part, flavor) for part in _split_by_minute(events)]
        self._max_row_ts[table_id] = max(self._max_row_ts.get(table_id, 0), out[-1].last_ts)
        return out

    def _upgrade_format(self) -> None:
        if self.log.version < 2:  # binlog event files need a version 2 reader
            write_json(self.root / "FORMAT", {"format": FORMAT_NAME, "version": 2})
            self.log.version = 2

    def adopt_rows(
        self, table_id: int, shard: int, ts: int, path: Path, tag: str, link: bool = False
    ) -> DataFile:
        """Move a rows file written elsewhere into the log as rows at ``ts`` (a snapshot
        chunk read at a binlog position, placed in the stream by its one writer). The file
        has the data-file layout of the schema valid at ``ts`` without ``_commit_ts``; it
        becomes ``<ts>-<ts>-s<shard>-<tag>.parquet`` by a rename, or a hard link (``link``:
        the source stays until its producer is told), never a copy."""
        version = self.log.schema_version_at(table_id, ts)
        if version is None:
            raise RowSchemaMismatchError(f"table {table_id} does not exist at ts {ts}")
        schema = self._check_target(table_id, shard, version)
        where = f"table {schema.qualified_name} (id {table_id}) file {path}"
        meta = pq.read_metadata(path)
        want = [(f.name, f.type) for f in data_file_schema(schema).remove(0)]  # no _commit_ts
        if [(f.name, f.type) for f in meta.schema.to_arrow_schema()] != want:
            raise RowSchemaMismatchError(
                f"{where}: layout {meta.schema.to_arrow_schema()} is not the table's at ts "
                f"{ts} (schema version {version}) without _commit_ts: {want}"
            )
        versions = _column_range(meta, "_schema_version")
        if versions != (version, version) or meta.num_rows == 0:
            raise RowSchemaMismatchError(
                f"{where}: rows of schema versions {versions}, expected {version} (the one "
                f"valid at ts {ts}), and at least one row"
            )
        resolved = self.log.shard_resolved_ts(table_id, shard)
        if ts <= resolved or not _TAG.fullmatch(tag):
            raise RowSchemaMismatchError(
                f"{where}: ts {ts} is at or below the shard's resolved ts {resolved}, or tag "
                f"{tag!r} is not 8 hex digits"
            )
        minute = physical_ms(ts) // _MINUTE_MS
        target = self.root / "tables" / str(table_id) / "data" / f"minute={minute}"
        target.mkdir(parents=True, exist_ok=True)
        name = target / f"{ts:020d}-{ts:020d}-s{shard}-{tag}.parquet"
        if link:
            os.link(path, name)
        else:
            os.replace(path, name)
        if self.fsync:
            fsync_path(target)
        self._max_row_ts[table_id] = max(self._max_row_ts.get(table_id, 0), ts)
        return DataFile(str(name), table_id, shard, ts, ts)

    def _check_target(self, table_id: int, shard: int, schema_version: int) -> TableSchema:
        shards = self.log.shards(table_id)
        if type(shard) is not int or not 0 <= shard < shards:
            raise RowSchemaMismatchError(
                f"table {table_id}: shard {shard!r} out of range 0..{shards - 1}"
            )
        if self.log.schema_version_at(table_id, schema_version) != schema_version:
            raise RowSchemaMismatchError(
                f"table {table_id}: schema version {schema_version} is not the commit ts of a "
                "DDL record giving its schema; pass the version from schema_version_at()"
            )
        schema = self.log.schema_at(table_id, schema_version)
        assert schema is not None
        return schema

    def _check_rows_in_version(
        self, schema: TableSchema, shard: int, schema_version: int, rows: pa.Table
    ) -> None:
        where = f"table {schema.qualified_name} (id {schema.table_id}) shard {shard}"
        lo, hi = (v.as_py() for v in pc.min_max(rows["_commit_ts"]).values())
        if (
            lo <= schema_version
            or self.log.schema_version_at(schema.table_id, hi) != schema_version
        ):
            raise RowSchemaMismatchError(
                f"{where}: rows with commit ts {lo}..{hi} do not all lie in schema version "
                f"{schema_version} (after it and before the table's next DDL); cut the rows "
                "at the DDL and write each part with its own version"
            )
        resolved = self.log.shard_resolved_ts(schema.table_id, shard)
        if lo <= resolved:
            raise RowSchemaMismatchError(
                f"{where}: rows at commit ts {lo} are at or below the shard's resolved ts "
                f"{resolved}; a resolved mark promises no more rows there"
            )

    def _write_file(
        self, table_id: int, shard: int, rows: pa.Table, flavor: str | None = None
    ) -> DataFile:
        """One data file of sorted rows (``flavor`` given: binlog events of that upstream)."""
        first, last = rows["_commit_ts"][0].as_py(), rows["_commit_ts"][-1].as_py()
        minute = physical_ms(first) // _MINUTE_MS
        suffix = ".parquet" if flavor is None else BINLOG_SUFFIX
        name = f"{first:020d}-{last:020d}-s{shard}-{uuid.uuid4().hex[:8]}{suffix}"
        path = self.root / "tables" / str(table_id) / "data" / f"minute={minute}" / name
        if flavor is not None:
            rows = rows.replace_schema_metadata({FLAVOR_KEY: flavor.encode()})
        buf = io.BytesIO()
        pq.write_table(rows, buf, **(BINLOG_WRITE_OPTIONS if flavor is not None else {}))
        _atomic_write(path, buf.getvalue(), fsync=self.fsync)
        return DataFile(str(path), table_id, shard, first, last)

    # ------------------------------------------------------------------ resolved
    def advance_resolved(self, table_id: int, shard: int, ts: int) -> None:
        """Promise every row of the shard with commit_ts <= ``ts`` is durable (never goes back)."""
        shards = self.log.shards(table_id)
        if type(shard) is not int or not 0 <= shard < shards:
            raise ValueError(f"table {table_id}: shard {shard!r} out of range 0..{shards - 1}")
        path = self.log._resolved_path(table_id, shard)
        self._advance_mark(path, ts, f"table {table_id} shard {shard}", self.fsync)

    @staticmethod
    def _advance_mark(path: Path, ts: int, what: str, fsync: bool) -> None:
        _check_ts_arg("resolved ts", ts)
        current = _read_ts_mark(path)
        if ts < current:
            raise ResolvedRegressionError(
                f"resolved ts of {what} would go back from {current} to {ts}; resolved marks "
                "never go back: pass a ts >= the current mark"
            )
        if ts > current:
            write_json(path, {"resolved_ts": ts}, fsync=fsync)


def _acquire_lock(root: Path) -> io.BufferedRandom:
    """Hold ``root``'s writer lock or raise ChangeLogLockedError naming the holder."""
    path = root / LOCK_NAME
    f = open(path, "a+b")  # noqa: SIM115 - held open for the writer's life
    holder = _try_flock(f)
    if holder.startswith(f"pid={os.getpid()} "):
        # A writer of this process that is unreachable but not yet collected (a reference
        # cycle) may hold it: collect once before calling the log taken.
        gc.collect()
        holder = _try_flock(f)
    if holder:
        f.close()
        raise ChangeLogLockedError(
            f"change log {root} already has a writer ({holder}); one writer per log: stop "
            f"it or close() it first (the lock {path} is released when its process exits)"
        )
    f.seek(0)
    f.truncate()
    since = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    f.write(f"pid={os.getpid()} host={socket.gethostname()} since={since}".encode())
    f.flush()
    return f


def _try_flock(f: io.BufferedRandom) -> str:
    """Take the exclusive lock on ``f``: "" when taken, else the holder's line."""
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        return ""
    except BlockingIOError:
        f.seek(0)
        return f.read().decode(errors="replace").strip() or "holder unknown"


# Under the change log's root but not the writer's: the snapshot runs' plans and chunks
# (cdc_dagster/mysql/snapshots.py), written by other processes while the puller runs. A
# writer opening removed a snapshot run's temp file between its write and its rename, and
# that run failed (a generation's removal takes a killed reader's temp files with it).
_NOT_THE_WRITERS = {"snapshot"}
# ``snapshot/<this>``: a byte a snapshot reader appends after each chunk it wrote (the
# puller's bell: cdc_dagster/mysql/snapshots.py ``ChunkBell``)
CHUNKS_WRITTEN = "chunks-written"
READING_S = 3.0  # a change log's snapshot is being read: a chunk written this recently


def snapshot_bell(root: str | os.PathLike[str]) -> Path:
    """The change log's snapshot bell (``CHUNKS_WRITTEN``)."""
    return Path(root) / "snapshot" / CHUNKS_WRITTEN


def snapshot_reading(root: str | os.PathLike[str], within_s: float = READING_S) -> bool:
    """Whether a snapshot reader wrote a chunk under ``root`` in the last ``within_s``
    seconds (the bell's mtime: its reads are going on)."""
    try:
        return time.time() - os.stat(snapshot_bell(root)).st_mtime < within_s
    except OSError:
        return False


def _remove_temp_files(root: Path) -> int:
    """Delete temp files (``.<name>.tmp-<uuid32>``) under ``root``, outside the snapshot
    runs' directory; how many went."""
    removed = 0
    for directory, subdirs, names in os.walk(root):
        if Path(directory) == root:
            subdirs[:] = [d for d in subdirs if d not in _NOT_THE_WRITERS]
        for name in names:
            if _TEMP_NAME.fullmatch(name):
                Path(directory, name).unlink(missing_ok=True)
                removed += 1
    return removed


def _ddl_name(commit_ts: int, n: int) -> str:
    return f"{commit_ts:020d}-{n:04d}.json"


def _conform(schema: TableSchema, schema_version: int, rows: pa.Table) -> pa.Table:
    """``rows`` in the exact data-file layout, or RowSchemaMismatchError naming the column."""
    want = data_file_schema(schema)
    where = f"table {schema.qualified_name} (id {schema.table_id}) schema version {schema_version}"
    extra = sorted(set(rows.column_names) - set(want.names))
    if extra:
        raise RowSchemaMismatchError(
            f"{where}: unknown columns {extra}; the schema has "
            f"{[f'c{c.id} ({c.name})' for c in schema.columns]}"
        )
    cols = []
    for f in want:
        if f.name not in rows.column_names:
            if f.name.startswith("b"):  # a before image may be left out: null everywhere
                cols.append(pa.nulls(rows.num_rows, f.type))
                continue
            raise RowSchemaMismatchError(f"{where}: column {_describe(schema, f.name)} is missing")
        col = rows[f.name]
        if col.type != f.type:
            raise RowSchemaMismatchError(
                f"{where}: column {_describe(schema, f.name)} has type {col.type}, "
                f"expected {f.type}"
            )
        if not f.nullable and col.null_count:
            raise RowSchemaMismatchError(f"{where}: column {f.name} has nulls")
        cols.append(col)
    out = pa.Table.from_arrays(cols, schema=want)
    _check_values(schema, where, schema_version, out)
    return out


def _check_values(schema: TableSchema, where: str, version: int, rows: pa.Table) -> None:
    if not pc.all(pc.equal(rows["_schema_version"], version)).as_py():
        raise RowSchemaMismatchError(f"{where}: _schema_version differs from {version}")
    if not pc.all(pc.is_in(rows["_op"], pa.array([1, 2, 3], pa.int8()))).as_py():
        raise RowSchemaMismatchError(f"{where}: _op must be 1 (insert), 2 (update), 3 (delete)")
    live = rows.filter(pc.not_equal(rows["_op"], OP_DELETE))
    for c in schema.columns:
        if (not c.nullable or c.id in schema.primary_key) and live[f"c{c.id}"].null_count:
            raise RowSchemaMismatchError(
                f"{where}: column c{c.id} ({c.name!r}) is not nullable but an insert/update has null"
            )
    deletes = rows.filter(pc.equal(rows["_op"], OP_DELETE))
    for c in schema.key_columns:
        if deletes[f"b{c.id}"].null_count:
            raise RowSchemaMismatchError(
                f"{where}: a delete has no before image b{c.id} ({c.name!r}) of its key"
            )


def _describe(schema: TableSchema, name: str) -> str:
    try:
        return f"{name} ({schema.column(int(name[1:])).name!r})"
    except (SchemaError, ValueError):
        return name


def _split_by_minute(rows: pa.Table) -> list[pa.Table]:
    """Cut sorted rows at minute boundaries: a file never spans two ``minute=`` directories."""
    minutes = (rows["_commit_ts"].to_numpy() >> LOGICAL_BITS) // _MINUTE_MS
    cuts = [0, *(np.flatnonzero(np.diff(minutes)) + 1).tolist(), rows.num_rows]
    return [rows.slice(a, b - a) for a, b in itertools.pairwise(cuts)]
