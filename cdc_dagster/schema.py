"""Table schemas, DDL records and the logical type map of the change log (docs/dataplane.md).

These records are shared by every producer (generator, binlog puller) and every consumer
(pipeline, sinks, oracle); their JSON form is the change-log format, version 1.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import pyarrow as pa

from scheduler_core.ddl import DDLEvent, DDLKind
from scheduler_core.model import check_ts


class SchemaError(ValueError):
    """A table schema, DDL record or type name is malformed (the message says which and why)."""


ACTIONS = frozenset(
    {
        "create_table",
        "drop_table",
        "rename_table",
        "truncate_table",
        "add_column",
        "drop_column",
        "rename_column",
        "modify_column",
        "add_index",
        "drop_index",
        "create_schema",
        "drop_schema",
    }
)

_FIXED_TYPES: dict[str, pa.DataType] = {
    "bool": pa.bool_(),
    "int8": pa.int8(),
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "uint8": pa.int16(),
    "uint16": pa.int32(),
    "uint32": pa.int64(),
    "uint64": pa.decimal128(20, 0),
    "float32": pa.float32(),
    "float64": pa.float64(),
    "string": pa.string(),
    "binary": pa.binary(),
    "json": pa.string(),
    "date": pa.date32(),
    "datetime": pa.timestamp("us"),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "time": pa.int64(),
}
_DECIMAL = re.compile(r"decimal\((\d{1,2}),(\d{1,2})\)")


def arrow_type(logical: str) -> pa.DataType:
    """The Arrow type of a logical column type (the type map in docs/dataplane.md)."""
    fixed = _FIXED_TYPES.get(logical)
    if fixed is not None:
        return fixed
    m = _DECIMAL.fullmatch(logical) if isinstance(logical, str) else None
    if m is None:
        raise SchemaError(
            f"unknown column type {logical!r}: expected one of {sorted(_FIXED_TYPES)} "
            "or decimal(p,s)"
        )
    p, s = int(m.group(1)), int(m.group(2))
    if not 1 <= p <= 76 or not 0 <= s <= p:
        raise SchemaError(f"decimal({p},{s}): need 1 <= p <= 76 and 0 <= s <= p")
    return pa.decimal128(p, s) if p <= 38 else pa.decimal256(p, s)


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise SchemaError(msg)


@dataclass(frozen=True, slots=True)
class ColumnSchema:
    """One column: a stable id (never reused), its current name, logical type, default."""

    id: int
    name: str
    type: str
    nullable: bool = True
    default: str | None = None

    def __post_init__(self) -> None:
        _need(type(self.id) is int and self.id > 0, f"column id must be an int > 0: {self.id!r}")
        _need(
            isinstance(self.name, str) and 0 < len(self.name) <= 256,
            f"column name must be a non-empty str of at most 256 chars: {self.name!r}",
        )
        arrow_type(self.type)
        _need(self.default is None or isinstance(self.default, str), "default must be a str")

    @property
    def arrow(self) -> pa.DataType:
        """The column's Arrow type."""
        return arrow_type(self.type)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "type": self.type,
            "nullable": self.nullable,
            "default": self.default,
        }


@dataclass(frozen=True, slots=True)
class IndexSchema:
    """A secondary index (column ids)."""

    name: str
    columns: tuple[int, ...]
    unique: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "columns": list(self.columns), "unique": self.unique}


@dataclass(frozen=True, slots=True)
class TableSchema:
    """A table's schema at one moment of its history."""

    table_id: int
    database: str
    table: str
    columns: tuple[ColumnSchema, ...]
    primary_key: tuple[int, ...]
    indexes: tuple[IndexSchema, ...] = ()
    shards: int = 1

    def __post_init__(self) -> None:
        _need(
            type(self.table_id) is int and self.table_id >= 0,
            f"table_id must be an int >= 0: {self.table_id!r}",
        )
        for what in ("database", "table"):
            name = getattr(self, what)
            _need(
                isinstance(name, str) and 0 < len(name) <= 256,
                f"{what} name must be a non-empty str of at most 256 chars: {name!r}",
            )
        object.__setattr__(self, "columns", tuple(self.columns))
        object.__setattr__(self, "primary_key", tuple(self.primary_key))
        object.__setattr__(self, "indexes", tuple(self.indexes))
        ids = [c.id for c in self.columns]
        names = [c.name for c in self.columns]
        where = f"table {self.qualified_name} (id {self.table_id})"
        _need(bool(ids), f"{where} has no columns")
        _need(len(set(ids)) == len(ids), f"{where}: a column id is used twice: {ids}")
        _need(len(set(names)) == len(names), f"{where}: a column name is used twice: {names}")
        _need(bool(self.primary_key), f"{where} has no primary key")
        _need(
            set(self.primary_key) <= set(ids),
            f"{where}: primary key {self.primary_key} names unknown column ids",
        )
        _need(type(self.shards) is int and self.shards >= 1, f"{where}: shards must be >= 1")

    @property
    def qualified_name(self) -> str:
        """``database.table`` as written (not quoted: for messages, never for SQL)."""
        return f"{self.database}.{self.table}"

    def column(self, column_id: int) -> ColumnSchema:
        """The column with ``column_id``."""
        for c in self.columns:
            if c.id == column_id:
                return c
        raise SchemaError(f"table {self.qualified_name} has no column id {column_id}")

    @property
    def key_columns(self) -> tuple[ColumnSchema, ...]:
        """The primary-key columns, in key order."""
        return tuple(self.column(i) for i in self.primary_key)

    def arrow_schema(self) -> pa.Schema:
        """The mounted form: columns by name with their Arrow types."""
        return pa.schema([pa.field(c.name, c.arrow, c.nullable) for c in self.columns])

    def to_json(self) -> dict[str, Any]:
        return {
            "table_id": self.table_id,
            "database": self.database,
            "table": self.table,
            "columns": [c.to_json() for c in self.columns],
            "primary_key": list(self.primary_key),
            "indexes": [i.to_json() for i in self.indexes],
            "shards": self.shards,
        }

    @staticmethod
    def from_json(obj: Mapping[str, Any]) -> TableSchema:
        try:
            return TableSchema(
                table_id=obj["table_id"],
                database=obj["database"],
                table=obj["table"],
                columns=tuple(
                    ColumnSchema(c["id"], c["name"], c["type"], c["nullable"], c.get("default"))
                    for c in obj["columns"]
                ),
                primary_key=tuple(obj["primary_key"]),
                indexes=tuple(
                    IndexSchema(i["name"], tuple(i["columns"]), bool(i.get("unique", False)))
                    for i in obj.get("indexes", ())
                ),
                shards=obj.get("shards", 1),
            )
        except (KeyError, TypeError) as exc:
            raise SchemaError(f"malformed table schema ({exc!r}): {str(obj)[:200]}") from exc


@dataclass(frozen=True, slots=True)
class DdlRecord:
    """One DDL of the change log: the DDLEvent fields, what the sink must do, schemas after it."""

    commit_ts: int
    kind: DDLKind
    action: str
    query: str
    table_ids: tuple[int, ...] = ()
    creates: tuple[int, ...] = ()
    drops: tuple[int, ...] = ()
    schema: str | None = None
    tables: Mapping[int, TableSchema | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_ts("commit_ts", self.commit_ts)
        _need(
            self.action in ACTIONS, f"unknown DDL action {self.action!r}: one of {sorted(ACTIONS)}"
        )
        self.to_event()  # validates the DDLEvent fields
        tables = dict(self.tables)
        for table_id, schema in tables.items():
            _need(
                schema is None or schema.table_id == table_id,
                f"DDL at {self.commit_ts}: tables[{table_id}] holds table id "
                f"{schema.table_id if schema else None}",
            )
        for table_id in self.creates:
            _need(
                tables.get(table_id) is not None,
                f"DDL at {self.commit_ts} creates table {table_id} but gives no schema for it",
            )
        object.__setattr__(self, "tables", MappingProxyType(tables))

    @property
    def replaces(self) -> tuple[int, ...]:
        """Ids of tables that left the changefeed under the name a ``create_table`` creates
        (``tables`` maps them to null, neither created nor touched): the sink replaces their
        downstream table with the new one (a table re-joining after a narrowed filter)."""
        if self.action != "create_table":
            return ()
        return tuple(
            t
            for t, s in self.tables.items()
            if s is None and t not in self.creates and t not in self.table_ids
        )

    def to_event(self) -> DDLEvent:
        """The event the owner's DDL manager schedules."""
        return DDLEvent(
            self.commit_ts,
            self.kind,
            self.query,
            tuple(self.table_ids),
            tuple(self.creates),
            tuple(self.drops),
            self.schema,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "commit_ts": self.commit_ts,
            "kind": self.kind.value,
            "action": self.action,
            "query": self.query,
            "table_ids": list(self.table_ids),
            "creates": list(self.creates),
            "drops": list(self.drops),
            "schema": self.schema,
            "tables": {
                str(t): (s.to_json() if s is not None else None) for t, s in self.tables.items()
            },
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), ensure_ascii=False, sort_keys=True)

    @staticmethod
    def from_json(obj: Mapping[str, Any]) -> DdlRecord:
        try:
            return DdlRecord(
                commit_ts=obj["commit_ts"],
                kind=DDLKind(obj["kind"]),
                action=obj["action"],
                query=obj["query"],
                table_ids=tuple(obj.get("table_ids", ())),
                creates=tuple(obj.get("creates", ())),
                drops=tuple(obj.get("drops", ())),
                schema=obj.get("schema"),
                tables={
                    int(t): (TableSchema.from_json(s) if s is not None else None)
                    for t, s in obj.get("tables", {}).items()
                },
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, SchemaError):
                raise
            raise SchemaError(f"malformed DDL record ({exc!r}): {str(obj)[:200]}") from exc
