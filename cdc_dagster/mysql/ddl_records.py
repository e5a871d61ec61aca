"""A DDL statement of the binlog -> the DDL record it means for the change log (or none).

The schema after CREATE TABLE / ALTER TABLE / RENAME is computed from the schema before
and the statement's AST (``mysql.evolve``), so a puller several DDLs behind is right; only
what the AST cannot say (CREATE TABLE ... LIKE / AS SELECT) reads the upstream catalog.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cdc_dagster.mysql import join
from cdc_dagster.mysql.catalog import IdRegistry, KeylessTableError, build_schema, read_table
from cdc_dagster.mysql.context import PullerContext
from cdc_dagster.mysql.ddl import ParsedDDL
from cdc_dagster.mysql.errors import PullerError
from cdc_dagster.mysql.evolve import NeedsCatalog, altered_schema, created_schema, renamed
from cdc_dagster.schema import DdlRecord, TableSchema
from scheduler_core.ddl import DDLKind

Issue = Callable[[], int]  # the DDL's commit ts, issued only when a record is made


def ddl_record(
    ctx: PullerContext, conn: Any, p: ParsedDDL, query: str, issue: Issue
) -> DdlRecord | None:
    """The record of statement ``p`` (None: it touches nothing the changefeed replicates)."""
    st = ctx.state
    if p.action in ("create_schema", "drop_schema"):
        return _schema_record(ctx, p, query, issue)
    if p.action == "create_table":
        return _create_record(ctx, conn, p, query, issue)
    if p.action == "drop_table":
        for name in p.drops:
            st.skipped.pop(name, None)  # a skipped table's drop: nothing downstream
        ids = tuple(t for t in (st.table_id(*n) for n in p.drops) if t is not None)
        if not ids:
            return None
        return DdlRecord(issue(), DDLKind.DROP_TABLE, p.action, query, ids,
                         drops=ids, tables=dict.fromkeys(ids))  # fmt: skip
    if p.action == "rename_table" and p.renames:
        return _rename_record(ctx, conn, p, query, issue)
    tid = st.table_id(*p.tables[0])
    if tid is None:
        if p.tables[0] in st.skipped and p.action != "truncate_table":
            _recheck_skipped(ctx, conn, p.tables[0])
        return None
    before = st.tables[tid]
    if p.action == "truncate_table":
        return DdlRecord(issue(), DDLKind.TRUNCATE_TABLE, p.action, query, (tid,),
                         tables={tid: before})  # fmt: skip
    after = _altered(ctx, conn, query, before, p.column_renames)
    return DdlRecord(issue(), DDLKind.ALTER_TABLE, p.action, query, (tid,), tables={tid: after})


def _schema_record(ctx: PullerContext, p: ParsedDDL, query: str, issue: Issue) -> DdlRecord | None:
    assert p.schema is not None
    if not ctx.filter(p.schema, "\x00any"):
        return None
    if p.action == "create_schema":
        return DdlRecord(issue(), DDLKind.CREATE_SCHEMA, p.action, query, schema=p.schema)
    for name in [n for n in ctx.state.skipped if n[0] == p.schema]:
        del ctx.state.skipped[name]
    gone = tuple(t for t, s in ctx.state.tables.items() if s.database == p.schema)
    return DdlRecord(issue(), DDLKind.DROP_SCHEMA, p.action, query, gone, drops=gone,
                     schema=p.schema, tables=dict.fromkeys(gone))  # fmt: skip


def _create_record(
    ctx: PullerContext, conn: Any, p: ParsedDDL, query: str, issue: Issue
) -> DdlRecord | None:
    st, force = ctx.state, ctx.upstream.force_replicate
    (db, name) = p.creates[0]
    if p.replace and st.table_id(db, name) is not None:
        raise PullerError(
            f"changefeed stopped at {query[:200]!r}: CREATE OR REPLACE of a replicated "
            f"table is not supported; use DROP TABLE then CREATE TABLE, or re-snapshot"
        )
    if not ctx.filter(db, name) or st.table_id(db, name) is not None:
        return None  # outside the filter, or CREATE TABLE IF NOT EXISTS of one we have
    # ids taken on a copy: a table skipped for having no key takes none
    ids = IdRegistry(st.ids.next_table_id, dict(st.ids.next_column_id))
    tid = ids.new_table_id()
    try:
        try:
            schema = created_schema(query, (db, name), tid, ids, force, ctx.info.is_mariadb)
        except NeedsCatalog:
            raw = read_table(conn, db, name)
            if raw is None:
                return None  # dropped again before we read it: its drop is skipped too
            schema = build_schema(raw, tid, ids, None, force_replicate=force)
    except KeylessTableError:
        ctx.skip_table((db, name))
        return None
    st.ids = ids
    st.skipped.pop((db, name), None)  # CREATE OR REPLACE of a skipped table, now with a key
    return DdlRecord(issue(), DDLKind.CREATE_TABLE, p.action, query, creates=(tid,),
                     tables={tid: schema, **join.replaced(ctx, db, name)})  # fmt: skip


def _rename_record(
    ctx: PullerContext, conn: Any, p: ParsedDDL, query: str, issue: Issue
) -> DdlRecord | None:
    st = ctx.state
    touched, drops, tables = [], [], {}
    for src, dst in p.renames:
        tid = st.table_id(*src)
        keep = ctx.filter(*dst)
        st.skipped.pop(src, None)  # renamed: into the filter it joins (keys checked again)
        if tid is None and not keep:
            continue
        if tid is None:
            ctx.need_join(dst)  # its rows so far are not in the binlog we read
            continue
        touched.append(tid)
        if not keep:
            drops.append(tid)
            tables[tid] = None
        elif p.is_alter:
            tables[tid] = _altered(ctx, conn, query, st.tables[tid], p.column_renames)
        else:
            tables[tid] = renamed(st.tables[tid], *dst)
    if not touched:
        return None
    return DdlRecord(issue(), DDLKind.RENAME_TABLES, "rename_table", query, tuple(touched), (),
                     tuple(drops), tables=tables)  # fmt: skip


def _recheck_skipped(ctx: PullerContext, conn: Any, name: tuple[str, str]) -> None:
    """A DDL on a table skipped for having no key: if the catalog now gives it one, it
    joins the changefeed with a snapshot (its rows so far are not in the binlog we read)."""
    raw = read_table(conn, *name)
    if raw is None:
        return
    try:
        build_schema(raw, 1, IdRegistry(), None)
    except KeylessTableError:
        return  # still no key: still skipped
    del ctx.state.skipped[name]
    ctx.need_join(name)


def _altered(
    ctx: PullerContext, conn: Any, query: str, before: TableSchema, renames: dict[str, str]
) -> TableSchema:
    st, force = ctx.state, ctx.upstream.force_replicate
    try:
        return altered_schema(query, before, st.ids, force, ctx.info.is_mariadb)
    except NeedsCatalog:
        raw = read_table(conn, before.database, before.table)
        if raw is None:
            raise PullerError(f"table {before.qualified_name} vanished after {query!r}") from None
        return build_schema(raw, before.table_id, st.ids, before, renames, force)


__all__ = ["ddl_record"]
