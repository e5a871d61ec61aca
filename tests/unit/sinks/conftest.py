"""Fixtures for the sink tests: a fresh Delta root per test and a small table schema."""

from __future__ import annotations

import pyarrow as pa
import pytest

from cdc_dagster.schema import ColumnSchema, TableSchema
from cdc_dagster.sinks.base import COMMIT_TS_COLUMN, OP_COLUMN
from cdc_dagster.sinks.delta import DeltaSink

CF = "cf-1"


def accounts(
    database: str = "bank",
    table: str = "accounts",
    table_id: int = 7,
    extra: tuple[ColumnSchema, ...] = (),
) -> TableSchema:
    """id int64 key, balance decimal(18,2) not null, note string."""
    return TableSchema(
        table_id=table_id,
        database=database,
        table=table,
        columns=(
            ColumnSchema(1, "id", "int64", False),
            ColumnSchema(2, "balance", "decimal(18,2)", False, "0.00"),
            ColumnSchema(3, "note", "string", True),
            *extra,
        ),
        primary_key=(1,),
    )


def batch(table: TableSchema, rows: list[dict], commit_ts: int = 1) -> pa.Table:
    """A collapsed batch: each row a dict of column values plus optional 'op' ('d' = delete)."""
    cols: dict[str, list] = {c.name: [] for c in table.columns}
    ops = []
    for r in rows:
        delete = r.get("op") == "d"
        for c in table.columns:
            keep = (not delete) or c.id in table.primary_key
            cols[c.name].append(r.get(c.name) if keep else None)
        ops.append(1 if delete else 0)
    arrays = {c.name: pa.array(cols[c.name], c.arrow) for c in table.columns}
    arrays[OP_COLUMN] = pa.array(ops, pa.int8())
    arrays[COMMIT_TS_COLUMN] = pa.array([commit_ts] * len(rows), pa.int64())
    return pa.table(arrays)


@pytest.fixture
def sink(tmp_path) -> DeltaSink:
    return DeltaSink(str(tmp_path / "lake"))
