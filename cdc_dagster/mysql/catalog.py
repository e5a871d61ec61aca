"""Table schemas read from the upstream catalog, with stable table and column ids.

Ids live in the puller's state (``PullerState``): a table keeps its id across renames and
truncates; a column keeps its id across renames and type changes; ids are never reused.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Any

from cdc_dagster.mysql.types import default_text, logical_type
from cdc_dagster.schema import ColumnSchema, IndexSchema, TableSchema

SYSTEM_SCHEMAS = frozenset({"mysql", "information_schema", "performance_schema", "sys"})


def quote_ident(name: str) -> str:
    """``name`` as a MySQL identifier: in backticks, a backtick doubled."""
    return "`" + name.replace("`", "``") + "`"


class CatalogError(Exception):
    """A table cannot be replicated as it is (the message names it and what to do)."""


class KeylessTableError(CatalogError):
    """A table has neither a primary key nor a NOT NULL unique key (and force-replicate is
    off): TiCDC calls it ineligible; a running changefeed skips it (``PullerState.skipped``)."""


@dataclass(frozen=True, slots=True)
class TableFilter:
    """``db.table`` glob patterns; ``!pattern`` excludes. No pattern: every user table."""

    patterns: tuple[str, ...] = ()

    def __call__(self, database: str, table: str) -> bool:
        if database.lower() in SYSTEM_SCHEMAS:
            return False
        name = f"{database}.{table}"
        include = [p for p in self.patterns if not p.startswith("!")]
        exclude = [p[1:] for p in self.patterns if p.startswith("!")]
        if include and not any(fnmatch.fnmatchcase(name, p) for p in include):
            return False
        return not any(fnmatch.fnmatchcase(name, p) for p in exclude)


@dataclass(slots=True)
class RawTable:
    """One table as the catalog describes it (names, not ids)."""

    database: str
    table: str
    columns: list[tuple[str, str, bool, str | None]]  # name, logical, nullable, default
    keys: dict[str, tuple[bool, list[str]]]  # index name -> (unique, column names)


def list_tables(conn, flt: TableFilter) -> list[tuple[str, str]]:
    with conn.cursor() as cur:
        cur.execute(
            "SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES "
            "WHERE TABLE_TYPE = 'BASE TABLE' ORDER BY TABLE_SCHEMA, TABLE_NAME"
        )
        return [(d, t) for d, t in cur.fetchall() if flt(d, t)]


def read_columns(
    conn, database: str, table: str, lock: bool = False
) -> list[tuple[str, str, bool, str | None]]:
    """The table's columns now: (name, logical type, nullable, default) each, in order
    (none if it does not exist). One query: ``read_table`` without the keys. ``lock``: the
    query opens the table too (an error if it does not exist), so a transaction it is part
    of holds the table's metadata lock from before its columns were read (DDL waits for
    the transaction's end; writes do not)."""
    sql = (
        "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, IS_NULLABLE, COLUMN_DEFAULT, "
        "ORDINAL_POSITION FROM information_schema.COLUMNS "
        "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s"
    )
    if lock:  # every table of a statement is opened before any of it runs
        sql = (f"({sql}) UNION ALL (SELECT NULL, NULL, NULL, NULL, NULL, NULL FROM "
               f"{quote_ident(database)}.{quote_ident(table)} LIMIT 0)")  # fmt: skip
    with conn.cursor() as cur:
        cur.execute(sql + " ORDER BY 6", (database, table))
        rows = cur.fetchall()
    cols = []
    for name, dtype, ctype, nullable, default, _ in rows:
        lt = logical_type(dtype, ctype)
        cols.append((name, lt, nullable == "YES", default_text(lt, default)))
    return cols


def read_table(conn, database: str, table: str) -> RawTable | None:
    """The table's columns and keys now (None if it does not exist)."""
    cols = read_columns(conn, database, table)
    if not cols:
        return None
    with conn.cursor() as cur:
        cur.execute(
            "SELECT INDEX_NAME, NON_UNIQUE, COLUMN_NAME FROM information_schema.STATISTICS "
            "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s ORDER BY INDEX_NAME, SEQ_IN_INDEX",
            (database, table),
        )
        keys: dict[str, tuple[bool, list[str]]] = {}
        for index, non_unique, col in cur.fetchall():
            keys.setdefault(index, (not int(non_unique), []))[1].append(col)
    return RawTable(database, table, cols, keys)


@dataclass(slots=True)
class IdRegistry:
    """Table ids by current name and column ids per table; persisted in the puller state."""

    next_table_id: int = 1
    next_column_id: dict[int, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "next_table_id": self.next_table_id,
            "next_column_id": {str(k): v for k, v in self.next_column_id.items()},
        }

    @staticmethod
    def from_json(obj: dict[str, Any]) -> IdRegistry:
        return IdRegistry(
            obj["next_table_id"], {int(k): v for k, v in obj["next_column_id"].items()}
        )

    def new_table_id(self) -> int:
        tid = self.next_table_id
        self.next_table_id += 1
        self.next_column_id[tid] = 1
        return tid


def build_schema(
    raw: RawTable,
    table_id: int,
    ids: IdRegistry,
    before: TableSchema | None,
    column_renames: dict[str, str] | None = None,
    force_replicate: bool = False,
) -> TableSchema:
    """The TableSchema of ``raw``: ids carried over from ``before`` by (renamed) name."""
    prior: dict[str, int] = {}
    if before is not None:
        renames = column_renames or {}
        for c in before.columns:
            prior[renames.get(c.name, c.name)] = c.id
    cols = []
    for name, lt, nullable, default in raw.columns:
        cid = prior.get(name)
        if cid is None:
            cid = ids.next_column_id.get(table_id, 1)
            ids.next_column_id[table_id] = cid + 1
        cols.append(ColumnSchema(cid, name, lt, nullable, default))
    by_name = {c.name: c for c in cols}
    key = _choose_key(raw, by_name)
    if key is None:
        if not force_replicate:
            raise KeylessTableError(
                f"table {raw.database}.{raw.table} has no primary key and no NOT NULL unique "
                "key: add one, filter the table out, or set force-replicate=true on the "
                "upstream URI (then rows are keyed by their full image)"
            )
        key = [c.name for c in cols]
    indexes = tuple(
        IndexSchema(n, tuple(by_name[c].id for c in names), unique)
        for n, (unique, names) in sorted(raw.keys.items())
        if n != "PRIMARY"
    )
    return TableSchema(
        table_id, raw.database, raw.table, tuple(cols), tuple(by_name[c].id for c in key), indexes
    )


def _choose_key(raw: RawTable, by_name: dict[str, ColumnSchema]) -> list[str] | None:
    if "PRIMARY" in raw.keys:
        return raw.keys["PRIMARY"][1]
    for _, (unique, names) in sorted(raw.keys.items()):
        if unique and all(not by_name[c].nullable for c in names):
            return names
    return None
