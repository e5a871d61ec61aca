"""One chunk's SELECT: its rows in the data-file layout, and the binlog position they are at.

Two clients read a chunk. ``ArrowClient`` uses connectorx (Rust: the MySQL wire protocol
straight into Arrow columns, no Python object per value; ~0.6-0.9M sysbench rows/s on one
core here, against ~0.1-0.15M for pymysql's row decoding plus the columns built from its
tuples). ``RowClient`` uses pymysql; it serves tables whose key columns connectorx cannot
give back exactly as the keyset needs them (dates, times, floats: ``arrow_keys``).

In a snapshot (``snapshot=True``) each SELECT runs inside its own ``START TRANSACTION WITH
CONSISTENT SNAPSHOT``, and the position comes from that same transaction: MariaDB reports the
snapshot's binlog file and offset as session status (``binlog_snapshot_file/position``),
given with the server's id (``Selected.binlog``; the puller turns them into GTIDs) or, for a
client made with ``gtid_positions``, turned into GTIDs by ``BINLOG_GTID_POS`` (which reads the
binlog file up to the offset: ~0.1 s per chunk at 380 MB into a file). connectorx runs statements before its query on
the query's own connection (``pre_execution_query``: the snapshot's start) but returns no
result of theirs, so the chunk's own SELECT reads the position, as its first column
(``_pos``); the rows and the position are one transaction's. Only the first row the server
sends carries it (a session variable marks it sent; the others are NULL): as a
string on every row it cost the client ~20-30% more CPU per row (0.58 -> 0.69-0.84 s per
million sysbench rows) and the server as much again to send.

connectorx's own type map is lossy in places (BIGINT UNSIGNED as float64; zero dates and
TIME beyond 24 h are errors), so the SELECT hands it only types it carries exactly
(``_arrow_expr``): unsigned 64-bit and decimals as text, TIME as microseconds, zero dates as
NULL (as pymysql gives them); Arrow then casts each column to the change log's type.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Protocol

import connectorx
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cdc_dagster.mysql.catalog import quote_ident as _q
from cdc_dagster.mysql.errors import PullerError
from cdc_dagster.mysql.position import (
    COORDS_SQL,
    GTIDS_SQL,
    Coords,
    mariadb_snapshot_coords,
    mariadb_snapshot_state,
    parse_coords,
)
from cdc_dagster.mysql.state import parse_gtid_pos
from cdc_dagster.mysql.types import converter, passthrough
from cdc_dagster.mysql.upstream import connect
from cdc_dagster.schema import TableSchema, arrow_type
from cdc_dagster.secrets import redact_text
from cdc_dagster.upstream.uri import UpstreamConfig

Bounds = tuple[tuple[Any, ...] | None, tuple[Any, ...] | None]  # keys after lo, at or before hi

# Key types connectorx gives back as the same Python values pymysql gives (the keyset
# bounds are such values: chunk ends, JSON-encoded in the chunk records)
_ARROW_KEY_TYPES = {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                    "string", "binary"}  # fmt: skip
# Two statements before a snapshot chunk's SELECT, each a round trip (five were: under the
# stack's load a round trip took ~10 ms, a table of 100k rows ~0.2 s): the session's settings
# in one SET (the marker of the position's first row reset: ``arrow_select``), then the
# snapshot; its position is read by the SELECT itself.
_SNAPSHOT_SQL = [
    "SET SESSION time_zone = '+00:00', @cdc_snapshot_pos_sent = NULL, "
    "SESSION tx_isolation = 'REPEATABLE-READ'",
    "START TRANSACTION WITH CONSISTENT SNAPSHOT",
]


@dataclass(frozen=True, slots=True)
class Selected:
    """What one chunk SELECT gave: rows, the last row's key, and (in a snapshot) where."""

    rows: pa.Table  # the data-file layout without ``_commit_ts`` (``rows_table``)
    last_key: tuple[Any, ...] | None  # key values as pymysql gives them; None: no rows
    position: dict[int, str]  # GTID per domain of the snapshot ({}: no rows, no snapshot,
    # or coordinates instead:)
    binlog: Coords | None = None  # (server id, binlog file, offset) of the snapshot


class ChunkClient(Protocol):
    """Reads chunks of one table, each SELECT at its own snapshot when asked."""

    name: str

    def select(self, bounds: Bounds, limit: int | None, snapshot: bool) -> Selected:
        """Keys after ``bounds[0]`` and at or before ``bounds[1]`` (None: open), in key order."""

    def close(self) -> None:
        """Release the client's connections."""


def arrow_keys(schema: TableSchema) -> bool:
    """Whether connectorx can read the table (its key values round-trip exactly)."""
    return all(
        schema.column(k).type in _ARROW_KEY_TYPES or schema.column(k).type.startswith("decimal(")
        for k in schema.primary_key
    )


def client_for(
    upstream: UpstreamConfig,
    schema: TableSchema,
    version: int,
    prefer: str = "auto",
    gtid_positions: bool = False,
) -> ChunkClient:
    """``prefer``: ``auto`` (connectorx when ``arrow_keys``), ``arrow`` or ``rows`` (pymysql);
    ``gtid_positions``: a snapshot's position as GTIDs, not binlog coordinates."""
    if prefer not in ("auto", "arrow", "rows"):
        raise ValueError(f"chunk client {prefer!r}: expected auto, arrow or rows")
    if prefer == "rows" or (prefer == "auto" and not arrow_keys(schema)):
        return RowClient(upstream, schema, version, gtid_positions)
    if not arrow_keys(schema):
        raise ValueError(f"{schema.qualified_name}: its key types need the rows client")
    return ArrowClient(upstream, schema, version, gtid_positions)


# ----------------------------------------------------------------------------- the SELECT
def keyset_where(cols: list[str], bounds: Bounds, literal: Any) -> tuple[str, list[Any]]:
    """``WHERE`` terms for keys after ``lo`` and at or before ``hi`` in key order, as ORs of
    prefixes (an index range scan in every MariaDB/MySQL version, unlike a row-constructor
    comparison); values through ``literal`` (None: as ``%s`` arguments)."""
    where, args = [], []
    for key, op in zip(bounds, (">", "<"), strict=True):
        if key is None:
            continue
        terms = []
        for i in range(len(cols)):
            last = i == len(cols) - 1
            parts = [(c, "=", v) for c, v in zip(cols[:i], key[:i], strict=True)]
            parts.append((cols[i], op + ("=" if op == "<" and last else ""), key[i]))
            sql = []
            for c, o, v in parts:
                if literal is None:
                    sql.append(f"{c} {o} %s")
                    args.append(v)
                else:
                    sql.append(f"{c} {o} {literal(v)}")
            terms.append("(" + " AND ".join(sql) + ")")
        where.append("(" + " OR ".join(terms) + ")")
    return (" WHERE " + " AND ".join(where)) if where else "", args


def sql_literal(v: Any) -> str:
    """A key value as a SQL literal that needs no escaping (whatever the sql_mode): numbers
    as digits, strings as ``_utf8mb4 X'..'`` (compared in the column's collation), bytes
    as ``X'..'``."""
    if isinstance(v, bool) or v is None:
        raise TypeError(f"key value {v!r} has no literal here")
    if isinstance(v, int):
        return str(v)
    if isinstance(v, Decimal):
        if not v.is_finite():
            raise TypeError(f"key value {v!r} has no literal here")
        return format(v, "f")
    if isinstance(v, str):
        return "_utf8mb4 X'" + v.encode("utf-8").hex() + "'"
    if isinstance(v, bytes | bytearray):
        return "X'" + bytes(v).hex() + "'"
    raise TypeError(f"key value {v!r} ({type(v).__name__}) has no literal here")


def _arrow_expr(table: str, name: str, logical: str) -> str:
    """The column as connectorx carries it exactly (the module docstring)."""
    c = f"{table}.{_q(name)}"
    if logical == "uint64":  # BIGINT UNSIGNED, BIT(64): digits (connectorx: float64)
        return f"CAST({c} + 0 AS CHAR)"
    if logical.startswith("decimal("):  # exact digits, any precision
        return f"CAST({c} AS CHAR)"
    if logical == "int64":  # BIGINT, BIT(n < 64)
        return f"CAST({c} AS SIGNED)"
    if logical == "float32":  # the exact float32 value
        return f"CAST({c} AS DOUBLE)"
    if logical == "time":  # microseconds, negative and past 24 h too
        return f"CAST(TIME_TO_SEC({c}) * 1000000 AS SIGNED)"
    if logical in ("date", "datetime", "timestamp"):  # zero dates: NULL, as pymysql gives
        return f"IF(YEAR({c}) = 0 OR MONTH({c}) = 0 OR DAYOFMONTH({c}) = 0, NULL, {c})"
    return c


def _first_row_position(gtids: bool) -> str:
    """The snapshot's position (``_SNAPSHOT_SQL``'s transaction's) on the first row sent,
    NULL on the others: as GTIDs (``gtids``) or binlog coordinates."""
    return (
        "CASE WHEN @cdc_snapshot_pos_sent IS NULL AND (@cdc_snapshot_pos_sent := 1) "
        f"THEN CAST(({GTIDS_SQL if gtids else COORDS_SQL}) AS CHAR) END AS `_pos`"
    )


def arrow_select(
    schema: TableSchema, bounds: Bounds, limit: int | None, position: bool, gtids: bool = False
) -> str:
    """connectorx's SELECT of a chunk (key values inlined as literals); ``position``: the
    snapshot's on its first row, as GTIDs (``gtids``) or binlog coordinates."""
    t = "`_t`"
    cols = [f"{_arrow_expr(t, c.name, c.type)} AS `c{c.id}`" for c in schema.columns]
    if position:
        cols.insert(0, _first_row_position(gtids))
    keys = [f"{t}.{_q(schema.column(k).name)}" for k in schema.primary_key]
    where, _ = keyset_where(keys, bounds, sql_literal)
    sql = f"SELECT {', '.join(cols)} FROM {_q(schema.database)}.{_q(schema.table)} AS {t}{where}"
    sql += f" ORDER BY {', '.join(keys)}"
    return sql + (f" LIMIT {limit}" if limit is not None else "")


def rows_select(
    schema: TableSchema, bounds: Bounds, limit: int | None
) -> tuple[str, tuple[Any, ...]]:
    """pymysql's SELECT of a chunk (columns in schema order, key values as arguments)."""
    # FLOAT through the text protocol keeps 6 digits; as DOUBLE it is the exact float32 value
    cols = ", ".join(
        f"CAST({_q(c.name)} AS DOUBLE)" if c.type == "float32" else _q(c.name)
        for c in schema.columns
    )
    keys = [_q(schema.column(k).name) for k in schema.primary_key]
    where, args = keyset_where(keys, bounds, None)
    sql = f"SELECT {cols} FROM {_q(schema.database)}.{_q(schema.table)}{where}"
    sql += f" ORDER BY {', '.join(keys)}"
    return sql + (f" LIMIT {limit}" if limit is not None else ""), tuple(args)


# ------------------------------------------------------------------------------ the layout
def _layout(schema: TableSchema, version: int, n: int, columns: dict[str, Any]) -> pa.Table:
    arrays: dict[str, Any] = {
        "_seq": pa.array(np.arange(n, dtype=np.int32)),
        "_op": pa.array(np.ones(n, np.int8)),
        "_schema_version": pa.array(np.full(n, version, np.int64)),
        **columns,
    }
    for k in schema.primary_key:
        arrays[f"b{k}"] = pa.nulls(n, arrow_type(schema.column(k).type))
    return pa.table(arrays)


def rows_table(schema: TableSchema, version: int, rows: list[tuple]) -> pa.Table:
    """Snapshot rows (tuples in schema order, as pymysql gives them) in the data-file layout
    without ``_commit_ts``: inserts, ``_seq`` 0..n-1."""
    columns = {}
    for i, c in enumerate(schema.columns):
        values = [r[i] for r in rows]
        ok, fn = passthrough(c.type), converter(c.type)
        if ok is None or any(v is not None and type(v) is not ok for v in values):
            values = [None if v is None else fn(v) for v in values]
        columns[f"c{c.id}"] = pa.array(values, arrow_type(c.type))
    return _layout(schema, version, len(rows), columns)


def arrow_table(schema: TableSchema, version: int, got: pa.Table) -> pa.Table:
    """connectorx's result (``arrow_select``'s columns) in the data-file layout."""
    columns = {}
    for c in schema.columns:
        arr = got.column(f"c{c.id}")  # chunked as connectorx gave it (no copy)
        want = arrow_type(c.type)
        if pa.types.is_large_binary(arr.type) and want == pa.string():
            arr = arr.cast(pa.large_string())  # TEXT reported with a binary flag: UTF-8 checked
        if arr.type != want:
            try:
                arr = pc.cast(arr, want)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise PullerError(
                    f"{schema.qualified_name}.{c.name}: {arr.type} from the upstream does not "
                    f"convert to the change log's {c.type}: {exc}"
                ) from exc
        columns[f"c{c.id}"] = arr
    return _layout(schema, version, got.num_rows, columns)


def _last_key(schema: TableSchema, rows: pa.Table) -> tuple[Any, ...] | None:
    if rows.num_rows == 0:
        return None
    out = []
    for k in schema.primary_key:
        v = rows.column(f"c{k}")[-1].as_py()
        if isinstance(v, Decimal) and schema.column(k).type == "uint64":
            v = int(v)  # pymysql gives BIGINT UNSIGNED as int
        out.append(v)
    return tuple(out)


# ----------------------------------------------------------------------------- the clients
class _Client:
    """What both clients keep: the table, its schema version, the kind of positions."""

    def __init__(
        self,
        upstream: UpstreamConfig,
        schema: TableSchema,
        version: int,
        gtid_positions: bool = False,
    ) -> None:
        self.schema, self.version = schema, version
        self.gtid_positions = gtid_positions  # GTIDs (BINLOG_GTID_POS), else coordinates
        self._open(upstream)

    def _open(self, upstream: UpstreamConfig) -> None:
        pass


class ArrowClient(_Client):
    """connectorx: one connection per SELECT (its own), statements run before it there."""

    name = "connectorx"

    def _open(self, upstream: UpstreamConfig) -> None:
        self.url = connectorx_url(upstream)
        self.snapshot_sql = _SNAPSHOT_SQL

    def select(self, bounds: Bounds, limit: int | None, snapshot: bool) -> Selected:
        sql = arrow_select(self.schema, bounds, limit, snapshot, self.gtid_positions)
        try:
            got = connectorx.read_sql(
                self.url,
                sql,
                return_type="arrow",
                pre_execution_query=self.snapshot_sql if snapshot else ["SET time_zone = '+00:00'"],
            )
        except RuntimeError as exc:  # connectorx's error for what the server said
            raise PullerError(
                f"{self.schema.qualified_name}: reading a chunk failed: {redact_text(str(exc))}"
            ) from None
        position: dict[int, str] = {}
        coords = None
        if snapshot and got.num_rows:
            sent = got.column("_pos").drop_null()
            text = sent[0].as_py() if len(sent) else None
            if not text:
                raise PullerError(
                    f"{self.schema.qualified_name}: the upstream gave no binlog position for a "
                    "consistent snapshot (binlog_snapshot_file; log_bin must be ON)"
                )
            if self.gtid_positions:
                position = parse_gtid_pos(text)
            else:
                coords = parse_coords(text)
        rows = arrow_table(self.schema, self.version, got)
        return Selected(rows, _last_key(self.schema, rows), position, coords)

    def close(self) -> None:
        pass


def connectorx_url(upstream: UpstreamConfig) -> str:
    """``mysql://user:password@host:port`` for connectorx (``${VAR}``s resolved here)."""
    kw = upstream.connect_kwargs()
    quote = lambda s: urllib.parse.quote(s, safe="")  # noqa: E731
    cred = quote(kw["user"]) + (f":{quote(kw['password'])}" if kw["password"] else "")
    host = f"[{kw['host']}]" if ":" in kw["host"] else kw["host"]
    # prefer_socket: the client would otherwise ask for @@socket and reconnect through it
    return f"mysql://{cred}@{host}:{kw['port']}?prefer_socket=false"


class RowClient(_Client):
    """pymysql: one connection for all SELECTs of the client, a transaction per snapshot."""

    name = "pymysql"

    def _open(self, upstream: UpstreamConfig) -> None:
        self.conn = connect(upstream)
        with self.conn.cursor() as cur:
            cur.execute("SET SESSION time_zone = '+00:00'")
            cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")

    def select(self, bounds: Bounds, limit: int | None, snapshot: bool) -> Selected:
        position: dict[int, str] = {}
        coords = None
        try:
            with self.conn.cursor() as cur:
                if snapshot and self.gtid_positions:
                    position = mariadb_snapshot_state(cur).position
                elif snapshot:
                    coords = mariadb_snapshot_coords(cur)
                cur.execute(*rows_select(self.schema, bounds, limit))
                rows = cur.fetchall()
        finally:
            if snapshot:
                self.conn.rollback()
        key_pos = [[c.id for c in self.schema.columns].index(k) for k in self.schema.primary_key]
        last = tuple(rows[-1][i] for i in key_pos) if rows else None
        return Selected(rows_table(self.schema, self.version, rows), last,
                        position if rows else {}, coords if rows else None)  # fmt: skip

    def close(self) -> None:
        self.conn.close()


__all__ = [
    "ArrowClient",
    "ChunkClient",
    "RowClient",
    "Selected",
    "arrow_keys",
    "arrow_select",
    "arrow_table",
    "client_for",
    "connectorx_url",
    "keyset_where",
    "rows_select",
    "rows_table",
    "sql_literal",
]
