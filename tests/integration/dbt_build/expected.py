"""The models' queries, run in Python on a replica snapshot (the state at a syncpoint)."""

from __future__ import annotations

from collections import defaultdict
from decimal import Decimal
from typing import Any

import duckdb

from tests.integration.dbt_build.replica import CUSTOMERS, ORDERS, TABLES


def expected_models(snapshot: dict[int, dict[int, dict[str, Any]]]) -> dict[str, set[tuple]]:
    """account_balances, bank_total, order_facts, daily_order_summary as row sets."""
    accounts = {
        (f"{t.table}:{k}", t.table, k, r["owner"], r["balance"])
        for t in TABLES[:2]
        for k, r in snapshot[t.table_id].items()
    }
    customers = snapshot[CUSTOMERS.table_id]
    facts = set()
    daily: dict[Any, list] = defaultdict(lambda: [0, set(), Decimal(0)])
    for k, o in snapshot[ORDERS.table_id].items():
        c = customers.get(o["customer_id"])
        placed = o.get("placed_at")  # a DDL may have dropped or renamed it
        day = placed.date() if placed else None
        facts.add(
            (
                k,
                o["customer_id"],
                c["name"] if c else None,
                o["amount"],
                o.get("status"),
                placed,
                day,
            )
        )
        daily[day][0] += 1
        daily[day][1].add(o["customer_id"])
        daily[day][2] += o["amount"]
    return {
        "account_balances": accounts,
        "bank_total": {(len(accounts), sum((a[4] for a in accounts), Decimal(0)))},
        "order_facts": facts,
        "daily_order_summary": {(d, n, len(cs), rev) for d, (n, cs, rev) in daily.items()},
    }


QUERIES = {
    "account_balances": "select account_key, bank_table, account_id, owner, balance, syncpoint_ts from main.account_balances",
    "bank_total": "select n_accounts, total_balance, syncpoint_ts from main.bank_total",
    "order_facts": "select order_id, customer_id, customer_name, amount, status, placed_at, order_date, syncpoint_ts from main.order_facts",
    "daily_order_summary": "select order_date, n_orders, n_customers, revenue, syncpoint_ts from main.daily_order_summary",
}


def built_models(duckdb_path: str, ts: int) -> dict[str, set[tuple]]:
    """The models as built, each row checked to carry syncpoint ``ts`` (then dropped)."""
    out = {}
    with duckdb.connect(duckdb_path, read_only=True) as con:
        for name, sql in QUERIES.items():
            rows = con.execute(sql).fetchall()
            assert {r[-1] for r in rows} <= {ts}, (
                f"{name} rows stamped {set(r[-1] for r in rows)}, not {ts}"
            )
            out[name] = {tuple(r[:-1]) for r in rows}
    return out


def built_pg_models(conn, ts: int) -> dict[str, set[tuple]]:
    """The models as built in PostgreSQL (schema ``cdc_models``), each row stamped ``ts``."""
    out = {}
    for name, sql in QUERIES.items():
        rows = conn.execute(sql.replace(" main.", " cdc_models.")).fetchall()
        assert {r[-1] for r in rows} <= {ts}, f"{name} rows stamped {set(r[-1] for r in rows)}"
        out[name] = {tuple(r[:-1]) for r in rows}
    return out
