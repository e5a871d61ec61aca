"""TS: the 64-bit hybrid timestamp, ``(physical_ms << 18) | logical``."""

from __future__ import annotations

import datetime as _dt

from scheduler_core.errors import InvalidMessageError

LOGICAL_BITS = 18
LOGICAL_MASK = (1 << LOGICAL_BITS) - 1
MAX_TS = (1 << 63) - 1


def compose(physical_ms: int, logical: int = 0) -> int:
    """Build a TS from wall milliseconds and a logical counter."""
    if physical_ms < 0:
        raise InvalidMessageError(f"physical_ms must be >= 0, got {physical_ms}")
    if not 0 <= logical <= LOGICAL_MASK:
        raise InvalidMessageError(f"logical must be in [0, {LOGICAL_MASK}], got {logical}")
    ts = (physical_ms << LOGICAL_BITS) | logical
    if ts > MAX_TS:
        raise InvalidMessageError(f"physical_ms {physical_ms} overflows a 63-bit TS")
    return ts


def split(ts: int) -> tuple[int, int]:
    """Return ``(physical_ms, logical)`` of a TS."""
    if ts < 0:
        raise InvalidMessageError(f"TS must be >= 0, got {ts}")
    return ts >> LOGICAL_BITS, ts & LOGICAL_MASK


def physical_ms(ts: int) -> int:
    """The wall-clock milliseconds part of a TS."""
    return split(ts)[0]


def add_ms(ts: int, ms: int) -> int:
    """The TS ``ms`` milliseconds after ``ts`` (logical part kept)."""
    phys, logical = split(ts)
    return compose(phys + ms, logical)


def to_datetime(ts: int) -> _dt.datetime:
    """The TS's physical part as an aware UTC datetime."""
    return _dt.datetime.fromtimestamp(physical_ms(ts) / 1000, tz=_dt.UTC)


def wall_time(ts: int) -> str:
    """The TS's physical part as UTC: ``2026-11-22T02:04:56.123Z``."""
    return to_datetime(ts).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def format_ts(ts: int) -> str:
    """Printable form: ``2026-11-22T02:04:56.123Z+logical (ts)``."""
    return f"{wall_time(ts)}+{split(ts)[1]} ({ts})"
