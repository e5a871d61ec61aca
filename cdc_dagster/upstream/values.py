"""Column values in their Python form (what ``pyarrow.array`` takes for the type map) and text.

The canonical text form is the one of a column ``default`` in docs/dataplane.md: decimal
as text, date ``YYYY-MM-DD``, datetime ``YYYY-MM-DD HH:MM:SS[.ffffff]``, binary as
base64, json as its text. Producers, the oracle and sinks share these conversions so an
ADD COLUMN default means the same value everywhere.
"""

from __future__ import annotations

import base64
import datetime as dt
import re
from decimal import Context, Decimal, InvalidOperation
from typing import Any

from cdc_dagster.schema import ColumnSchema, SchemaError
from scheduler_core.ts import physical_ms

_INTS = frozenset({"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32"})
_DECIMAL = re.compile(r"decimal\((\d+),(\d+)\)")
_TIME = re.compile(r"(-?)(\d+):(\d{2}):(\d{2})(?:\.(\d{1,6}))?")
_UTC = dt.UTC
# Decimal arithmetic wide enough for decimal(76, s): the default context rounds at 28 digits.
WIDE = Context(prec=80)
_NOW = frozenset({"CURRENT_TIMESTAMP", "CURRENT_TIMESTAMP()", "NOW()", "LOCALTIMESTAMP"})


def decimal_scale(logical: str) -> int | None:
    """The scale of a ``decimal(p,s)`` type (0 for ``uint64``), None for other types."""
    if logical == "uint64":
        return 0
    m = _DECIMAL.fullmatch(logical)
    return int(m.group(2)) if m else None


def value_from_text(logical: str, text: str) -> Any:
    """The Python value of canonical ``text`` for a column of type ``logical``."""
    try:
        return _from_text(logical, text)
    except (ValueError, InvalidOperation, TypeError) as exc:
        raise SchemaError(f"{text!r} is not a valid {logical} value ({exc})") from exc


def _from_text(logical: str, text: str) -> Any:
    scale = decimal_scale(logical)
    if scale is not None:
        return Decimal(text).quantize(Decimal(1).scaleb(-scale, WIDE), context=WIDE)
    if logical in _INTS:
        return int(text)
    if logical == "bool":
        if text.lower() not in ("true", "false", "1", "0"):
            raise ValueError("want true/false")
        return text.lower() in ("true", "1")
    if logical in ("float32", "float64"):
        return float(text)
    if logical in ("string", "json"):
        return text
    if logical == "binary":
        return base64.b64decode(text, validate=True)
    if logical == "date":
        return dt.date.fromisoformat(text)
    if logical == "datetime":
        return dt.datetime.fromisoformat(text).replace(tzinfo=None)
    if logical == "timestamp":
        ts = dt.datetime.fromisoformat(text)
        return ts.replace(tzinfo=_UTC) if ts.tzinfo is None else ts.astimezone(_UTC)
    if logical == "time":
        return _time_from_text(text)
    raise ValueError(f"unknown type {logical}")


def _time_from_text(text: str) -> int:
    m = _TIME.fullmatch(text)
    if m is None:
        return int(text)
    sign, h, mi, s, frac = m.groups()
    us = ((int(h) * 60 + int(mi)) * 60 + int(s)) * 1_000_000 + int((frac or "").ljust(6, "0"))
    return -us if sign else us


def value_to_text(logical: str, value: Any) -> str:
    """The canonical text of ``value`` (a Python value of a ``logical`` column)."""
    if decimal_scale(logical) is not None:
        return format(Decimal(value), "f")
    if logical == "bool":
        return "true" if value else "false"
    if logical in ("float32", "float64"):
        return repr(float(value))
    if logical == "binary":
        return base64.b64encode(value).decode()
    if logical == "date":
        return value.isoformat()
    if logical == "timestamp" and value.tzinfo is not None:
        value = value.astimezone(_UTC).replace(tzinfo=None)  # the text of a timestamp is UTC
    if logical in ("datetime", "timestamp"):
        return value.isoformat(sep=" ")
    if logical == "time":
        sign, us = ("-" if value < 0 else ""), abs(value)
        s, frac = divmod(us, 1_000_000)
        return f"{sign}{s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d}.{frac:06d}"
    return str(value)


def column_default(column: ColumnSchema, commit_ts: int | None = None) -> Any:
    """The value existing rows get when ``column`` is added at ``commit_ts`` (None: no default).

    ``CURRENT_TIMESTAMP`` (and its synonyms) on a datetime/timestamp column is the DDL's
    commit time, as MySQL gives existing rows, and as the Delta sink applies it.
    """
    text = column.default
    if text is None:
        return None
    if column.type in ("datetime", "timestamp") and text.upper() in _NOW:
        if commit_ts is None:
            raise SchemaError(f"column {column.name!r}: default {text} needs the DDL's commit ts")
        when = dt.datetime.fromtimestamp(physical_ms(commit_ts) / 1000, _UTC)
        return when if column.type == "timestamp" else when.replace(tzinfo=None)
    return value_from_text(column.type, text)


# MODIFY COLUMN type changes the oracle models: each keeps every value exactly, as MySQL
# converts them (integers widen, DECIMAL gains digits, FLOAT -> DOUBLE, DATE -> DATETIME
# at midnight). Digits an integer type needs as a decimal or a float mantissa:
_INT_DIGITS = {
    "bool": 1,
    "int8": 3,
    "uint8": 3,
    "int16": 5,
    "uint16": 5,
    "int32": 10,
    "uint32": 10,
    "int64": 19,
    "uint64": 20,
}
_INT_RANGE = {
    "bool": (0, 1),
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint8": (0, 2**8 - 1),
    "uint16": (0, 2**16 - 1),
    "uint32": (0, 2**32 - 1),
    "uint64": (0, 2**64 - 1),
}
_FLOAT_EXACT_BITS = {"float32": 24, "float64": 53}


def _decimal_ps(logical: str) -> tuple[int, int] | None:
    m = _DECIMAL.fullmatch(logical)
    return (int(m.group(1)), int(m.group(2))) if m else None


def widening(from_type: str, to_type: str) -> Any:
    """A converter for a MODIFY COLUMN from ``from_type`` to ``to_type`` that loses nothing.

    Raises SchemaError for any other change (narrowing, text <-> number, time zones...):
    those depend on the data and the server's SQL mode, which the change log does not hold.
    """
    if from_type == to_type:
        return lambda v: v
    conv = _widening(from_type, to_type)
    if conv is None:
        raise SchemaError(
            f"MODIFY COLUMN {from_type} -> {to_type} is not a widening change that keeps "
            "every value; only integer/decimal/float widenings and date -> datetime are modelled"
        )
    return lambda v: None if v is None else conv(v)


def _widening(src: str, dst: str) -> Any:
    if src in _INT_RANGE and dst in _INT_RANGE:
        lo, hi = _INT_RANGE[src]
        dlo, dhi = _INT_RANGE[dst]
        if dst == "bool" or not (dlo <= lo and hi <= dhi):
            return None
        return (lambda v: Decimal(int(v))) if dst == "uint64" else (lambda v: int(v))
    dst_dec = _decimal_ps(dst)
    if src in _INT_RANGE and dst_dec is not None:
        p, s = dst_dec
        quantum = Decimal(1).scaleb(-s, WIDE)
        fits = p - s >= _INT_DIGITS[src]
        return (lambda v: Decimal(int(v)).quantize(quantum, context=WIDE)) if fits else None
    src_dec = _decimal_ps(src)
    if src_dec is not None and dst_dec is not None:
        (p, s), (p2, s2) = src_dec, dst_dec
        if s2 < s or p2 - s2 < p - s:
            return None
        quantum = Decimal(1).scaleb(-s2, WIDE)
        return lambda v: Decimal(v).quantize(quantum, context=WIDE)
    if src in _INT_RANGE and dst in _FLOAT_EXACT_BITS:
        lo, hi = _INT_RANGE[src]
        fits = max(abs(lo), hi) <= 2 ** _FLOAT_EXACT_BITS[dst]
        return (lambda v: float(int(v))) if fits else None
    if (src, dst) == ("float32", "float64"):
        return float
    if (src, dst) == ("date", "datetime"):
        return lambda v: dt.datetime(v.year, v.month, v.day)
    return None
