"""Every logical type lands in Delta as docs/dataplane.md 3.1 says, and reads back equal."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import duckdb
import pyarrow as pa
from conftest import CF, batch
from deltalake import DeltaTable

from cdc_dagster.schema import ColumnSchema, TableSchema
from cdc_dagster.sinks.delta import read_table_at

VALUES = {
    "bool": True,
    "int8": -8,
    "int16": -16,
    "int32": -32,
    "int64": -(2**62),
    "uint8": 255,
    "uint16": 65535,
    "uint32": 2**32 - 1,
    "uint64": Decimal(2**64 - 1),
    "decimal(18,2)": Decimal("-12345.67"),
    "decimal(50,10)": Decimal("1234567890123456789012345678901234567890.0123456789"),
    "float32": 1.5,
    "float64": -2.25,
    "string": "ünï ☃ 表 '\";`",
    "binary": b"\x00\xffbin",
    "json": '{"a": [1, 2]}',
    "date": dt.date(2024, 2, 29),
    "datetime": dt.datetime(2024, 2, 29, 23, 59, 59, 123456),
    "timestamp": dt.datetime(2024, 2, 29, 23, 59, 59, 123456, tzinfo=dt.UTC),
    "time": -(838 * 3600 * 10**6),
}
DELTA_TYPES = {
    "uint64": "decimal(20,0)",
    "decimal(50,10)": "string",
    "datetime": "timestamp_ntz",
    "timestamp": "timestamp",
    "time": "long",
    "json": "string",
}


def wide() -> TableSchema:
    cols = [ColumnSchema(1, "k", "int64", False)]
    cols += [ColumnSchema(i + 2, f"c_{t}", t) for i, t in enumerate(VALUES)]
    return TableSchema(11, "db", "wide", tuple(cols), (1,))


def test_every_type_round_trips_through_delta(sink):
    t = wide()
    token = sink.acquire(CF, t)
    row = {"k": 1, **{f"c_{k}": v for k, v in VALUES.items()}}
    nulls = {"k": 2}
    sink.write(CF, t, batch(t, [row, nulls]), 0, 10, token)
    got = sorted(read_table_at(sink.root, t).to_pylist(), key=lambda r: r["k"])
    expected = dict(row, **{"c_decimal(50,10)": str(VALUES["decimal(50,10)"])})
    assert got[0] == expected
    assert all(v is None for k, v in got[1].items() if k != "k")
    fields = {f.name: f for f in DeltaTable(sink.path(t)).schema().fields}
    for logical, delta in DELTA_TYPES.items():
        assert str(fields[f"c_{logical}"].type.type) == delta, logical


def test_duckdb_reads_a_pinned_version_through_file_uris(sink):
    t = wide()
    token = sink.acquire(CF, t)
    sink.write(CF, t, batch(t, [{"k": 1, "c_int32": 5}]), 0, 10, token)
    sink.write(CF, t, batch(t, [{"k": 1, "c_int32": 6}, {"k": 2}]), 10, 20, token)
    files = DeltaTable(sink.path(t), version=1).file_uris()  # after the first write
    con = duckdb.connect()
    rows = con.execute(
        'SELECT k, "c_int32" FROM read_parquet(?, union_by_name=true) ORDER BY k', [files]
    ).fetchall()
    assert rows == [(1, 5)]
    assert pa.types.is_int32(read_table_at(sink.root, t, 2).schema.field("c_int32").type)
