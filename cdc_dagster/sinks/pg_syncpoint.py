"""Consistent copies of registered PostgreSQL tables at each syncpoint (docs/dbt.md).

PostgreSQL has no time travel: once a table moves past a syncpoint, the state at the
syncpoint is gone. A reader that needs it (the dbt downstream) registers the tables it
reads in ``cdc_dagster.syncpoint_copy_requests``. Syncpoints hold nothing back: each
table's sink splits its batches at syncpoint TSs, and the write that ends exactly at one
copies the table, if registered, in its own transaction (:func:`copy_table`): the copy is
the table's state at the syncpoint, whatever the other tables are doing. When the owner
records the syncpoint (every table passed it), :func:`copy_missing` makes the copies a
write could not (a table registered since, or one that started exactly at the syncpoint)
only where the table's checkpoint row still says ``committed_ts <= ts`` in the record's
REPEATABLE READ snapshot: a wrong copy is never made, a missing one only means that
syncpoint is not built.

Copies live in schema ``cdc_syncpoint`` and are listed in
``cdc_dagster.syncpoint_copies``; each record keeps the newest ``KEEP`` syncpoints' copies
and the one the reader pinned (``pinned_ts``), and prunes only while no reader holds the
build lock (:data:`BUILD_LOCK_SQL`).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence

import psycopg
from psycopg import sql

from cdc_dagster.schema import TableSchema

_log = logging.getLogger(__name__)

META = "cdc_dagster"
COPY_SCHEMA = "cdc_syncpoint"
KEEP = 5
# A reader holds this session lock while it builds on a copy; pruning takes it or skips.
BUILD_LOCK_KEY = "cdc_dagster.syncpoint_build"
BUILD_LOCK_SQL = f"SELECT pg_advisory_lock(hashtext('{BUILD_LOCK_KEY}'))"

BOOTSTRAP = [
    f"CREATE SCHEMA IF NOT EXISTS {META}",
    f"CREATE SCHEMA IF NOT EXISTS {COPY_SCHEMA}",
    f"""CREATE TABLE IF NOT EXISTS {META}.syncpoint_copy_requests (
        changefeed text NOT NULL, database text NOT NULL, table_name text NOT NULL,
        pinned_ts bigint NOT NULL DEFAULT 0,
        PRIMARY KEY (changefeed, database, table_name))""",
    f"""CREATE TABLE IF NOT EXISTS {META}.syncpoint_copies (
        changefeed text NOT NULL, upstream_ts bigint NOT NULL, table_id bigint NOT NULL,
        database text NOT NULL, table_name text NOT NULL, copy_table text NOT NULL,
        n_rows bigint NOT NULL, PRIMARY KEY (changefeed, upstream_ts, table_id))""",
]


def copy_table_name(changefeed_id: str, ts: int, table_id: int) -> str:
    """``c<hash of changefeed>_<ts>_<table id>`` (well under PostgreSQL's 63 bytes)."""
    h = hashlib.sha1(changefeed_id.encode()).hexdigest()[:8]
    return f"c{h}_{ts}_{table_id}"


def ensure_schema(conn: psycopg.Connection) -> None:
    """The copy schema and bookkeeping tables (idempotent)."""
    for stmt in BOOTSTRAP:
        conn.execute(stmt)


def register(
    conn: psycopg.Connection, changefeed_id: str, tables: Sequence[tuple[str, str]]
) -> None:
    """Ask for copies of ``tables`` (database, table) at the changefeed's next syncpoints."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('cdc_dagster.bootstrap'))")
        ensure_schema(conn)
        for database, table in tables:
            conn.execute(
                f"INSERT INTO {META}.syncpoint_copy_requests (changefeed, database, table_name) "
                "VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
                (changefeed_id, database, table),
            )


def _requested(conn: psycopg.Connection, changefeed_id: str) -> set[tuple[str, str]]:
    exists = conn.execute(
        "SELECT to_regclass(%s) IS NOT NULL", (f"{META}.syncpoint_copy_requests",)
    ).fetchone()[0]
    if not exists:
        return set()
    rows = conn.execute(
        f"SELECT database, table_name FROM {META}.syncpoint_copy_requests WHERE changefeed = %s",
        (changefeed_id,),
    ).fetchall()
    return {(d, t) for d, t in rows}


def copy_table(conn: psycopg.Connection, changefeed_id: str, ts: int, table: TableSchema) -> bool:
    """Copy ``table`` as syncpoint ``ts`` if a reader registered it; True if copied.

    Runs inside the sink write whose batch ends exactly at ``ts`` (after its MERGE and
    checkpoint row): the transaction's own view of the table is its state at ``ts``.
    """
    if (table.database, table.table) not in _requested(conn, changefeed_id):
        return False
    _copy(conn, changefeed_id, ts, table)
    return True


def _copy(conn: psycopg.Connection, changefeed_id: str, ts: int, t: TableSchema) -> None:
    name = copy_table_name(changefeed_id, ts, t.table_id)
    target = sql.Identifier(COPY_SCHEMA, name)
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(target))
    conn.execute(
        sql.SQL("CREATE TABLE {} AS TABLE {}").format(target, sql.Identifier(t.database, t.table))
    )
    (n,) = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(target)).fetchone()
    conn.execute(
        f"INSERT INTO {META}.syncpoint_copies VALUES (%s, %s, %s, %s, %s, %s, %s) "
        "ON CONFLICT DO NOTHING",
        (changefeed_id, ts, t.table_id, t.database, t.table, name, n),
    )


def copy_missing(
    conn: psycopg.Connection, changefeed_id: str, ts: int, tables: Sequence[TableSchema]
) -> int:
    """At the record of syncpoint ``ts``: copy the registered ``tables`` that have no copy
    yet and are not past ``ts``; then prune old copies. The number copied.

    Must run as the first statements of a REPEATABLE READ transaction (the caller's, which
    also inserts the syncpoint row): the check and the copies then read one snapshot.
    """
    wanted = _requested(conn, changefeed_id)
    todo = [t for t in tables if (t.database, t.table) in wanted]
    if not todo:
        return 0
    have = {
        tid
        for (tid,) in conn.execute(
            f"SELECT table_id FROM {META}.syncpoint_copies "
            "WHERE changefeed = %s AND upstream_ts = %s",
            (changefeed_id, ts),
        ).fetchall()
    }
    todo = [t for t in todo if t.table_id not in have]
    at = dict(
        conn.execute(
            f"SELECT table_id, committed_ts FROM {META}.checkpoints "
            "WHERE changefeed = %s AND table_id = ANY(%s)",
            (changefeed_id, [t.table_id for t in todo]),
        ).fetchall()
    )
    # Not past ts is at ts: a table whose checkpoint row is below it (or absent: acquired,
    # never written) had nothing to write up to ts, as the owner's checkpoint says.
    off = {t.qualified_name: at.get(t.table_id) for t in todo if (at.get(t.table_id) or 0) > ts}
    if off:
        _log.warning(
            "syncpoint %d of %s: tables without a copy and no longer at the syncpoint %s; "
            "no copies made: this syncpoint will not be built",
            ts,
            changefeed_id,
            off,
        )
        todo = []
    for t in todo:
        _copy(conn, changefeed_id, ts, t)
    _prune(conn, changefeed_id)
    return len(todo)


def _prune(conn: psycopg.Connection, changefeed_id: str) -> None:
    """Drop copies older than the newest KEEP syncpoints, except the pinned one."""
    (free,) = conn.execute(
        f"SELECT pg_try_advisory_xact_lock(hashtext('{BUILD_LOCK_KEY}'))"
    ).fetchone()
    if not free:
        return  # a build is reading copies: prune at a later syncpoint
    old = conn.execute(
        f"""SELECT c.upstream_ts, c.copy_table FROM {META}.syncpoint_copies c
        WHERE c.changefeed = %s
          AND c.upstream_ts NOT IN (SELECT DISTINCT upstream_ts FROM {META}.syncpoint_copies
                                    WHERE changefeed = %s ORDER BY upstream_ts DESC LIMIT %s)
          AND c.upstream_ts NOT IN (SELECT pinned_ts FROM {META}.syncpoint_copy_requests
                                    WHERE changefeed = %s)""",
        (changefeed_id, changefeed_id, KEEP, changefeed_id),
    ).fetchall()
    for ts, name in old:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(COPY_SCHEMA, name)))
        conn.execute(
            f"DELETE FROM {META}.syncpoint_copies WHERE changefeed = %s AND upstream_ts = %s "
            "AND copy_table = %s",
            (changefeed_id, ts, name),
        )
