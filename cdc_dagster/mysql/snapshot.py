"""Initial snapshot: existing tables and rows at one snapshot ts, then stream from its GTID.

``START TRANSACTION WITH CONSISTENT SNAPSHOT`` on MariaDB also fixes the binlog position
of that snapshot (``binlog_snapshot_file/position``), which ``BINLOG_GTID_POS`` turns
into the GTID to stream from: no global read lock is held. Every table is logged as a
``create_table`` DDL record (one TS each), then its rows are written as inserts at one
snapshot TS above those, read in primary-key order in chunks (progress per chunk).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from cdc_dagster.mysql.catalog import build_schema, list_tables, read_table
from cdc_dagster.mysql.catalog import quote_ident as _q
from cdc_dagster.mysql.state import PullerState, TsAllocator, parse_gtid_pos, save_state
from cdc_dagster.mysql.types import converter
from cdc_dagster.mysql.upstream import connect
from cdc_dagster.schema import DdlRecord, TableSchema
from scheduler_core.ddl import DDLKind

if TYPE_CHECKING:
    from cdc_dagster.mysql.puller import Puller


def bootstrap(puller: Puller, conn: Any) -> PullerState:
    """First start: create records for every table, the snapshot rows, the start position."""
    from cdc_dagster.mysql.puller import PullerError, change_rows

    snap = connect(puller.upstream)
    try:
        with snap.cursor() as cur:
            cur.execute("SET SESSION time_zone = '+00:00'")
            cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            if puller.info.is_mariadb:
                state = _mariadb_snapshot(cur, PullerError)
            else:
                state = _mysql_snapshot(cur, PullerError)
        alloc = TsAllocator(0)
        now = time.time()
        for db, name in list_tables(snap, puller.filter):
            raw = read_table(snap, db, name)
            if raw is None:
                continue
            tid = state.ids.new_table_id()
            schema = build_schema(raw, tid, state.ids, None,
                                  force_replicate=puller.upstream.force_replicate)  # fmt: skip
            ts = alloc.issue(now)
            query = f"CREATE TABLE {_q(db)}.{_q(name)} /* existing at changefeed start */"
            puller.writer.write_ddl(DdlRecord(ts, DDLKind.CREATE_TABLE, "create_table", query,
                                              creates=(tid,), tables={tid: schema}))  # fmt: skip
            state.set_table(tid, schema, ts)
        # A changefeed starts one TS below the snapshot rows and above every CREATE: the
        # owner then finds each table existing at its start ts and replicates the rows.
        puller.stats.start_ts = alloc.issue(now)
        snapshot_ts = alloc.issue(now)
        if puller.config.snapshot:
            for tid, schema in state.tables.items():
                for rows in _chunks(snap, schema, puller.config.snapshot_chunk_rows, puller):
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


def _mariadb_snapshot(cur: Any, error: type[Exception]) -> PullerState:
    """Open the snapshot; MariaDB reports its binlog position (no lock needed)."""
    cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
    cur.execute("SHOW STATUS LIKE 'binlog_snapshot_%'")
    status = {k.lower(): v for k, v in cur.fetchall()}
    if "binlog_snapshot_file" not in status:
        raise error("the upstream gives no binlog_snapshot_file (not MariaDB?)")
    cur.execute(
        "SELECT BINLOG_GTID_POS(%s, %s)",
        (status["binlog_snapshot_file"], int(status["binlog_snapshot_position"])),
    )
    return PullerState(parse_gtid_pos(cur.fetchone()[0] or ""), 0)


def _mysql_snapshot(cur: Any, error: type[Exception]) -> PullerState:
    """Open the snapshot at a known MySQL binlog position (mysqldump's --single-transaction
    --source-data sequence): the global read lock is held only while the transaction starts
    and the position is read, not while the rows are read. Needs RELOAD.

    UNTESTED against a MySQL server (none can be installed here; docs/mysql-postgres.md).
    """
    cur.execute("FLUSH TABLES WITH READ LOCK")
    try:
        cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
        status = binary_log_status(cur)
        cur.execute("SELECT @@GLOBAL.gtid_mode")
        gtid_mode = str(cur.fetchone()[0]).upper()
    finally:
        cur.execute("UNLOCK TABLES")
    if status is None:
        raise error("the upstream reports no binary log status: start it with --log-bin")
    return mysql_state_at(status, gtid_mode)


def binary_log_status(cur: Any) -> dict[str, Any] | None:
    """``SHOW BINARY LOG STATUS`` (MySQL >= 8.2) or ``SHOW MASTER STATUS``, as a dict."""
    import pymysql

    for stmt in ("SHOW BINARY LOG STATUS", "SHOW MASTER STATUS"):
        try:
            cur.execute(stmt)
        except pymysql.err.ProgrammingError:
            continue
        row = cur.fetchone()
        if row is None:
            return None
        return {d[0]: v for d, v in zip(cur.description, row, strict=True)}
    return None


def mysql_state_at(status: dict[str, Any], gtid_mode: str) -> PullerState:
    """The puller's start state from MySQL's binary log status: resume by GTID set when
    ``gtid_mode=ON`` and the set is not empty, else by file:pos."""
    gtids = "".join(str(status.get("Executed_Gtid_Set") or "").split())
    file, pos = str(status["File"]), int(status["Position"])
    if gtid_mode == "ON" and gtids:
        return PullerState({}, 0, flavor="mysql_gtid", gtid_set=gtids, log_file=file,
                           log_pos=pos)  # fmt: skip
    return PullerState({}, 0, flavor="mysql_file", log_file=file, log_pos=pos)


def _chunks(conn: Any, t: TableSchema, chunk: int, puller: Puller):
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
    progress = puller.config.progress
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
