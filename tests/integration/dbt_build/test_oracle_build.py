"""The models at a syncpoint equal the same queries on the oracle's state at that ts.

The embedded workload writes a change log; a stand-in replicator moves each table into
Delta (real ``DeltaSink``) by diffing the oracle's states, table by table, and records
syncpoints. Between pinning and building, some tables move on to the next ts.
"""

from __future__ import annotations

import os
from decimal import Decimal
from typing import Any

import duckdb
import pyarrow as pa
import pytest

from cdc_dagster.dbt import pin_syncpoint, run_build
from cdc_dagster.schema import TableSchema
from cdc_dagster.sinks.base import COMMIT_TS_COLUMN, OP_COLUMN, OP_DELETE, OP_UPSERT
from cdc_dagster.sinks.delta import DeltaSink
from cdc_dagster.upstream.generator import Workload, WorkloadConfig
from cdc_dagster.upstream.oracle import Oracle
from tests.integration.dbt_build.expected import built_models, expected_models
from tests.integration.dbt_build.replica import CF

pytestmark = pytest.mark.slow


class OracleReplicator:
    """Each table's Delta copy follows the oracle's state (upserts + deletes per batch)."""

    def __init__(self, log_root: str, delta_root: str, table_ids: list[int]) -> None:
        self.oracle = Oracle(log_root)
        self.sink = DeltaSink(delta_root)
        self.table_ids = table_ids
        self.state: dict[int, dict[Any, dict[str, Any]]] = {t: {} for t in table_ids}
        self.committed = dict.fromkeys(table_ids, 0)
        self.tokens: dict[int, int] = {}

    def schema(self, table_id: int, ts: int) -> TableSchema:
        return self.oracle.log.schema_at(table_id, ts)

    def replicate(self, table_id: int, ts: int) -> None:
        """One batch (committed, ts] of ``table_id``: the oracle's diff."""
        schema = self.schema(table_id, ts)
        if table_id not in self.tokens:
            self.tokens[table_id] = self.sink.acquire(CF, schema)
        key = schema.key_columns[0].name
        new = {r[key]: r for r in self.oracle.table_at(table_id, ts).to_pylist()}
        old = self.state[table_id]
        rows = [{**r, OP_COLUMN: OP_UPSERT} for k, r in new.items() if old.get(k) != r]
        rows += [{key: k, OP_COLUMN: OP_DELETE} for k in old if k not in new]
        fields = [f.with_nullable(True) for f in schema.arrow_schema()]
        batch = pa.Table.from_pylist(
            [{**r, COMMIT_TS_COLUMN: ts} for r in rows],
            schema=pa.schema(
                [*fields, pa.field(OP_COLUMN, pa.int8()), pa.field(COMMIT_TS_COLUMN, pa.int64())]
            ),
        )
        self.committed[table_id] = self.sink.write(
            CF, schema, batch, self.committed[table_id], ts, self.tokens[table_id]
        )
        self.state[table_id] = new

    def syncpoint(self, ts: int) -> None:
        for t in self.table_ids:
            self.replicate(t, ts)
        self.sink.record_syncpoint(CF, ts, [self.schema(t, ts) for t in self.table_ids])


def oracle_snapshot(oracle: Oracle, ts: int) -> dict[int, dict[Any, dict[str, Any]]]:
    return {t: {r["id"]: r for r in oracle.table_at(t, ts).to_pylist()} for t in (1, 2, 3, 4)}


def test_models_equal_the_oracle_state_at_the_syncpoint(workdir: str, duckdb_path: str) -> None:
    log, delta = os.path.join(workdir, "changelog"), os.path.join(workdir, "delta")
    config = WorkloadConfig(seed=11, ddls=False, fsync=False, rows_per_table=30, txns_per_step=150)
    w = Workload(config, log)
    w.step()
    ts1 = w.advance_resolved()
    rep = OracleReplicator(log, delta, [1, 2, 3, 4, config.wide_id])
    rep.syncpoint(ts1)
    w.step()
    ts2 = w.advance_resolved()
    total = rep.oracle.bank_total_at(ts1, w.bank_table_ids)
    assert total == Decimal("1000.00") * 60

    def replicate_some(pinned) -> None:
        for table_id in (1, config.orders_id):  # half the changefeed moves on to ts2
            rep.replicate(table_id, ts2)

    run_build(
        delta,
        CF,
        duckdb_path,
        ts1,
        after_pin=replicate_some,
        extra_vars={"expected_bank_total": str(total)},
    )
    assert built_models(duckdb_path, ts1) == expected_models(oracle_snapshot(rep.oracle, ts1))

    rep.syncpoint(ts2)
    run_build(delta, CF, duckdb_path, ts2, extra_vars={"expected_bank_total": str(total)})
    assert built_models(duckdb_path, ts2) == expected_models(oracle_snapshot(rep.oracle, ts2))
    with duckdb.connect(duckdb_path, read_only=True) as con:
        history = con.execute(
            "select syncpoint_ts, total_balance from main.bank_total_history order by 1"
        ).fetchall()
    assert history == [(ts1, total), (ts2, total)]


def test_pin_quotes_odd_table_and_column_names(workdir: str, duckdb_path: str) -> None:
    log, delta = os.path.join(workdir, "changelog"), os.path.join(workdir, "delta")
    config = WorkloadConfig(seed=5, ddls=False, fsync=False, rows_per_table=10, txns_per_step=20)
    w = Workload(config, log)
    w.step()
    ts = w.advance_resolved()
    rep = OracleReplicator(log, delta, [1, 2, 3, 4, config.wide_id])
    rep.syncpoint(ts)
    pinned = pin_syncpoint(duckdb_path, delta, CF, ts)  # every table, the odd wide one too
    wide = rep.schema(config.wide_id, ts)
    odd = [c.name for c in wide.columns if not c.name.isidentifier()]
    assert odd and any(t.table == wide.table for t in pinned.tables)
    quoted_table = '"' + wide.table.replace('"', '""') + '"'
    quoted_col = '"' + odd[0].replace('"', '""') + '"'
    with duckdb.connect(duckdb_path, read_only=True) as con:
        rows = con.execute(
            f"select id, {quoted_col} from types.{quoted_table} order by id"
        ).fetchall()
    expected = rep.oracle.table_at(config.wide_id, ts).select(["id", odd[0]]).to_pylist()
    assert rows == [(r["id"], r[odd[0]]) for r in expected]
