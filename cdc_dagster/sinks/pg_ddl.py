"""PostgreSQL DDL generated from table schemas (the type map and schema diffs).

We never transpile MySQL text: sqlglot leaves MySQL-only syntax in place, so the
downstream DDL is built from the schema before and after each DDL record
(docs/mysql-postgres.md, "Type map" and "DDL support"). Identifiers are always
quoted with ``psycopg.sql.Identifier``; literals with ``psycopg.sql.Literal``.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass

from psycopg import sql

from cdc_dagster.schema import ColumnSchema, IndexSchema, TableSchema

PG_MAX_IDENT_BYTES = 63

_PG_TYPES: dict[str, str] = {
    "bool": "boolean",
    "int8": "smallint",
    "int16": "smallint",
    "int32": "integer",
    "int64": "bigint",
    "uint8": "smallint",
    "uint16": "integer",
    "uint32": "bigint",
    "uint64": "numeric(20,0)",
    "float32": "real",
    "float64": "double precision",
    "string": "text",
    "binary": "bytea",
    "json": "jsonb",
    "date": "date",
    "datetime": "timestamp(6) without time zone",
    "timestamp": "timestamp(6) with time zone",
    "time": "interval",
}

# Types whose upstream may hold values PostgreSQL cannot (MySQL zero dates): the
# puller turns those into NULL, so these columns are always nullable downstream.
_ZERO_DATE_TYPES = frozenset({"date", "datetime", "timestamp"})

# The implicit value MySQL gives existing rows for ADD COLUMN ... NOT NULL without DEFAULT.
_IMPLICIT_ZERO: dict[str, str] = {
    "bool": "false",
    "string": "",
    "binary": "",
    "json": "null",
    "time": "0",
}


class PgDDLError(ValueError):
    """A schema cannot be expressed in PostgreSQL (the message says which and why)."""


def pg_type(logical: str) -> str:
    """The PostgreSQL type of a logical column type."""
    t = _PG_TYPES.get(logical)
    if t is not None:
        return t
    if logical.startswith("decimal("):
        return "numeric" + logical[len("decimal") :]
    raise PgDDLError(f"no PostgreSQL type for logical type {logical!r}")


def staging_type(logical: str) -> str:
    """The type of a column in the COPY staging table (TIME travels as bigint microseconds)."""
    return "bigint" if logical == "time" else pg_type(logical)


def ident(name: str) -> sql.Identifier:
    """A quoted identifier; refuses names PostgreSQL would silently truncate."""
    if len(name.encode()) > PG_MAX_IDENT_BYTES:
        raise PgDDLError(
            f"identifier {name!r} is {len(name.encode())} bytes; PostgreSQL keeps only "
            f"{PG_MAX_IDENT_BYTES} (rename it upstream or filter the table out)"
        )
    if "\x00" in name:
        raise PgDDLError(f"identifier {name!r} holds a NUL byte")
    return sql.Identifier(name)


def table_ident(t: TableSchema) -> sql.Composed:
    """``"database"."table"``."""
    return sql.SQL(".").join([ident(t.database), ident(t.table)])


def index_name(t: TableSchema, index: str) -> str:
    """PostgreSQL index names are per schema, MySQL's per table: prefix the table, cap at 63."""
    name = f"{t.table}__{index}"
    if len(name.encode()) <= PG_MAX_IDENT_BYTES:
        return name
    digest = hashlib.sha1(name.encode()).hexdigest()[:10]
    head = name.encode()[: PG_MAX_IDENT_BYTES - 11].decode(errors="ignore")
    return f"{head}_{digest}"


def pk_name(t: TableSchema) -> str:
    return index_name(t, "pkey")


def literal_default(col: ColumnSchema, value: str) -> sql.Composable:
    """A canonical default text (docs/dataplane.md) as a typed PostgreSQL literal."""
    if col.type == "binary":
        return sql.SQL("{}::bytea").format(sql.Literal(base64.b64decode(value)))
    if col.type == "time":
        return sql.SQL("({} * interval '1 microsecond')").format(sql.Literal(int(value)))
    if col.type == "bool":
        return sql.Literal(value.lower() in ("1", "true", "t"))
    return sql.SQL("{}::{}").format(sql.Literal(value), sql.SQL(pg_type(col.type)))


def column_def(col: ColumnSchema, with_default: bool = True) -> sql.Composed:
    parts: list[sql.Composable] = [ident(col.name), sql.SQL(pg_type(col.type))]
    if with_default and col.default is not None:
        parts += [sql.SQL("DEFAULT"), literal_default(col, col.default)]
    if not col.nullable and col.type not in _ZERO_DATE_TYPES:
        parts.append(sql.SQL("NOT NULL"))
    return sql.SQL(" ").join(parts)


def create_schema(database: str) -> sql.Composed:
    return sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(ident(database))


def create_table(t: TableSchema) -> list[sql.Composable]:
    """CREATE SCHEMA/TABLE IF NOT EXISTS with the primary key, then its secondary indexes."""
    cols = [column_def(c) for c in t.columns]
    pk = sql.SQL("CONSTRAINT {} PRIMARY KEY ({})").format(
        ident(pk_name(t)), sql.SQL(", ").join(ident(c.name) for c in t.key_columns)
    )
    stmts: list[sql.Composable] = [
        create_schema(t.database),
        sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
            table_ident(t), sql.SQL(", ").join([*cols, pk])
        ),
    ]
    stmts += [create_index(t, i) for i in t.indexes]
    return stmts


def create_index(t: TableSchema, index: IndexSchema) -> sql.Composed:
    return sql.SQL("CREATE {}INDEX IF NOT EXISTS {} ON {} ({})").format(
        sql.SQL("UNIQUE " if index.unique else ""),
        ident(index_name(t, index.name)),
        table_ident(t),
        sql.SQL(", ").join(ident(t.column(c).name) for c in index.columns),
    )


def drop_index(t: TableSchema, index: IndexSchema) -> sql.Composed:
    return sql.SQL("DROP INDEX IF EXISTS {}.{}").format(
        ident(t.database), ident(index_name(t, index.name))
    )


def drop_table(t: TableSchema) -> sql.Composed:
    return sql.SQL("DROP TABLE IF EXISTS {}").format(table_ident(t))


def truncate_table(t: TableSchema) -> sql.Composed:
    return sql.SQL("TRUNCATE TABLE {}").format(table_ident(t))


def rename_table(before: TableSchema, after: TableSchema) -> list[sql.Composable]:
    """Move to the new schema (database) if it changed, then rename; indexes follow the name."""
    stmts: list[sql.Composable] = []
    cur = before
    if before.database != after.database:
        stmts += [
            create_schema(after.database),
            sql.SQL("ALTER TABLE {} SET SCHEMA {}").format(table_ident(cur), ident(after.database)),
        ]
        cur = _renamed(cur, database=after.database)
    if before.table != after.table:
        stmts.append(
            sql.SQL("ALTER TABLE {} RENAME TO {}").format(table_ident(cur), ident(after.table))
        )
        cur = _renamed(cur, table=after.table)
    for idx in before.indexes:
        old, new = index_name(before, idx.name), index_name(after, idx.name)
        if old != new:
            stmts.append(
                sql.SQL("ALTER INDEX IF EXISTS {}.{} RENAME TO {}").format(
                    ident(after.database), ident(old), ident(new)
                )
            )
    if pk_name(before) != pk_name(after):
        stmts.append(
            sql.SQL("ALTER TABLE {} RENAME CONSTRAINT {} TO {}").format(
                table_ident(cur), ident(pk_name(before)), ident(pk_name(after))
            )
        )
    return stmts


def _renamed(t: TableSchema, **kw: str) -> TableSchema:
    return TableSchema(
        t.table_id,
        kw.get("database", t.database),
        kw.get("table", t.table),
        t.columns,
        t.primary_key,
        t.indexes,
        t.shards,
    )


@dataclass(frozen=True, slots=True)
class _ColumnDiff:
    added: tuple[ColumnSchema, ...]
    dropped: tuple[ColumnSchema, ...]
    changed: tuple[tuple[ColumnSchema, ColumnSchema], ...]  # (before, after), same id


def _diff_columns(before: TableSchema, after: TableSchema) -> _ColumnDiff:
    old = {c.id: c for c in before.columns}
    new = {c.id: c for c in after.columns}
    return _ColumnDiff(
        tuple(c for c in after.columns if c.id not in old),
        tuple(c for c in before.columns if c.id not in new),
        tuple((old[i], new[i]) for i in old.keys() & new.keys() if old[i] != new[i]),
    )


def alter_table(before: TableSchema, after: TableSchema) -> list[sql.Composable]:
    """Statements that take ``before`` to ``after`` (same table id): any column/index/key change."""
    stmts: list[sql.Composable] = []
    if (before.database, before.table) != (after.database, after.table):
        stmts += rename_table(before, after)
    t = table_ident(after)
    diff = _diff_columns(before, after)
    pk_changed = [before.column(i).name for i in before.primary_key] != [
        after.column(i).name for i in after.primary_key
    ] or before.primary_key != after.primary_key
    after_idx = {i.name: i for i in after.indexes}
    before_idx = {i.name: i for i in before.indexes}
    for name, idx in before_idx.items():
        if after_idx.get(name) != idx or any(
            before.column(c).name != _name_or_none(after, c) for c in idx.columns
        ):
            stmts.append(drop_index(after, idx))
    if pk_changed:
        stmts.append(
            sql.SQL("ALTER TABLE {} DROP CONSTRAINT IF EXISTS {}").format(t, ident(pk_name(after)))
        )
    for col in diff.dropped:
        stmts.append(sql.SQL("ALTER TABLE {} DROP COLUMN IF EXISTS {}").format(t, ident(col.name)))
    for old, new in sorted(diff.changed, key=lambda p: p[1].id):
        stmts += _alter_column(t, old, new)
    for col in diff.added:
        stmts += _add_column(t, col)
    if pk_changed:
        stmts.append(
            sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} PRIMARY KEY ({})").format(
                t,
                ident(pk_name(after)),
                sql.SQL(", ").join(ident(c.name) for c in after.key_columns),
            )
        )
    for name, idx in after_idx.items():
        if before_idx.get(name) != idx or any(
            _name_or_none(before, c) != after.column(c).name for c in idx.columns
        ):
            stmts.append(create_index(after, idx))
    return stmts


def _name_or_none(t: TableSchema, column_id: int) -> str | None:
    return next((c.name for c in t.columns if c.id == column_id), None)


def _add_column(t: sql.Composed, col: ColumnSchema) -> list[sql.Composable]:
    # PostgreSQL fills existing rows with the DEFAULT (MariaDB's instant ADD COLUMN logs
    # no row events for them); NOT NULL without a default gets MySQL's implicit zero.
    stmts: list[sql.Composable] = [
        sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {}").format(t, column_def(col))
    ]
    if col.default is None and not col.nullable and col.type not in _ZERO_DATE_TYPES:
        zero = _IMPLICIT_ZERO.get(col.type, "0")
        implicit = ColumnSchema(col.id, col.name, col.type, True, zero)
        stmts = [
            sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} DEFAULT {} NOT NULL").format(
                t,
                sql.SQL(" ").join([ident(col.name), sql.SQL(pg_type(col.type))]),
                literal_default(implicit, zero),
            ),
            sql.SQL("ALTER TABLE {} ALTER COLUMN {} DROP DEFAULT").format(t, ident(col.name)),
        ]
    return stmts


def _alter_column(t: sql.Composed, old: ColumnSchema, new: ColumnSchema) -> list[sql.Composable]:
    stmts: list[sql.Composable] = []
    name = ident(new.name)
    if old.name != new.name:
        stmts.append(
            sql.SQL("ALTER TABLE {} RENAME COLUMN {} TO {}").format(t, ident(old.name), name)
        )
    if old.type != new.type:
        stmts.append(
            sql.SQL("ALTER TABLE {} ALTER COLUMN {} TYPE {} USING {}").format(
                t, name, sql.SQL(pg_type(new.type)), _convert(name, old.type, new.type)
            )
        )
    if old.default != new.default:
        if new.default is None:
            stmts.append(sql.SQL("ALTER TABLE {} ALTER COLUMN {} DROP DEFAULT").format(t, name))
        else:
            stmts.append(
                sql.SQL("ALTER TABLE {} ALTER COLUMN {} SET DEFAULT {}").format(
                    t, name, literal_default(new, new.default)
                )
            )
    old_nn = not old.nullable and old.type not in _ZERO_DATE_TYPES
    new_nn = not new.nullable and new.type not in _ZERO_DATE_TYPES
    if old_nn != new_nn or (old.type != new.type and old_nn):
        verb = "SET" if new_nn else "DROP"
        stmts.append(
            sql.SQL("ALTER TABLE {} ALTER COLUMN {} {} NOT NULL").format(t, name, sql.SQL(verb))
        )
    return stmts


def _convert(name: sql.Identifier, old: str, new: str) -> sql.Composable:
    if new == "time" and old != "time":
        return sql.SQL("({}::text)::interval").format(name)
    if old == "time" and new != "time":
        return sql.SQL("({}::text)::{}").format(name, sql.SQL(pg_type(new)))
    if old == "binary" and new in ("string", "json"):
        return sql.SQL("convert_from({}, 'UTF8')::{}").format(name, sql.SQL(pg_type(new)))
    if new == "binary" and old != "binary":
        return sql.SQL("convert_to({}::text, 'UTF8')").format(name)
    return sql.SQL("{}::{}").format(name, sql.SQL(pg_type(new)))
