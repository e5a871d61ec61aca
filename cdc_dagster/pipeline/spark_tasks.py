"""What one Spark task does for one table: pull/sort/mount into staging, or collapse and sink.

Pure pyarrow, no Spark: a task gets a JSON spec (one table) and returns one result row.
Tables have different column sets and types, so one Spark DataFrame cannot carry their
rows in typed columns; the Spark job distributes the per-table specs (one table per task
call) and each task reads, sorts and writes that table's Arrow data itself. The same
functions run in a Spark Python worker, locally or behind Spark Connect.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from cdc_dagster.schema import TableSchema
from cdc_dagster.sinks.base import FencedError, SinkError
from cdc_dagster.sinks.uri import open_sink
from cdc_dagster.text import shorten
from cdc_dagster.upstream.changelog import ChangeLog, ChangeLogError, DataFile, fsync_path

OP_COLUMN = "_cdc_op"
COMMIT_TS_COLUMN = "_cdc_commit_ts"
SEQ_COLUMN = "_cdc_seq"  # staging only: (log _seq) * 2 + (0 old-key delete, 1 the change)
OP_UPSERT = 0
OP_DELETE = 1
LOG_INSERT, LOG_UPDATE, LOG_DELETE = 1, 2, 3

RESULT_SCHEMA = pa.schema(
    [
        ("table_id", pa.int64()),
        ("status", pa.string()),  # ok | error | fenced
        ("message", pa.string()),
        ("detail", pa.string()),  # JSON: staged files (pull) or committed ts (sink)
        ("rows", pa.int64()),
        ("seconds", pa.float64()),  # the sink's write (sink results; pull: 0)
    ]
)
SPEC_SCHEMA = pa.schema([("table_id", pa.int64()), ("spec", pa.string())])


class BadInputError(Exception):
    """A change-log file or row does not fit: the message names the table, the file, the fix."""


# ---------------------------------------------------------------------------- pull
def pull_table(spec: dict[str, Any]) -> dict[str, Any]:
    """Read, sort and mount one table's slice into staged Parquet files, one per schema segment."""
    table_id = spec["table_id"]
    staged, rows = [], 0
    try:
        for seg in spec["segments"]:
            mounted = _read_segment(spec["changelog_root"], table_id, seg)
            if mounted is None or mounted.num_rows == 0:
                continue
            name = f"{seg['lo']:020d}-{seg['hi']:020d}.parquet"
            _write_atomic(mounted, os.path.join(spec["out_dir"], name))
            staged.append(
                {"name": name, "lo": seg["lo"], "hi": seg["hi"], "rows": mounted.num_rows}
            )
            rows += mounted.num_rows
    except BadInputError as exc:
        return _result(table_id, "error", str(exc))
    except (pa.ArrowException, ValueError) as exc:  # rows Arrow cannot mount as declared
        return _result(
            table_id,
            "error",
            f"table {table_id}: the change-log rows in ({spec['segments'][0]['lo']}, "
            f"{spec['upto']}] cannot be mounted ({type(exc).__name__}: {shorten(exc)}); "
            "rewrite the files of that range, then the table resumes from its checkpoint",
        )
    except OSError as exc:
        return _result(
            table_id,
            "error",
            f"table {table_id}: the staging under {spec['out_dir']} cannot be written "
            f"({exc}); free or fix that file system, then the table resumes",
        )
    return _result(table_id, "ok", "", json.dumps(staged), rows)


def _read_segment(root: str, table_id: int, seg: dict[str, Any]) -> pa.Table | None:
    if not seg["files"]:
        return None
    schema = TableSchema.from_json(seg["schema"])
    where = f"table {schema.qualified_name} (id {table_id})"
    parts = []
    log = ChangeLog(root)
    for path, shard, first_ts, last_ts in seg["files"]:
        try:
            # The change log's own reader: a missing or corrupt file is its typed error.
            data = log.read_data_file(DataFile(path, table_id, shard, first_ts, last_ts))
        except ChangeLogError as exc:
            raise BadInputError(
                f"{where}: change-log file {path} cannot be read ({type(exc).__name__}: "
                f"{exc}); then the table resumes from its checkpoint"  # ours: whole
            ) from exc
        if first_ts <= seg["lo"] or last_ts > seg["hi"]:  # a file across the slice's edge
            ts = data.column("_commit_ts")
            data = data.filter(pc.and_(pc.greater(ts, seg["lo"]), pc.less_equal(ts, seg["hi"])))
        parts.append(_fit(schema, data, path, where))
    data = pa.concat_tables(parts)
    data = data.sort_by([("_commit_ts", "ascending"), ("_seq", "ascending")])
    return mount(schema, data)


def _fit(schema: TableSchema, data: pa.Table, path: str, where: str) -> pa.Table:
    """Cast the file's columns to the schema's types; refuse a file that does not fit."""
    want = {"_commit_ts": pa.int64(), "_seq": pa.int32(), "_op": pa.int8()}
    for c in schema.columns:
        want[f"c{c.id}"] = c.arrow
    for k in schema.key_columns:
        want[f"b{k.id}"] = k.arrow
    have = set(data.column_names)
    extra = sorted(n for n in have if n[:1] in "cb" and n[1:].isdigit() and n not in want)
    missing = sorted(n for n in want if n not in have and not n.startswith("b"))
    if missing or extra:
        raise BadInputError(
            f"{where}: change-log file {path} does not fit the table's schema (missing columns "
            f"{missing}, unknown columns {extra}); rewrite the file with the schema valid at its "
            "commit ts, then the table resumes from its checkpoint"
        )
    cols = {}
    for name, typ in want.items():
        if name not in have:
            cols[name] = pa.nulls(data.num_rows, typ)
            continue
        try:
            cols[name] = pc.cast(data.column(name), typ, safe=True)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise BadInputError(
                f"{where}: column {name} of change-log file {path} has type "
                f"{data.schema.field(name).type}, which does not fit {typ} ({shorten(exc, 120)}); "
                "rewrite the file with the schema's types, then the table resumes"
            ) from exc
    out = pa.table(cols)
    _check_rows(schema, out, path, where)
    return out


def _check_rows(schema: TableSchema, data: pa.Table, path: str, where: str) -> None:
    op = data.column("_op")
    bad_op = pc.sum(pc.invert(pc.is_in(op, pa.array([1, 2, 3], pa.int8())))).as_py()
    problems = []
    if bad_op:
        problems.append(f"{bad_op} rows with an _op outside 1/2/3")
    is_del = pc.equal(op, LOG_DELETE)
    for c in schema.columns:
        if c.nullable and c.id not in schema.primary_key:
            continue
        nulls = pc.sum(pc.and_(pc.invert(is_del), pc.is_null(data.column(f"c{c.id}")))).as_py()
        if nulls:
            problems.append(f"{nulls} upserts with a null in NOT NULL column {c.name!r}")
    for k in schema.primary_key:
        nulls = pc.sum(pc.and_(is_del, pc.is_null(data.column(f"b{k}")))).as_py()
        if nulls:
            problems.append(f"{nulls} deletes without the before image of key column c{k}")
    if problems:
        raise BadInputError(
            f"{where}: change-log file {path} has rows that do not fit the table's schema: "
            f"{'; '.join(problems)}; rewrite the file, then the table resumes from its checkpoint"
        )


def mount(schema: TableSchema, data: pa.Table) -> pa.Table:
    """Columns by name; a delete keyed by its before image; a key change = delete + upsert."""
    op = data.column("_op")
    is_del = pc.equal(op, LOG_DELETE)
    keys = set(schema.primary_key)
    names = [c.name for c in schema.columns]
    first_key = schema.primary_key[0]
    key_changed = pc.and_(
        pc.equal(op, LOG_UPDATE), pc.is_valid(data.column(f"b{first_key}"))
    ).combine_chunks()
    seq = pc.cast(data.column("_seq"), pa.int64())
    main_cols = [
        pc.if_else(is_del, data.column(f"b{c.id}"), data.column(f"c{c.id}"))
        if c.id in keys
        else data.column(f"c{c.id}")
        for c in schema.columns
    ]
    main = pa.table(
        [
            *main_cols,
            pc.cast(pc.if_else(is_del, OP_DELETE, OP_UPSERT), pa.int8()),
            data.column("_commit_ts"),
            pc.add(pc.multiply(seq, 2), 1),
        ],
        names=[*names, OP_COLUMN, COMMIT_TS_COLUMN, SEQ_COLUMN],
    )
    n_moved = pc.sum(key_changed).as_py() or 0
    if not n_moved:
        return main
    moved = data.filter(key_changed)
    old = pa.table(
        [
            *(
                moved.column(f"b{c.id}") if c.id in keys else pa.nulls(n_moved, c.arrow)
                for c in schema.columns
            ),
            pa.array([OP_DELETE] * n_moved, pa.int8()),
            moved.column("_commit_ts"),
            pc.multiply(pc.cast(moved.column("_seq"), pa.int64()), 2),
        ],
        schema=main.schema,
    )
    both = pa.concat_tables([main, old])
    return both.sort_by([(COMMIT_TS_COLUMN, "ascending"), (SEQ_COLUMN, "ascending")])


def _write_atomic(table: pa.Table, path: str) -> None:
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp-{uuid.uuid4().hex[:8]}")
    # local and short-lived: speed over size (no dictionary tried on the row images)
    pq.write_table(table, tmp, compression="lz4", use_dictionary=False)
    fsync_path(tmp)
    os.replace(tmp, path)


# ---------------------------------------------------------------------------- sink
def collapse(schema: TableSchema, staged: pa.Table, start_ts: int, end_ts: int) -> pa.Table:
    """The batch the sink gets: changes in (start, end], the last one per primary key."""
    ts = staged.column(COMMIT_TS_COLUMN)
    staged = staged.filter(pc.and_(pc.greater(ts, start_ts), pc.less_equal(ts, end_ts)))
    staged = staged.sort_by([(COMMIT_TS_COLUMN, "ascending"), (SEQ_COLUMN, "ascending")])
    keys = [c.name for c in schema.key_columns]
    idx = pa.array(range(staged.num_rows), pa.int64())
    last = (
        staged.select(keys)
        .append_column("_cdc_i", idx)
        .group_by(keys, use_threads=False)
        .aggregate([("_cdc_i", "max")])
        .column("_cdc_i_max")
    )
    batch = staged.take(last.take(pc.sort_indices(last))).drop_columns([SEQ_COLUMN])
    names = [c.name for c in schema.columns]
    return batch.select([*names, OP_COLUMN, COMMIT_TS_COLUMN]).cast(
        pa.schema(
            [
                *(pa.field(c.name, c.arrow, True) for c in schema.columns),
                pa.field(OP_COLUMN, pa.int8(), False),
                pa.field(COMMIT_TS_COLUMN, pa.int64(), False),
            ]
        )
    )


def read_staged(paths: Sequence[str]) -> pa.Table:
    """The staged files of one table and schema version, concatenated."""
    return pa.concat_tables([pq.read_table(p) for p in paths])


def sink_table(spec: dict[str, Any]) -> dict[str, Any]:
    """Collapse one table's staged changes in (start, end] and write them with the sink, one
    commit per syncpoint interval (``spec["syncpoints"]``: the syncpoint TSs inside)."""
    table_id = spec["table_id"]
    schema = TableSchema.from_json(spec["schema"])
    where = f"table {schema.qualified_name} (id {table_id})"
    try:
        staged = read_staged(spec["files"]) if spec["files"] else _empty_staged(schema)
    except (OSError, pa.ArrowException) as exc:
        # Staging is a cache of the change log above the checkpoint: the executor drops the
        # table's and stages it again (RESTAGE), which heals a damaged staging by itself.
        where_files = os.path.dirname(spec["files"][0]) if spec["files"] else "(none)"
        return _result(
            table_id,
            RESTAGE,
            f"{where}: {len(spec['files'])} staged file(s) in {where_files} cannot be read "
            f"({shorten(exc, 200)}); the capture's staging was damaged: the table is staged "
            "again from the change log at its checkpoint (nothing to do)",
        )
    cuts = list(spec.get("syncpoints", ()))
    copy_at = set(spec.get("copy_at", cuts))
    began = time.perf_counter()
    committed, rows, start = spec["start"], 0, spec["start"]
    try:
        sink = open_sink(spec["sink_uri"])
        for end in [*cuts, spec["end"]]:
            batch = collapse(schema, staged, start, end)
            committed = sink.write(
                spec["changefeed"], schema, batch, start, end, spec["token"],
                at_syncpoint=end in copy_at,
            )  # fmt: skip
            rows, start = rows + batch.num_rows, end
    except FencedError as exc:
        return _result(table_id, "fenced", str(exc))
    except SinkError as exc:
        return _result(table_id, "error", f"{where}: {type(exc).__name__}: {exc}")
    except Exception as exc:  # e.g. a bare DeltaError: this table's error, not the whole job's
        return _result(
            table_id,
            "error",
            f"{where}: the sink {spec['sink_uri']!r} failed writing ({start}, "
            f"{spec['end']}] with an unexpected {type(exc).__name__}: {shorten(exc)}; "
            "the batch is retried every tick, fix the downstream",
        )
    return _result(table_id, "ok", "", json.dumps(committed), rows, time.perf_counter() - began)


def _empty_staged(schema: TableSchema) -> pa.Table:
    fields = [pa.field(c.name, c.arrow) for c in schema.columns]
    fields += [(OP_COLUMN, pa.int8()), (COMMIT_TS_COLUMN, pa.int64()), (SEQ_COLUMN, pa.int64())]
    return pa.schema(fields).empty_table()


# ---------------------------------------------------------------------------- Spark glue
# A sink task's status for a table whose staged files cannot be read: stage it again.
RESTAGE = "restage"


def _result(
    table_id: int, status: str, message: str, detail: str = "", rows: int = 0, seconds: float = 0.0
) -> dict:
    return {
        "table_id": table_id,
        "status": status,
        "message": message,
        "detail": detail,
        "rows": rows,
        "seconds": seconds,
    }


def run_specs(kind: str, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The body of ``mapInArrow``: run every spec of this partition, one table at a time."""
    fn = pull_table if kind == "pull" else sink_table
    out = []
    for batch in batches:
        for slot in batch.column("spec").to_pylist():
            out.extend(fn(spec) for spec in json.loads(slot))
    yield pa.RecordBatch.from_pylist(out, schema=RESULT_SCHEMA)


def pull_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow body of the pull job."""
    return run_specs("pull", batches)


def sink_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow body of the sink job."""
    return run_specs("sink", batches)
