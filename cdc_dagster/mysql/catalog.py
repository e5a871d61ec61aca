"""Table schemas read from the upstream catalog, with stable table and column ids.

Ids live in the puller's state (``PullerState``): a table keeps its id across renames and
truncates; a column keeps its id across renames and type changes; ids are never reused.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cdc_dagster.mysql.types import UnsupportedTypeError, default_text, logical_type
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
    return [_column(*row[:5]) for row in rows]


def _column(
    name: str, dtype: str, ctype: str, nullable: str, default: str | None
) -> tuple[str, str, bool, str | None]:
    """A ``COLUMNS`` row as (name, logical type, nullable, default)."""
    lt = logical_type(dtype, ctype)
    return name, lt, nullable == "YES", default_text(lt, default)


CATALOG_BATCH = 500  # tables whose catalog one query reads (``read_tables``)


def read_tables(
    conn,
    names: Sequence[tuple[str, str]],
    unsupported: Callable[[str, str, UnsupportedTypeError], None] | None = None,
) -> dict[tuple[str, str], RawTable]:
    """``read_table`` of each (database, table), two queries per database and
    ``CATALOG_BATCH`` tables, not two per table (a changefeed of 100 tables read its catalog
    twice at create: 400 round trips, seconds under load). Tables that do not exist are left
    out; one with a column of an unsupported type is given to ``unsupported`` (None: its
    ``UnsupportedTypeError`` is raised)."""
    by_db: dict[str, list[str]] = {}
    for db, table in names:
        by_db.setdefault(db, []).append(table)
    columns: dict[tuple[str, str], list[tuple[str, str, bool, str | None]]] = {}
    keys: dict[tuple[str, str], dict[str, tuple[bool, list[str]]]] = {}
    bad: set[tuple[str, str]] = set()
    for db, tables in by_db.items():
        for i in range(0, len(tables), CATALOG_BATCH):
            batch = tables[i : i + CATALOG_BATCH]
            marks = ", ".join(["%s"] * len(batch))
            with conn.cursor() as cur:
                cur.execute(
                    "SELECT TABLE_NAME, COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, IS_NULLABLE, "
                    "COLUMN_DEFAULT FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s "
                    f"AND TABLE_NAME IN ({marks}) ORDER BY TABLE_NAME, ORDINAL_POSITION",
                    (db, *batch),
                )
                for table, *row in cur.fetchall():
                    key = (db, table)
                    if key in bad:
                        continue
                    try:
                        columns.setdefault(key, []).append(_column(*row))
                    except UnsupportedTypeError as exc:
                        if unsupported is None:
                            raise
                        bad.add(key)
                        columns.pop(key, None)
                        unsupported(db, table, exc)
                cur.execute(
                    "SELECT TABLE_NAME, INDEX_NAME, NON_UNIQUE, COLUMN_NAME "
                    "FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = %s "
                    f"AND TABLE_NAME IN ({marks}) ORDER BY TABLE_NAME, INDEX_NAME, SEQ_IN_INDEX",
                    (db, *batch),
                )
                for table, index, non_unique, col in cur.fetchall():
                    per = keys.setdefault((db, table), {})
                    per.setdefault(index, (not int(non_unique), []))[1].append(col)
    return {
        (db, t): RawTable(db, t, columns[(db, t)], keys.get((db, t), {}))
        for db, t in names
        if (db, t) in columns
    }


def read_table(conn, database: str, table: str) -> RawTable | None:
    """The table's columns and keys now (None if it does not exist)."""
    return read_tables(conn, [(database, table)]).get((database, table))


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
