"""The sink contract every downstream implements (docs/dataplane.md, section 3).

A sink receives one batch per table: the table's changes with commit ts in
``(start_ts, end_ts]``, collapsed to the last change per primary key, as a pyarrow Table
with the table's columns by name plus ``_cdc_op`` (int8: 0 upsert, 1 delete) and
``_cdc_commit_ts`` (int64). Each write commits data and the table's
``(committed_ts, token)`` atomically; a stale token is refused (fencing).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import pyarrow as pa

from cdc_dagster.schema import DdlRecord, TableSchema

OP_COLUMN = "_cdc_op"
COMMIT_TS_COLUMN = "_cdc_commit_ts"
OP_UPSERT = 0
OP_DELETE = 1


class SinkError(Exception):
    """A downstream write or DDL failed; the message names the changefeed, table and remedy."""


class FencedError(SinkError):
    """The write's fencing token is not the table's current one: another capture owns it."""


class SinkGapError(SinkError):
    """A batch starts above the downstream's committed ts: the changes in between would be lost."""


class SinkSchemaError(SinkError):
    """A batch does not fit the downstream table's schema."""


class SyncpointUnpinnableError(SinkError):
    """A syncpoint cannot be recorded: a table has no commit ending exactly at its ts."""


class SinkDDLError(SinkError):
    """A DDL could not be applied downstream."""


@dataclass(frozen=True, slots=True)
class Committed:
    """What the downstream holds for one table: its committed ts and current fencing token."""

    committed_ts: int
    token: int


@dataclass(frozen=True, slots=True)
class SyncpointRecord:
    """One consistent cross-table moment: upstream ts -> each table's downstream version."""

    changefeed_id: str
    ts: int
    versions: Mapping[int, int]  # table_id -> downstream version (Delta version, or 0)
    locations: Mapping[int, str]  # table_id -> where the table lives (path or schema.table)


@runtime_checkable
class Sink(Protocol):
    """A downstream that commits per table and batch, fenced by a token."""

    def committed(self, changefeed_id: str, table: TableSchema) -> Committed:
        """The table's committed ts and current token ((0, 0) for a table never written)."""
        ...

    def acquire(self, changefeed_id: str, table: TableSchema) -> int:
        """Take a new fencing token, larger than every earlier one; older tokens are refused."""
        ...

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
        """Commit the batch and ``(end_ts, token)`` atomically; return the committed ts.

        ``at_syncpoint``: ``end_ts`` is a syncpoint TS (sinks split their batches there, so
        every table's downstream passes through it): keep what a consistent read of the
        syncpoint needs in the same commit (PostgreSQL: the registered copy of the table).
        """
        ...

    def apply_ddl(
        self, changefeed_id: str, record: DdlRecord, before: Mapping[int, TableSchema | None]
    ) -> None:
        """Apply one DDL exactly once (a DDL already applied is skipped)."""
        ...

    def record_syncpoint(
        self, changefeed_id: str, ts: int, tables: Sequence[TableSchema]
    ) -> SyncpointRecord:
        """Record the syncpoint at ``ts`` for ``tables`` (all at a checkpoint >= ts, each
        with a commit that ended exactly at ``ts``)."""
        ...
