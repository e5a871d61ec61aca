"""The embedded upstream: a seeded workload that writes the change log through ChangeLogWriter.

Tables: bank accounts (transfers inside and across tables keep the total constant),
shop customers + orders (for joins), one wide table of every column type, and scratch
tables that DDLs create, rename, truncate and drop. Transactions touch one to three of
them with inserts, updates (primary-key changes included) and deletes. The generator
keeps its own model of every table, so ``bank_total()`` and tests can check the log.

Deterministic: the same config gives the same change log, byte for byte in content
(file names carry random suffixes). Bank tables are never dropped, truncated, or have
their ``id``/``balance`` dropped or renamed, so the invariant holds under DDLs.
"""

from __future__ import annotations

import os
import random
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa

from cdc_dagster.schema import ColumnSchema, DdlRecord, IndexSchema, TableSchema
from cdc_dagster.upstream import bulk, resume
from cdc_dagster.upstream import workload_data as wd
from cdc_dagster.upstream.changelog import (
    OP_DELETE,
    OP_INSERT,
    OP_UPDATE,
    ChangeLogWriter,
    data_file_schema,
)
from cdc_dagster.upstream.values import column_default
from cdc_dagster.upstream.workload_model import (
    Key,
    Row,
    ShardLag,
    TableModel,
    WorkloadConfig,
    WorkloadError,
)
from scheduler_core.ddl import DDLKind
from scheduler_core.ts import LOGICAL_MASK, compose, physical_ms, split


@dataclass(frozen=True, slots=True)
class _Change:
    commit_ts: int
    seq: int
    op: int
    after: Row | None
    before: Key | None


class _Txn:
    """One upstream transaction: a commit ts and a running ``_seq``."""

    def __init__(self, workload: Workload, commit_ts: int) -> None:
        self.w = workload
        self.commit_ts = commit_ts
        self.seq = 0

    def _emit(self, t: TableModel, op: int, after: Row | None, before: Key | None) -> None:
        key = t.key_of(after) if after is not None else before
        shard = zlib.crc32(repr(key).encode()) % t.schema.shards
        change = _Change(self.commit_ts, self.seq, op, after, before)
        self.w._buffer.setdefault((t.schema.table_id, shard), []).append(change)
        self.seq += 1

    def insert(self, t: TableModel, row: Row) -> None:
        t.put(t.key_of(row), row)
        self._emit(t, OP_INSERT, row, None)

    def update(self, t: TableModel, key: Key, row: Row) -> None:
        new_key = t.key_of(row)
        if new_key != key:
            t.remove(key)
        t.put(new_key, row)
        self._emit(t, OP_UPDATE, row, key if new_key != key else None)

    def delete(self, t: TableModel, key: Key) -> None:
        t.remove(key)
        self._emit(t, OP_DELETE, None, key)


class Workload:
    """The embedded upstream writing a change log at ``root``.

    ``Workload(config, root)`` starts a fresh log; ``Workload.open(config, root)`` continues
    the log a Workload wrote there before (or starts it when the directory is empty): see
    ``cdc_dagster.upstream.resume`` for what a resumed producer keeps and discards. One
    Workload per log at a time (the writer's lock); ``close()`` releases it.
    """

    def __init__(self, config: WorkloadConfig, root: str | os.PathLike[str]) -> None:
        self._init_state(config, root)
        try:
            if self.writer.log.ddl_records():
                raise WorkloadError(
                    f"change log {root} already has DDL records; a Workload writes a fresh log: "
                    "give it an empty directory, or continue it with Workload.open(config, root)"
                )
            self._start_fresh()
        except BaseException:
            self.close()
            raise

    @classmethod
    def open(cls, config: WorkloadConfig, root: str | os.PathLike[str]) -> Workload:
        """Continue the log a Workload wrote at ``root`` (an empty one is started afresh).

        WorkloadError when the log was written with another config that shapes it (seed,
        table counts, shards, names, balances) or not by a Workload at all.
        """
        if not isinstance(config, WorkloadConfig):
            raise WorkloadError(
                f"Workload.open(config, root): config must be a WorkloadConfig, got "
                f"{type(config).__name__} (arguments swapped?)"
            )
        w = cls.__new__(cls)
        w._init_state(config, root)
        try:
            has_ddls = bool(w.writer.log.ddl_records())
            if resume.check_config(w.writer.root, config, has_ddls):
                w._take_over(resume.resume(config, w.writer))
            else:
                w._start_fresh()
        except BaseException:
            w.close()
            raise
        return w

    def _init_state(self, config: WorkloadConfig, root: str | os.PathLike[str]) -> None:
        self.config = config
        self.writer = ChangeLogWriter(root, fsync=config.fsync)
        self.rng = random.Random(config.seed)
        self.tables: dict[int, TableModel] = {}
        self.dropped: list[int] = []  # tables whose final resolved marks are still due
        self._buffer: dict[tuple[int, int], list[_Change]] = {}
        self._marks: dict[tuple[int, int], int] = {}
        self._last_ts = 0
        self._next_table_id = config.wide_id + 1
        self._scratch_count = 0
        self._renames = 0  # suffix of renamed tables and columns: names never collide
        self.rows_written = 0
        self.resumed_from: int | None = None  # the last ts of the log when it was opened
        self.discarded_above: int | None = None  # rows above this ts were cut at open

    def _take_over(self, model: resume.ResumedModel) -> None:
        """Continue from a model rebuilt from the log (``upstream.resume``)."""
        self._last_ts, self.rng, self.tables = model.last_ts, model.rng, model.tables
        self._next_table_id, self._scratch_count = model.next_table_id, model.scratch_count
        self._renames, self._marks, self.dropped = model.renames, model.marks, model.dropped
        self.resumed_from, self.discarded_above = model.last_ts, model.discarded_above
        if model.never_resolved:  # the set-up's rows were all discarded (upstream.resume)
            self._bootstrap()

    def _start_fresh(self) -> None:
        resume.save_config(self.writer.root, self.config, self.config.fsync)
        self._bootstrap()

    def close(self) -> None:
        """Release the change log's writer lock (buffered changes are not written)."""
        self.writer.close()

    def __enter__(self) -> Workload:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ public
    @property
    def last_commit_ts(self) -> int:
        """The commit ts of the last transaction or DDL."""
        return self._last_ts

    def step(self, n_txns: int | None = None) -> int:
        """Commit ``n_txns`` transactions (and DDLs at the configured rate); rows written."""
        before = self.rows_written
        for _ in range(self.config.txns_per_step if n_txns is None else n_txns):
            if self.config.ddls and self.rng.randrange(self.config.ddl_every) == 0:
                self._ddl()
            self._transaction()
        self.flush()
        return self.rows_written - before

    def step_transfers(self, n_txns: int) -> int:
        """Commit ``n_txns`` bank transfers, vectorised (benchmarks); rows written.

        Narrow two-row updates at numpy speed; the bank total still holds (balances may
        go negative). Wall-clock mode numbers them by the logical part of one ms.
        """
        if n_txns <= 0:
            return 0
        self.flush()
        first = self._next_ts()
        if self.config.wall_clock:
            ts = first + np.arange(n_txns, dtype=np.int64)
        else:
            ts = bulk.ts_range(first, n_txns, self.config.ms_per_txn)
        self._last_ts = int(ts[-1])
        banks = [self.tables[t] for t in self.bank_table_ids]
        rows = bulk.bulk_transfers(banks, self.writer, self.rng.getrandbits(64), n_txns, ts)
        self.rows_written += rows
        return rows

    def advance_resolved(self) -> int:
        """Mark every shard resolved up to the last commit ts (lagging shards behind it)."""
        self.flush()
        target = self._last_ts
        lags = {(g.table_id, g.shard): g.lag_ms for g in self.config.lagging}
        for table_id in [*self.tables, *self.dropped]:
            shards = self._schema_shards(table_id)
            for shard in range(shards):
                lag = lags.get((table_id, shard), 0)
                ts = target if lag == 0 else compose(max(0, physical_ms(target) - lag))
                self._advance_mark(table_id, shard, min(ts, target))
        self.dropped.clear()
        self.writer.advance_ddl_resolved(target)
        return target

    def bank_total(self) -> Decimal:
        """Sum of every bank balance (constant for the workload's whole life)."""
        return sum(
            (r[2] for t in self.tables.values() if t.role == "bank" for r in t.rows.values()),
            Decimal("0.00"),
        )

    def table_rows(self, table_id: int) -> Mapping[Key, Row]:
        """The generator's model of a live table: key -> {column id: value}."""
        return self.tables[table_id].rows

    def schema(self, table_id: int) -> TableSchema:
        return self.tables[table_id].schema

    @property
    def bank_table_ids(self) -> tuple[int, ...]:
        return tuple(range(1, self.config.bank_tables + 1))

    def flush(self, table_id: int | None = None) -> None:
        """Write buffered changes (all, or one table's): one file per table, shard and minute."""
        for key, changes in sorted(self._buffer.items()):
            if table_id is not None and key[0] != table_id:
                continue
            del self._buffer[key]  # before writing: a refused write is not retried blindly
            t = self.tables[key[0]]
            rows = _to_arrow(t.schema, t.version, changes)
            self.writer.write_rows(key[0], key[1], t.version, rows)
            self.rows_written += len(changes)

    # ------------------------------------------------------------------ clock
    def _next_ts(self) -> int:
        phys, logical = split(self._last_ts)
        if self.config.wall_clock:
            now = time.time_ns() // 1_000_000
            if now > phys:
                ts = compose(now)
            else:  # the clock is behind the last TS issued (e.g. a resumed log): never go back
                ts = compose(phys, logical + 1) if logical < LOGICAL_MASK else compose(phys + 1)
        elif self._last_ts == 0:
            ts = compose(self.config.start_physical_ms)
        else:
            ts = compose(phys + self.config.ms_per_txn)
        self._last_ts = ts
        return ts

    # ------------------------------------------------------------------ set-up
    def _bootstrap(self) -> None:
        """Create the base tables (those not created yet) and write their initial rows."""
        cfg = self.config
        n = cfg.shards_per_table
        schemas = [wd.bank_schema(i + 1, i, n) for i in range(cfg.bank_tables)]
        schemas += [
            wd.customers_schema(cfg.customers_id, n),
            wd.orders_schema(cfg.orders_id, n),
            wd.wide_schema(cfg.wide_id, n, cfg.odd_identifiers),
        ]
        for schema in schemas:
            if schema.table_id not in self.tables:
                self._create(schema, *self.config.role(schema.table_id))
        for t in [self.tables[s.table_id] for s in schemas]:
            txn = _Txn(self, self._next_ts())
            for _ in range(cfg.rows_per_table):
                txn.insert(t, self._new_row(t))
        self.flush()

    def _create(
        self,
        schema: TableSchema,
        role: str,
        protected: set[int] | frozenset[int],
        ts: int | None = None,
    ) -> None:
        ts = self._next_ts() if ts is None else ts
        record = DdlRecord(
            ts,
            DDLKind.CREATE_TABLE,
            "create_table",
            wd.create_query(schema),
            creates=(schema.table_id,),
            tables={schema.table_id: schema},
        )
        self.writer.write_ddl(record)
        nxt = max(c.id for c in schema.columns) + 1
        self.tables[schema.table_id] = TableModel(
            schema, ts, role, next_column=nxt, protected=frozenset(protected)
        )

    def _schema_shards(self, table_id: int) -> int:
        t = self.tables.get(table_id)
        return t.schema.shards if t is not None else self.writer.log.shards(table_id)

    def _advance_mark(self, table_id: int, shard: int, ts: int) -> None:
        if ts > self._marks.get((table_id, shard), 0):
            self.writer.advance_resolved(table_id, shard, ts)
            self._marks[(table_id, shard)] = ts

    # ------------------------------------------------------------------ rows
    def _new_row(self, t: TableModel) -> Row:
        row: Row = {}
        for c in t.schema.columns:
            row[c.id] = self._value(t, c)
        return row

    def _value(self, t: TableModel, c: ColumnSchema) -> Any:
        rng = self.rng
        if c.id in t.schema.primary_key:
            t.next_key += 1
            return t.next_key - 1
        special = _SPECIAL.get((t.role, c.id))  # ids are never reused: safe after renames
        if special is not None:
            return special(self, t)
        if c.nullable and rng.random() < 0.15:
            return None
        return wd.random_value(rng, c.type)

    def _pick(self, t: TableModel) -> Key | None:
        return t.pick(self.rng)

    def _touch(self, t: TableModel, row: Row) -> Row:
        """A copy of ``row`` with one to three non-key, non-protected columns changed."""
        out = dict(row)
        free = [c for c in t.schema.columns if c.id not in t.protected]
        for c in self.rng.sample(free, min(len(free), self.rng.randint(1, 3))):
            out[c.id] = self._value(t, c)
        return out

    def _of_role(self, role: str) -> list[TableModel]:
        return [t for t in self.tables.values() if t.role == role]

    # ------------------------------------------------------------------ transactions
    def _transaction(self) -> None:
        txn = _Txn(self, self._next_ts())
        parts = self.rng.choices(_PARTS, weights=_WEIGHTS, k=self.rng.randint(1, 3))
        for part in parts:
            part(self, txn)
        if txn.seq == 0:  # every part found nothing to do: still commit one change
            _bank_transfer(self, txn)

    # ------------------------------------------------------------------ DDLs
    def _ddl(self) -> None:
        choices = [d for d in _DDLS if d[1](self)]
        _, _, action = self.rng.choices(choices, weights=[d[0] for d in choices])[0]
        action(self, self._next_ts())

    def _alter(
        self, t: TableModel, ts: int, action: str, query: str, schema: TableSchema
    ) -> DdlRecord:
        kind = DDLKind.TRUNCATE_TABLE if action == "truncate_table" else DDLKind.ALTER_TABLE
        if action == "rename_table":
            kind = DDLKind.RENAME_TABLES
        tid = t.schema.table_id
        self.flush(tid)  # its rows before the DDL are written with the schema before it
        record = DdlRecord(ts, kind, action, query, (tid,), tables={tid: schema})
        self.writer.write_ddl(record)
        t.schema, t.version = schema, ts
        return record


# ---------------------------------------------------------------------- transaction parts
def _bank_transfer(w: Workload, txn: _Txn) -> None:
    """Move money between two accounts, in one table or across two: the total stays."""
    banks = w._of_role("bank")
    src, dst = w.rng.choice(banks), w.rng.choice(banks)
    a, b = w._pick(src), w._pick(dst)
    if a is None or b is None or (src is dst and a == b):
        return
    amount = (src.rows[a][2] * Decimal(w.rng.random())).quantize(Decimal("0.01"))
    txn.update(src, a, {**src.rows[a], 2: src.rows[a][2] - amount})
    txn.update(dst, b, {**dst.rows[b], 2: dst.rows[b][2] + amount})


def _bank_rekey(w: Workload, txn: _Txn) -> None:
    """Change an account's primary key (an update with a before image)."""
    t = w.rng.choice(w._of_role("bank"))
    key = w._pick(t)
    if key is not None:
        txn.update(t, key, {**t.rows[key], 1: t.next_key})
        t.next_key += 1


def _bank_close_open(w: Workload, txn: _Txn) -> None:
    """Close an account (its balance moves to another, then delete) and open an empty one."""
    t = w.rng.choice(w._of_role("bank"))
    a, b = w._pick(t), w._pick(t)
    if a is None or b is None or a == b:
        return
    txn.update(t, b, {**t.rows[b], 2: t.rows[b][2] + t.rows[a][2]})
    txn.delete(t, a)
    row = w._new_row(t)
    row[2] = Decimal("0.00")
    txn.insert(t, row)


def _shop(w: Workload, txn: _Txn) -> None:
    """A new customer with orders, an order paid or cancelled, a customer edited."""
    (cust,), (orders,) = w._of_role("customers"), w._of_role("orders")
    r = w.rng.random()
    if r < 0.4 or not orders.rows:
        c = w._new_row(cust)
        txn.insert(cust, c)
        for _ in range(w.rng.randint(0, 3)):
            o = w._new_row(orders)
            o[2] = c[1]
            txn.insert(orders, o)
    elif r < 0.7:
        key = w._pick(orders)
        txn.update(orders, key, {**w._touch(orders, orders.rows[key])})
    elif r < 0.85:
        txn.delete(orders, w._pick(orders))
    elif cust.rows:
        key = w._pick(cust)
        txn.update(cust, key, w._touch(cust, cust.rows[key]))


def _generic(role: str) -> Callable[[Workload, _Txn], None]:
    def part(w: Workload, txn: _Txn) -> None:
        tables = w._of_role(role)
        if not tables:
            return
        t = w.rng.choice(tables)
        key, r = w._pick(t), w.rng.random()
        if key is None or r < 0.35:
            txn.insert(t, w._new_row(t))
        elif r < 0.75:
            txn.update(t, key, w._touch(t, t.rows[key]))
        elif r < 0.9:
            txn.delete(t, key)
        else:  # primary-key change
            txn.update(t, key, {**w._touch(t, t.rows[key]), t.schema.primary_key[0]: t.next_key})
            t.next_key += 1

    part.__doc__ = f"Insert, update, re-key or delete a row of a {role} table."
    return part


_PARTS = (
    _bank_transfer,
    _bank_rekey,
    _bank_close_open,
    _shop,
    _generic("wide"),
    _generic("scratch"),
)
_WEIGHTS = (35, 4, 4, 25, 20, 12)

_SPECIAL: dict[tuple[str, int], Callable[[Workload, TableModel], Any]] = {
    ("bank", 2): lambda w, t: w.config.initial_balance,
    ("bank", 3): lambda w, t: wd.random_text(w.rng) or None,
    ("customers", 2): lambda w, t: wd.random_text(w.rng) + "name",
    ("orders", 2): lambda w, t: (w.tables[w.config.customers_id].pick(w.rng) or (0,))[0],
    ("orders", 3): lambda w, t: Decimal(w.rng.randint(1, 99_999)).scaleb(-2),
    ("orders", 4): lambda w, t: w.rng.choice(wd.STATUSES),
}


# ---------------------------------------------------------------------- DDLs
def _any_table(w: Workload) -> TableModel:
    return w.rng.choice(list(w.tables.values()))


def _ddl_add_column(w: Workload, ts: int) -> None:
    """Instant ADD COLUMN with a default: existing rows take the default, no row events."""
    t = _any_table(w)
    logical, default = w.rng.choice(wd.ADDABLE)
    name = f"added_{t.next_column}" + (
        " ü`" if w.config.odd_identifiers and t.role == "wide" else ""
    )
    column = ColumnSchema(t.next_column, name, logical, True, default)
    t.next_column += 1
    schema = replace(t.schema, columns=(*t.schema.columns, column))
    dflt = "" if default is None else f" DEFAULT {wd.sql_literal(default)}"
    query = (
        f"ALTER TABLE {wd.qualified(t.schema)} ADD COLUMN "
        f"{wd.quote_ident(name)} {wd.mysql_type(logical)}{dflt}"
    )
    w._alter(t, ts, "add_column", query, schema)
    value = column_default(column)
    for row in t.rows.values():
        row[column.id] = value


def _droppable(w: Workload) -> list[tuple[TableModel, ColumnSchema]]:
    return [
        (t, c)
        for t in w.tables.values()
        if t.role != "bank"  # bank tables only gain columns and indexes
        for c in t.schema.columns
        if c.id not in t.protected and c.id not in t.schema.primary_key
    ]


def _ddl_drop_column(w: Workload, ts: int) -> None:
    t, c = w.rng.choice(_droppable(w))
    schema = replace(t.schema, columns=tuple(x for x in t.schema.columns if x.id != c.id))
    indexes = tuple(i for i in schema.indexes if c.id not in i.columns)
    schema = replace(schema, indexes=indexes)
    query = f"ALTER TABLE {wd.qualified(t.schema)} DROP COLUMN {wd.quote_ident(c.name)}"
    w._alter(t, ts, "drop_column", query, schema)
    for row in t.rows.values():
        row.pop(c.id, None)


def _ddl_rename_column(w: Workload, ts: int) -> None:
    t, c = w.rng.choice(_droppable(w))
    w._renames += 1
    new = f"{c.name.split('~')[0]}~{w._renames}"
    cols = tuple(replace(x, name=new) if x.id == c.id else x for x in t.schema.columns)
    query = (
        f"ALTER TABLE {wd.qualified(t.schema)} RENAME COLUMN "
        f"{wd.quote_ident(c.name)} TO {wd.quote_ident(new)}"
    )
    w._alter(t, ts, "rename_column", query, replace(t.schema, columns=cols))


def _ddl_add_index(w: Workload, ts: int) -> None:
    t = _any_table(w)
    c = w.rng.choice([x for x in t.schema.columns if x.type not in ("json", "binary")])
    index = IndexSchema(f"idx_{len(t.schema.indexes)}_{ts % 10_000}", (c.id,))
    query = (
        f"ALTER TABLE {wd.qualified(t.schema)} ADD INDEX {wd.quote_ident(index.name)} "
        f"({wd.quote_ident(c.name)})"
    )
    w._alter(t, ts, "add_index", query, replace(t.schema, indexes=(*t.schema.indexes, index)))


def _truncatable(w: Workload) -> list[TableModel]:
    return [t for t in w.tables.values() if t.role in ("scratch", "orders")]


def _ddl_truncate(w: Workload, ts: int) -> None:
    t = w.rng.choice(_truncatable(w))
    w._alter(t, ts, "truncate_table", f"TRUNCATE TABLE {wd.qualified(t.schema)}", t.schema)
    t.clear()


def _ddl_create_table(w: Workload, ts: int) -> None:
    tid = w._next_table_id
    w._next_table_id += 1
    w._scratch_count += 1
    prefix = wd.ODD_SCRATCH_PREFIX if w.config.odd_identifiers else "scratch_"
    schema = wd.scratch_schema(tid, f"{prefix}{w._scratch_count}", w.config.shards_per_table)
    w._create(schema, "scratch", {1}, ts)


def _ddl_drop_table(w: Workload, ts: int) -> None:
    t = w.rng.choice(w._of_role("scratch"))
    tid = t.schema.table_id
    w.flush(tid)
    query = f"DROP TABLE {wd.qualified(t.schema)}"
    w.writer.write_ddl(
        DdlRecord(
            ts, DDLKind.DROP_TABLE, "drop_table", query, (tid,), drops=(tid,), tables={tid: None}
        )
    )
    del w.tables[tid]
    w.dropped.append(tid)


def _ddl_rename_table(w: Workload, ts: int) -> None:
    t = w.rng.choice(w._of_role("scratch"))
    w._renames += 1
    new = f"{t.schema.table.split('~')[0]}~{w._renames}"
    schema = replace(t.schema, table=new)
    query = f"RENAME TABLE {wd.qualified(t.schema)} TO {wd.qualified(schema)}"
    w._alter(t, ts, "rename_table", query, schema)


_DDLS: tuple[tuple[int, Callable[[Workload], bool], Callable[[Workload, int], None]], ...] = (
    (4, lambda w: True, _ddl_add_column),
    (2, lambda w: bool(_droppable(w)), _ddl_drop_column),
    (2, lambda w: bool(_droppable(w)), _ddl_rename_column),
    (2, lambda w: True, _ddl_add_index),
    (1, lambda w: bool(_truncatable(w)), _ddl_truncate),
    (2, lambda w: len(w._of_role("scratch")) < 3, _ddl_create_table),
    (1, lambda w: bool(w._of_role("scratch")), _ddl_drop_table),
    (1, lambda w: bool(w._of_role("scratch")), _ddl_rename_table),
)


# ---------------------------------------------------------------------- Arrow
def _to_arrow(schema: TableSchema, version: int, changes: list[_Change]) -> pa.Table:
    """Buffered changes in the data-file layout of ``schema``."""
    data: dict[str, list[Any]] = {
        "_commit_ts": [c.commit_ts for c in changes],
        "_seq": [c.seq for c in changes],
        "_op": [c.op for c in changes],
        "_schema_version": [version] * len(changes),
    }
    for col in schema.columns:
        data[f"c{col.id}"] = [None if c.after is None else c.after.get(col.id) for c in changes]
    for i, col in enumerate(schema.key_columns):
        data[f"b{col.id}"] = [None if c.before is None else c.before[i] for c in changes]
    return pa.Table.from_pydict(data, schema=data_file_schema(schema))


__all__ = ["ShardLag", "Workload", "WorkloadConfig", "WorkloadError"]
