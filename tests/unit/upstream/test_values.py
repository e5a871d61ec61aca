"""Canonical text <-> Python values of column types (column defaults)."""

from __future__ import annotations

import datetime as dt
import random
import re
from decimal import Decimal

import pyarrow as pa
import pytest

from cdc_dagster.schema import ColumnSchema, SchemaError, arrow_type
from cdc_dagster.upstream.values import column_default, value_from_text, value_to_text, widening
from cdc_dagster.upstream.workload_data import WIDE_TYPES, random_value
from scheduler_core.ts import compose


@pytest.mark.parametrize("logical", [t for _, t in WIDE_TYPES])
def test_random_values_round_trip_through_text_and_arrow(logical: str) -> None:
    rng = random.Random(1)
    for _ in range(50):
        value = random_value(rng, logical)
        assert value_from_text(logical, value_to_text(logical, value)) == value
        assert pa.array([value], arrow_type(logical)).to_pylist() == [value]


def test_text_forms_follow_the_format() -> None:
    assert value_from_text("decimal(10,2)", "1.5") == Decimal("1.50")
    assert value_to_text("binary", b"\x00\xff") == "AP8="
    assert value_from_text("datetime", "2001-02-03 04:05:06.5") == dt.datetime(
        2001, 2, 3, 4, 5, 6, 500000
    )
    assert value_to_text("time", -3_723_000_001) == "-01:02:03.000001"
    assert value_from_text("time", "838:59:59") == 838 * 3600 * 10**6 + 59 * 60 * 10**6 + 59 * 10**6
    utc = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
    assert value_to_text("timestamp", utc) == "2020-01-01 00:00:00"
    assert value_from_text("timestamp", "2020-01-01 01:00:00+01:00") == utc
    with pytest.raises(SchemaError, match="not a valid int32"):
        value_from_text("int32", "x")


def test_current_timestamp_default_is_the_ddl_commit_time() -> None:
    column = ColumnSchema(9, "at", "timestamp", True, "CURRENT_TIMESTAMP")
    at = column_default(column, compose(1_600_000_000_123))
    assert at == dt.datetime.fromtimestamp(1_600_000_000.123, dt.UTC)
    assert column_default(ColumnSchema(9, "n", "int32", True, None)) is None


@pytest.mark.parametrize(
    ("src", "dst", "value", "want"),
    [
        ("int16", "int64", -5, -5),
        ("uint32", "int64", 2**32 - 1, 2**32 - 1),
        ("uint32", "uint64", 7, Decimal(7)),
        ("bool", "int8", True, 1),
        ("int64", "decimal(19,0)", -(2**63), Decimal(-(2**63))),
        ("decimal(4,1)", "decimal(6,3)", Decimal("-123.4"), Decimal("-123.400")),
        ("int32", "float64", 2**31 - 1, float(2**31 - 1)),
        ("float32", "float64", 0.125, 0.125),
        ("date", "datetime", dt.date(2000, 1, 2), dt.datetime(2000, 1, 2)),
        ("string", "string", "x", "x"),
    ],
)
def test_widening_keeps_every_value(src: str, dst: str, value: object, want: object) -> None:
    got = widening(src, dst)(value)
    assert got == want and type(got) is type(want)
    assert widening(src, dst)(None) is None


@pytest.mark.parametrize(
    ("src", "dst"),
    [
        ("int64", "int32"),
        ("int8", "uint64"),
        ("int64", "float64"),
        ("int32", "decimal(9,0)"),
        ("decimal(6,3)", "decimal(6,2)"),
        ("float64", "float32"),
        ("datetime", "timestamp"),
        ("int8", "bool"),
        ("string", "json"),
    ],
)
def test_narrowing_or_lossy_changes_are_refused(src: str, dst: str) -> None:
    with pytest.raises(SchemaError, match=f"{re.escape(src)} -> {re.escape(dst)}"):
        widening(src, dst)
