"""Building change-log rows and schemas for the pipeline tests."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa

from cdc_dagster.schema import ColumnSchema, DdlRecord, TableSchema
from scheduler_core.ddl import DDLKind

INSERT, UPDATE, DELETE = 1, 2, 3


def accounts(table_id: int, name: str | None = None, shards: int = 1, extra=()) -> TableSchema:
    """id int64 (key), owner string, balance decimal(18,2) NOT NULL, plus ``extra`` columns."""
    cols = [
        ColumnSchema(1, "id", "int64", False),
        ColumnSchema(2, "owner", "string", True),
        ColumnSchema(3, "balance", "decimal(18,2)", False, "0.00"),
        *extra,
    ]
    return TableSchema(
        table_id, "bank", name or f"accounts_{table_id}", tuple(cols), (1,), (), shards
    )


def create(ts: int, *schemas: TableSchema) -> DdlRecord:
    ids = tuple(s.table_id for s in schemas)
    return DdlRecord(
        ts,
        DDLKind.CREATE_TABLE,
        "create_table",
        "CREATE TABLE ...",
        (),
        ids,
        (),
        "bank",
        {s.table_id: s for s in schemas},
    )


def alter(ts: int, schema: TableSchema, action: str = "add_column") -> DdlRecord:
    return DdlRecord(
        ts,
        DDLKind.ALTER_TABLE,
        action,
        "ALTER TABLE ...",
        (schema.table_id,),
        (),
        (),
        "bank",
        {schema.table_id: schema},
    )


def rows(schema: TableSchema, changes: Iterable[Sequence[Any]]) -> pa.Table:
    """Change-log rows from ``(commit_ts, seq, op, after: {name: v} | None, before_key | None)``."""
    changes = list(changes)
    cols: dict[str, pa.Array] = {
        "_commit_ts": pa.array([c[0] for c in changes], pa.int64()),
        "_seq": pa.array([c[1] for c in changes], pa.int32()),
        "_op": pa.array([c[2] for c in changes], pa.int8()),
    }
    for col in schema.columns:
        cols[f"c{col.id}"] = pa.array(
            [(c[3] or {}).get(col.name) if c[3] else None for c in changes], col.arrow
        )
    for col in schema.key_columns:
        cols[f"b{col.id}"] = pa.array(
            [(c[4] or {}).get(col.name) if c[4] else None for c in changes], col.arrow
        )
    return pa.table(cols)
