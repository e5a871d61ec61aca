"""Pure parts of DDL application on Delta: column defaults and rewriting a table's data.

A column DDL (add / drop / rename / modify column) rewrites the table's data into the
schema after the DDL, matching columns by column id: deltalake 1.6.6 can add columns but
has no drop or rename, and cannot write column-mapped schema changes, so every schema
change is one overwrite commit (with the table's markers), which also keeps data files
readable by any Parquet reader.
"""

from __future__ import annotations

import base64
import datetime as dt
from decimal import Decimal, InvalidOperation
from typing import Any

import pyarrow as pa

from cdc_dagster.schema import ColumnSchema, TableSchema, arrow_type
from scheduler_core.ts import physical_ms

_NOW = frozenset({"CURRENT_TIMESTAMP", "CURRENT_TIMESTAMP()", "NOW()", "LOCALTIMESTAMP"})
_INTS = frozenset({"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32"})


class DefaultError(ValueError):
    """A column default that cannot be read as a value of the column's type."""


def _time_micros(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        pass
    neg = text.startswith("-")
    h, m, s = text.lstrip("-").split(":")
    micros = (int(h) * 3600 + int(m) * 60) * 1_000_000 + round(Decimal(s) * 1_000_000)
    return -micros if neg else micros


def default_value(column: ColumnSchema, commit_ts: int) -> Any:
    """The Python value of ``column.default`` (canonical text, docs/dataplane.md), or None.

    ``CURRENT_TIMESTAMP`` on a datetime/timestamp column is the DDL's commit time (what
    MySQL gives existing rows of an added column).
    """
    text, kind = column.default, column.type
    if text is None:
        return None
    try:
        if kind in ("datetime", "timestamp") and text.upper() in _NOW:
            when = dt.datetime.fromtimestamp(physical_ms(commit_ts) / 1000, dt.UTC)
            return when if kind == "timestamp" else when.replace(tzinfo=None)
        if kind == "bool":
            low = text.lower()
            if low not in ("0", "1", "true", "false"):
                raise ValueError(text)
            return low in ("1", "true")
        if kind in _INTS:
            return int(text)
        if kind == "time":
            return _time_micros(text)
        if kind == "uint64" or kind.startswith("decimal("):
            value = Decimal(text)
            return str(value) if pa.types.is_decimal256(arrow_type(kind)) else value
        if kind in ("float32", "float64"):
            return float(text)
        if kind in ("string", "json"):
            return text
        if kind == "binary":
            return base64.b64decode(text, validate=True)
        if kind == "date":
            return dt.date.fromisoformat(text)
        if kind == "datetime":
            return dt.datetime.fromisoformat(text).replace(tzinfo=None)
        if kind == "timestamp":
            value = dt.datetime.fromisoformat(text)
            return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    except (ValueError, InvalidOperation, TypeError) as exc:
        raise DefaultError(
            f"column {column.name!r}: default {text!r} is not a {kind} value ({exc})"
        ) from exc
    raise DefaultError(f"column {column.name!r}: no default parser for type {kind}")


def evolve(
    data: pa.Table,
    before: TableSchema,
    after: TableSchema,
    target: pa.Schema,
    commit_ts: int,
) -> pa.Table:
    """``data`` (columns named as in ``before``) in the ``target`` schema of ``after``.

    Columns match by id: a kept column is cast (MODIFY COLUMN), a new one is filled with
    its default (or null). Raises ValueError / pyarrow errors naming the column.
    """
    old_ids = {c.id for c in before.columns}
    arrays = []
    for col, field in zip(after.columns, target, strict=True):
        if col.id in old_ids:
            old = before.column(col.id).name
            if old not in data.column_names:
                raise ValueError(f"column {old!r} of the schema before the DDL is not in Delta")
            try:
                arrays.append(data.column(old).cast(field.type, safe=True))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise ValueError(
                    f"column {old!r}: existing values do not convert to {col.type} ({exc})"
                ) from exc
        else:
            value = default_value(col, commit_ts)
            if value is None and not field.nullable:
                raise ValueError(f"new key column {col.name!r} has no default")
            arrays.append(pa.array([value] * data.num_rows, field.type))
    return pa.Table.from_arrays(arrays, schema=target)


def same_schema(a: pa.Schema, b: pa.Schema) -> bool:
    """Equal names, order, nullability and types (string/binary views count as plain)."""
    if a.names != b.names:
        return False
    return all(
        fa.nullable == fb.nullable and plain_type(fa.type) == plain_type(fb.type)
        for fa, fb in zip(a, b, strict=True)
    )


def plain_type(t: pa.DataType) -> pa.DataType:
    """string/binary for their view and large variants (how Parquet files read back)."""
    if t in (pa.string_view(), pa.large_string()):
        return pa.string()
    if t in (pa.binary_view(), pa.large_binary()):
        return pa.binary()
    return t
