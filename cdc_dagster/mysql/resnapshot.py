"""Re-snapshot of a replicated table (``cdc-dagster table resnapshot``), on the chunked path.

Debezium's incremental snapshot (a signal) re-reads a table's rows in chunks and emits them
as reads; reads cannot delete, so a row the downstream holds but the upstream no longer has
survives it. A user re-snapshots precisely because the downstream diverged (rows changed,
added or deleted there, or upstream changes that never reached the binlog), so here the
re-snapshot *replaces* the table's downstream state at one point of the stream:

1. Between two transactions, at the stream's position P, the puller flushes, then writes a
   ``truncate_table`` DDL record for the table at a fresh TS T (query ``TRUNCATE TABLE ..
   /* re-snapshot requested at <P> ... */``), puts the table in ``state.snapshots`` under
   generation T, starts remembering its changes from P, and saves the state (one flush).
2. The ``mysql_snapshot`` run reads the table in key-range chunks, each at its own
   consistent snapshot at or after P; the puller places each chunk at its binlog position,
   above T (``mysql.adoption``): what a chunk's keys held there, every later change after it.
3. The table's resolved mark stays where it was before T until every range is placed, so
   the downstream keeps serving the old rows meanwhile; then the sinks apply the truncate
   (a table barrier: only this table waits for it) and the rows after it: the table equals
   the upstream, with nothing of the old state left (Delta and PostgreSQL both truncate in
   the DDL's commit). The other tables' marks, and the stream, never wait.

A crash before the state save leaves nothing (the record is above the saved ``last_ts`` and
removed at the next start) and the request is still pending (it is forgotten only after the
save), so it is taken again; after the save the snapshot resumes like any other.
"""

from __future__ import annotations

from cdc_dagster.mysql.catalog import quote_ident as _q
from cdc_dagster.mysql.context import PullerContext
from cdc_dagster.mysql.state import PullerState
from cdc_dagster.schema import DdlRecord
from scheduler_core.ddl import DDLKind


def split_name(name: str) -> tuple[str, str] | None:
    """``database.table`` -> its parts (None: not of that form). A dot inside a table name
    is not supported here (the first dot splits)."""
    db, dot, table = name.partition(".")
    return (db, table) if dot and db and table else None


def refusal(state: PullerState, name: str) -> str | None:
    """Why the puller cannot re-snapshot ``name`` now (None: it can). The admin side checks
    the same before it writes a request; this is the answer at the time it is taken."""
    parts = split_name(name)
    if parts is None:
        return f"{name!r} is not DATABASE.TABLE"
    if state.flavor != "mariadb":
        return (
            "a re-snapshot reads chunks at MariaDB's consistent-snapshot binlog positions; "
            f"this change log is pulled from {state.flavor}"
        )
    tid = state.table_id(*parts)
    if tid is None:
        why = state.skipped.get(parts)
        return f"{name} is not replicated: {why}" if why else (
            f"{name} is not replicated by this changefeed now (dropped, renamed or out of "
            "the filter since it was requested?)"
        )  # fmt: skip
    if tid in state.snapshots:
        return f"{name} (table id {tid}) is being snapshotted already"
    return None


def truncate_record(ctx: PullerContext, table_id: int) -> DdlRecord:
    """The truncate that starts a re-snapshot of ``table_id``, at a fresh TS next to the
    stream's (the binlog's time, as a join's create record)."""
    schema = ctx.state.tables[table_id]
    where = ctx.state.gtid
    query = (
        f"TRUNCATE TABLE {_q(schema.database)}.{_q(schema.table)} /* re-snapshot requested "
        f"at {where}: its rows come again in chunks */"
    )
    return DdlRecord(ctx.alloc.issue(0.0), DDLKind.TRUNCATE_TABLE, "truncate_table", query,
                     (table_id,), tables={table_id: schema})  # fmt: skip


__all__ = ["refusal", "split_name", "truncate_record"]
