"""Reading a snapshot range in chunks, each at its own short consistent snapshot.

What one Spark task (or any worker) does for one key range of a table
(``mysql.snapshots``): for each chunk, take the table's metadata lock (a transaction that
opened it: DDL waits, writes do not), check the catalog's columns are the change log's
schema, open ``START TRANSACTION WITH CONSISTENT SNAPSHOT`` and note its binlog position,
read the next keys (keyset, in key order), end both transactions, and write the chunk's
rows in the data-file layout (no ``_commit_ts``: the puller places them). A killed reader
loses at most the chunk it was reading: the next one starts at the first key not read.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from cdc_dagster.mysql.catalog import quote_ident as _q
from cdc_dagster.mysql.catalog import read_table
from cdc_dagster.mysql.errors import PullerBusyError
from cdc_dagster.mysql.position import mariadb_snapshot_state
from cdc_dagster.mysql.snapshots import (
    Chunk,
    Key,
    NextRead,
    Plan,
    decode_key,
    done_chunks,
    encode_key,
    generation_dir,
    next_read,
    pending_chunks,
    read_plan,
    write_chunk,
    write_plan,
)
from cdc_dagster.mysql.types import converter, passthrough
from cdc_dagster.mysql.upstream import connect
from cdc_dagster.schema import TableSchema, arrow_type
from cdc_dagster.upstream.changelog import ChangeLog
from cdc_dagster.upstream.uri import UpstreamConfig

SCHEMA_WAIT_S = 60.0  # a DDL the puller has not written yet: wait this long for it
Progress = Callable[[Chunk], None]


def read_range(
    upstream: UpstreamConfig,
    root: str,
    table_id: int,
    generation: int,
    range_no: int,
    chunk_rows: int = 50_000,
    progress: Progress | None = None,
) -> int:
    """Read range ``range_no`` of the table's snapshot plan to its end; rows read."""
    plan = read_plan(root, table_id, generation)
    if plan is None:
        raise PullerBusyError(f"table {table_id}: no snapshot plan of generation {generation}")
    gen_dir = generation_dir(root, table_id, generation)
    total = 0
    while True:
        # pending first: the puller marks a chunk done before it removes its file
        pending = {(c.range_no, c.chunk_no): c for _, c in pending_chunks(gen_dir)}
        records = done_chunks(gen_dir) | pending
        if not gen_dir.exists():
            return total  # released meanwhile: every chunk was placed
        nr = next_read(plan, range_no, records, chunk_rows)
        if nr is None:
            return total
        schema, version = _schema(root, table_id)
        chunk, rows = _read_chunk(upstream, schema, version, range_no, nr)
        write_chunk(gen_dir, chunk, rows)
        total += chunk.rows
        if progress is not None:
            progress(chunk)


def _schema(root: str, table_id: int) -> tuple[TableSchema, int]:
    log = ChangeLog(root)
    ts = log.ddl_resolved_ts()
    schema, version = log.schema_at(table_id, ts), log.schema_version_at(table_id, ts)
    if schema is None or version is None:
        raise PullerBusyError(f"table {table_id} is not in the change log at its DDL mark {ts}")
    return schema, version


def _read_chunk(
    upstream: UpstreamConfig, schema: TableSchema, version: int, range_no: int, nr: NextRead
) -> tuple[Chunk, pa.Table]:
    lock = connect(upstream)
    snap = connect(upstream)
    try:
        _lock_and_check(lock, schema)
        with snap.cursor() as cur:
            cur.execute("SET SESSION time_zone = '+00:00'")
            cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            position = mariadb_snapshot_state(cur).position
            cur.execute(*_select(schema, nr))
            rows = cur.fetchall()
        snap.rollback()
        lock.rollback()
    finally:
        snap.close()
        lock.close()
    key_pos = [[c.id for c in schema.columns].index(k) for k in schema.primary_key]
    full = nr.limit is not None and len(rows) == nr.limit
    hi = encode_key([rows[-1][i] for i in key_pos]) if full else nr.bound
    chunk = Chunk(range_no, nr.chunk_no, position, nr.lo, hi, not full and not nr.fills_hole,
                  len(rows), version)  # fmt: skip
    return chunk, chunk_table(schema, version, rows)


def _lock_and_check(lock: Any, schema: TableSchema) -> None:
    """Take the table's metadata lock; wait while the catalog is ahead of the change log."""
    table = f"{_q(schema.database)}.{_q(schema.table)}"
    deadline = time.monotonic() + SCHEMA_WAIT_S
    want = [(c.name, c.type) for c in schema.columns]
    while True:
        with lock.cursor() as cur:
            cur.execute("START TRANSACTION")
            cur.execute(f"SELECT 1 FROM {table} LIMIT 0")  # the metadata lock
        raw = read_table(lock, schema.database, schema.table)
        if raw is not None and [(n, t) for n, t, _, _ in raw.columns] == want:
            return
        lock.rollback()
        if time.monotonic() > deadline:
            raise PullerBusyError(
                f"table {schema.qualified_name}: its columns upstream are not the change log's "
                f"after {SCHEMA_WAIT_S:.0f} s (a DDL the puller has not reached yet?)"
            )
        time.sleep(0.5)


def _select(schema: TableSchema, nr: NextRead) -> tuple[str, tuple]:
    # FLOAT through the text protocol keeps 6 digits; as DOUBLE it is the exact float32 value
    cols = ", ".join(
        f"CAST({_q(c.name)} AS DOUBLE)" if c.type == "float32" else _q(c.name)
        for c in schema.columns
    )
    keys = [_q(schema.column(k).name) for k in schema.primary_key]
    where, args = [], []
    lo, bound = decode_key(nr.lo), decode_key(nr.bound)
    if lo is not None:
        w, a = _compare(keys, list(lo), ">")
        where.append(w)
        args += a
    if bound is not None:
        w, a = _compare(keys, list(bound), "<")
        where.append(w)
        args += a
    sql = f"SELECT {cols} FROM {_q(schema.database)}.{_q(schema.table)}"
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += f" ORDER BY {', '.join(keys)}"
    if nr.limit is not None:
        sql += f" LIMIT {nr.limit}"
    return sql, tuple(args)


def _compare(cols: list[str], values: list[Any], op: str) -> tuple[str, list[Any]]:
    """Keys after (``>``) or up to (``<``: at or before) ``values`` in key order, as OR of
    prefixes (an index range scan in every MariaDB/MySQL version)."""
    terms, args = [], []
    for i in range(len(cols)):
        eq = [f"{c} = %s" for c in cols[:i]]
        last = len(cols) - 1
        cmp = f"{cols[i]} {op}{'=' if op == '<' and i == last else ''} %s"
        terms.append("(" + " AND ".join([*eq, cmp]) + ")")
        args += [*values[:i], values[i]]
    return "(" + " OR ".join(terms) + ")", args


def chunk_table(schema: TableSchema, version: int, rows: list[tuple]) -> pa.Table:
    """Snapshot rows (tuples in schema order, as pymysql gives them) in the data-file layout
    without ``_commit_ts``: inserts, ``_seq`` 0..n-1."""
    n = len(rows)
    arrays: dict[str, Any] = {
        "_seq": pa.array(np.arange(n, dtype=np.int32)),
        "_op": pa.array(np.ones(n, np.int8)),
        "_schema_version": pa.array(np.full(n, version, np.int64)),
    }
    for i, c in enumerate(schema.columns):
        values = [r[i] for r in rows]
        ok, fn = passthrough(c.type), converter(c.type)
        if ok is None or any(v is not None and type(v) is not ok for v in values):
            values = [None if v is None else fn(v) for v in values]
        arrays[f"c{c.id}"] = pa.array(values, arrow_type(c.type))
    for k in schema.primary_key:
        arrays[f"b{k}"] = pa.nulls(n, arrow_type(schema.column(k).type))
    return pa.table(arrays)


def plan_table(
    upstream: UpstreamConfig,
    root: str,
    table_id: int,
    generation: int,
    parallelism: int,
    chunk_rows: int,
) -> Plan:
    """Split the table into key ranges read in parallel: a single integer key by equal
    spans of [min, max]; any other key as one range. Written once (a resumed run reuses it),
    with the table's row count then (what progress counts chunks against)."""
    plan = read_plan(root, table_id, generation)
    if plan is not None:
        return plan
    schema, _ = _schema(root, table_id)
    ranges: list[tuple[Key, Key]] = [(None, None)]
    key = [schema.column(k) for k in schema.primary_key]
    split = len(key) == 1 and key[0].type.startswith(("int", "uint")) and parallelism > 1
    table = f"{_q(schema.database)}.{_q(schema.table)}"
    conn = connect(upstream)
    try:
        with conn.cursor() as cur:
            if split:
                name = _q(key[0].name)
                cur.execute(f"SELECT MIN({name}), MAX({name}), COUNT(*) FROM {table}")
                lo, hi, count = cur.fetchone()
            else:  # the count only sizes the progress shown (chunks done / total)
                cur.execute(f"SELECT COUNT(*) FROM {table}")
                lo, hi, count = None, None, cur.fetchone()[0]
    finally:
        conn.close()
    n = min(parallelism, max(1, (count or 0) // chunk_rows))
    if split and lo is not None and n > 1:
        cuts = [lo + (hi - lo) * i // n for i in range(1, n)]
        bounds: list[Key] = [None, *([c] for c in cuts), None]
        ranges = list(itertools.pairwise(bounds))
    plan = Plan(table_id, generation, tuple(ranges), int(count or 0), chunk_rows)
    write_plan(root, plan)
    return plan


__all__ = ["chunk_table", "plan_table", "read_range"]
