"""Static parts of the embedded workload: the initial tables, value generators, SQL text.

Kept apart from ``generator.py`` so the generator reads as the transaction logic alone.
"""

from __future__ import annotations

import datetime as dt
import json
import random
from decimal import Decimal
from typing import Any

from cdc_dagster.schema import ColumnSchema, TableSchema
from cdc_dagster.upstream.values import WIDE, decimal_scale

ODD_TABLE = 'wide `t` "q"; ü 表'
ODD_COLUMN = 'we`ird "c"; DROP TABLE x; -- ü'
ODD_SCRATCH_PREFIX = "scr ätch;`"

# Fragments of strings: unicode, quotes, backslashes, control-ish characters, empty.
_TEXT = (
    "",
    "a",
    "Zoë",
    "日本語",
    "😀",
    "it's",
    '"q"',
    "`b`",
    "back\\slash",
    "semi;",
    " sp ",
    "ñ\n",
)
STATUSES = ("new", "paid", "shipped", "returned", "cañcelled")

WIDE_TYPES: tuple[tuple[str, str], ...] = (
    ("c_bool", "bool"),
    ("c_i8", "int8"),
    ("c_i16", "int16"),
    ("c_i32", "int32"),
    ("c_i64", "int64"),
    ("c_u8", "uint8"),
    ("c_u16", "uint16"),
    ("c_u32", "uint32"),
    ("c_u64", "uint64"),
    ("c_dec", "decimal(18,4)"),
    ("c_bigdec", "decimal(38,10)"),
    ("c_f32", "float32"),
    ("c_f64", "float64"),
    ("c_str", "string"),
    ("c_json", "json"),
    ("c_bin", "binary"),
    ("c_date", "date"),
    ("c_dt", "datetime"),
    ("c_ts", "timestamp"),
    ("c_time", "time"),
)

# Columns an ADD COLUMN may add: (logical type, default text or None).
ADDABLE: tuple[tuple[str, str | None], ...] = (
    ("int32", "7"),
    ("string", 'it\'s "x"; `y`'),
    ("decimal(10,2)", "1.50"),
    ("date", "2020-02-29"),
    ("float64", "0.5"),
    ("datetime", "2001-02-03 04:05:06.5"),
    ("string", None),
    ("bool", "true"),
)

_MYSQL_TYPES = {
    "bool": "tinyint(1)",
    "int8": "tinyint",
    "int16": "smallint",
    "int32": "int",
    "int64": "bigint",
    "uint8": "tinyint unsigned",
    "uint16": "smallint unsigned",
    "uint32": "int unsigned",
    "uint64": "bigint unsigned",
    "float32": "float",
    "float64": "double",
    "string": "varchar(255)",
    "binary": "varbinary(255)",
    "json": "json",
    "date": "date",
    "datetime": "datetime(6)",
    "timestamp": "timestamp(6)",
    "time": "time(6)",
}


def col(cid: int, name: str, logical: str, nullable: bool = True, default: str | None = None):
    """Shorthand for a ColumnSchema."""
    return ColumnSchema(cid, name, logical, nullable, default)


def bank_schema(table_id: int, index: int, shards: int) -> TableSchema:
    """A bank accounts table: id, balance (the invariant), owner."""
    cols = (
        col(1, "id", "int64", False),
        col(2, "balance", "decimal(18,2)", False, "0.00"),
        col(3, "owner", "string"),
    )
    return TableSchema(table_id, "bank", f"accounts_{index}", cols, (1,), shards=shards)


def customers_schema(table_id: int, shards: int) -> TableSchema:
    cols = (
        col(1, "id", "int64", False),
        col(2, "name", "string", False),
        col(3, "email", "string"),
        col(4, "created_at", "timestamp"),
    )
    return TableSchema(table_id, "shop", "customers", cols, (1,), shards=shards)


def orders_schema(table_id: int, shards: int) -> TableSchema:
    cols = (
        col(1, "id", "int64", False),
        col(2, "customer_id", "int64", False),
        col(3, "amount", "decimal(12,2)", False),
        col(4, "status", "string"),
        col(5, "placed_at", "datetime"),
    )
    return TableSchema(table_id, "shop", "orders", cols, (1,), shards=shards)


def wide_schema(table_id: int, shards: int, odd: bool) -> TableSchema:
    cols = [col(1, "id", "int64", False)]
    cols += [col(i + 2, name, logical) for i, (name, logical) in enumerate(WIDE_TYPES)]
    if odd:
        cols.append(col(len(cols) + 1, ODD_COLUMN, "string"))
    name = ODD_TABLE if odd else "wide"
    return TableSchema(table_id, "types", name, tuple(cols), (1,), shards=shards)


def scratch_schema(table_id: int, name: str, shards: int) -> TableSchema:
    cols = (col(1, "id", "int64", False), col(2, "v", "string"), col(3, "n", "int32"))
    return TableSchema(table_id, "scratch", name, cols, (1,), shards=shards)


def random_text(rng: random.Random) -> str:
    return "".join(rng.choice(_TEXT) for _ in range(rng.randint(0, 4)))


def random_value(rng: random.Random, logical: str) -> Any:
    """A random value of a logical type in its Python form; every value round-trips exactly."""
    scale = decimal_scale(logical)
    if scale is not None:
        digits = 20 if logical == "uint64" else int(logical[8:].split(",")[0])
        if logical == "uint64":
            return Decimal(rng.randint(0, 2**64 - 1))
        bound = 10 ** min(digits, 30) - 1
        return Decimal(rng.randint(-bound, bound)).scaleb(-scale, WIDE)
    return _RANDOM[logical](rng)


def _dt_from(rng: random.Random, start: dt.datetime, days: int) -> dt.datetime:
    return start + dt.timedelta(microseconds=rng.randint(0, days * 86_400_000_000))


_EPOCH = dt.datetime(1970, 1, 1)
_RANDOM: dict[str, Any] = {
    "bool": lambda r: r.random() < 0.5,
    "int8": lambda r: r.randint(-128, 127),
    "int16": lambda r: r.randint(-(2**15), 2**15 - 1),
    "int32": lambda r: r.randint(-(2**31), 2**31 - 1),
    "int64": lambda r: r.randint(-(2**63), 2**63 - 1),
    "uint8": lambda r: r.randint(0, 255),
    "uint16": lambda r: r.randint(0, 2**16 - 1),
    "uint32": lambda r: r.randint(0, 2**32 - 1),
    # float32 values are multiples of 1/8 below 2^20: exact in 32 bits.
    "float32": lambda r: r.randint(-(2**23), 2**23) / 8,
    "float64": lambda r: r.choice((r.uniform(-1e6, 1e6), r.uniform(-1, 1) * 1e300, 0.0, -0.5)),
    "string": random_text,
    "json": lambda r: json.dumps(
        {"k": r.randint(0, 99), "s": random_text(r), "a": [r.random() < 0.5, None]},
        ensure_ascii=False,
        sort_keys=True,
    ),
    "binary": lambda r: r.randbytes(r.randint(0, 12)),
    "date": lambda r: dt.date(1900, 1, 1) + dt.timedelta(days=r.randint(0, 73_000)),
    "datetime": lambda r: _dt_from(r, dt.datetime(1900, 1, 1), 73_000),
    "timestamp": lambda r: _dt_from(r, _EPOCH, 24_000).replace(tzinfo=dt.UTC),
    "time": lambda r: r.randint(-838 * 3_600_000_000, 838 * 3_600_000_000),
}


def quote_ident(name: str) -> str:
    """MySQL identifier quoting (backticks doubled): for the DDL's query text only."""
    return "`" + name.replace("`", "``") + "`"


def qualified(schema: TableSchema) -> str:
    return f"{quote_ident(schema.database)}.{quote_ident(schema.table)}"


def sql_literal(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "''") + "'"


def mysql_type(logical: str) -> str:
    return _MYSQL_TYPES.get(logical) or logical  # decimal(p,s) is spelled the same


def create_query(schema: TableSchema) -> str:
    cols = ", ".join(
        f"{quote_ident(c.name)} {mysql_type(c.type)}{'' if c.nullable else ' NOT NULL'}"
        for c in schema.columns
    )
    pk = ", ".join(quote_ident(c.name) for c in schema.key_columns)
    return f"CREATE TABLE {qualified(schema)} ({cols}, PRIMARY KEY ({pk}))"
