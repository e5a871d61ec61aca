"""Delta Lake sink: fenced, exactly-once primary-key writes per table and batch (deltalake):
by key range for a one-integer-column key (``delta_layout``: only the files the batch's keys
fall in are rewritten), else a MERGE.

Layout (docs/dataplane.md, section 3): one Delta table per upstream table at
``<root>/<database>/<table>`` (components encoded by ``delta_paths``), syncpoints under
``<root>/_cdc_dagster/syncpoints/<changefeed>/<ts:020d>.json``. The files a write replaced
are vacuumed once past the retention, except those of syncpoint versions (``delta_vacuum``).

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

import contextlib
import dataclasses
import json
import logging
import os
import random
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable, WriterProperties, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.transaction import CommitProperties, Transaction

from cdc_dagster.schema import DdlRecord, TableSchema, arrow_type
from cdc_dagster.sinks import delta_layout, delta_vacuum
from cdc_dagster.sinks.base import (
    COMMIT_TS_COLUMN,
    OP_COLUMN,
    OP_DELETE,
    OP_UPSERT,
    Committed,
    FencedError,
    SinkDDLError,
    SinkError,
    SinkGapError,
    SinkSchemaError,
    SyncpointRecord,
    SyncpointUnpinnableError,
)
from cdc_dagster.sinks.delta_ddl import evolve, plain_type, same_schema
from cdc_dagster.sinks.delta_paths import (
    META_DIR,
    encode_component,
    local_path,
    table_location,
    table_path,
)
from cdc_dagster.sinks.delta_syncpoint_file import (
    DEFAULT_SYNCPOINT_RETENTION_HOURS,
    prune_syncpoints,
    syncpoint_path,
    syncpoint_record,
)

log = logging.getLogger(__name__)

APP_PREFIX = "cdc-dagster"
# The Parquet codec of the files this sink writes (the URI's ``?compression=``). Every write
# of a batch rewrites the files holding its keys (copy on write): the codec is most of a
# rewrite's CPU. Measured on a 250k-row sysbench table (41 MB), CPU per 50-row MERGE:
# snappy (delta-rs's default) 0.40-0.44 s, zstd level 1 0.24-0.27 s at half the size,
# uncompressed 0.13-0.17 s at 1.2x snappy's size (docs/latency.md).
DEFAULT_COMPRESSION = "zstd"
_CODECS: dict[str, tuple[str, int | None]] = {
    "zstd": ("ZSTD", 1),
    "snappy": ("SNAPPY", None),
    "lz4": ("LZ4_RAW", None),
    "uncompressed": ("UNCOMPRESSED", None),
}
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
    """Delta metadata description: the upstream table id (the name is the metadata name)."""
    return json.dumps({"cdc_dagster_table_id": table.table_id})


def _quote(name: str) -> str:
    """A DataFusion SQL identifier (double quotes, embedded quotes doubled)."""
    return '"' + name.replace('"', '""') + '"'


def _where(changefeed_id: str, table: TableSchema) -> str:
    return f"changefeed {changefeed_id}, table {table.qualified_name} (id {table.table_id})"


def _schema_of(dt: DeltaTable) -> pa.Schema:
    return pa.schema(dt.schema().to_arrow())


def _writer_properties(compression: str) -> WriterProperties:
    codec, level = _CODECS[compression]
    return WriterProperties(compression=codec, compression_level=level)  # type: ignore[arg-type]


def _empty_commit(dt: DeltaTable, txns: list[Transaction]) -> None:
    """A commit with no data: only application transactions (acquire, empty batch, DDL mark)."""
    dt.create_write_transaction(
        [], "append", dt.schema(), commit_properties=CommitProperties(app_transactions=txns)
    )


def _with_retries(attempt: Callable[[], _T], what: str) -> _T:
    """Run ``attempt`` until it commits; a concurrent commit makes it reload and re-check.

    Any other deltalake error becomes a ``SinkError`` naming ``what`` (nothing committed).
    """
    for n in range(MAX_COMMIT_ATTEMPTS):
        try:
            return attempt()
        except CommitFailedError:
            time.sleep(random.uniform(0.002, 0.02) * min(n + 1, 10))
        except DeltaError as exc:
            raise SinkError(f"{what}: deltalake refused it: {exc}; nothing was written") from exc
    raise SinkError(
        f"{what}: {MAX_COMMIT_ATTEMPTS} commits in a row lost to concurrent commits; "
        "nothing was written — is another capture writing this table? retry later"
    )


class DeltaSink:
    """The Delta Lake downstream under ``root`` (``delta:///abs/path``), its files written
    with ``compression`` (``?compression=``), the files its writes replaced vacuumed once
    ``vacuum_retention_hours`` old (``?vacuum_retention_hours=``; None: never, ``off``):
    ``delta_vacuum``; syncpoints kept ``syncpoint_retention_hours`` behind the newest
    (``?syncpoint_retention_hours=``; None: for ever, ``off``): ``delta_syncpoint_file``.
    Picklable (those four only)."""

    def __init__(
        self,
        root: str,
        *,
        compression: str = DEFAULT_COMPRESSION,
        vacuum_retention_hours: int | None = delta_vacuum.DEFAULT_RETENTION_HOURS,
        syncpoint_retention_hours: int | None = DEFAULT_SYNCPOINT_RETENTION_HOURS,
    ) -> None:
        if not os.path.isabs(root):
            raise SinkError(f"Delta sink root must be an absolute path, got {root!r}")
        if compression not in _CODECS:
            raise SinkError(
                f"Delta sink compression {compression!r} is not one of {', '.join(_CODECS)}"
            )
        if vacuum_retention_hours is not None and vacuum_retention_hours < 0:
            raise SinkError(
                f"Delta sink vacuum_retention_hours {vacuum_retention_hours} is negative; "
                "give 0 or more hours, or None (off)"
            )
        if syncpoint_retention_hours is not None and syncpoint_retention_hours < 0:
            raise SinkError(
                f"Delta sink syncpoint_retention_hours {syncpoint_retention_hours} is negative; "
                "give 0 or more hours, or None (off)"
            )
        self.root = os.path.normpath(root)
        self.compression = compression
        self.vacuum_retention_hours = vacuum_retention_hours
        self.syncpoint_retention_hours = syncpoint_retention_hours

    def _key(self) -> tuple[str, str, int | None, int | None]:
        return (
            self.root,
            self.compression,
            self.vacuum_retention_hours,
            self.syncpoint_retention_hours,
        )

    def __repr__(self) -> str:
        return (
            f"DeltaSink({self.root!r}, compression={self.compression!r}, "
            f"vacuum_retention_hours={self.vacuum_retention_hours!r}, "
            f"syncpoint_retention_hours={self.syncpoint_retention_hours!r})"
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DeltaSink) and other._key() == self._key()

    def __hash__(self) -> int:
        return hash(("DeltaSink", *self._key()))

    def _writer_properties(self) -> WriterProperties:
        return _writer_properties(self.compression)

    @property
    def uri(self) -> str:
        options = []
        if self.compression != DEFAULT_COMPRESSION:
            options.append(f"compression={self.compression}")
        if self.vacuum_retention_hours != delta_vacuum.DEFAULT_RETENTION_HOURS:
            hours = self.vacuum_retention_hours
            options.append(f"vacuum_retention_hours={'off' if hours is None else hours}")
        if self.syncpoint_retention_hours != DEFAULT_SYNCPOINT_RETENTION_HOURS:
            hours = self.syncpoint_retention_hours
            options.append(f"syncpoint_retention_hours={'off' if hours is None else hours}")
        return f"delta://{self.root}{'?' + '&'.join(options) if options else ''}"

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
        found = _table_id_of(dt)
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
        except DeltaError as exc:  # delta-rs raises a bare DeltaError for "already exists"
            if DeltaTable.is_deltatable(path):
                return False
            raise SinkError(
                f"{_where(changefeed_id, table)}: cannot create the Delta table at {path}: {exc}"
            ) from exc
        return True

    def _check_root(self, where: str, *, missing_ok: bool = False) -> None:
        """A table missing because the whole root is gone is the sink's outage, not a
        fence (a dropped table or another holder): say so, so the batch is retried. A
        missing root is fine to acquire in (a new sink makes it), never to write in (the
        table was made there by the acquire that gave the token)."""
        if missing_ok and not os.path.exists(self.root):
            return
        if not os.path.isdir(self.root):
            what = "a file" if os.path.exists(self.root) else "missing"
            raise SinkError(
                f"{where}: the Delta sink's root {self.root} is {what}, not a directory; "
                "nothing was written — put the root back (a lost mount, a moved directory); "
                "the batch is retried every tick"
            )

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
                self._check_root(_where(changefeed_id, table), missing_ok=True)
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
        *,
        at_syncpoint: bool = False,
    ) -> int:
        """Write the batch and ``(end_ts, token)`` in one Delta commit; return the committed ts.

        ``at_syncpoint`` needs nothing here: the commit ending at a syncpoint is the table's
        version there, found again when the syncpoint is recorded (Delta keeps versions).
        """
        del at_syncpoint
        where = _where(changefeed_id, table)
        if not 0 <= start_ts <= end_ts:
            raise SinkError(f"{where}: bad batch range ({start_ts}, {end_ts}]")
        source = prepare_batch(where, table, batch)
        every_s = delta_vacuum.vacuum_every_s()  # a bad setting refuses before anything is written

        def attempt() -> int:
            dt = self._open(changefeed_id, table)
            if dt is None:
                self._check_root(where)
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
                _apply(dt, self.path(table), table, source, txns, self.compression)
            else:
                _empty_commit(dt, txns)
            return end_ts

        committed_ts = _with_retries(attempt, f"{where}: write ({start_ts}, {end_ts}]")
        delta_vacuum.maybe_vacuum(
            self.root,
            table_location(table.database, table.table),
            self.path(table),
            self.vacuum_retention_hours,
            every_s,
        )
        return committed_ts

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
            if plain_type(have.field(i).type) != plain_type(f.type):
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

    # -- DDL -----------------------------------------------------------------------------

    def apply_ddl(
        self, changefeed_id: str, record: DdlRecord, before: Mapping[int, TableSchema | None]
    ) -> None:
        """Apply one DDL record exactly once per table (see ``docs/dataplane.md``, 3.2).

        Drops and renames are directory moves (a table that is already gone or already at
        its new place is done); every other change is one commit per table carrying the
        ``ddl`` marker (version = the DDL's commit ts) and is skipped when the table's
        marker is already at or past it, so a crash between apply and record is harmless.
        """
        where = _ddl_where(changefeed_id, record)
        try:
            self._apply_ddl(changefeed_id, record, before, where)
        except SinkDDLError:
            raise
        except SinkError as exc:
            raise SinkDDLError(f"{where}: {exc}") from exc
        except (OSError, ValueError, pa.ArrowException, DeltaError) as exc:
            raise SinkDDLError(
                f"{where}: {exc}; the DDL is not recorded as applied — fix the downstream "
                "table (or the record), then run the DDL again"
            ) from exc

    def _apply_ddl(
        self,
        changefeed_id: str,
        record: DdlRecord,
        before: Mapping[int, TableSchema | None],
        where: str,
    ) -> None:
        for table_id in record.drops:
            self._drop(changefeed_id, _need_schema(before, table_id, "before", where))
        kept = [t for t in record.table_ids if t not in record.drops]
        pairs = [
            (
                _need_schema(before, t, "before", where),
                _need_schema(record.tables, t, "after", where),
            )
            for t in kept
        ]
        moves = [(b, a) for b, a in pairs if self.path(b) != self.path(a)]
        if moves:
            self._relocate(changefeed_id, record, moves, where)
        for table_id in record.creates:
            table = _need_schema(record.tables, table_id, "after", where)
            for gone in record.replaces:  # a table that left the changefeed had this name
                self._drop(changefeed_id, dataclasses.replace(table, table_id=gone))
            self._create_for_ddl(changefeed_id, record, table)
        for b, a in pairs:
            self._alter(changefeed_id, record, b, a, where)
        if record.action == "drop_schema" and record.schema:
            with contextlib.suppress(OSError):  # only if empty: tables of other feeds stay
                os.rmdir(os.path.join(self.root, encode_component(record.schema)))

    def _drop(self, changefeed_id: str, table: TableSchema) -> None:
        path = self.path(table)
        try:
            dt = DeltaTable(path)
        except TableNotFoundError:
            return  # dropped already (replay) or never written
        if _table_id_of(dt) != table.table_id:
            return  # another table took the name after this drop: not ours to drop
        trash = os.path.join(self.root, META_DIR, "trash", uuid.uuid4().hex)
        os.makedirs(os.path.dirname(trash), exist_ok=True)
        os.rename(path, trash)  # atomic: readers see the whole table or none
        shutil.rmtree(trash, ignore_errors=True)
        delta_vacuum.forget(self.root, table_location(table.database, table.table))

    def _relocate(
        self,
        changefeed_id: str,
        record: DdlRecord,
        moves: list[tuple[TableSchema, TableSchema]],
        where: str,
    ) -> None:
        """RENAME TABLE(s): move every source aside first, then into place (swaps work)."""
        stage_dir = os.path.join(
            self.root, META_DIR, "renaming", encode_component(changefeed_id), str(record.commit_ts)
        )
        staged = {b.table_id: os.path.join(stage_dir, str(b.table_id)) for b, _ in moves}
        for b, _ in moves:
            src = self.path(b)
            if os.path.isdir(src) and _table_id_at(src) == b.table_id:
                os.makedirs(stage_dir, exist_ok=True)
                os.rename(src, staged[b.table_id])
        for b, a in moves:
            dst = self.path(a)
            if os.path.isdir(staged[b.table_id]):
                if os.path.exists(dst):
                    raise SinkDDLError(
                        f"{where}: cannot rename {b.qualified_name} to {a.qualified_name}: "
                        f"{dst} is taken (table id {_table_id_at(dst)}); the table waits at "
                        f"{staged[b.table_id]} — move the other table away and run the DDL again"
                    )
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                os.rename(staged[b.table_id], dst)
            elif not (os.path.isdir(dst) and _table_id_at(dst) == a.table_id):
                raise SinkDDLError(
                    f"{where}: table {b.qualified_name} (id {b.table_id}) is neither at "
                    f"{self.path(b)} nor at {dst}; restore it or re-create the table downstream"
                )
        with contextlib.suppress(OSError):
            os.rmdir(stage_dir)

    def _create_for_ddl(self, changefeed_id: str, record: DdlRecord, table: TableSchema) -> None:
        marker = Transaction(app_id(changefeed_id, "ddl"), record.commit_ts)
        if not self._create(changefeed_id, table, [marker]):
            # exists: a replay, or a new primary's acquire got there first
            self._alter(changefeed_id, record, table, table, _ddl_where(changefeed_id, record))

    def _alter(
        self,
        changefeed_id: str,
        record: DdlRecord,
        before: TableSchema,
        after: TableSchema,
        where: str,
    ) -> None:
        """One commit that brings ``after``'s table to the DDL's effect, with its marker."""
        ddl, fence = app_id(changefeed_id, "ddl"), app_id(changefeed_id, "fence")
        checkpoint = app_id(changefeed_id, "checkpoint")

        def attempt() -> None:
            dt = self._open(changefeed_id, after)
            if dt is None:
                raise SinkDDLError(
                    f"{where}: table {after.qualified_name} (id {after.table_id}) is missing "
                    f"downstream at {self.path(after)}; re-create it (acquire creates it empty) "
                    "or filter it out, then run the DDL again"
                )
            if (dt.transaction_version(ddl) or 0) >= record.commit_ts:
                return  # applied already
            txns = [
                Transaction(fence, dt.transaction_version(fence) or 0),  # conflicts with writers
                Transaction(ddl, record.commit_ts),
            ]
            # The table's last batch before the DDL claims T - 1 (every row change below T;
            # none shares T): this commit holds the DDL, so it claims T.
            if dt.transaction_version(checkpoint) == record.commit_ts - 1:
                txns.append(Transaction(checkpoint, record.commit_ts))
            target = delta_schema(after)
            props = CommitProperties(app_transactions=txns)
            if record.action == "truncate_table":
                write_deltalake(
                    dt,
                    target.empty_table(),
                    mode="overwrite",
                    commit_properties=props,
                    writer_properties=self._writer_properties(),
                )
            elif not same_schema(_schema_of(dt), target) or any(
                c.default is not None and c.id not in {x.id for x in before.columns}
                for c in after.columns
            ):
                data = evolve(_read_snapshot(dt), before, after, target, record.commit_ts)
                write_deltalake(
                    dt,
                    data,
                    mode="overwrite",
                    schema_mode="overwrite",
                    commit_properties=props,
                    writer_properties=self._writer_properties(),
                )
            elif dt.metadata().name != after.qualified_name:
                dt.alter.set_table_name(after.qualified_name, commit_properties=props)
            else:
                _empty_commit(dt, txns)  # add/drop index, same-type modify: the marker only

        _with_retries(attempt, "applying it")

    # -- syncpoints ----------------------------------------------------------------------

    def record_syncpoint(
        self, changefeed_id: str, ts: int, tables: Sequence[TableSchema]
    ) -> SyncpointRecord:
        """Write ``_cdc_dagster/syncpoints/<cf>/<ts:020d>.json``: ts -> each table's version.

        Each table's version is its commit whose checkpoint is exactly ``ts``: sinks split
        their batches at syncpoint TSs, so it exists even when the table has moved on since
        (syncpoints hold nothing back). Idempotent: a syncpoint already recorded is returned
        as it is. A table with no version ending exactly at ``ts`` raises ``SinkError``.
        """
        existing = read_syncpoint(self.root, changefeed_id, ts)
        if existing is not None:
            return existing
        entries: dict[int, dict[str, Any]] = {}
        for table in tables:
            dt = self._open(changefeed_id, table)
            if dt is None:
                raise SinkError(
                    f"syncpoint {ts}: {_where(changefeed_id, table)} has no Delta table at "
                    f"{self.path(table)}; a syncpoint needs every table — acquire it first"
                )
            version = version_at(dt, self.path(table), app_id(changefeed_id, "checkpoint"), ts)
            if version is None:
                raise SyncpointUnpinnableError(
                    f"syncpoint {ts}: {_where(changefeed_id, table)} has no Delta version "
                    f"committed exactly at {ts} (a batch spanned the syncpoint: written by a "
                    "capture that does not split its batches at syncpoints?); this syncpoint "
                    "cannot be pinned — turn syncpoints off and on again to start anew"
                )
            entries[table.table_id] = {
                "version": version,
                "location": table_location(table.database, table.table),
                "database": table.database,
                "table": table.table,
                "committed_ts": ts,
            }
        doc = {
            "changefeed": changefeed_id,
            "ts": ts,
            "tables": {str(k): v for k, v in entries.items()},
        }
        path = syncpoint_path(self.root, changefeed_id, ts)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = os.path.join(
            os.path.dirname(path), f".{os.path.basename(path)}.tmp-{uuid.uuid4().hex}"
        )
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, ensure_ascii=False, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        prune_syncpoints(self.root, changefeed_id, ts, self.syncpoint_retention_hours)
        return syncpoint_record(doc)


def version_at(dt: DeltaTable, path: str, checkpoint_app_id: str, ts: int) -> int | None:
    """The table's version as of checkpoint ``ts``: the last one before the first commit
    that took the checkpoint past ``ts``, provided a commit set it to exactly ``ts`` (None:
    no commit ended there, a batch spanned ``ts``).

    Read back from the newest commit in ``_delta_log``: commits carry ``{"txn": {"appId":
    ..., "version": <checkpoint>}}`` and checkpoints only grow. Commits after the one at
    ``ts`` without a checkpoint of their own (a new primary's acquire, a DDL at ``ts``)
    belong to it: a DDL at a syncpoint's TS is part of the syncpoint. A syncpoint is
    recorded soon after every table passed it, so the walk reads a few small JSON files.

    A table whose newest checkpoint is not past ``ts`` (at it, or below it: nothing was
    written since, e.g. a table acquired and never written) is at ``ts`` as it is now.
    """
    if (dt.transaction_version(checkpoint_app_id) or 0) <= ts:
        return dt.version()
    first_after = dt.version() + 1
    for version in range(dt.version(), -1, -1):
        log_file = os.path.join(path, "_delta_log", f"{version:020d}.json")
        seen = _checkpoint_txn(log_file, checkpoint_app_id)
        if seen is None:
            continue  # no checkpoint in it (acquire, a DDL marker), or cleaned up
        if seen > ts:
            first_after = version
        elif seen == ts:
            return first_after - 1
        else:
            return None
    return None


def _checkpoint_txn(log_file: str, checkpoint_app_id: str) -> int | None:
    try:
        with open(log_file, encoding="utf-8") as fh:
            for line in fh:
                if '"txn"' not in line:
                    continue
                txn = json.loads(line).get("txn") or {}
                if txn.get("appId") == checkpoint_app_id:
                    return int(txn["version"])
    except FileNotFoundError:
        return None
    return None


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


def by_key_range(table: TableSchema, source: pa.Table) -> bool:
    """Whether a batch is written by key range (``delta_layout``), not by a MERGE."""
    return delta_layout.eligible([source.schema.field(c.name).type for c in table.key_columns])


def _apply(
    dt: DeltaTable,
    path: str,
    table: TableSchema,
    source: pa.Table,
    txns: list[Transaction],
    compression: str,
) -> None:
    """One commit of a batch with ``txns``: by key range (a one-integer-column key: only the
    files its keys fall in are rewritten, ``delta_layout``), else a MERGE."""
    if by_key_range(table, source):
        codec, level = _CODECS[compression]
        delta_layout.write(
            dt,
            path,
            table.key_columns[0].name,
            source,
            txns,
            compression=codec,
            compression_level=level,
        )
    else:
        _merge(dt, table, source, txns, _writer_properties(compression))


def _merge(
    dt: DeltaTable,
    table: TableSchema,
    source: pa.Table,
    txns: list[Transaction],
    writer_properties: WriterProperties,
) -> None:
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
            writer_properties=writer_properties,
            commit_properties=CommitProperties(app_transactions=txns),
        )
        .when_matched_delete(predicate=f"s.{_quote(OP_COLUMN)} = {OP_DELETE}")
        .when_matched_update(updates=sets, predicate=upsert)
        .when_not_matched_insert(updates=sets, predicate=upsert)
        .execute()
    )


_WARM_LOCK = threading.Lock()
_WARMED_PID = 0  # the process whose delta-rs warm_up ran (a forked child warms again)


def warm_up(compression: str = DEFAULT_COMPRESSION) -> bool:
    """One MERGE of a few rows into a scratch Delta table, shaped as a batch's (delete,
    update and insert on ``_cdc_op``, app transactions, the sink's codec), once per process;
    whether it ran now. A process's first MERGE costs ~0.25-0.3 CPU-s more than its later
    ones (delta-rs's and DataFusion's process-wide set-up, whatever the table): measured on
    a drain's 250k-row sysbench table, 0.72-0.85 CPU-s cold, 0.52-0.58 after this, which
    costs 0.25-0.3 itself. A backlog's sink phase often was that first MERGE -- in a capture
    run just started (every ``CDC_DAGSTER_CAPTURE_LOOP_S``) and in each of its bulk workers --
    so the warm-up runs while those wait or idle (``pipeline.background``). Never raises (a
    warning). Not for a process that forks afterwards: delta-rs refuses to run in a child
    forked after its runtime started (the run workers' zygote never calls it)."""
    global _WARMED_PID
    with _WARM_LOCK:
        if os.getpid() == _WARMED_PID:
            return False
        _WARMED_PID = os.getpid()
    codec, level = _CODECS[compression]
    props = WriterProperties(compression=codec, compression_level=level)  # type: ignore[arg-type]
    schema = pa.schema([("id", pa.int64()), ("v", pa.string())])
    txns = [Transaction(f"{APP_PREFIX}/warm-up/fence", 1)]
    try:
        with tempfile.TemporaryDirectory(prefix="cdc-dagster-delta-warm-") as where:
            write_deltalake(where, pa.table({"id": [1, 2, 3], "v": ["a", "b", "c"]}, schema),
                            writer_properties=props)  # fmt: skip
            source = pa.table(
                {"id": [2, 3, 4], "v": ["x", None, "y"], OP_COLUMN: pa.array([0, 1, 0], pa.int8())}
            )
            sets = {"id": "s.id", "v": "s.v"}
            merge = DeltaTable(where).merge(
                source,
                "t.id = s.id",
                source_alias="s",
                target_alias="t",
                writer_properties=props,
                commit_properties=CommitProperties(app_transactions=txns),
            )
            (
                merge.when_matched_delete(predicate=f"s.{OP_COLUMN} = {OP_DELETE}")
                .when_matched_update(updates=sets, predicate=f"s.{OP_COLUMN} = {OP_UPSERT}")
                .when_not_matched_insert(updates=sets, predicate=f"s.{OP_COLUMN} = {OP_UPSERT}")
                .execute()
            )
    except (DeltaError, OSError, pa.ArrowException) as exc:
        log.warning("the Delta warm-up MERGE failed (%s): the first real one pays the set-up",
                    exc)  # fmt: skip
        return False
    return True


# -- reading -------------------------------------------------------------------------------


def _need_schema(
    schemas: Mapping[int, TableSchema | None], table_id: int, which: str, where: str
) -> TableSchema:
    schema = schemas.get(table_id)
    if schema is None:
        raise SinkDDLError(
            f"{where}: no schema {which} the DDL for table id {table_id}; the DDL record or "
            "the schema history is incomplete — fix the change log, then run the DDL again"
        )
    return schema


def _ddl_where(changefeed_id: str, record: DdlRecord) -> str:
    names = [f"{t.qualified_name} (id {i})" for i, t in record.tables.items() if t]
    return (
        f"changefeed {changefeed_id}: DDL {record.action} at {record.commit_ts} on "
        f"{names or list(record.table_ids)} ({record.query[:200]!r})"
    )


def _table_id_of(dt: DeltaTable) -> int | None:
    desc = dt.metadata().description
    try:
        return int(json.loads(desc)["cdc_dagster_table_id"]) if desc else None
    except (ValueError, KeyError, TypeError):
        return None


def _table_id_at(path: str) -> int | None:
    try:
        return _table_id_of(DeltaTable(path))
    except TableNotFoundError:
        return None


def _read_snapshot(dt: DeltaTable) -> pa.Table:
    """The rows of ``dt``'s loaded version (``file_uris()`` + pyarrow, never to_pyarrow_*)."""
    schema = pa.schema([f.with_type(plain_type(f.type)) for f in _schema_of(dt)])
    parts = [pq.read_table(local_path(u)) for u in dt.file_uris()]
    parts = [p.select(schema.names).cast(schema) for p in parts if p.num_rows]
    return pa.concat_tables(parts) if parts else schema.empty_table()


def read_table_at(root: str, table: TableSchema | str, version: int | None = None) -> pa.Table:
    """The content of a Delta table at ``version`` (latest if None), via ``file_uris()``.

    ``table`` is a TableSchema or a location relative to ``root`` (as in a syncpoint).
    """
    path = (
        os.path.join(root, table)
        if isinstance(table, str)
        else table_path(root, table.database, table.table)
    )
    return _read_snapshot(DeltaTable(path, version=version))


# -- syncpoint files -------------------------------------------------------------------------


def read_syncpoint(root: str, changefeed_id: str, ts: int) -> SyncpointRecord | None:
    """The syncpoint recorded at ``ts``, None if there is none."""
    try:
        with open(syncpoint_path(root, changefeed_id, ts), encoding="utf-8") as fh:
            return syncpoint_record(json.load(fh))
    except FileNotFoundError:
        return None
