"""Initial snapshot: existing tables and rows at one snapshot ts, then stream from its GTID.

``START TRANSACTION WITH CONSISTENT SNAPSHOT`` on MariaDB also fixes the binlog position
of that snapshot (``binlog_snapshot_file/position``), which ``BINLOG_GTID_POS`` turns
into the GTID to stream from: no global read lock is held. Every table is logged as a
``create_table`` DDL record (one TS each), then its rows are written as inserts at one
snapshot TS above those, read in primary-key order in chunks (progress per chunk).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from cdc_dagster.mysql.catalog import build_schema, list_tables, read_tables
from cdc_dagster.mysql.catalog import quote_ident as _q
from cdc_dagster.mysql.changelog_io import change_rows
from cdc_dagster.mysql.context import PullerContext
from cdc_dagster.mysql.position import mariadb_snapshot_state, mysql_snapshot_state
from cdc_dagster.mysql.state import PullerState, TsAllocator, parse_gtid_pos, save_state
from cdc_dagster.mysql.types import converter
from cdc_dagster.mysql.upstream import connect
from cdc_dagster.schema import DdlRecord, TableSchema
from cdc_dagster.upstream.changelog import META_WRITERS
from scheduler_core.ddl import DDLKind

Progress = Callable[[str, int, int], None]  # (db.table, rows done, rows total)


def bootstrap(puller: PullerContext) -> PullerState:
    """First start: create records for every table, the snapshot rows, the start position."""
    snap = connect(puller.upstream)
    try:
        with snap.cursor() as cur:
            cur.execute("SET SESSION time_zone = '+00:00'")
            cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            if puller.info.is_mariadb:
                state = mariadb_snapshot_state(cur)
            else:
                state = mysql_snapshot_state(cur)
        alloc = TsAllocator(0)
        now = time.time()
        names = list_tables(snap, puller.filter)
        found = read_tables(snap, names)
        for raw in (found[n] for n in names if n in found):
            tid = state.ids.new_table_id()
            schema = build_schema(raw, tid, state.ids, None,
                                  force_replicate=puller.upstream.force_replicate)  # fmt: skip
            ts = alloc.issue(now)
            query = f"CREATE TABLE {_q(raw.database)}.{_q(raw.table)} /* existing at changefeed start */"
            puller.writer.write_ddl(DdlRecord(ts, DDLKind.CREATE_TABLE, "create_table", query,
                                              creates=(tid,), tables={tid: schema}))  # fmt: skip
            state.set_table(tid, schema, ts)
        # A changefeed starts one TS below the snapshot rows and above every CREATE: the
        # owner then finds each table existing at its start ts and replicates the rows.
        puller.stats.start_ts = alloc.issue(now)
        snapshot_ts = alloc.issue(now)
        if puller.config.snapshot:
            for tid, schema in state.tables.items():
                chunk_rows, progress = puller.config.snapshot_chunk_rows, puller.config.progress
                for rows in read_chunks(snap, schema, chunk_rows, progress):
                    batch = [(snapshot_ts, i, 1, r, None) for i, r in enumerate(rows)]
                    puller.writer.write_rows(tid, 0, state.versions[tid],
                                             change_rows(schema, state.versions[tid], batch))  # fmt: skip
                    puller.stats.snapshot_rows += len(rows)
        snap.rollback()
    finally:
        snap.close()
    state.last_ts = snapshot_ts
    save_state(puller.root, state)
    for tid, t in state.tables.items():
        for shard in range(t.shards):
            puller.writer.advance_resolved(tid, shard, snapshot_ts)
    puller.writer.advance_ddl_resolved(snapshot_ts)
    return state


LOCK_BATCH = 200  # tables whose metadata locks one statement takes (``bootstrap_chunked``)


def bootstrap_chunked(puller: PullerContext) -> PullerState:
    """First start, chunked (MariaDB): create records and the start position, no rows.

    The selected tables' metadata locks are held (an open transaction that opened each:
    DDL waits, writes do not) while their schemas and the binlog position are read, so the
    schemas are those at the position. Every table is then snapshotted in chunks
    (``mysql.snapshots``), its resolved mark held at the changefeed's start ts until done.
    """
    lock = connect(puller.upstream)
    try:
        names = list_tables(lock, puller.filter)
        with lock.cursor() as cur:
            cur.execute("START TRANSACTION")
            # the tables' metadata locks, a statement per LOCK_BATCH tables (every table
            # of a statement is opened before any of it runs)
            for i in range(0, len(names), LOCK_BATCH):
                cur.execute(" UNION ALL ".join(
                    f"(SELECT 1 FROM {_q(db)}.{_q(name)} LIMIT 0)"
                    for db, name in names[i : i + LOCK_BATCH]
                ))  # fmt: skip
        found = read_tables(lock, names)
        raws = [found[n] for n in names if n in found]
        with lock.cursor() as cur:
            cur.execute("SELECT @@GLOBAL.gtid_binlog_pos")
            state = PullerState(parse_gtid_pos(cur.fetchone()[0] or ""), 0)
        lock.rollback()
    finally:
        lock.close()
    alloc, now = TsAllocator(0), time.time()
    records = []
    for raw in raws:
        tid = state.ids.new_table_id()
        schema = build_schema(raw, tid, state.ids, None,
                              force_replicate=puller.upstream.force_replicate)  # fmt: skip
        ts = alloc.issue(now)
        query = (
            f"CREATE TABLE {_q(raw.database)}.{_q(raw.table)} /* existing at changefeed start */"
        )
        records.append(DdlRecord(ts, DDLKind.CREATE_TABLE, "create_table", query,
                                 creates=(tid,), tables={tid: schema}))  # fmt: skip
        state.set_table(tid, schema, ts)
    puller.writer.write_ddls(records)
    start_ts = puller.stats.start_ts = alloc.issue(now)
    state.snapshots = dict.fromkeys(state.tables, start_ts)
    state.last_ts = start_ts
    save_state(puller.root, state)
    marks = [(tid, shard) for tid, t in state.tables.items() for shard in range(t.shards)]
    # each table's own file (two fsyncs): a few threads, as the meta files
    with ThreadPoolExecutor(max(1, min(META_WRITERS, len(marks)))) as pool:
        list(pool.map(lambda m: puller.writer.advance_resolved(*m, start_ts), marks))
    puller.writer.advance_ddl_resolved(start_ts)
    return state


def read_chunks(
    conn: Any, t: TableSchema, chunk: int, progress: Progress | None = None
) -> Iterator[list[dict[int, Any]]]:
    """The table's rows in key order, ``chunk`` at a time, as {column id: value}.

    Each chunk is its own (keyset) query inside the snapshot transaction, so a large table
    never needs one huge result set, and progress is reported per chunk.
    """
    # FLOAT through the text protocol keeps 6 digits; as DOUBLE it is the exact float32 value
    cols = ", ".join(
        f"CAST({_q(c.name)} AS DOUBLE)" if c.type == "float32" else _q(c.name) for c in t.columns
    )
    keys = [t.column(k) for k in t.primary_key]
    key_sql = ", ".join(_q(k.name) for k in keys)
    key_pos = [[c.id for c in t.columns].index(k.id) for k in keys]
    convs = [converter(c.type) for c in t.columns]
    table = f"{_q(t.database)}.{_q(t.table)}"
    with conn.cursor() as cur:
        cur.execute(f"SELECT COUNT(*) FROM {table}")
        total = cur.fetchone()[0]
    done, last = 0, None
    while True:
        where, args = "", ()
        if last is not None:
            where, args = _after_key([_q(k.name) for k in keys], [last[i] for i in key_pos])
        with conn.cursor() as cur:
            cur.execute(f"SELECT {cols} FROM {table}{where} ORDER BY {key_sql} LIMIT {chunk}", args)
            rows = cur.fetchall()
        if not rows:
            return
        last = rows[-1]
        done += len(rows)
        if progress is not None:
            progress(t.qualified_name, done, total)
        yield [
            {
                c.id: (None if v is None else fn(v))
                for c, v, fn in zip(t.columns, r, convs, strict=True)
            }
            for r in rows
        ]
        if len(rows) < chunk:
            return


def _after_key(cols: list[str], values: list[Any]) -> tuple[str, tuple]:
    """``WHERE`` for keys after ``values`` in key order, as OR of prefixes (an index range
    scan in every MariaDB/MySQL version, unlike a row-constructor comparison)."""
    terms, args = [], []
    for i in range(len(cols)):
        eq = [f"{c} = %s" for c in cols[:i]]
        terms.append("(" + " AND ".join([*eq, f"{cols[i]} > %s"]) + ")")
        args += [*values[:i], values[i]]
    return " WHERE " + " OR ".join(terms), tuple(args)
