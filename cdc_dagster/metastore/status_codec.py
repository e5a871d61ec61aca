"""Compact binary encoding of one capture's table statuses for one changefeed.

The owner reads one such value per capture per tick, so its size is the tick's etcd
cost. Layout (version 1), all little-endian::

    header  "TS" | version u8 | liveness u8 | count u32 | owner_rev u64 | changefeed_epoch u64
    body    zlib( w_ids u8 | w_ckpt u8 | w_res u8 | ckpt_base u64
                  | table_id deltas     (w_ids bytes each)
                  | states              (1 byte each)
                  | checkpoint - base   (w_ckpt bytes each)
                  | resolved - checkpoint (w_res bytes each) )

Rows are sorted by table_id; each integer column uses the narrowest of 1/2/4/8 bytes that
holds its largest value and is byte-shuffled (all first bytes, then all second bytes, ...)
so that zlib sees long runs: ids step by small deltas and a capture's checkpoints sit
within seconds of each other.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

import numpy as np

from cdc_dagster.metastore.errors import CorruptValueError
from scheduler_core.errors import InvalidMessageError
from scheduler_core.messages import Liveness, TableStatusBatch

MAGIC = b"TS"
VERSION = 1
_HEADER = struct.Struct("<2sBBIQQ")
_BODY_HEAD = struct.Struct("<BBBQ")
_WIDTHS = (1, 2, 4, 8)
_ZLIB_LEVEL = 6


@dataclass(frozen=True, slots=True)
class TaskStatus:
    """What one capture reports for one changefeed: the fencing fields and every table it holds."""

    owner_rev: int
    changefeed_epoch: int
    liveness: Liveness
    tables: TableStatusBatch

    def __post_init__(self) -> None:
        for name in ("owner_rev", "changefeed_epoch"):
            value = getattr(self, name)
            if type(value) is not int or not 0 <= value < 2**64:
                raise ValueError(f"{name} must be an int in [0, 2^64), got {value!r}")
        if not isinstance(self.liveness, Liveness):
            raise ValueError(f"liveness must be a Liveness, got {self.liveness!r}")
        if not isinstance(self.tables, TableStatusBatch):
            raise ValueError(f"tables must be a TableStatusBatch, got {self.tables!r}")


def sorted_batch(batch: TableStatusBatch) -> TableStatusBatch:
    """The same statuses ordered by table_id (the order :func:`decode` returns)."""
    order = np.argsort(batch.table_ids, kind="stable")
    if np.array_equal(order, np.arange(len(order))):
        return batch
    return TableStatusBatch(
        batch.table_ids[order],
        batch.states[order],
        batch.checkpoint_ts[order],
        batch.resolved_ts[order],
    )


def _width(values: np.ndarray) -> int:
    top = int(values.max()) if len(values) else 0
    return next(w for w in _WIDTHS if top < 1 << (8 * w))


def _shuffle(values: np.ndarray, width: int) -> bytes:
    raw = values.astype(f"<u{width}").view(np.uint8).reshape(len(values), width)
    return raw.T.tobytes()


def _unshuffle(buf: memoryview, n: int, width: int) -> np.ndarray:
    raw = np.frombuffer(buf, dtype=np.uint8, count=n * width).reshape(width, n)
    return np.ascontiguousarray(raw.T).view(f"<u{width}").ravel().astype(np.int64)


def encode(status: TaskStatus) -> bytes:
    """The compact bytes for ``status`` (rows reordered by table_id)."""
    batch = sorted_batch(status.tables)
    n = len(batch)
    ids = np.diff(batch.table_ids, prepend=np.int64(0))
    base = int(batch.checkpoint_ts.min()) if n else 0
    ckpt = batch.checkpoint_ts - base
    res = batch.resolved_ts - batch.checkpoint_ts
    w_ids, w_ckpt, w_res = _width(ids), _width(ckpt), _width(res)
    body = b"".join(
        (
            _BODY_HEAD.pack(w_ids, w_ckpt, w_res, base),
            _shuffle(ids, w_ids),
            batch.states.astype(np.uint8).tobytes(),
            _shuffle(ckpt, w_ckpt),
            _shuffle(res, w_res),
        )
    )
    header = _HEADER.pack(
        MAGIC, VERSION, int(status.liveness), n, status.owner_rev, status.changefeed_epoch
    )
    return header + zlib.compress(body, _ZLIB_LEVEL)


def decode(data: bytes) -> TaskStatus:
    """Inverse of :func:`encode`; raises CorruptValueError on anything it did not write."""
    if len(data) < _HEADER.size:
        raise CorruptValueError(f"task status of {len(data)} bytes is shorter than its header")
    magic, version, liveness, n, owner_rev, cf_epoch = _HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        raise CorruptValueError(
            f"task status has magic {magic!r} version {version}; this build reads "
            f"{MAGIC!r} version {VERSION}: was it written by another cdc-dagster version?"
        )
    body = _inflate(data[_HEADER.size :], _BODY_HEAD.size + n * 25)
    try:
        w_ids, w_ckpt, w_res, base = _BODY_HEAD.unpack_from(body)
        expected = _BODY_HEAD.size + n * (w_ids + 1 + w_ckpt + w_res)
        if w_ids not in _WIDTHS or w_ckpt not in _WIDTHS or w_res not in _WIDTHS:
            raise CorruptValueError(f"task status has column widths {(w_ids, w_ckpt, w_res)}")
        if len(body) != expected:
            raise CorruptValueError(f"task status body is {len(body)} bytes, expected {expected}")
        view, pos = memoryview(body), _BODY_HEAD.size
        ids = np.cumsum(_unshuffle(view[pos:], n, w_ids))
        pos += n * w_ids
        states = np.frombuffer(view[pos:], dtype=np.uint8, count=n).astype(np.int64)
        pos += n
        ckpt = _unshuffle(view[pos:], n, w_ckpt) + base
        res = _unshuffle(view[pos + n * w_ckpt :], n, w_res) + ckpt
        tables = TableStatusBatch(ids, states, ckpt, res)
        return TaskStatus(owner_rev, cf_epoch, Liveness(liveness), tables)
    except (struct.error, ValueError, InvalidMessageError) as exc:
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
