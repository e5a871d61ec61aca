"""Compact binary encoding of one capture's table statuses for one changefeed.

The owner reads one such value per capture per tick, so its size is the tick's etcd
cost. Layout (version 2), all little-endian::

    header   "TS" | version u8 | liveness u8 | count u32 | owner_rev u64 | changefeed_epoch u64
    body     zlib( ids | states | column(checkpoint_ts) | column(resolved_ts)
                   | column(rows_applied) )
    ids      width u8 | table_id deltas (rows sorted by table_id)
    states   one byte per row
    column   0 u8 | width u8 | base u64 | value - base                       (offset mode)
           | 1 u8 | k u32 | width u8 | base u64 | deltas of the k distinct values
               | index width u8 | index into the distinct values per row     (dictionary mode)

Integers use the narrowest of 1/2/4/8 bytes that holds the column's largest value and
are byte-shuffled (all first bytes, then all second bytes, ...) so that zlib sees long
runs. Tables of a capture share a few resolved-ts marks, so the dictionary mode usually
wins; the offset mode bounds the worst case (every checkpoint distinct).

``rows_applied`` is each table's count of rows the capture's sink wrote for it since the
capture took it: the owner reads it so that a table written slice by slice while its
checkpoint waits at one ts (a large snapshot's rows, all at its snapshot ts) shows motion.
Version 1 (a capture of the previous release, still running during an upgrade) is the
same without that column; it decodes with 0 rows for every table.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field

import numpy as np

from cdc_dagster.metastore.errors import CorruptValueError, InvalidArgumentError
from scheduler_core.errors import InvalidMessageError
from scheduler_core.messages import Liveness, TableStatusBatch
from scheduler_core.ts import MAX_TS

MAGIC = b"TS"
VERSION = 2
_READS = (1, 2)  # version 1: no rows_applied column (read as 0 rows)
_HEADER = struct.Struct("<2sBBIQQ")
_WIDTHS = (1, 2, 4, 8)
_ZLIB_LEVEL = 6
# The default of TaskStatus.rows_applied (one object, known by identity): 0 for every table.
_NO_ROWS = np.zeros(0, np.int64)
_NO_ROWS.flags.writeable = False


@dataclass(frozen=True, slots=True, eq=False)
class TaskStatus:
    """What one capture reports for one changefeed: the fencing fields and every table it holds.

    ``rows_applied``: per row of ``tables``, the rows the capture's sink wrote for that table
    since the capture took it (a counter; left out: 0 for every table). Read-only int64.
    """

    owner_rev: int
    changefeed_epoch: int
    liveness: Liveness
    tables: TableStatusBatch
    rows_applied: np.ndarray = field(default_factory=lambda: _NO_ROWS)

    def __post_init__(self) -> None:
        for name in ("owner_rev", "changefeed_epoch"):
            value = getattr(self, name)
            if type(value) is not int or not 0 <= value < 2**64:
                raise InvalidArgumentError(f"{name} must be an int in [0, 2^64), got {value!r}")
        if not isinstance(self.liveness, Liveness):
            raise InvalidArgumentError(f"liveness must be a Liveness, got {self.liveness!r}")
        if not isinstance(self.tables, TableStatusBatch):
            raise InvalidArgumentError(f"tables must be a TableStatusBatch, got {self.tables!r}")
        object.__setattr__(self, "rows_applied", _rows_column(self.rows_applied, len(self.tables)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TaskStatus):
            return NotImplemented
        return (
            (self.owner_rev, self.changefeed_epoch, self.liveness)
            == (other.owner_rev, other.changefeed_epoch, other.liveness)
            and self.tables == other.tables
            and np.array_equal(self.rows_applied, other.rows_applied)
        )

    def __hash__(self) -> int:
        return hash((self.owner_rev, self.changefeed_epoch, self.liveness, self.tables))

    def rows_by_table(self) -> dict[int, int]:
        """Table id -> rows applied, for the tables with any."""
        rows = self.rows_applied
        mask = rows != 0
        if not mask.any():
            return {}
        return dict(zip(self.tables.table_ids[mask].tolist(), rows[mask].tolist(), strict=True))


def _rows_column(rows: np.ndarray, n: int) -> np.ndarray:
    """``rows`` as a read-only int64 column of ``n`` counts (``_NO_ROWS``: zeros)."""
    if rows is _NO_ROWS:
        out = np.zeros(n, np.int64)
    else:
        arr = np.asarray(rows)
        if arr.ndim != 1 or len(arr) != n or (n and arr.dtype.kind not in "iu"):
            raise InvalidArgumentError(
                f"rows_applied must be {n} integer counts (one per table), got shape "
                f"{arr.shape} of {arr.dtype}"
            )
        if n and (int(arr.min()) < 0 or int(arr.max()) > MAX_TS):
            raise InvalidArgumentError("rows_applied must be counts in [0, 2^63)")
        if not arr.flags.writeable and arr.dtype == np.int64:
            return arr
        out = arr.astype(np.int64)  # a copy: the caller's array stays as it was
    out.flags.writeable = False
    return out


def sorted_batch(batch: TableStatusBatch) -> TableStatusBatch:
    """The same statuses ordered by table_id (the order :func:`decode` returns)."""
    return _sorted(batch, np.zeros(len(batch), np.int64))[0]


def _sorted(batch: TableStatusBatch, rows: np.ndarray) -> tuple[TableStatusBatch, np.ndarray]:
    """``batch`` and its ``rows`` ordered by table_id."""
    order = np.argsort(batch.table_ids, kind="stable")
    if np.array_equal(order, np.arange(len(order))):
        return batch, rows
    ordered = TableStatusBatch(
        batch.table_ids[order],
        batch.states[order],
        batch.checkpoint_ts[order],
        batch.resolved_ts[order],
    )
    return ordered, rows[order]


def _width(values: np.ndarray) -> int:
    top = int(values.max()) if len(values) else 0
    return next(w for w in _WIDTHS if top < 1 << (8 * w))


def _shuffled(values: np.ndarray) -> bytes:
    width = _width(values)
    raw = values.astype(f"<u{width}").view(np.uint8).reshape(len(values), width)
    return bytes([width]) + raw.T.tobytes()


def _column(values: np.ndarray) -> bytes:
    base = int(values.min()) if len(values) else 0
    offsets = values - base
    offset_mode = b"\x00" + _with_base(_shuffled(offsets), base)
    uniq, index = np.unique(values, return_inverse=True)
    if len(uniq) > 0xFFFF:
        return offset_mode
    dict_mode = b"".join(
        (
            b"\x01" + struct.pack("<I", len(uniq)),
            _with_base(_shuffled(np.diff(uniq, prepend=np.int64(base))), base),
            _shuffled(index.astype(np.int64)),
        )
    )
    return dict_mode if len(dict_mode) < len(offset_mode) else offset_mode


def _with_base(shuffled: bytes, base: int) -> bytes:
    return shuffled[:1] + struct.pack("<Q", base) + shuffled[1:]


def encode(status: TaskStatus) -> bytes:
    """The compact bytes for ``status`` (rows reordered by table_id)."""
    batch, rows = _sorted(status.tables, status.rows_applied)
    body = b"".join(
        (
            _shuffled(np.diff(batch.table_ids, prepend=np.int64(0))),
            batch.states.astype(np.uint8).tobytes(),
            _column(batch.checkpoint_ts),
            _column(batch.resolved_ts),
            _column(rows),
        )
    )
    header = _HEADER.pack(
        MAGIC, VERSION, int(status.liveness), len(batch), status.owner_rev, status.changefeed_epoch
    )
    return header + zlib.compress(body, _ZLIB_LEVEL)


class _Reader:
    """Bounds-checked reads from a decoded body."""

    def __init__(self, body: bytes) -> None:
        self._view = memoryview(body)
        self._pos = 0

    def take(self, size: int) -> memoryview:
        if size < 0 or self._pos + size > len(self._view):
            raise CorruptValueError("task status body ends early")
        chunk = self._view[self._pos : self._pos + size]
        self._pos += size
        return chunk

    def unpack(self, fmt: str) -> int:
        return int(struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0])

    def shuffled(self, n: int) -> np.ndarray:
        width = self.unpack("<B")
        if width not in _WIDTHS:
            raise CorruptValueError(f"task status has a column of width {width}")
        return self.shuffled_of(n, width)

    def shuffled_of(self, n: int, width: int) -> np.ndarray:
        raw = np.frombuffer(self.take(n * width), dtype=np.uint8).reshape(width, n)
        values = np.ascontiguousarray(raw.T).view(f"<u{width}").ravel()
        if width == 8 and len(values) and int(values.max()) > MAX_TS:
            raise CorruptValueError("task status has a value beyond 2^63")
        return values.astype(np.int64)

    def column(self, n: int) -> np.ndarray:
        mode = self.unpack("<B")
        if mode == 0:
            width = self.unpack("<B")
            if width not in _WIDTHS:
                raise CorruptValueError(f"task status has a column of width {width}")
            base = self._base()
            return self.shuffled_of(n, width) + base
        if mode != 1:
            raise CorruptValueError(f"task status has column mode {mode}")
        k = self.unpack("<I")
        width = self.unpack("<B")
        if width not in _WIDTHS:
            raise CorruptValueError(f"task status has a column of width {width}")
        base = self._base()
        uniq = np.cumsum(self.shuffled_of(k, width)) + base
        index = self.shuffled(n)
        if n and (k == 0 or int(index.max()) >= k):
            raise CorruptValueError("task status dictionary index out of range")
        return uniq[index] if n else np.zeros(0, np.int64)

    def _base(self) -> int:
        base = self.unpack("<Q")
        if base > MAX_TS:
            raise CorruptValueError(f"task status base {base} is beyond 2^63")
        return base

    def done(self) -> None:
        if self._pos != len(self._view):
            raise CorruptValueError("task status body has trailing bytes")


def decode(data: bytes) -> TaskStatus:
    """Inverse of :func:`encode`; raises CorruptValueError on anything it did not write."""
    if len(data) < _HEADER.size:
        raise CorruptValueError(f"task status of {len(data)} bytes is shorter than its header")
    magic, version, liveness, n, owner_rev, cf_epoch = _HEADER.unpack_from(data)
    if magic != MAGIC or version not in _READS:
        raise CorruptValueError(
            f"task status has magic {magic!r} version {version}; this build reads "
            f"{MAGIC!r} versions {', '.join(map(str, _READS))}: was it written by another "
            "cdc-dagster version?"
        )
    columns = 3 if version >= 2 else 2
    # Widest possible body: 8-byte ids and columns, dictionaries of 0xFFFF values, headers.
    limit = 64 + n * (9 + 8 * columns) + columns * 0x10000 * 8
    body = _Reader(_inflate(data[_HEADER.size :], limit))
    try:
        ids = np.cumsum(body.shuffled(n))
        states = np.frombuffer(body.take(n), dtype=np.uint8).astype(np.int64)
        checkpoint_ts = body.column(n)
        resolved_ts = body.column(n)
        rows = body.column(n) if version >= 2 else np.zeros(n, np.int64)
        body.done()
        for column in (ids, states, checkpoint_ts, resolved_ts, rows):
            column.flags.writeable = False  # fresh arrays: the batch need not copy them
        tables = TableStatusBatch(ids, states, checkpoint_ts, resolved_ts)
        return TaskStatus(owner_rev, cf_epoch, Liveness(liveness), tables, rows)
    except (struct.error, ValueError, OverflowError, InvalidMessageError) as exc:
        raise CorruptValueError(f"task status does not decode: {exc}") from exc


def _inflate(compressed: bytes, limit: int) -> bytes:
    inflater = zlib.decompressobj()
    try:
        body = inflater.decompress(compressed, limit + 1)
    except zlib.error as exc:
        raise CorruptValueError(f"task status body is not zlib data: {exc}") from exc
    if len(body) > limit or inflater.unconsumed_tail or not inflater.eof:
        raise CorruptValueError("task status body is truncated or longer than its row count allows")
    return body
