"""Tables that join a running changefeed with data in them: a snapshot at a known position.

A table joins when the filter is widened (``changefeed update``; seen at the next puller
start) or when a ``RENAME TABLE`` brings a table from outside the filter into it. Its
history before the join is not in the binlog the puller still reads, so it is snapshotted:

1. ``open_join``: list the tables the filter selects that the puller does not track (the
   *candidates*); a lock connection takes their metadata locks (``SELECT 1 ... LIMIT 0`` in
   an open transaction: no DDL can touch them until the join is done, while their rows stay
   writable) and reads their schemas; then a second connection opens ``START TRANSACTION
   WITH CONSISTENT SNAPSHOT`` and MariaDB reports that snapshot's binlog position
   (``binlog_snapshot_file/position`` -> ``BINLOG_GTID_POS``), the *join point*. The
   candidates are listed again: if a table appeared or vanished meanwhile, it starts over.
2. The puller streams on as before; rows of untracked tables are skipped, so a candidate's
   changes up to the join point (which the snapshot holds) are never written twice.
3. ``complete`` runs once the stream has passed the join point (every transaction the
   snapshot sees, no other): the candidates still untracked there join (a candidate the
   stream itself created, or a tracked table renamed meanwhile, does not): one
   ``create_table`` record each, then their rows at one snapshot ts above those, read from
   the snapshot in key order and chunks; then the state (and so the position) is saved.

A crash or stop before ``complete`` leaves nothing: the join's files are above the saved
state's ``last_ts`` (removed at the next start), and the next start finds the same tables
untracked and joins them again, at a later point. No global read lock is taken.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import pymysql

from cdc_dagster.mysql.catalog import (
    CatalogError,
    IdRegistry,
    KeylessTableError,
    RawTable,
    build_schema,
)
from cdc_dagster.mysql.catalog import list_tables as _list_tables
from cdc_dagster.mysql.catalog import quote_ident as _q
from cdc_dagster.mysql.catalog import read_table as _read_table
from cdc_dagster.mysql.changelog_io import change_rows
from cdc_dagster.mysql.context import PullerContext
from cdc_dagster.mysql.errors import PullerBusyError, PullerError
from cdc_dagster.mysql.position import mariadb_snapshot_state
from cdc_dagster.mysql.snapshot import read_chunks
from cdc_dagster.mysql.upstream import connect
from cdc_dagster.schema import DdlRecord
from scheduler_core.ddl import DDLKind

log = logging.getLogger(__name__)

Name = tuple[str, str]
OPEN_ATTEMPTS = 5
_RACE_CODES = (1146, 1412)  # no such table, table definition changed (a DDL raced the open)


def _seq(gtid: str) -> int:
    return int(gtid.rsplit("-", 1)[1])


@dataclass(slots=True)
class PendingJoin:
    """An open join: the snapshot, the locks held, and the tables that may join."""

    lock_conn: Any  # holds the candidates' metadata locks
    snap_conn: Any  # START TRANSACTION WITH CONSISTENT SNAPSHOT
    position: dict[int, str]  # the snapshot's GTID per domain (the join point)
    candidates: dict[Name, RawTable]  # schemas at the join point (read under the locks)
    reason: str
    again: bool = False  # a table came into the filter under a name not among the candidates
    opened: float = field(default_factory=time.monotonic)

    def reached(self, position: dict[int, str]) -> bool:
        """Whether a stream at ``position`` has passed every transaction the snapshot sees."""
        for domain, gtid in self.position.items():
            mine = position.get(domain)
            if mine is None or _seq(mine) < _seq(gtid):
                return False
        return True

    def close(self) -> None:
        """End both transactions (the locks go with the lock connection's)."""
        for conn in (self.snap_conn, self.lock_conn):
            try:
                conn.rollback()
                conn.close()
            except pymysql.MySQLError:
                pass  # the connection is gone: so are its transaction and locks


def candidates(puller: PullerContext, conn: Any) -> list[Name]:
    """Tables the filter selects now that the puller does not track under that name (and
    did not skip for having no key)."""
    st = puller.state
    return [
        n
        for n in _list_tables(conn, puller.filter)
        if st.table_id(*n) is None and n not in st.skipped
    ]


def open_join(puller: PullerContext, reason: str) -> PendingJoin | None:
    """Open a join for the untracked tables the filter selects (None: there are none)."""
    for _ in range(OPEN_ATTEMPTS):
        lock = connect(puller.upstream)
        try:
            names = candidates(puller, lock)
            if not names:
                lock.close()
                return None
            join = _open(puller, lock, names, reason)
        except pymysql.MySQLError as exc:
            lock.close()
            if exc.args and exc.args[0] in _RACE_CODES:
                continue  # a candidate was dropped or altered while we opened: again
            raise
        except BaseException:
            lock.close()
            raise
        if join is not None:
            log.info("join of %s opened at %s (%s)", _names(join.candidates), join.position, reason)
            return join
        lock.close()
    raise PullerBusyError(
        f"tables kept being created, renamed or altered in the filter while a join snapshot "
        f"was opened ({reason}); the next puller run tries again"
    )


def _open(puller: PullerContext, lock: Any, names: list[Name], reason: str) -> PendingJoin | None:
    """Lock and read the candidates, open the snapshot; None if the candidates changed."""
    raws: dict[Name, RawTable] = {}
    with lock.cursor() as cur:
        cur.execute("START TRANSACTION")
        for db, t in names:
            cur.execute(f"SELECT 1 FROM {_q(db)}.{_q(t)} LIMIT 0")  # its metadata lock
    keyless = False
    for db, t in names:
        raw = _read_table(lock, db, t)
        if raw is None:
            return None
        if _keyless(puller, raw):
            puller.skip_table((db, t))
            keyless = True
        raws[(db, t)] = raw
    if keyless:
        return None  # opened again without them (they are skipped, not joined)
    snap = connect(puller.upstream)
    try:
        with snap.cursor() as cur:
            cur.execute("SET SESSION time_zone = '+00:00'")
            cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            position = mariadb_snapshot_state(cur).position
        if candidates(puller, lock) != names:
            snap.close()
            return None
    except BaseException:
        snap.close()
        raise
    return PendingJoin(lock, snap, position, raws, reason)


def _keyless(puller: PullerContext, raw: RawTable) -> bool:
    """Whether a joining table has no key (it is skipped, as a CREATE TABLE of one is)."""
    try:
        build_schema(raw, 1, IdRegistry(), None, force_replicate=puller.upstream.force_replicate)
    except KeylessTableError:
        return True
    except CatalogError as exc:
        raise PullerError(
            f"table {raw.database}.{raw.table} joins the changefeed (a widened filter or a "
            f"RENAME into it) but cannot be replicated: {exc}"
        ) from None
    return False


def refuse_on_mysql(puller: PullerContext, names: list[Name]) -> None:
    """On MySQL a joining table is a clear error (the join is implemented for MariaDB)."""
    raise PullerError(
        f"table(s) {', '.join(f'{d}.{t}' for d, t in names)} join a running changefeed "
        "(a widened filter or a RENAME into it), and a join snapshot is implemented "
        "for MariaDB upstreams only: exclude them from the filter, or remove the "
        "changefeed and create it again with the new filter (a new initial snapshot)"
    )


def refuse_widened_filter(puller: PullerContext) -> None:
    """MySQL: a changed filter that selects untracked tables is refused, naming them."""
    conn = connect(puller.upstream)
    try:
        names = candidates(puller, conn)
    finally:
        conn.close()
    if names:
        refuse_on_mysql(puller, names)


def complete(puller: PullerContext, join: PendingJoin) -> int:
    """At the join point: create records and snapshot rows of the joining tables; returns
    the rows written. The caller flushed everything before and saves the state after."""
    st, alloc, writer = puller.state, puller.alloc, puller.writer
    joined = []
    where = ",".join(join.position[d] for d in sorted(join.position))
    for (db, t), raw in sorted(join.candidates.items()):
        if st.table_id(db, t) is not None:
            continue  # the stream created it (or renamed a tracked table to this name)
        tid = st.ids.new_table_id()
        schema = build_schema(raw, tid, st.ids, None,
                              force_replicate=puller.upstream.force_replicate)  # fmt: skip
        ts = alloc.issue(0.0)  # next to the stream's own ts (the binlog's time)
        gone = replaced(puller, db, t)
        note = f"; replaces table id {next(iter(gone))} downstream" if gone else ""
        query = f"CREATE TABLE {_q(db)}.{_q(t)} /* joined the changefeed at {where}{note} */"
        writer.write_ddl(DdlRecord(ts, DDLKind.CREATE_TABLE, "create_table", query,
                                   creates=(tid,), tables={tid: schema, **gone}))  # fmt: skip
        st.set_table(tid, schema, ts)
        puller.forget_table_plans(tid)
        joined.append(tid)
    rows_written = 0
    if joined:
        snapshot_ts = alloc.issue(0.0)
        for tid in joined:
            schema, version = st.tables[tid], st.versions[tid]
            chunk_rows, progress = puller.config.snapshot_chunk_rows, puller.config.progress
            for rows in read_chunks(join.snap_conn, schema, chunk_rows, progress):
                batch = [(snapshot_ts, i, 1, r, None) for i, r in enumerate(rows)]
                writer.write_rows(tid, 0, version, change_rows(schema, version, batch))
                rows_written += len(rows)
        puller.stats.ddls += len(joined)
    log.info(
        "join at %s: %s joined with %d rows (%s)",
        where,
        ", ".join(st.tables[t].qualified_name for t in joined) or "no table",
        rows_written,
        join.reason,
    )
    return rows_written


def leave_unselected(puller: PullerContext) -> list[int]:
    """Tables tracked but no longer selected by the filter (a narrowed filter) leave the
    changefeed: one ``drop_table`` record each (the owner, whose filter no longer selects
    them either, leaves their downstream table as it is), then they are forgotten, so their
    binlog rows are skipped, and their names are kept in ``state.left``. The caller saves
    the state (with the records) right after. Returns the ids that left."""
    st = puller.state
    for name in [n for n in st.skipped if not puller.filter(*n)]:
        del st.skipped[name]  # no longer selected: no longer skipped either
    gone = sorted(t for t, s in st.tables.items() if not puller.filter(s.database, s.table))
    for tid in gone:
        schema = st.tables[tid]
        db, t = schema.database, schema.table
        query = (
            f"DROP TABLE {_q(db)}.{_q(t)} /* left the changefeed: the filter no longer "
            "selects it; its downstream table is kept */"
        )
        ts = puller.alloc.issue(0.0)
        puller.writer.write_ddl(DdlRecord(ts, DDLKind.DROP_TABLE, "drop_table", query, (tid,),
                                          drops=(tid,), tables={tid: None}))  # fmt: skip
        st.set_table(tid, None, ts)
        st.left[(db, t)] = tid
        puller.forget_table_plans(tid)
        log.info("%s.%s (id %d) left the changefeed (filter %s)", db, t, tid, puller.filter)
    return gone


def replaced(puller: PullerContext, db: str, table: str) -> dict[int, None]:
    """For a table created (or joining) as ``db.table``: the id of a table that left the
    changefeed under that name, as ``DdlRecord.tables`` entries (``{id: None}``), so the sink
    replaces that downstream table (``DdlRecord.replaces``); forgets it in the state."""
    old = puller.state.left.pop((db, table), None)
    return {} if old is None else {old: None}


def _names(c: dict[Name, RawTable]) -> str:
    return ", ".join(f"{d}.{t}" for d, t in sorted(c))
