"""A small replicated downstream for the dbt tests: the workload's bank and shop tables
written through the real ``DeltaSink`` (one fenced commit per table and batch, as the
pipeline does), with syncpoints recorded between batches.

The model of each table (key -> row) is kept here, so the expected content at a syncpoint
is known independently of Delta; the tests compare dbt's models with it.
"""

from __future__ import annotations

import datetime as dt
import random
from decimal import Decimal
from typing import Any

import pyarrow as pa

from cdc_dagster.schema import ColumnSchema, DdlRecord, TableSchema
from cdc_dagster.sinks.base import COMMIT_TS_COLUMN, OP_COLUMN, OP_DELETE, OP_UPSERT
from cdc_dagster.sinks.delta import DeltaSink, delta_schema
from scheduler_core.ddl import DDLKind

CF = "cf-dbt"
BALANCE = Decimal("1000.00")


def _col(cid: int, name: str, logical: str, nullable: bool = True) -> ColumnSchema:
    return ColumnSchema(cid, name, logical, nullable)


def bank(table_id: int, index: int) -> TableSchema:
    cols = (
        _col(1, "id", "int64", False),
        _col(2, "balance", "decimal(18,2)", False),
        _col(3, "owner", "string"),
    )
    return TableSchema(table_id, "bank", f"accounts_{index}", cols, (1,))


CUSTOMERS = TableSchema(
    3,
    "shop",
    "customers",
    (_col(1, "id", "int64", False), _col(2, "name", "string", False), _col(3, "email", "string")),
    (1,),
)
ORDERS = TableSchema(
    4,
    "shop",
    "orders",
    (
        _col(1, "id", "int64", False),
        _col(2, "customer_id", "int64", False),
        _col(3, "amount", "decimal(12,2)", False),
        _col(4, "status", "string"),
        _col(5, "placed_at", "datetime"),
    ),
    (1,),
)
TABLES = (bank(1, 0), bank(2, 1), CUSTOMERS, ORDERS)


class Replica:
    """The four tables in Delta under ``root`` (or in ``sink``), a model of each, and a
    commit ts clock."""

    def __init__(self, root: str, accounts: int = 20, seed: int = 7, sink: Any = None) -> None:
        self.sink = sink if sink is not None else DeltaSink(root)
        self.root = root
        self.rng = random.Random(seed)
        self.ts = 1 << 20
        self.rows: dict[int, dict[int, dict[str, Any]]] = {t.table_id: {} for t in TABLES}
        self.tokens = {t.table_id: self.sink.acquire(CF, t) for t in TABLES}
        self.committed = {t.table_id: 0 for t in TABLES}
        self.snapshots: dict[int, dict[int, dict[int, dict[str, Any]]]] = {}
        self.next_id = {t.table_id: 1 for t in TABLES}
        self.schemas = {t.table_id: t for t in TABLES}  # current schemas (DDLs change them)
        for t in TABLES[:2]:
            self.write(t, [self._account(t) for _ in range(accounts)])
        customers = [self._customer() for _ in range(5)]
        self.write(CUSTOMERS, customers)
        self.write(ORDERS, [self._order(c["id"]) for c in customers for _ in range(2)])

    # -- rows ------------------------------------------------------------------------
    def _id(self, t: TableSchema) -> int:
        self.next_id[t.table_id] += 1
        return self.next_id[t.table_id] - 1

    def _account(self, t: TableSchema) -> dict[str, Any]:
        return {"id": self._id(t), "balance": BALANCE, "owner": f"o{self.rng.randrange(9)}"}

    def _customer(self) -> dict[str, Any]:
        i = self._id(CUSTOMERS)
        return {"id": i, "name": f"customer {i} ü'", "email": None}

    def _order(self, customer_id: int) -> dict[str, Any]:
        day = dt.datetime(2026, 1, 1) + dt.timedelta(
            days=self.rng.randrange(4), seconds=self.rng.randrange(80000)
        )
        return {
            "id": self._id(ORDERS),
            "customer_id": customer_id,
            "amount": Decimal(self.rng.randint(1, 99_999)).scaleb(-2),
            "status": self.rng.choice(["new", "paid"]),
            "placed_at": day,
        }

    # -- commits ---------------------------------------------------------------------
    def write(
        self,
        t: TableSchema,
        upserts: list[dict[str, Any]],
        deletes: list[int] = (),
        end_ts: int = 0,
    ) -> int:
        """One sink batch for ``t`` ending at ``end_ts`` (the next ts if 0); the model follows."""
        if not end_ts:
            self.ts += 1
            end_ts = self.ts
        schema = delta_schema(t)
        rows = [{**r, OP_COLUMN: OP_UPSERT} for r in upserts]
        rows += [
            {**dict.fromkeys(c.name for c in t.columns), "id": k, OP_COLUMN: OP_DELETE}
            for k in deletes
        ]
        cols = {
            c.name: pa.array([r.get(c.name) for r in rows], schema.field(c.name).type)
            for c in t.columns
        }
        cols[OP_COLUMN] = pa.array([r[OP_COLUMN] for r in rows], pa.int8())
        cols[COMMIT_TS_COLUMN] = pa.array([end_ts] * len(rows), pa.int64())
        batch = pa.table(cols)
        start = self.committed[t.table_id]
        self.committed[t.table_id] = self.sink.write(
            CF, t, batch, start, end_ts, self.tokens[t.table_id]
        )
        model = self.rows[t.table_id]
        for r in upserts:
            model[r["id"]] = {c.name: r.get(c.name) for c in t.columns}
        for k in deletes:
            model.pop(k, None)
        return self.ts

    def transfer_half(self, debit: bool) -> None:
        """Half a cross-table transfer: only one table's commit (the total is off until the other)."""
        t = TABLES[0] if debit else TABLES[1]
        key = self.rng.choice(sorted(self.rows[t.table_id]))
        row = dict(self.rows[t.table_id][key])
        row["balance"] += Decimal("-10.00") if debit else Decimal("10.00")
        self.write(t, [row])

    def transfer(self) -> None:
        """A cross-table transfer: two per-table commits (a reader of 'latest' may see one)."""
        self.transfer_half(True)
        self.transfer_half(False)

    def shop_step(self) -> None:
        """A new customer and orders for it: orders commit first, as another table's batch may."""
        c = self._customer()
        self.write(self.schemas[ORDERS.table_id], [self._order(c["id"]) for _ in range(2)])
        self.write(self.schemas[CUSTOMERS.table_id], [c])

    def shop_step_orders_only(self) -> None:
        """Orders of a customer whose own commit has not landed (as between two tables' batches)."""
        orders = self.schemas[ORDERS.table_id]
        self.write(orders, [self._order(self.next_id[CUSTOMERS.table_id] + 1000)])

    def syncpoint(self) -> int:
        """Record a syncpoint at the current ts (every table committed up to it)."""
        self.ts += 1
        for t in self.schemas.values():  # the barrier: every table reaches ts (empty batches)
            self.write(t, [], end_ts=self.ts)
        self.sink.record_syncpoint(CF, self.ts, list(self.schemas.values()))
        self.snapshots[self.ts] = {
            k: {i: dict(r) for i, r in v.items()} for k, v in self.rows.items()
        }
        return self.ts

    def alter(self, action: str, after: TableSchema, query: str) -> None:
        """Apply a column DDL downstream (the sink rewrites the table) and to the model."""
        before = self.schemas[after.table_id]
        self.ts += 1
        record = DdlRecord(
            self.ts,
            DDLKind.ALTER_TABLE,
            action,
            query,
            (after.table_id,),
            tables={after.table_id: after},
        )
        self.sink.apply_ddl(CF, record, {after.table_id: before})
        self.schemas[after.table_id] = after
        names = {c.id: c.name for c in after.columns}
        old = {c.name: c.id for c in before.columns}
        self.rows[after.table_id] = {
            k: {names[old[n]]: v for n, v in r.items() if old[n] in names}
            for k, r in self.rows[after.table_id].items()
        }

    def bank_total(self, ts: int) -> Decimal:
        snap = self.snapshots[ts]
        return sum(
            (r["balance"] for t in TABLES[:2] for r in snap[t.table_id].values()), Decimal(0)
        )
