"""Key-range copy-on-write for the Delta sink: a batch rewrites only the files its keys fall in.

delta-rs's MERGE (1.6.6) writes every file its keys touch back as *one* file spanning all
their key ranges, so after the first batch of scattered updates a table is one file that
overlaps every key, and from then on each batch rewrites the whole table whatever its size
(measured: 50 updates into a 2M-row table rewrote 2M rows, 1.5-1.7 CPU-s, every time, local
keys or not). It writes no deletion vectors either.

So for a table whose primary key is one integer column, the sink keeps the table's data
files **clustered**: each file holds a key range ``[lo, hi]`` (its Delta stats) that no other
file overlaps, and a batch

- gives each key inside a file's range to that file; upserts in a gap (below the first
  file, between two, above the last) to a new file in that gap, or to the file before the
  gap while it holds less than a file's worth of rows (an insert-only table rewrites a
  growing tail file, not a file per commit); a delete in a gap touches nothing (``plan``),
- reads just those files, drops the batch's keys from them, adds its upserts, writes each
  back over its own range (sorted by key and split once it grows past twice the target),
- and commits the removes, the adds and the sink's application transactions as one Delta
  commit (``create_write_transaction``; delta-rs's conflict checker refuses it if a commit
  after its read removed a file it removes, as for a MERGE, and the fence id makes any
  commit in between fail it: ``cdc_dagster/sinks/delta.py``).

A table whose files are not clustered (written by a MERGE, a DDL's rewrite, or an older
version of this sink) is rewritten once as clustered files by its next batch: the cost one
MERGE had on every batch. Files are plain Parquet with Delta stats, read by any reader
(docs/dataplane.md, "Data files: by key range").
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import math
import os
import time
import uuid
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.transaction import AddAction, CommitProperties, RemoveAction, Transaction

from cdc_dagster.sinks.base import OP_COLUMN, OP_UPSERT
from cdc_dagster.sinks.delta_paths import local_path

# A data file's target size (compressed). A batch rewrites the files its keys fall in, so a
# file's size is the floor of a batch's cost; readers want files not too small. A file is
# split when it grows past twice this; a table starts a new tail file once its last file
# holds this much.
TARGET_FILE_BYTES = 8 * 1024 * 1024
MIN_FILE_ROWS = 10_000
MAX_FILE_ROWS = 128_000
_DEFAULT_ROW_BYTES = 100
# The sink's codec names (delta-rs's) as pyarrow's.
_PYARROW_CODECS = {"ZSTD": "zstd", "SNAPPY": "snappy", "LZ4_RAW": "lz4", "UNCOMPRESSED": "none"}


@dataclasses.dataclass(frozen=True)
class DataFile:
    """One data file of the table's current version: its path (relative to the table) and
    its key range from the Delta stats (None when the file has none)."""

    path: str
    size: int
    rows: int | None
    lo: int | None
    hi: int | None


def eligible(key_types: Sequence[pa.DataType]) -> bool:
    """Whether a table with these primary-key column types is written by key range."""
    return len(key_types) == 1 and pa.types.is_integer(key_types[0])


def data_files(dt: DeltaTable, key: str) -> list[DataFile]:
    """The loaded version's data files with their key ranges."""
    actions = pa.table(dt.get_add_actions(flatten=True))
    if actions.num_rows == 0:
        return []
    names = set(actions.column_names)

    def column(name: str) -> list:
        return actions.column(name).to_pylist() if name in names else [None] * actions.num_rows

    return [
        DataFile(path, size, rows, lo, hi)
        for path, size, rows, lo, hi in zip(
            column("path"),
            column("size_bytes"),
            column("num_records"),
            column(f"min.{key}"),
            column(f"max.{key}"),
            strict=True,
        )
    ]


def clustered(files: Sequence[DataFile]) -> bool:
    """Every file has a row count and a key range (or is empty) and no two ranges overlap."""
    if any(f.rows is None for f in files):
        return False
    ranged = [f for f in files if f.rows]
    if any(f.lo is None or f.hi is None for f in ranged):
        return False
    ranged.sort(key=lambda f: f.lo)  # type: ignore[arg-type,return-value]
    return all(a.hi < b.lo for a, b in itertools.pairwise(ranged))  # type: ignore[operator]


def target_rows(files: Sequence[DataFile]) -> int:
    """Rows per file for the target size, from the table's bytes per row."""
    rows = sum(f.rows or 0 for f in files)
    per_row = sum(f.size for f in files) / rows if rows else _DEFAULT_ROW_BYTES
    return int(min(MAX_FILE_ROWS, max(MIN_FILE_ROWS, TARGET_FILE_BYTES / max(per_row, 1.0))))


def plan(
    files: Sequence[DataFile], keys: np.ndarray, upserts: np.ndarray, target: int
) -> list[tuple[list[DataFile], np.ndarray]]:
    """The groups a batch writes: each the files it reads and replaces (one; every file of
    an unclustered table; none for a new file in a gap) and the batch's row positions that
    go there.

    A key inside a file's range goes to that file. A key in a gap (below the first file,
    between two, above the last) touches no file: a delete there is dropped (no file holds
    its key); upserts there go to a new file of their own, which fits in the gap, unless
    the file before the gap (the first file, for the gap below it) holds less than
    ``target`` rows: then to that file, which grows into the gap (no file per batch of an
    insert-only table).
    """
    if not clustered(files):
        return [(list(files), np.arange(len(keys)))]  # every file, rewritten as clustered
    ranged = sorted((f for f in files if f.rows), key=lambda f: f.lo)  # type: ignore[arg-type,return-value]
    if not ranged:
        return [([], np.arange(len(keys)))]
    lows = np.array([f.lo for f in ranged], dtype=np.int64)
    highs = np.array([f.hi for f in ranged], dtype=np.int64)
    before = np.searchsorted(lows, keys, side="right") - 1  # the file at or before each key
    inside = (before >= 0) & (keys <= highs[np.maximum(before, 0)])
    neighbour = np.maximum(before, 0)  # the file a gap's upserts may join
    small = np.array([(f.rows or 0) < target for f in ranged])
    joins = ~inside & upserts & small[neighbour]
    fresh = ~inside & upserts & ~small[neighbour]
    to_file = np.where(inside, before, neighbour)
    groups: list[tuple[list[DataFile], np.ndarray]] = []
    touching = inside | joins
    for i in np.unique(to_file[touching]):
        groups.append(([ranged[int(i)]], np.flatnonzero(touching & (to_file == i))))
    for g in np.unique(before[fresh]):  # one new file per gap (-1: below the first file)
        groups.append(([], np.flatnonzero(fresh & (before == g))))
    return groups


def _read(root: str, files: Sequence[DataFile], schema: pa.Schema) -> pa.Table:
    parts = []
    for f in files:
        t = pq.read_table(local_path(f.path if "://" in f.path else os.path.join(root, f.path)))
        arrays = [
            t.column(field.name).cast(field.type)
            if field.name in t.column_names
            else pa.nulls(t.num_rows, field.type)
            for field in schema
        ]
        parts.append(pa.Table.from_arrays(arrays, schema=schema))
    return pa.concat_tables(parts) if parts else schema.empty_table()


def _stats(t: pa.Table) -> str:
    """Delta file stats: row count, null counts, min/max of the integer columns."""
    lows: dict[str, int] = {}
    highs: dict[str, int] = {}
    for field, column in zip(t.schema, t.columns, strict=True):
        if pa.types.is_integer(field.type) and column.null_count < t.num_rows:
            mm = pc.min_max(column)
            lows[field.name] = mm["min"].as_py()
            highs[field.name] = mm["max"].as_py()
    return json.dumps(
        {
            "numRecords": t.num_rows,
            "minValues": lows,
            "maxValues": highs,
            "nullCount": {f.name: c.null_count for f, c in zip(t.schema, t.columns, strict=True)},
        }
    )


def _pieces(rows: int, target: int) -> int:
    """How many files a group of ``rows`` is written as (split past twice the target)."""
    return max(1, math.ceil(rows / (2 * target)))


def write(
    dt: DeltaTable,
    root: str,
    key: str,
    source: pa.Table,
    txns: list[Transaction],
    *,
    compression: str,
    compression_level: int | None,
) -> None:
    """Apply ``source`` (the sink's MERGE source: columns + ``_cdc_op``) to ``dt`` by key
    range in one commit carrying ``txns``."""
    files = data_files(dt, key)
    schema = source.schema.remove(source.schema.get_field_index(OP_COLUMN))
    keys = source.column(key).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    upserts = source.column(OP_COLUMN).to_numpy(zero_copy_only=False) == OP_UPSERT
    target = target_rows(files)
    written: list[str] = []
    actions: list[AddAction | RemoveAction] = []
    now_ms = int(time.time() * 1000)
    codec = _PYARROW_CODECS[compression]
    try:
        for group, positions in plan(files, keys, upserts, target):
            part = source.take(pa.array(positions, pa.int64()))
            old = _read(root, group, schema)
            gone = pc.is_in(old.column(key), value_set=part.column(key))
            kept = old.filter(pc.invert(gone))
            new_rows = part.filter(pc.equal(part.column(OP_COLUMN), OP_UPSERT)).drop_columns(
                [OP_COLUMN]
            )
            if group and not new_rows.num_rows and kept.num_rows == old.num_rows:
                continue  # deletes of keys the file does not hold
            merged = pa.concat_tables([kept, new_rows.cast(schema)])
            n = _pieces(merged.num_rows, target) if merged.num_rows else 0
            if n > 1 or len(group) > 1:  # split by key: each piece over a range of its own
                merged = merged.sort_by(key)
            step = math.ceil(merged.num_rows / n) if n else 0
            for i in range(n):
                chunk = merged.slice(i * step, step)
                name = f"part-00000-{uuid.uuid4()}-c000{'' if codec == 'none' else '.' + codec}.parquet"
                path = os.path.join(root, name)
                written.append(path)
                pq.write_table(
                    chunk,
                    path,
                    compression=codec,
                    compression_level=compression_level,
                )
                size = os.path.getsize(path)
                actions.append(AddAction(name, size, {}, now_ms, True, _stats(chunk)))
            actions.extend(RemoveAction(f.path, True, now_ms, f.size, {}) for f in group)
        # The commit's history entry says how it was written (Delta's ``DESCRIBE HISTORY``).
        removed = sum(1 for a in actions if isinstance(a, RemoveAction))
        about = {
            "cdcDagsterWrite": "key range",
            "filesRemoved": removed,
            "filesAdded": len(actions) - removed,
        }
        dt.create_write_transaction(
            actions,
            "append",
            dt.schema(),
            commit_properties=CommitProperties(custom_metadata=about, app_transactions=txns),
        )
    except BaseException:
        for path in written:
            with contextlib.suppress(OSError):
                os.unlink(path)
        raise
