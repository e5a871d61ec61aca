"""Delta Lake sink: fenced, exactly-once primary-key MERGE per table and batch (deltalake).

Layout (docs/dataplane.md, section 3): one Delta table per upstream table at
``<root>/<database>/<table>`` (components encoded by ``delta_paths``), syncpoints under
``<root>/_cdc_dagster/syncpoints/<changefeed>/<ts:020d>.json``.

Every commit of this sink carries Delta application transactions (``txn`` actions):
``cdc-dagster/<changefeed>/fence`` (version = fencing token) always, plus
``.../checkpoint`` (version = committed ts) on a write and ``.../ddl`` (version = DDL
commit ts) on a DDL. delta-rs's conflict checker refuses a commit when a commit that
landed after its read version carries an application id the committing transaction also
carries (``CommitFailedError: Concurrent transaction failed``; verified for deltalake
1.6.6 in tests/unit/sinks/test_delta_fencing.py). Since every commit carries the fence id,
any commit between our read version and our commit makes ours fail; we then reload and
check the token again. So the fence is checked against exactly the version the commit
is validated against: an ``acquire`` racing a stale ``write`` cannot both land.

Never read through ``to_pyarrow_table()``/``to_pyarrow_dataset()`` (the interpreter
aborts at exit, delta-rs#2184): ``read_table_at`` reads a pinned version's
``file_uris()`` with pyarrow.parquet.
"""

from __future__ import annotations

import json
import os
import random
import time
import urllib.parse
from collections.abc import Callable
from typing import TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError, TableNotFoundError
from deltalake.transaction import CommitProperties, Transaction

from cdc_dagster.sinks.base import (
    COMMIT_TS_COLUMN,
    OP_COLUMN,
    OP_DELETE,
    OP_UPSERT,
    Committed,
    FencedError,
    SinkError,
    SinkGapError,
    SinkSchemaError,
)
from cdc_dagster.sinks.delta_paths import table_path
from cdc_dagster.upstream.schema import TableSchema, arrow_type

APP_PREFIX = "cdc-dagster"
MAX_COMMIT_ATTEMPTS = 50
_T = TypeVar("_T")


def app_id(changefeed_id: str, what: str) -> str:
    """The Delta application id of one changefeed's ``fence``/``checkpoint``/``ddl`` marker."""
    return f"{APP_PREFIX}/{changefeed_id}/{what}"


# -- the type map as it lands in Delta --------------------------------------------------


def delta_type(logical: str) -> pa.DataType:
    """The Arrow type a logical column type has in Delta (decimal(p>38) lands as string)."""
    t = arrow_type(logical)
    if pa.types.is_decimal256(t):
        return pa.string()  # Delta decimals stop at precision 38; canonical text instead
    return t


def delta_schema(table: TableSchema) -> pa.Schema:
    """The Delta schema of a table: its columns by name; key columns NOT NULL, others nullable."""
    keys = set(table.primary_key)
    return pa.schema(
        [pa.field(c.name, delta_type(c.type), nullable=c.id not in keys) for c in table.columns]
    )


def _table_description(table: TableSchema) -> str:
    return json.dumps(
        {"table_id": table.table_id, "database": table.database, "table": table.table},
        ensure_ascii=False,
        sort_keys=True,
    )


def _quote(name: str) -> str:
    """A DataFusion SQL identifier (double quotes, embedded quotes doubled)."""
    return '"' + name.replace('"', '""') + '"'


def _where(changefeed_id: str, table: TableSchema) -> str:
    return f"changefeed {changefeed_id}, table {table.qualified_name} (id {table.table_id})"


def _local_path(uri: str) -> str:
    """A local path from a ``file_uris()`` entry (delta-rs percent-encodes some)."""
    if uri.startswith("file://"):
        return urllib.parse.unquote(urllib.parse.urlparse(uri).path)
    if "%" in uri:
        return urllib.parse.unquote(uri)  # our paths never hold a literal '%'
    return uri


def _schema_of(dt: DeltaTable) -> pa.Schema:
    return pa.schema(dt.schema().to_arrow())


def _empty_commit(dt: DeltaTable, txns: list[Transaction]) -> None:
    """A commit with no data: only application transactions (acquire, empty batch, DDL mark)."""
    dt.create_write_transaction(
        [], "append", dt.schema(), commit_properties=CommitProperties(app_transactions=txns)
    )


def _with_retries(attempt: Callable[[], _T], what: str) -> _T:
    """Run ``attempt`` until it commits; a concurrent commit makes it reload and re-check."""
    for n in range(MAX_COMMIT_ATTEMPTS):
        try:
            return attempt()
        except CommitFailedError:
            time.sleep(random.uniform(0.002, 0.02) * min(n + 1, 10))
    raise SinkError(
        f"{what}: {MAX_COMMIT_ATTEMPTS} commits in a row lost to concurrent commits; "
        "nothing was written — is another capture writing this table? retry later"
    )


class DeltaSink:
    """The Delta Lake downstream under ``root`` (``delta:///abs/path``); picklable (root only)."""

    def __init__(self, root: str) -> None:
        if not os.path.isabs(root):
            raise SinkError(f"Delta sink root must be an absolute path, got {root!r}")
        self.root = os.path.normpath(root)

    def __repr__(self) -> str:
        return f"DeltaSink({self.root!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DeltaSink) and other.root == self.root

    def __hash__(self) -> int:
        return hash(("DeltaSink", self.root))

    @property
    def uri(self) -> str:
        return f"delta://{self.root}"

    def path(self, table: TableSchema) -> str:
        """The directory of ``table``'s Delta table."""
        return table_path(self.root, table.database, table.table)

    # -- opening -------------------------------------------------------------------------

    def _open(self, changefeed_id: str, table: TableSchema) -> DeltaTable | None:
        """The latest snapshot of the table, None when it does not exist; checks the table id."""
        try:
            dt = DeltaTable(self.path(table))
        except TableNotFoundError:
            return None
        self._check_identity(changefeed_id, table, dt)
        return dt

    def _check_identity(self, changefeed_id: str, table: TableSchema, dt: DeltaTable) -> None:
        desc = dt.metadata().description
        try:
            found = json.loads(desc)["table_id"] if desc else None
        except (ValueError, KeyError, TypeError):
            found = None
        if found != table.table_id:
            raise SinkError(
                f"{_where(changefeed_id, table)}: the Delta table at {self.path(table)} belongs "
                f"to table id {found!r}; move it away or fix the table mapping"
            )

    def _create(self, changefeed_id: str, table: TableSchema, txns: list[Transaction]) -> bool:
        """Create the empty table (version 0); False when it already exists (lost a race)."""
        path = self.path(table)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            DeltaTable.create(
                path,
                delta_schema(table),
                mode="error",
                name=table.qualified_name,
                description=_table_description(table),
                commit_properties=CommitProperties(app_transactions=txns),
            )
        except Exception as exc:  # delta-rs raises a bare DeltaError for "already exists"
            if DeltaTable.is_deltatable(path):
                return False
            raise SinkError(
                f"{_where(changefeed_id, table)}: cannot create the Delta table at {path}: {exc}"
            ) from exc
        return True

    # -- the fenced protocol -------------------------------------------------------------

    def committed(self, changefeed_id: str, table: TableSchema) -> Committed:
        """The table's committed ts and current token ((0, 0) for a table never written)."""
        dt = self._open(changefeed_id, table)
        if dt is None:
            return Committed(0, 0)
        return Committed(
            dt.transaction_version(app_id(changefeed_id, "checkpoint")) or 0,
            dt.transaction_version(app_id(changefeed_id, "fence")) or 0,
        )

    def acquire(self, changefeed_id: str, table: TableSchema) -> int:
        """Commit token = current + 1 (creating the empty table if missing); return it."""
        fence = app_id(changefeed_id, "fence")

        def attempt() -> int:
            dt = self._open(changefeed_id, table)
            if dt is None:
                if self._create(changefeed_id, table, [Transaction(fence, 1)]):
                    return 1
                raise CommitFailedError("table created concurrently")
            token = (dt.transaction_version(fence) or 0) + 1
            _empty_commit(dt, [Transaction(fence, token)])
            return token

        return _with_retries(attempt, f"{_where(changefeed_id, table)}: acquire")

    def write(
        self,
        changefeed_id: str,
        table: TableSchema,
        batch: pa.Table,
        start_ts: int,
        end_ts: int,
        token: int,
    ) -> int:
        """MERGE the batch and ``(end_ts, token)`` in one Delta commit; return the committed ts."""
        where = _where(changefeed_id, table)
        if not 0 <= start_ts <= end_ts:
            raise SinkError(f"{where}: bad batch range ({start_ts}, {end_ts}]")
        source = prepare_batch(where, table, batch)

        def attempt() -> int:
            dt = self._open(changefeed_id, table)
            current = 0 if dt is None else dt.transaction_version(app_id(changefeed_id, "fence"))
            if dt is None or token != (current or 0):
                raise FencedError(
                    f"{where}: write of ({start_ts}, {end_ts}] with fencing token {token} "
                    f"refused, the table's token is {current or 0}"
                    f"{' (no Delta table at ' + self.path(table) + ')' if dt is None else ''}; "
                    "nothing was written — another capture owns this table: stop it here"
                )
            committed = dt.transaction_version(app_id(changefeed_id, "checkpoint")) or 0
            if end_ts <= committed:
                return committed  # replay after a crash: already in
            if committed > 0 and start_ts > committed:
                raise SinkGapError(
                    f"{where}: batch ({start_ts}, {end_ts}] starts above the committed ts "
                    f"{committed}; changes in between would be lost — restart the table "
                    f"from {committed}"
                )
            self._check_table_schema(where, table, dt)
            txns = [
                Transaction(app_id(changefeed_id, "fence"), token),
                Transaction(app_id(changefeed_id, "checkpoint"), end_ts),
            ]
            if source.num_rows:
                _merge(dt, table, source, txns)
            else:
                _empty_commit(dt, txns)
            return end_ts

        return _with_retries(attempt, f"{where}: write ({start_ts}, {end_ts}]")

    def _check_table_schema(self, where: str, table: TableSchema, dt: DeltaTable) -> None:
        have = _schema_of(dt)
        want = delta_schema(table)
        for f in want:
            i = have.get_field_index(f.name)
            if i < 0:
                raise SinkSchemaError(
                    f"{where}: column {f.name!r} is not in the Delta table at {self.path(table)} "
                    f"(it has {have.names}); was a DDL not applied? apply it, then retry"
                )
            if not _same_type(have.field(i).type, f.type):
                raise SinkSchemaError(
                    f"{where}: column {f.name!r} is {have.field(i).type} in Delta but "
                    f"{f.type} in the batch's schema; was a DDL not applied? apply it, then retry"
                )
        extra = [n for n in have.names if want.get_field_index(n) < 0]
        if extra:
            raise SinkSchemaError(
                f"{where}: the Delta table has columns {extra} the table schema lacks; "
                "was a DDL not applied? apply it, then retry"
            )


def _same_type(a: pa.DataType, b: pa.DataType) -> bool:
    if a == b:
        return True
    strings = (pa.string(), pa.large_string(), pa.string_view())
    binaries = (pa.binary(), pa.large_binary(), pa.binary_view())
    return (a in strings and b in strings) or (a in binaries and b in binaries)


def prepare_batch(where: str, table: TableSchema, batch: pa.Table) -> pa.Table:
    """The MERGE source: the table's columns cast to their Delta types, plus ``_cdc_op``.

    Raises ``SinkSchemaError`` naming the column when the batch does not fit the table.
    """
    names = set(batch.column_names)
    wanted = [c.name for c in table.columns]
    missing = [n for n in [*wanted, OP_COLUMN] if n not in names]
    extra = sorted(names - set(wanted) - {OP_COLUMN, COMMIT_TS_COLUMN})
    if missing or extra:
        raise SinkSchemaError(
            f"{where}: batch columns do not fit the table (missing {missing}, unexpected "
            f"{extra}); was a DDL skipped? nothing was written"
        )
    schema = delta_schema(table)
    arrays = []
    for f in schema:
        try:
            arrays.append(batch.column(f.name).cast(f.type, safe=True))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise SinkSchemaError(
                f"{where}: column {f.name!r} of type {batch.column(f.name).type} does not fit "
                f"{f.type}: {exc}; nothing was written"
            ) from exc
    op = batch.column(OP_COLUMN)
    try:
        op = op.cast(pa.int8())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise SinkSchemaError(f"{where}: column {OP_COLUMN!r} is not int8: {exc}") from exc
    if (
        batch.num_rows
        and not pc.all(pc.is_in(op, pa.array([OP_UPSERT, OP_DELETE], pa.int8()))).as_py()
    ):
        raise SinkSchemaError(
            f"{where}: column {OP_COLUMN!r} holds values other than {OP_UPSERT} (upsert) "
            f"and {OP_DELETE} (delete); nothing was written"
        )
    source = pa.Table.from_arrays(
        [*arrays, op],
        schema=pa.schema(
            [*(f.with_nullable(True) for f in schema), pa.field(OP_COLUMN, pa.int8())]
        ),
    )
    _check_keys(where, table, source)
    return source


def _check_keys(where: str, table: TableSchema, source: pa.Table) -> None:
    keys = [c.name for c in table.key_columns]
    for k in keys:
        if source.column(k).null_count:
            raise SinkSchemaError(
                f"{where}: primary-key column {k!r} is null in {source.column(k).null_count} "
                "rows; nothing was written"
            )
    if source.num_rows and source.group_by(keys).aggregate([]).num_rows != source.num_rows:
        raise SinkSchemaError(
            f"{where}: the batch holds a primary key more than once (not collapsed to the last "
            "change per key); nothing was written"
        )


def _merge(dt: DeltaTable, table: TableSchema, source: pa.Table, txns: list[Transaction]) -> None:
    """One MERGE commit: delete where ``_cdc_op`` = 1, upsert where 0, with ``txns``."""
    on = " AND ".join(f"t.{_quote(c.name)} = s.{_quote(c.name)}" for c in table.key_columns)
    sets = {_quote(c.name): f"s.{_quote(c.name)}" for c in table.columns}
    upsert = f"s.{_quote(OP_COLUMN)} = {OP_UPSERT}"
    (
        dt.merge(
            source,
            on,
            source_alias="s",
            target_alias="t",
            commit_properties=CommitProperties(app_transactions=txns),
        )
        .when_matched_delete(predicate=f"s.{_quote(OP_COLUMN)} = {OP_DELETE}")
        .when_matched_update(updates=sets, predicate=upsert)
        .when_not_matched_insert(updates=sets, predicate=upsert)
        .execute()
    )


# -- reading -------------------------------------------------------------------------------


def read_table_at(root: str, table: TableSchema | str, version: int | None = None) -> pa.Table:
    """The content of a Delta table at ``version`` (latest if None), via ``file_uris()``.

    ``table`` is a TableSchema or a location relative to ``root`` (as in a syncpoint).
    """
    path = (
        os.path.join(root, table)
        if isinstance(table, str)
        else table_path(root, table.database, table.table)
    )
    dt = DeltaTable(path, version=version)
    schema = _schema_of(dt)
    schema = pa.schema([f.with_type(_plain(f.type)) for f in schema])
    parts = [pq.read_table(_local_path(u)) for u in dt.file_uris()]
    parts = [p.select(schema.names).cast(schema) for p in parts if p.num_rows]
    if not parts:
        return schema.empty_table()
    return pa.concat_tables(parts)


def _plain(t: pa.DataType) -> pa.DataType:
    if t in (pa.string_view(), pa.large_string()):
        return pa.string()
    if t in (pa.binary_view(), pa.large_binary()):
        return pa.binary()
    return t
