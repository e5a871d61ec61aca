"""The embedded workload's configuration and its model of one table (shared by the
generator, its vectorised transfers and its resume): no producer logic here."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from cdc_dagster.schema import TableSchema

Key = tuple[Any, ...]
Row = dict[int, Any]  # column id -> value (Python form of the type map)


class WorkloadError(ValueError):
    """A workload config or target change log is unusable (the message says why)."""


@dataclass(frozen=True, slots=True)
class ShardLag:
    """Shard ``shard`` of table ``table_id`` keeps its resolved mark ``lag_ms`` behind."""

    table_id: int
    shard: int
    lag_ms: int


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    """Everything the workload depends on; the same config writes the same change log.

    Table ids: bank tables ``1..bank_tables``, then customers, orders, wide; scratch
    tables created by DDLs take the next ids.
    """

    seed: int = 0
    bank_tables: int = 2
    rows_per_table: int = 50
    shards_per_table: int = 2
    txns_per_step: int = 100
    lagging: tuple[ShardLag, ...] = ()
    ddls: bool = True
    ddl_every: int = 30  # on average one DDL per this many transactions
    start_physical_ms: int = 1_700_000_000_000
    ms_per_txn: int = 1  # virtual clock step; ignored with wall_clock
    wall_clock: bool = False  # commit ts from the machine's clock (the demo)
    odd_identifiers: bool = True  # quotes, backticks, ; spaces and unicode in names
    initial_balance: Decimal = Decimal("1000.00")
    fsync: bool = True  # False for tests and benchmarks: atomic renames, no disk flushes

    def __post_init__(self) -> None:
        ints = ("bank_tables", "rows_per_table", "shards_per_table", "txns_per_step")
        for name in ints:
            if type(getattr(self, name)) is not int or getattr(self, name) < 1:
                raise WorkloadError(f"{name} must be an int >= 1, got {getattr(self, name)!r}")
        if self.ddl_every < 1 or self.ms_per_txn < 1 or self.start_physical_ms < 0:
            raise WorkloadError("ddl_every and ms_per_txn must be >= 1, start_physical_ms >= 0")
        object.__setattr__(self, "lagging", tuple(self.lagging))
        for lag in self.lagging:
            if lag.shard >= self.shards_per_table or lag.lag_ms < 0:
                raise WorkloadError(f"{lag}: shard must be < shards_per_table, lag_ms >= 0")

    @property
    def customers_id(self) -> int:
        return self.bank_tables + 1

    @property
    def orders_id(self) -> int:
        return self.bank_tables + 2

    @property
    def wide_id(self) -> int:
        return self.bank_tables + 3

    def role(self, table_id: int) -> tuple[str, frozenset[int]]:
        """The role of a table id and the column ids DDLs must not drop or rename."""
        if table_id <= self.bank_tables:
            return "bank", frozenset({1, 2})
        roles = {
            self.customers_id: ("customers", frozenset({1, 2})),
            self.orders_id: ("orders", frozenset({1, 2, 3})),
        }
        return roles.get(
            table_id, ("wide" if table_id == self.wide_id else "scratch", frozenset({1}))
        )


@dataclass(slots=True)
class TableModel:
    """The workload's model of one live table: schema, rows by key, next key and column."""

    schema: TableSchema
    version: int  # commit ts of the DDL record of the current schema
    role: str  # bank, customers, orders, wide, scratch
    rows: dict[Key, Row] = field(default_factory=dict)
    next_key: int = 1
    next_column: int = 0
    protected: frozenset[int] = frozenset()  # column ids DDLs must not drop or rename
    # Keys in a list with their positions: a seeded random pick and a removal in O(1).
    keys: list[Key] = field(default_factory=list)
    pos: dict[Key, int] = field(default_factory=dict)

    def key_of(self, row: Row) -> Key:
        return tuple(row[c] for c in self.schema.primary_key)

    def put(self, key: Key, row: Row) -> None:
        if key not in self.rows:
            self.pos[key] = len(self.keys)
            self.keys.append(key)
        self.rows[key] = row

    def remove(self, key: Key) -> None:
        del self.rows[key]
        i, last = self.pos.pop(key), self.keys.pop()
        if last != key:
            self.keys[i], self.pos[last] = last, i

    def clear(self) -> None:
        self.rows.clear()
        self.keys.clear()
        self.pos.clear()

    def pick(self, rng: random.Random) -> Key | None:
        return self.keys[rng.randrange(len(self.keys))] if self.keys else None


__all__ = ["Key", "Row", "ShardLag", "TableModel", "WorkloadConfig", "WorkloadError"]
