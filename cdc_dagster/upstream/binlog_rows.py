"""Binlog row events as change-log records (format version 2), and their mounting.

A binlog puller that only reads (docs/dataplane.md section 1, "Binlog event files") writes
each row event as it came: the event's rows part (from its column count on) and the body
of the table-map event it refers to, with the transaction's commit ts. Decoding them into
the data-file layout (typed ``c<id>`` / ``b<id>`` columns) is "mounting" here, done by any
reader through ``ChangeLog.read_data_file`` -- in the data plane's Spark tasks, in
parallel per table, instead of in the puller's one process.

Mounting compiles one small Python function per (table map, table schema): it walks the
row images with ``struct`` and slices, one branch per column and no per-value dispatch,
and the values become Arrow arrays of the schema's logical types (docs/dataplane.md's type
map; docs/mysql-postgres.md's MySQL mapping). Columns are matched by name (the table map
carries them with ``binlog_row_metadata=FULL``); every column must be present (``FULL``
row image). ``_seq`` of a mounted row is its place among the table's rows of its commit ts.
"""

from __future__ import annotations

import codecs
import datetime as dt
import functools
import json
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pymysqlreplication.constants import CHARSET
from pymysqlreplication.json_binary import parse_json

from cdc_dagster.schema import ColumnSchema, TableSchema

# MySQL column type codes in a table map (include/mysql_com.h, enum_field_types)
T_DECIMAL, T_TINY, T_SHORT, T_LONG, T_FLOAT, T_DOUBLE = 0, 1, 2, 3, 4, 5
T_TIMESTAMP, T_LONGLONG, T_INT24, T_DATE, T_TIME, T_DATETIME, T_YEAR = 7, 8, 9, 10, 11, 12, 13
T_VARCHAR, T_BIT, T_TIMESTAMP2, T_DATETIME2, T_TIME2 = 15, 16, 17, 18, 19
T_JSON, T_NEWDECIMAL, T_ENUM, T_SET = 245, 246, 247, 248
T_TINY_BLOB, T_MEDIUM_BLOB, T_LONG_BLOB, T_BLOB = 249, 250, 251, 252
T_VAR_STRING, T_STRING, T_GEOMETRY = 253, 254, 255
_NUMERIC = {T_TINY, T_SHORT, T_INT24, T_LONG, T_LONGLONG, T_NEWDECIMAL, T_FLOAT, T_DOUBLE, T_YEAR}
_CHARACTER = {T_STRING, T_VAR_STRING, T_VARCHAR, T_BLOB}

# Binlog event type codes of row events, and the change-log op each one is
WRITE_ROWS_V1, UPDATE_ROWS_V1, DELETE_ROWS_V1 = 23, 24, 25
WRITE_ROWS_V2, UPDATE_ROWS_V2, DELETE_ROWS_V2 = 30, 31, 32
OP_INSERT, OP_UPDATE, OP_DELETE = 1, 2, 3
ROW_EVENT_OPS = {
    WRITE_ROWS_V1: OP_INSERT,
    UPDATE_ROWS_V1: OP_UPDATE,
    DELETE_ROWS_V1: OP_DELETE,
    WRITE_ROWS_V2: OP_INSERT,
    UPDATE_ROWS_V2: OP_UPDATE,
    DELETE_ROWS_V2: OP_DELETE,
}

# The columns of a binlog event file (``<first>-<last>-s<shard>-<uuid8>.binlog.parquet``)
EVENT_COLUMNS: tuple[tuple[str, pa.DataType], ...] = (
    ("_commit_ts", pa.int64()),
    ("_seq", pa.int32()),  # the event's place in its transaction
    ("_op", pa.int8()),  # 1 write (insert), 2 update, 3 delete
    ("_schema_version", pa.int64()),
    ("_table_map", pa.binary()),  # the table-map event's body (after the common header)
    ("_rows", pa.binary()),  # the row event's body from its column count on
)
EVENT_SCHEMA = pa.schema([pa.field(n, t, nullable=False) for n, t in EVENT_COLUMNS])
FLAVOR_KEY = b"cdc_dagster.binlog_flavor"  # Parquet key-value metadata: "mariadb" | "mysql"
FLAVORS = ("mariadb", "mysql")


class BinlogRowsError(ValueError):
    """Binlog row events that cannot be mounted (the message names the table and why)."""


# ----------------------------------------------------------------------------- table maps
@dataclass(frozen=True, slots=True)
class BinlogColumn:
    """One column of a table map: its binlog type and what the row images need of it."""

    name: str
    type: int  # the real type (ENUM / SET behind a STRING)
    nullable: bool
    unsigned: bool = False
    length_size: int = 0  # bytes of a value's length prefix (strings, blobs, json)
    max_length: int = 0  # CHAR/BINARY(n): n in bytes (a binary value is padded to it)
    size: int = 0  # fixed bytes: ENUM/SET/BIT; fractional-second bytes of temporal types
    precision: int = 0  # DECIMAL
    scale: int = 0
    collation: int | None = None  # character and ENUM/SET columns
    values: tuple[str, ...] = ()  # ENUM / SET members


@dataclass(frozen=True, slots=True)
class TableMap:
    """A table-map event: the table's name and its columns as the row images have them."""

    database: str
    table: str
    columns: tuple[BinlogColumn, ...]

    @property
    def qualified_name(self) -> str:
        return f"{self.database}.{self.table}"


def _packed_int(b: bytes, p: int) -> tuple[int, int]:
    """A length-encoded integer at ``p``: (value, position after it)."""
    c = b[p]
    if c < 251:
        return c, p + 1
    if c == 252:
        return b[p + 1] | b[p + 2] << 8, p + 3
    if c == 253:
        return b[p + 1] | b[p + 2] << 8 | b[p + 3] << 16, p + 4
    if c == 254:
        return int.from_bytes(b[p + 1 : p + 9], "little"), p + 9
    raise BinlogRowsError(f"bad length-encoded integer 0x{c:02x}")


def table_map_name(body: bytes) -> tuple[str, str]:
    """(database, table) of a table-map event body: cheap, for the puller's filter."""
    n = body[8]
    m = body[10 + n]
    return (
        body[9 : 9 + n].decode("utf-8", "surrogateescape"),
        body[11 + n : 11 + n + m].decode("utf-8", "surrogateescape"),
    )


@functools.lru_cache(maxsize=4096)
def parse_table_map(body: bytes, flavor: str = "mariadb") -> TableMap:
    """The table map of a table-map event ``body`` (after the common header, no checksum)."""
    try:
        return _parse_table_map(body, flavor)
    except (IndexError, ValueError, UnicodeDecodeError) as exc:
        if isinstance(exc, BinlogRowsError):
            raise
        raise BinlogRowsError(f"malformed table-map event ({exc})") from exc


def _parse_table_map(body: bytes, flavor: str) -> TableMap:
    db, table = table_map_name(body)
    p = 12 + body[8] + body[10 + body[8]]  # past the names and their NUL bytes
    n, p = _packed_int(body, p)
    types = list(body[p : p + n])
    p += n
    meta_len, p = _packed_int(body, p)
    metas, q = [], p
    for i, t in enumerate(types):
        m, q, types[i] = _column_meta(t, body, q)
        metas.append(m)
    p += meta_len
    nulls = body[p : p + (n + 7) // 8]
    p += (n + 7) // 8
    opt = _optional_metadata(body, p, types)
    if len(opt.get("names", ())) != n:
        raise BinlogRowsError(
            f"the table map of {db}.{table} carries no column names: set "
            "binlog_row_metadata=FULL on the upstream"
        )
    char_collations = iter(opt.get("charsets", ()))
    enum_collations = iter(opt.get("enum_charsets", ()))
    enums, sets = iter(opt.get("enums", ())), iter(opt.get("sets", ()))
    unsigned = iter(opt.get("unsigned", ()))
    cols = []
    for i, t in enumerate(types):
        kw: dict[str, Any] = dict(metas[i])
        if t in _NUMERIC:
            kw["unsigned"] = next(unsigned, False)
        if t in _CHARACTER:
            kw["collation"] = next(char_collations, None)
        if t in (T_ENUM, T_SET):
            kw["collation"] = next(enum_collations, None)
            kw["values"] = tuple(next(enums if t == T_ENUM else sets, ()))
        nullable = bool(nulls[i >> 3] >> (i & 7) & 1)
        cols.append(BinlogColumn(opt["names"][i], t, nullable, **kw))
    del flavor  # the layout is the same; charsets are looked up per flavor when mounting
    return TableMap(db, table, tuple(cols))


def _column_meta(t: int, b: bytes, q: int) -> tuple[dict[str, int], int, int]:
    """(metadata fields, position after them, real type) of one column of a table map."""
    if t in (T_VARCHAR, T_VAR_STRING):
        n = b[q] | b[q + 1] << 8
        return {"length_size": 1 if n < 256 else 2, "max_length": n}, q + 2, t
    if t == T_STRING:
        hi, lo = b[q], b[q + 1]
        if hi in (T_ENUM, T_SET):
            return {"size": lo}, q + 2, hi
        n = ((((hi << 8) | lo) >> 4) & 0x300 ^ 0x300) + lo
        return {"length_size": 1 if n < 256 else 2, "max_length": n}, q + 2, t
    if t in (T_BLOB, T_GEOMETRY, T_JSON):
        return {"length_size": b[q]}, q + 1, t
    if t in (T_FLOAT, T_DOUBLE):
        return {}, q + 1, t
    if t in (T_TIMESTAMP2, T_DATETIME2, T_TIME2):
        return {"size": (b[q] + 1) // 2}, q + 1, t
    if t == T_NEWDECIMAL:
        return {"precision": b[q], "scale": b[q + 1]}, q + 2, t
    if t == T_BIT:
        bits = b[q + 1] * 8 + b[q]
        return {"size": (bits + 7) // 8}, q + 2, t
    if t in (T_ENUM, T_SET):
        return {"size": b[q + 1]}, q + 2, t
    return {}, q, t


def _optional_metadata(b: bytes, p: int, types: list[int]) -> dict[str, Any]:
    """The TLV fields after a table map's null bitmap (MySQL 8 / MariaDB 10.5+)."""
    out: dict[str, Any] = {}
    n_char = sum(1 for t in types if t in _CHARACTER)
    n_enum = sum(1 for t in types if t in (T_ENUM, T_SET))
    while p < len(b):
        kind = b[p]
        length, p = _packed_int(b, p + 1)
        field, p = b[p : p + length], p + length
        if kind == 1:  # SIGNEDNESS: a bit per numeric column, most significant first
            n_num = sum(1 for t in types if t in _NUMERIC)
            out["unsigned"] = [bool(field[i >> 3] & (0x80 >> (i & 7))) for i in range(n_num)]
        elif kind in (2, 10):  # DEFAULT_CHARSET (+ exceptions), for character / enum columns
            default, q = _packed_int(field, 0)
            exceptions = {}
            while q < len(field):
                idx, q = _packed_int(field, q)
                exceptions[idx], q = _packed_int(field, q)
            count = n_char if kind == 2 else n_enum
            key = "charsets" if kind == 2 else "enum_charsets"
            out[key] = [exceptions.get(i, default) for i in range(count)]
        elif kind in (3, 11):  # COLUMN_CHARSET: one collation per character / enum column
            out["charsets" if kind == 3 else "enum_charsets"] = _packed_ints(field)
        elif kind == 4:  # COLUMN_NAME
            out["names"] = _strings(field)
        elif kind in (5, 6):  # SET_STR_VALUE / ENUM_STR_VALUE
            values, q = [], 0
            while q < len(field):
                count, q = _packed_int(field, q)
                members = []
                for _ in range(count):
                    ln, q = _packed_int(field, q)
                    members.append(field[q : q + ln].decode("utf-8", "replace"))
                    q += ln
                values.append(members)
            out["sets" if kind == 5 else "enums"] = values
    return out


def _packed_ints(field: bytes) -> list[int]:
    out, q = [], 0
    while q < len(field):
        v, q = _packed_int(field, q)
        out.append(v)
    return out


def _strings(field: bytes) -> list[str]:
    out, q = [], 0
    while q < len(field):
        ln, q = _packed_int(field, q)
        out.append(field[q : q + ln].decode("utf-8", "surrogateescape"))
        q += ln
    return out


def rows_payload(event_type: int, body: bytes) -> bytes:
    """A row event's body from its column count on (what a binlog event file stores)."""
    p = 8  # table id (6), flags (2)
    if event_type >= WRITE_ROWS_V2:
        p += body[8] | body[9] << 8  # extra data, its length (2 bytes) included
    return body[p:]


def full_image(payload: bytes, op: int) -> bool:
    """Whether a row event's images carry every column (``binlog_row_image=FULL``)."""
    n, p = _packed_int(payload, 0)
    nb = (n + 7) // 8
    full = bytes([0xFF] * (n // 8)) + (bytes([(1 << (n % 8)) - 1]) if n % 8 else b"")
    if payload[p : p + nb] != full:
        return False
    return op != OP_UPDATE or payload[p + nb : p + 2 * nb] == full


# ----------------------------------------------------------------------------- mounting
def mount_events(events: pa.Table, schema: TableSchema, flavor: str = "mariadb") -> pa.Table:
    """Binlog events of one table and schema version in the data-file layout (rows in
    (commit ts, event seq, image) order); ``BinlogRowsError`` naming the table if they do
    not fit the schema."""
    events = events.sort_by([("_commit_ts", "ascending"), ("_seq", "ascending")])
    maps = pc.dictionary_encode(events.column("_table_map").combine_chunks())
    which = maps.indices.to_numpy(zero_copy_only=False)
    payloads = events.column("_rows").to_pylist()
    ops = events.column("_op").to_pylist()
    n = len(payloads)
    images, first = np.zeros(n, np.int64), np.zeros(n, np.int64)
    layouts: dict[tuple[BinlogColumn, ...], tuple[_Decoder, list[list[Any]]]] = {}
    try:
        for d, body in enumerate(maps.dictionary.to_pylist()):
            idx = np.flatnonzero(which == d)
            dec = _decoder(body, schema, flavor)
            _, columns = layouts.setdefault(dec.tmap.columns, (dec, [[] for _ in schema.columns]))
            start = len(columns[0])  # images of this layout so far
            counts = dec.images([payloads[i] for i in idx], [ops[i] for i in idx], columns)
            images[idx] = counts
            first[idx] = start + np.cumsum(counts) - counts
    except (IndexError, struct.error, ValueError) as exc:
        if isinstance(exc, BinlogRowsError):
            raise
        raise BinlogRowsError(
            f"table {schema.qualified_name}: a binlog row event cannot be decoded "
            f"({type(exc).__name__}: {exc})"
        ) from exc
    parts: list[list[pa.Array]] = [[] for _ in schema.columns]
    at, offset = 0, {}
    for key, (dec, columns) in layouts.items():  # one layout per table map's columns
        offset[key], at = at, at + (len(columns[0]) if columns else 0)
        for k, c in enumerate(schema.columns):
            parts[k].append(_finish(c, columns[k], dec.binlog_column(c.name), flavor))
    if len(offset) > 1:  # events of several layouts: each image index is within its layout
        for d, body in enumerate(maps.dictionary.to_pylist()):
            first[which == d] += offset[_decoder(body, schema, flavor).tmap.columns]
    arrays = [
        pa.concat_arrays(p) if p else pa.array([], c.arrow)
        for c, p in zip(schema.columns, parts, strict=True)
    ]
    return _rows(schema, events, images, first, arrays)


def _rows(
    schema: TableSchema,
    events: pa.Table,
    images: np.ndarray,
    first_image: np.ndarray,
    arrays: list[pa.Array],
) -> pa.Table:
    """Image arrays -> one row per insert / delete image and per update image pair."""
    ops = events.column("_op").to_numpy().astype(np.int64)
    per_event = np.where(ops == OP_UPDATE, images // 2, images)
    row_event = np.repeat(np.arange(len(ops)), per_event)
    first_row = np.concatenate([[0], np.cumsum(per_event)[:-1]]).astype(np.int64)
    k = np.arange(len(row_event)) - first_row[row_event]  # row index within its event
    op = ops[row_event]
    is_update = op == OP_UPDATE
    after = np.where(is_update, first_image[row_event] + 2 * k + 1, first_image[row_event] + k)
    before = np.where(is_update, first_image[row_event] + 2 * k, after)
    after_idx = pa.array(after, mask=op == OP_DELETE)
    before_idx = pa.array(before, mask=op == OP_INSERT)
    ts = events.column("_commit_ts").to_numpy()[row_event]
    starts = np.flatnonzero(np.r_[True, ts[1:] != ts[:-1]]) if len(ts) else np.array([], int)
    seq = np.arange(len(ts)) - np.repeat(starts, np.diff(np.r_[starts, len(ts)]))
    out: dict[str, Any] = {
        "_commit_ts": pa.array(ts, pa.int64()),
        "_seq": pa.array(seq, pa.int32()),
        "_op": pa.array(op, pa.int8()),
        "_schema_version": pa.array(
            events.column("_schema_version").to_numpy()[row_event], pa.int64()
        ),
    }
    by_id = {c.id: a for c, a in zip(schema.columns, arrays, strict=True)}
    for c in schema.columns:
        out[f"c{c.id}"] = by_id[c.id].take(after_idx)
    if schema.primary_key:
        moved = _key_changed(schema, by_id, after_idx, before_idx, is_update)
        keep = pc.or_(pc.invert(pa.array(is_update)), moved)
        before_idx = pc.if_else(keep, before_idx, pa.nulls(len(ts), pa.int64()))
    for cid in schema.primary_key:
        out[f"b{cid}"] = by_id[cid].take(before_idx)
    return pa.table(out)


def _key_changed(
    schema: TableSchema, by_id: dict, after: pa.Array, before: pa.Array, is_update: np.ndarray
) -> pa.Array:
    moved = pa.array(np.zeros(len(is_update), bool))
    for cid in schema.primary_key:
        a, b = by_id[cid].take(after), by_id[cid].take(before)
        diff = pc.fill_null(pc.not_equal(a, b), False)
        diff = pc.or_(diff, pc.xor(pc.is_null(a), pc.is_null(b)))
        moved = pc.or_(moved, diff)
    return moved


class _Decoder:
    """Row images of one table map, into lists per schema column (compiled once)."""

    def __init__(self, tmap: TableMap, schema: TableSchema) -> None:
        names = [c.name for c in tmap.columns]
        if sorted(names) != sorted(c.name for c in schema.columns):
            raise BinlogRowsError(
                f"the binlog's columns of {tmap.qualified_name} ({sorted(names)}) differ from "
                f"its schema ({sorted(c.name for c in schema.columns)}): binlog_row_metadata "
                "must be FULL, and the rows must be written with the schema valid at their ts"
            )
        self.tmap = tmap
        self._by_name = {c.name: c for c in tmap.columns}
        order = {c.name: k for k, c in enumerate(schema.columns)}
        logical = {c.name: c.type for c in schema.columns}
        self._images = _compile(
            tmap,
            [order[c.name] for c in tmap.columns],
            [logical[c.name].startswith("uint") for c in tmap.columns],
        )

    def binlog_column(self, name: str) -> BinlogColumn:
        return self._by_name[name]

    def images(self, payloads: list[bytes], ops: list[int], columns: list[list[Any]]) -> list[int]:
        """Append the events' images to ``columns``; how many images each event had."""
        counts: list[int] = []
        try:
            self._images(payloads, ops, columns, counts)
        except _NotFull:
            raise BinlogRowsError(
                f"a row event of {self.tmap.qualified_name} does not carry every column: "
                "set binlog_row_image=FULL on the upstream"
            ) from None
        return counts


class _NotFull(Exception):
    """A row event whose column count or columns-present bitmap is not every column."""


@functools.lru_cache(maxsize=1024)
def _decoder(body: bytes, schema: TableSchema, flavor: str) -> _Decoder:
    return _Decoder(parse_table_map(body, flavor), schema)


_STRUCTS = {f: struct.Struct("<" + f).unpack_from for f in "bBhHiIqQfd"}


def _compile(
    tmap: TableMap, out_index: Sequence[int], unsigned: Sequence[bool]
) -> Callable[[list[bytes], list[int], list, list[int]], None]:
    """Generate the image loop of a table map over many events: one branch per column,
    values appended to ``columns[out_index[j]]`` (raw forms: ints, bytes slices; ``_finish``
    types them), each event's image count to ``counts``."""
    n = len(tmap.columns)
    nb = (n + 7) // 8
    full = bytes([0xFF] * (n // 8)) + (bytes([(1 << (n % 8)) - 1]) if n % 8 else b"")
    head = _packed_bytes(n) + full  # column count and the columns-present bitmap(s)
    lines = [
        "def images(payloads, ops, columns, counts):",
        *(f"    a{j} = columns[{k}].append" for j, k in enumerate(out_index)),
        "    for b, op in zip(payloads, ops):",
        f"        if op == {OP_UPDATE}:",
        f"            if b[:{len(head) + nb}] != HEAD2: raise NotFull",
        f"            p = {len(head) + nb}",
        f"        elif b[:{len(head)}] != HEAD: raise NotFull",
        "        else:",
        f"            p = {len(head)}",
        "        end = len(b)",
        "        count = 0",
        "        while p < end:",
        "            nb = p",
        f"            p += {nb}",
        "            count += 1",
    ]
    for j, c in enumerate(tmap.columns):
        body = _value_code(c, unsigned[j])
        if c.nullable:
            lines.append(f"            if b[nb + {j >> 3}] & {1 << (j & 7)}:")
            lines.append(f"                a{j}(None)")
            lines.append("            else:")
            lines += [f"                {line}" for line in body] + [f"                a{j}(v)"]
        else:
            lines += [f"            {line}" for line in body] + [f"            a{j}(v)"]
    lines.append("        counts.append(count)")
    namespace: dict[str, Any] = {f"S_{f}": fn for f, fn in _STRUCTS.items()}
    namespace.update(from_bytes=int.from_bytes, HEAD=head, HEAD2=head + full, NotFull=_NotFull)
    exec("\n".join(lines), namespace)  # code made of type codes and sizes only
    return namespace["images"]


def _packed_bytes(n: int) -> bytes:
    """``n`` as a length-encoded integer."""
    if n < 251:
        return bytes([n])
    if n < 1 << 16:
        return b"\xfc" + n.to_bytes(2, "little")
    return b"\xfd" + n.to_bytes(3, "little")


def _value_code(c: BinlogColumn, unsigned: bool) -> list[str]:
    """Lines that read one value of ``c`` at ``p`` into ``v`` and move ``p`` past it."""
    t = c.type
    fixed = {T_TINY: "b", T_SHORT: "h", T_LONG: "i", T_LONGLONG: "q", T_FLOAT: "f", T_DOUBLE: "d"}
    if t in fixed:
        f = fixed[t]
        f = f.upper() if unsigned and t not in (T_FLOAT, T_DOUBLE) else f
        return [f"v = S_{f}(b, p)[0]", f"p += {struct.calcsize(f)}"]
    if t == T_INT24:
        sign = [] if unsigned else ["if v & 0x800000: v -= 0x1000000"]
        return ["v = b[p] | b[p + 1] << 8 | b[p + 2] << 16", *sign, "p += 3"]
    if t in (T_YEAR, T_DATE, T_TIME, T_DATETIME, T_TIMESTAMP, T_ENUM, T_SET, T_BIT):
        size = {T_YEAR: 1, T_DATE: 3, T_TIME: 3, T_DATETIME: 8, T_TIMESTAMP: 4}.get(t, c.size)
        order = "big" if t == T_BIT else "little"
        return [f"v = from_bytes(b[p:p + {size}], '{order}')", f"p += {size}"]
    if t in (T_DATETIME2, T_TIMESTAMP2, T_TIME2):
        size = {T_DATETIME2: 5, T_TIMESTAMP2: 4, T_TIME2: 3}[t] + c.size
        return [f"v = from_bytes(b[p:p + {size}], 'big')", f"p += {size}"]
    if t == T_NEWDECIMAL:
        size = _decimal_size(c.precision, c.scale)
        return [f"v = b[p:p + {size}]", f"p += {size}"]
    if t in (T_VARCHAR, T_VAR_STRING, T_STRING, T_BLOB, T_JSON, T_GEOMETRY):
        n = c.length_size
        if n == 1:
            return ["n = b[p]", "v = b[p + 1:p + 1 + n]", "p += 1 + n"]
        if n == 2:
            return ["n = b[p] | b[p + 1] << 8", "v = b[p + 2:p + 2 + n]", "p += 2 + n"]
        return [f"n = from_bytes(b[p:p + {n}], 'little')", f"v = b[p + {n}:p + {n} + n]",
                f"p += {n} + n"]  # fmt: skip
    raise BinlogRowsError(f"column {c.name!r}: binlog column type {t} is not supported")


_DIG2BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)


def _decimal_size(precision: int, scale: int) -> int:
    intg = precision - scale
    return (intg // 9) * 4 + _DIG2BYTES[intg % 9] + (scale // 9) * 4 + _DIG2BYTES[scale % 9]


def _decimal(raw: bytes, precision: int, scale: int) -> Decimal:
    """MySQL's binary DECIMAL (strings/decimal.c bin2decimal) as a Decimal."""
    b = bytearray(raw)
    negative = not b[0] & 0x80
    b[0] ^= 0x80
    if negative:
        b = bytearray(x ^ 0xFF for x in b)
    intg = precision - scale
    digits, p = [], 0
    for count, lead in ((intg, True), (scale, False)):
        full, rest = divmod(count, 9)
        parts = []
        if lead and rest:
            size = _DIG2BYTES[rest]
            parts.append(f"{int.from_bytes(b[p : p + size], 'big'):0{rest}d}")
            p += size
        for _ in range(full):
            parts.append(f"{int.from_bytes(b[p : p + 4], 'big'):09d}")
            p += 4
        if not lead and rest:
            size = _DIG2BYTES[rest]
            parts.append(f"{int.from_bytes(b[p : p + size], 'big'):0{rest}d}")
            p += size
        digits.append("".join(parts) or "0")
    return Decimal(f"{'-' if negative else ''}{digits[0]}.{digits[1]}" if scale else
                   f"{'-' if negative else ''}{digits[0]}")  # fmt: skip


# ----------------------------------------------------------------------------- typing values
def _finish(col: ColumnSchema, values: list[Any], bc: BinlogColumn, flavor: str) -> pa.Array:
    """The raw values of one column as an Arrow array of its logical type."""
    typ = col.arrow
    t, logical = bc.type, col.type
    try:
        if t in (T_DATETIME2, T_DATETIME, T_DATE, T_TIMESTAMP2, T_TIMESTAMP, T_TIME2, T_TIME):
            return _temporal(values, bc, typ)
        if t == T_NEWDECIMAL:
            return pa.array([None if v is None else _decimal(v, bc.precision, bc.scale)
                             for v in values], typ)  # fmt: skip
        if t == T_YEAR:
            values = [None if v is None else (v + 1900 if v else 0) for v in values]
        if t in (T_ENUM, T_SET):
            values = _members(values, bc)
        elif t in (T_STRING, T_VARCHAR, T_VAR_STRING, T_BLOB, T_JSON):
            return _text(values, bc, col, flavor)
        if logical == "uint64":
            values = [None if v is None else Decimal(v) for v in values]
        return pa.array(values, typ)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError) as exc:
        raise BinlogRowsError(
            f"column {col.name!r} ({col.type}): binlog values of type {t} do not fit "
            f"({str(exc)[:200]})"
        ) from exc


def _members(values: list[Any], bc: BinlogColumn) -> list[str | None]:
    if bc.type == T_ENUM:
        names = ("", *bc.values)
        return [None if v is None else names[v] if v < len(names) else "" for v in values]
    return [
        None if v is None else ",".join(m for i, m in enumerate(bc.values) if v >> i & 1)
        for v in values
    ]


def _text(values: list[Any], bc: BinlogColumn, col: ColumnSchema, flavor: str) -> pa.Array:
    if bc.type == T_JSON:  # MySQL's binary JSON
        return pa.array([None if v is None else json_text(parse_json(v[0], v[1:]))
                         if v else "null" for v in values], pa.string())  # fmt: skip
    if col.type == "binary":
        if bc.type == T_STRING and bc.max_length:  # BINARY(n): the binlog strips trailing 0x00
            n = bc.max_length
            values = [v if v is None or len(v) >= n else v.ljust(n, b"\0") for v in values]
        return pa.array(values, pa.binary())
    encoding = _encoding(bc.collation, flavor)
    raw = pa.array(values, pa.binary())
    if encoding == "utf8":
        try:
            return raw.cast(pa.string())
        except pa.ArrowInvalid:  # not valid UTF-8: replaced, as a text decode would
            pass
    enc = "utf-8" if encoding == "utf8" else encoding
    return pa.array([None if v is None else v.decode(enc, "replace") for v in values], pa.string())


@functools.lru_cache(maxsize=256)
def _encoding(collation: int | None, flavor: str) -> str:
    if collation is None:
        return "utf8"
    charset = CHARSET.charset_by_id(collation, flavor)
    if charset is None:
        return "utf8"
    try:
        return "utf8" if charset.encoding in ("utf8", "ascii") else _python_codec(charset.encoding)
    except LookupError:
        return "utf8"


def _python_codec(name: str) -> str:
    return codecs.lookup(name).name


_EPOCH_DAYS = 719163  # date(1970, 1, 1).toordinal()


def _temporal(values: list[Any], bc: BinlogColumn, typ: pa.DataType) -> pa.Array:
    """Packed temporal values -> date32 days / timestamp µs / time µs (zero dates: null)."""
    t = bc.type
    out: list[int | None] = []
    for v in values:
        if v is None:
            out.append(None)
        elif t == T_DATETIME2:
            out.append(_datetime2_us(v, bc.size))
        elif t == T_TIMESTAMP2:
            secs, frac = v >> (8 * bc.size), v & ((1 << (8 * bc.size)) - 1)
            out.append(
                None if secs == 0 and frac == 0 else secs * 1_000_000 + _frac_us(frac, bc.size)
            )
        elif t == T_TIME2:
            out.append(_time2_us(v, bc.size))
        elif t == T_DATE:
            out.append(_civil_days(v >> 9, (v >> 5) & 15, v & 31))
        elif t == T_DATETIME:
            d, s = divmod(v, 1_000_000)
            day = _civil_days(d // 10000, d // 100 % 100, d % 100)
            out.append(None if day is None else (day * 86400 + s // 10000 * 3600
                                                  + s // 100 % 100 * 60 + s % 100) * 1_000_000)  # fmt: skip
        elif t == T_TIMESTAMP:
            out.append(v * 1_000_000 if v else None)
        else:  # T_TIME: signed HHMMSS
            v = v - (1 << 24) if v & 0x800000 else v
            a = abs(v)
            us = ((a // 10000) * 3600 + (a // 100 % 100) * 60 + a % 100) * 1_000_000
            out.append(-us if v < 0 else us)
    if pa.types.is_date32(typ):
        return pa.array(out, pa.int32()).cast(typ)
    return pa.array(out, pa.int64()).cast(typ)


def _frac_us(frac: int, size: int) -> int:
    return frac * (10_000, 100, 1)[size - 1] if size else 0


def _datetime2_us(v: int, size: int) -> int | None:
    frac = v & ((1 << (8 * size)) - 1) if size else 0
    x = v >> (8 * size)
    ym = (x >> 22) & 0x1FFFF
    day = _civil_days(ym // 13, ym % 13, (x >> 17) & 31)
    if day is None:
        return None
    secs = ((x >> 12) & 31) * 3600 + ((x >> 6) & 63) * 60 + (x & 63)
    return (day * 86400 + secs) * 1_000_000 + _frac_us(frac, size)


def _time2_us(v: int, size: int) -> int:
    """MySQL's TIME2 (my_time_packed_from_binary) as signed microseconds."""
    if size == 0:
        packed = (v - 0x800000) << 24
    elif size == 3:
        packed = v - 0x800000000000
    else:
        bits = 8 * size
        intpart, frac = (v >> bits) - 0x800000, v & ((1 << bits) - 1)
        if intpart < 0 and frac:
            intpart += 1
            frac -= 1 << bits
        packed = (intpart << 24) + frac * (10_000 if size == 1 else 100)
    neg = packed < 0
    packed = -packed if neg else packed
    hms, us = packed >> 24, packed % (1 << 24)
    total = (((hms >> 12) & 0x3FF) * 3600 + ((hms >> 6) & 0x3F) * 60 + (hms & 0x3F)) * 1_000_000
    return -(total + us) if neg else total + us


def _civil_days(y: int, m: int, d: int) -> int | None:
    """Days since 1970-01-01 of a valid date (None: a zero or invalid date)."""
    try:
        return dt.date(y, m, d).toordinal() - _EPOCH_DAYS
    except ValueError:
        return None


def json_text(v: Any) -> str:
    """A JSON value (as mysql-replication parses MySQL's binary JSON, or text) as JSON text."""

    def fix(o: Any) -> Any:
        if isinstance(o, bytes):
            return o.decode("utf-8", errors="surrogateescape")
        if isinstance(o, dict):
            return {fix(k): fix(x) for k, x in o.items()}
        if isinstance(o, list | tuple):
            return [fix(x) for x in o]
        if isinstance(o, Decimal):
            return float(o)
        if isinstance(o, dt.date | dt.time | dt.timedelta):
            return str(o)
        return o

    if isinstance(v, str):
        return v
    return json.dumps(fix(v), ensure_ascii=False, separators=(", ", ": "))


__all__ = [
    "EVENT_COLUMNS",
    "EVENT_SCHEMA",
    "FLAVOR_KEY",
    "ROW_EVENT_OPS",
    "BinlogColumn",
    "BinlogRowsError",
    "TableMap",
    "full_image",
    "json_text",
    "mount_events",
    "parse_table_map",
    "rows_payload",
    "table_map_name",
]
