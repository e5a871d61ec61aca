"""The oracle: each table's expected content at any ts, by a plain replay of the change log.

Independent of Spark, the pipeline and the sinks: it reads data files and DDL records
with pyarrow and replays them row by row into Python dicts, honouring DDLs (create,
add column with its default, drop / rename column, truncate, drop / rename table). Its
answers are the truth tests and asset checks compare downstream tables against, through
``fingerprint``, which gives the same text for the same rows whatever system read them.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import pyarrow as pa

from cdc_dagster.schema import DdlRecord, SchemaError, TableSchema
from cdc_dagster.upstream.changelog import OP_DELETE, ChangeLog, ChangeLogError
from cdc_dagster.upstream.values import WIDE, column_default, widening

Key = tuple[Any, ...]
Row = dict[int, Any]


class OracleError(ChangeLogError):
    """The oracle cannot answer: the table does not exist at ts, or the log is not resolved."""


@dataclass(slots=True)
class _Replay:
    """One table's state after replaying every change and DDL with commit_ts <= ``upto_ts``."""

    upto_ts: int = 0
    schema: TableSchema | None = None
    rows: dict[Key, Row] = field(default_factory=dict)
    top_key: int = 0  # the highest integer first key column any change had (after or before)


class Oracle:
    """Expected table contents from the change log at ``root`` (replays are cached per table)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.log = ChangeLog(root)
        self._replays: dict[int, _Replay] = {}

    def table_at(self, table_id: int, ts: int, *, check_resolved: bool = True) -> pa.Table:
        """The table's rows at ``ts`` in the mounted form (columns by name, key order)."""
        schema = self.log.schema_at(table_id, ts)
        if schema is None:
            raise OracleError(
                f"table {table_id} does not exist at ts {ts} (not created or dropped)"
            )
        resolved = self.log.table_resolved_ts(table_id)
        if check_resolved and ts > resolved:
            raise OracleError(
                f"table {schema.qualified_name} (id {table_id}) is resolved only to "
                f"{resolved} < ts {ts}: rows may still arrive; ask at a resolved ts"
            )
        # Above the resolved ts rows may still arrive: such a replay is not kept.
        replay = self._replay(table_id, ts, keep=ts <= resolved)
        rows = [replay.rows[k] for k in sorted(replay.rows, key=_sort_key)]
        return _to_arrow(schema, rows)

    def rows_at(self, table_id: int, ts: int) -> tuple[dict[Key, Row], int]:
        """The table's rows at ``ts`` as key -> {column id: value}, resolved or not (a copy),
        and the highest integer value its first key column ever had up to ``ts`` (0: none).

        The generator's own model form: a resumed ``Workload`` rebuilds itself from it.
        """
        if self.log.schema_at(table_id, ts) is None:
            raise OracleError(
                f"table {table_id} does not exist at ts {ts} (not created or dropped)"
            )
        replay = self._replay(table_id, ts, keep=False)
        rows = {k: dict(r) for k, r in sorted(replay.rows.items(), key=lambda i: _sort_key(i[0]))}
        return rows, replay.top_key

    def bank_total_at(self, ts: int, table_ids: Iterable[int], column: str = "balance") -> Decimal:
        """Sum of ``column`` over the given tables at ``ts``."""
        total = Decimal(0)
        for table_id in table_ids:
            values = self.table_at(table_id, ts).column(column).to_pylist()
            total += sum((v for v in values if v is not None), Decimal(0))
        return total

    # ------------------------------------------------------------------ replay
    def _replay(self, table_id: int, ts: int, keep: bool) -> _Replay:
        safepoint = self.log.gc_safepoint()
        if safepoint:
            raise OracleError(
                f"change log {self.log.root} was garbage-collected up to {safepoint}: data "
                "files below it are gone, so a replay from the start would miss rows; the "
                "oracle needs a log that was never GC'd"
            )
        replay = self._replays.get(table_id)
        if not keep and replay is not None:
            replay = _Replay(
                replay.upto_ts,
                replay.schema,
                {k: dict(r) for k, r in replay.rows.items()},
                replay.top_key,
            )
        if replay is None or replay.upto_ts > ts:
            replay = _Replay()  # asked for an earlier ts: start again from the beginning
        ddls = [d for d in self.log.ddl_records(replay.upto_ts, ts) if table_id in d.tables]
        changes = self._changes(table_id, replay.upto_ts, ts)
        i = 0
        for ddl in ddls:
            while i < len(changes) and changes[i]["_commit_ts"] < ddl.commit_ts:
                _apply_change(replay, changes[i])
                i += 1
            _apply_ddl(replay, ddl, table_id)
        for change in changes[i:]:
            _apply_change(replay, change)
        replay.upto_ts = ts
        if keep:
            self._replays[table_id] = replay
        return replay

    def _changes(self, table_id: int, after_ts: int, upto_ts: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for f in self.log.data_files(table_id, after_ts, upto_ts):
            rows = self.log.read_data_file(f).to_pylist()
            out.extend(r for r in rows if after_ts < r["_commit_ts"] <= upto_ts)
        out.sort(key=lambda r: (r["_commit_ts"], r["_seq"]))
        return out


def _to_arrow(schema: TableSchema, rows: list[Row]) -> pa.Table:
    arrays = [pa.array([r.get(c.id) for r in rows], c.arrow) for c in schema.columns]
    return pa.Table.from_arrays(arrays, schema=schema.arrow_schema())


def _apply_ddl(replay: _Replay, ddl: DdlRecord, table_id: int) -> None:
    before, after = replay.schema, ddl.tables[table_id]
    if ddl.action in ("create_table", "truncate_table", "drop_table") or after is None:
        replay.rows.clear()
    if before is not None and after is not None:
        old = {c.id: c for c in before.columns}
        for column in after.columns:
            if column.id not in old:  # instant ADD COLUMN: existing rows take the default
                value = column_default(column, ddl.commit_ts)
                for row in replay.rows.values():
                    row[column.id] = value
            elif old[column.id].type != column.type or column.nullable < old[column.id].nullable:
                _modify_column(replay, ddl, after, old[column.id].type, column.id)
    replay.schema = after


def _modify_column(
    replay: _Replay, ddl: DdlRecord, after: TableSchema, from_type: str, column_id: int
) -> None:
    """Convert the column's values to its new type, or refuse what cannot be modelled."""
    column = after.column(column_id)
    where = (
        f"DDL {ddl.action} at commit_ts {ddl.commit_ts} on {after.qualified_name} "
        f"(id {after.table_id}) column {column.name!r}"
    )
    try:
        convert = widening(from_type, column.type)
    except SchemaError as exc:
        raise OracleError(f"{where}: {exc}; the oracle cannot replay this log past it") from exc
    for row in replay.rows.values():
        value = row.get(column_id)
        if value is None and not column.nullable:
            raise OracleError(
                f"{where}: the column becomes NOT NULL but a row (key "
                f"{tuple(row[i] for i in after.primary_key)}) holds NULL, which MySQL refuses "
                "in strict mode; the producer logged a DDL MySQL would not have run"
            )
        row[column_id] = convert(value)


def _apply_change(replay: _Replay, change: dict[str, Any]) -> None:
    schema = replay.schema
    if schema is None:
        raise OracleError(
            f"a change at commit_ts {change['_commit_ts']} has no table schema before it; "
            "the change log lacks the table's create_table record"
        )
    before = tuple(change.get(f"b{i}") for i in schema.primary_key)
    for v in (before[0], change.get(f"c{schema.primary_key[0]}")):
        if type(v) is int and v > replay.top_key:
            replay.top_key = v
    if change["_op"] == OP_DELETE:
        replay.rows.pop(before, None)
        return
    row = {c.id: change.get(f"c{c.id}") for c in schema.columns}
    if any(v is not None for v in before):  # a primary-key change: the old key goes
        replay.rows.pop(before, None)
    replay.rows[tuple(row[i] for i in schema.primary_key)] = row


def _sort_key(key: Key) -> tuple[Any, ...]:
    return tuple((v is None, v) for v in key)


# ---------------------------------------------------------------------- fingerprint
def fingerprint(table: pa.Table, ignore_columns: Sequence[str] = ()) -> str:
    """Order-independent fingerprint of a table's rows: ``<rows>:<sum of row hashes>``.

    Values are put in a canonical text first, so the same logical row gives the same
    fingerprint from the oracle, a Delta table read with pyarrow or DuckDB, or PostgreSQL:
    decimals normalised (``1.50`` == ``1.5``), floats by ``repr`` (-0.0 == 0.0), aware
    timestamps in UTC, binary as hex, large/small string and binary alike, columns by name
    in any order. JSON text is compared as text.
    """
    names = sorted(n for n in table.column_names if n not in set(ignore_columns))
    columns = [[_canonical(v) for v in table.column(n).to_pylist()] for n in names]
    total = 0
    for values in zip(*columns, strict=True) if columns else []:
        text = json.dumps(list(zip(names, values, strict=True)), ensure_ascii=False)
        total += int.from_bytes(hashlib.sha256(text.encode()).digest()[:16], "big")
    return f"{table.num_rows}:{total % (1 << 128):032x}"


def _canonical(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, Decimal):
        text = format(value.normalize(WIDE), "f")
        return "0" if text in ("-0", "0") else text
    if isinstance(value, float):
        return repr(value + 0.0)  # -0.0 + 0.0 == 0.0
    if isinstance(value, bytes):
        return "0x" + value.hex()
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.UTC).replace(tzinfo=None)
        return value.isoformat(sep=" ", timespec="microseconds")
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, dt.time | dt.timedelta):
        return str(value)
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in sorted(value.items())}
    return str(value)


__all__ = ["Oracle", "OracleError", "fingerprint"]
