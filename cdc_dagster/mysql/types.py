"""MySQL/MariaDB column types -> logical change-log types, and binlog values -> Arrow values.

| MySQL | logical | PostgreSQL |
|---|---|---|
| TINYINT / SMALLINT / MEDIUMINT / INT / BIGINT | int8 / int16 / int32 / int32 / int64 | smallint / smallint / integer / integer / bigint |
| ... UNSIGNED | uint8 / uint16 / uint32 / uint32 / uint64 | smallint / integer / bigint / bigint / numeric(20) |
| DECIMAL(p,s) | decimal(p,s) | numeric(p,s) |
| FLOAT / DOUBLE | float32 / float64 | real / double precision |
| CHAR, VARCHAR, TEXT*, ENUM, SET | string | text |
| BINARY, VARBINARY, BLOB* | binary | bytea |
| JSON | json | jsonb |
| BIT(n) | int64 (uint64 for n = 64) | bigint (numeric(20)) |
| YEAR | int16 | smallint |
| DATE / DATETIME / TIMESTAMP | date / datetime / timestamp | date / timestamp / timestamptz |
| TIME | time (microseconds) | interval |

Zero dates (``0000-00-00``) become NULL (PostgreSQL has no year 0).
"""

from __future__ import annotations

import base64
import datetime as dt
import re
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from cdc_dagster.upstream.binlog_rows import json_text

_INTS = {"tinyint": 8, "smallint": 16, "mediumint": 32, "int": 32, "integer": 32, "bigint": 64}


class UnsupportedTypeError(ValueError):
    """A column type the change log cannot carry (message names it)."""


def logical_type(data_type: str, column_type: str) -> str:
    """Logical type of an information_schema column (DATA_TYPE, COLUMN_TYPE)."""
    dtype, ctype = data_type.lower(), column_type.lower()
    unsigned = "unsigned" in ctype
    if dtype in _INTS:
        bits = _INTS[dtype]
        if unsigned:
            return {8: "uint8", 16: "uint16", 32: "uint32", 64: "uint64"}[bits]
        return {8: "int8", 16: "int16", 32: "int32", 64: "int64"}[bits]
    if dtype == "decimal" or dtype == "numeric":
        m = re.search(r"\((\d+)(?:,(\d+))?\)", ctype)
        p, s = (int(m.group(1)), int(m.group(2) or 0)) if m else (10, 0)
        return f"decimal({p},{s})"
    if dtype in ("float",):
        return "float32"
    if dtype in ("double", "real", "double precision"):
        return "float64"
    if dtype in ("char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set"):
        return "string"
    if dtype in ("binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"):
        return "binary"
    if dtype == "json":
        return "json"
    if dtype == "longtext" and "json" in ctype:
        return "json"
    if dtype == "bit":
        m = re.search(r"\((\d+)\)", ctype)
        return "uint64" if m and int(m.group(1)) == 64 else "int64"
    if dtype == "year":
        return "int16"
    if dtype in ("date", "datetime", "timestamp", "time"):
        return dtype
    raise UnsupportedTypeError(f"column type {column_type!r} is not supported by the change log")


def _time_us(v: Any) -> int:
    if isinstance(v, dt.timedelta):
        return (v.days * 86400 + v.seconds) * 1_000_000 + v.microseconds
    if isinstance(v, dt.time):
        return ((v.hour * 60 + v.minute) * 60 + v.second) * 1_000_000 + v.microsecond
    raise TypeError(f"TIME value {v!r}")


def _binary(v: Any) -> bytes:
    return v if isinstance(v, bytes) else str(v).encode("utf-8", errors="surrogateescape")


def _string(v: Any) -> str:
    if isinstance(v, set | frozenset):
        return ",".join(sorted(v))  # SET members (definition order is not in the binlog)
    if isinstance(v, bytes):
        return v.decode("utf-8", errors="replace")
    return str(v)


def _int(v: Any) -> int:
    if isinstance(v, str):  # BIT arrives as a string of 0/1 from the binlog
        return int(v, 2) if v else 0
    if isinstance(v, bytes):  # ... and as big-endian bytes from a SELECT
        return int.from_bytes(v, "big")
    return int(v)


def _bit64(v: Any) -> Decimal:
    return Decimal(_int(v))


def _timestamp(v: Any) -> dt.datetime | None:
    if v is None or not isinstance(v, dt.datetime):
        return None
    return v.replace(tzinfo=dt.UTC) if v.tzinfo is None else v


def _date(v: Any) -> dt.date | None:
    if isinstance(v, dt.datetime):
        return v.date()
    return v if isinstance(v, dt.date) else None


def _datetime(v: Any) -> dt.datetime | None:
    return v if isinstance(v, dt.datetime) else None


CONVERTERS: dict[str, Callable[[Any], Any]] = {
    "uint64": _bit64,
    "string": _string,
    "binary": _binary,
    "json": json_text,
    "time": _time_us,
    "date": _date,
    "datetime": _datetime,
    "timestamp": _timestamp,
    "float32": float,
    "float64": float,
}
for _t in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32"):
    CONVERTERS[_t] = _int


_AS_IS: dict[str, type] = {"string": str, "float64": float, "datetime": dt.datetime}
for _t in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32"):
    _AS_IS[_t] = int


def passthrough(logical: str) -> type | None:
    """The Python type whose values ``converter(logical)`` returns unchanged (None: none);
    the puller skips the call for those, the common case."""
    if logical.startswith("decimal("):
        return Decimal
    return _AS_IS.get(logical)


def converter(logical: str) -> Callable[[Any], Any]:
    """A function from a binlog (or pymysql) value to the Arrow-ready value (None passes)."""
    if logical.startswith("decimal("):
        return lambda v: v if isinstance(v, Decimal) else Decimal(str(v))
    fn = CONVERTERS.get(logical)
    if fn is None:
        return lambda v: v
    return fn


def default_text(logical: str, default: str | None) -> str | None:
    """information_schema COLUMN_DEFAULT (MariaDB quotes strings) -> canonical default text."""
    if default is None or default.upper() == "NULL":
        return None
    if default.startswith("'") and default.endswith("'") and len(default) >= 2:
        default = default[1:-1].replace("''", "'").replace("\\\\", "\\")
    if logical in ("date", "datetime", "timestamp") and (
        default.startswith("0000") or "(" in default or default.upper().startswith("CURRENT")
    ):
        return None  # expressions (CURRENT_TIMESTAMP) and zero dates: no static default
    if "(" in default and logical not in ("string", "json"):
        return None
    if logical == "binary":
        return base64.b64encode(default.encode()).decode()
    if logical == "time":
        neg = default.startswith("-")
        h, m, s = default.lstrip("-").split(":")
        us = round((int(h) * 3600 + int(m) * 60 + float(s)) * 1_000_000)
        return str(-us if neg else us)
    if logical.startswith(("int", "uint")) and default.startswith("b'"):
        return str(int(default[2:-1], 2))  # BIT default b'101'
    return default
