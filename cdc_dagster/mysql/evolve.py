"""The schema after a DDL, computed from the schema before and sqlglot's AST of the DDL.

The upstream catalog shows the schema *now*, which is ahead of a lagging puller (a
restart after several DDLs): so CREATE TABLE and ALTER TABLE are applied to our own
schema history instead. Forms the AST does not describe (CREATE TABLE ... LIKE / AS
SELECT) raise ``NeedsCatalog`` and the caller reads the catalog.
"""

from __future__ import annotations

import re

from sqlglot import exp

from cdc_dagster.mysql.catalog import IdRegistry, RawTable, build_schema
from cdc_dagster.mysql.ddl import UnsupportedDDLError, parse_mysql
from cdc_dagster.mysql.types import default_text, logical_type
from cdc_dagster.schema import ColumnSchema, IndexSchema, TableSchema


class NeedsCatalog(Exception):
    """The statement does not carry the schema (read it from the upstream catalog)."""


def _logical(kind: exp.DataType, is_mariadb: bool) -> str:
    text = kind.sql("mysql").lower().replace(", ", ",")
    dtype = re.split(r"[ (]", text, maxsplit=1)[0]
    dtype = {"boolean": "tinyint", "bool": "tinyint", "nchar": "char", "nvarchar": "varchar",
             "dec": "decimal", "fixed": "decimal"}.get(dtype, dtype)  # fmt: skip
    if dtype == "json" and is_mariadb:
        return "string"  # MariaDB's JSON is LONGTEXT (the catalog and binlog say so too)
    return logical_type(dtype, text)


def _column(
    cd: exp.ColumnDef, is_mariadb: bool
) -> tuple[tuple[str, str, bool, str | None], bool, bool]:
    """((name, logical, nullable, default), is primary key, is unique)."""
    kind = cd.args.get("kind")
    if kind is None:
        raise UnsupportedDDLError(f"column {cd.name!r} without a type")
    lt = _logical(kind, is_mariadb)
    nullable, default, pk, unique = True, None, False, False
    for c in cd.constraints:
        k = c.kind
        if isinstance(k, exp.NotNullColumnConstraint):
            nullable = bool(k.args.get("allow_null"))
        elif isinstance(k, exp.PrimaryKeyColumnConstraint):
            pk, nullable = True, False
        elif isinstance(k, exp.UniqueColumnConstraint):
            unique = True
        elif isinstance(k, exp.DefaultColumnConstraint):
            default = default_text(lt, k.this.sql("mysql"))
    return (cd.name, lt, nullable, default), pk, unique


def _raw_of(t: TableSchema) -> RawTable:
    cols = [(c.name, c.type, c.nullable, c.default) for c in t.columns]
    keys = {"PRIMARY": (True, [t.column(i).name for i in t.primary_key])}
    for i in t.indexes:
        keys[i.name] = (i.unique, [t.column(c).name for c in i.columns])
    return RawTable(t.database, t.table, cols, keys)


def _names(node: exp.Expression) -> list[str]:
    out = []
    for e in node.expressions:
        while isinstance(e, exp.Ordered):
            e = e.this
        out.append(e.name)
    return out


def _add_constraint(raw: RawTable, c: exp.Expression) -> None:
    if isinstance(c, exp.PrimaryKey):
        raw.keys["PRIMARY"] = (True, _names(c))
        pk = set(raw.keys["PRIMARY"][1])
        raw.columns = [(n, t, False if n in pk else nl, d) for n, t, nl, d in raw.columns]
    elif isinstance(c, exp.UniqueColumnConstraint):
        schema = c.this
        cols = _names(schema) if isinstance(schema, exp.Schema) else []
        name = schema.this.name if isinstance(schema, exp.Schema) and schema.this else cols[0]
        raw.keys[name] = (True, cols)
    elif isinstance(c, exp.IndexColumnConstraint):
        cols = _names(c)
        raw.keys[c.name or cols[0]] = (False, cols)
    elif isinstance(c, exp.Constraint):
        for inner in c.expressions:
            _add_constraint(raw, inner)
    elif isinstance(c, exp.ForeignKey | exp.CheckColumnConstraint):
        return  # no effect on the replicated schema
    else:
        raise UnsupportedDDLError(f"unsupported constraint {c.sql('mysql')!r}")


def created_schema(
    query: str, name: tuple[str, str], table_id: int, ids: IdRegistry, force: bool, mariadb: bool
) -> TableSchema:
    """The schema a CREATE TABLE statement defines (NeedsCatalog for LIKE / AS SELECT)."""
    stmt = parse_mysql(query)
    if not isinstance(stmt, exp.Create) or not isinstance(stmt.this, exp.Schema):
        raise NeedsCatalog(query)
    if stmt.args.get("expression") is not None:
        raise NeedsCatalog(query)
    raw = RawTable(name[0], name[1], [], {})
    for e in stmt.this.expressions:
        if isinstance(e, exp.ColumnDef):
            col, pk, unique = _column(e, mariadb)
            raw.columns.append(col)
            if pk:
                raw.keys["PRIMARY"] = (True, [col[0]])
            if unique:
                raw.keys[col[0]] = (True, [col[0]])
        else:
            _add_constraint(raw, e)
    _fix_pk_nullability(raw)
    return build_schema(raw, table_id, ids, None, force_replicate=force)


def _fix_pk_nullability(raw: RawTable) -> None:
    pk = set(raw.keys.get("PRIMARY", (True, []))[1])
    raw.columns = [(n, t, False if n in pk else nl, d) for n, t, nl, d in raw.columns]


def altered_schema(
    query: str, before: TableSchema, ids: IdRegistry, force: bool, mariadb: bool
) -> TableSchema:
    """``before`` with the ALTER TABLE statement's actions applied (column ids kept)."""
    stmt = parse_mysql(query)
    if isinstance(stmt, exp.Command) and " CONVERT " in f" {query.upper()} ":
        return before  # CONVERT TO CHARACTER SET: text stays a logical string
    if not isinstance(stmt, exp.Alter):
        raise NeedsCatalog(query)
    raw = _raw_of(before)
    renames: dict[str, str] = {}
    for a in stmt.args.get("actions") or []:
        _apply(raw, a, renames, before.database, mariadb)
    _fix_pk_nullability(raw)
    # ids follow names through renames: map the before-names to the final names
    return build_schema(raw, before.table_id, ids, before, renames, force)


def _rename_col(raw: RawTable, old: str, new: str, renames: dict[str, str]) -> None:
    raw.columns = [(new if n == old else n, t, nl, d) for n, t, nl, d in raw.columns]
    raw.keys = {k: (u, [new if c == old else c for c in cs]) for k, (u, cs) in raw.keys.items()}
    orig = next((o for o, cur in renames.items() if cur == old), old)
    renames[orig] = new


def _apply(
    raw: RawTable, a: exp.Expression, renames: dict[str, str], db: str, mariadb: bool
) -> None:
    if isinstance(a, exp.ColumnDef):
        col, pk, unique = _column(a, mariadb)
        raw.columns.append(col)
        if pk:
            raw.keys["PRIMARY"] = (True, [col[0]])
        if unique:
            raw.keys[col[0]] = (True, [col[0]])
    elif isinstance(a, exp.RenameColumn):
        _rename_col(raw, a.this.name, a.args["to"].name, renames)
    elif isinstance(a, exp.ModifyColumn):
        src = a.args.get("rename_from")
        old = src.name if src is not None else a.this.name
        if old != a.this.name:
            _rename_col(raw, old, a.this.name, renames)
        col, pk, _ = _column(a.this, mariadb)
        raw.columns = [col if n == col[0] else (n, t, nl, d) for n, t, nl, d in raw.columns]
        if pk:
            raw.keys["PRIMARY"] = (True, [col[0]])
    elif isinstance(a, exp.AlterColumn):
        name = a.this.name
        dflt = a.args.get("default")
        for i, (n, t, nl, _d) in enumerate(raw.columns):
            if n == name:
                new = default_text(t, dflt.sql("mysql")) if dflt is not None else None
                raw.columns[i] = (n, t, nl, new if a.args.get("drop") is None else None)
    elif isinstance(a, exp.Drop):
        kind = (a.args.get("kind") or "").upper()
        names = [t.name for t in a.args.get("tables") or []]
        if kind == "COLUMN":
            raw.columns = [c for c in raw.columns if c[0] not in names]
            raw.keys = {k: v for k, v in raw.keys.items() if not set(v[1]) & set(names)}
        elif kind in ("INDEX", "KEY"):
            for n in names:
                raw.keys.pop(n, None)
        elif kind == "PRIMARY KEY" or "PRIMARY" in names:
            raw.keys.pop("PRIMARY", None)
        elif kind in ("FOREIGN KEY", "CONSTRAINT", "CHECK"):
            return  # no effect on the replicated schema
        else:
            raise UnsupportedDDLError(f"unsupported DROP {kind} in ALTER TABLE")
    elif isinstance(a, exp.DropPrimaryKey):
        raw.keys.pop("PRIMARY", None)
    elif isinstance(a, exp.AddConstraint):
        for c in a.expressions:
            _add_constraint(raw, c)
    elif isinstance(a, exp.RenameIndex):
        old, new = a.this.name, a.args["to"].name
        if old in raw.keys:
            raw.keys[new] = raw.keys.pop(old)
    elif isinstance(a, exp.Property):
        return  # a table option (FORCE, ENGINE, ...): no column change
    elif isinstance(a, exp.AlterRename):
        raw.database = a.this.db or db
        raw.table = a.this.name
    else:
        raise UnsupportedDDLError(f"unsupported ALTER TABLE action {a.sql('mysql')!r}")


def renamed(t: TableSchema, database: str, table: str) -> TableSchema:
    return TableSchema(t.table_id, database, table, t.columns, t.primary_key, t.indexes, t.shards)


__all__ = [
    "ColumnSchema",
    "IndexSchema",
    "NeedsCatalog",
    "altered_schema",
    "created_schema",
    "renamed",
]
