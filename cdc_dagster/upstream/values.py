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

from cdc_dagster.upstream.schema import ColumnSchema, SchemaError
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
