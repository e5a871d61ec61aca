"""Pinning a syncpoint: views over exactly the files of each table's recorded version."""

from __future__ import annotations

import os

import duckdb
import pytest

from cdc_dagster.dbt import PinError, SyncpointNotFoundError, pin_syncpoint
from cdc_dagster.sinks.delta import DeltaSink
from tests.integration.dbt_build.replica import CF, ORDERS, TABLES, Replica


def test_pin_views_read_exactly_the_syncpoint_versions(replica: Replica, duckdb_path: str) -> None:
    ts = replica.syncpoint()
    replica.transfer()
    pinned = pin_syncpoint(duckdb_path, replica.root, CF, ts)
    with duckdb.connect(duckdb_path, read_only=True) as con:
        for t in TABLES:
            rows = con.execute(f'select count(*) from "{t.database}"."{t.table}"').fetchone()[0]
            assert rows == len(replica.snapshots[ts][t.table_id])
        recorded = con.execute(
            "select database, table_name, delta_version from cdc_meta.pinned_syncpoint"
        ).fetchall()
    assert {(d, n): v for d, n, v in recorded} == {
        (p.database, p.table): p.version for p in pinned.tables
    }


def test_pin_refuses_unknown_syncpoints_and_tables(replica: Replica, duckdb_path: str) -> None:
    ts = replica.syncpoint()
    with pytest.raises(SyncpointNotFoundError, match="no syncpoint at ts"):
        pin_syncpoint(duckdb_path, replica.root, CF, ts + 1)
    with pytest.raises(PinError, match="no table"):
        pin_syncpoint(duckdb_path, replica.root, CF, ts, {("shop", "returns")})


def test_pin_empty_version_gives_typed_empty_view(workdir: str, duckdb_path: str) -> None:
    sink = DeltaSink(os.path.join(workdir, "delta"))
    sink.acquire(CF, ORDERS)  # version 0: the empty table, no data file
    sink.record_syncpoint(CF, 5, [ORDERS])
    pinned = pin_syncpoint(duckdb_path, sink.root, CF, 5)
    assert pinned.tables[0].files == ()
    with duckdb.connect(duckdb_path, read_only=True) as con:
        assert con.execute("select count(*) from shop.orders").fetchone() == (0,)
        types = dict(
            con.execute(
                "select column_name, data_type from information_schema.columns "
                "where table_schema = 'shop' and table_name = 'orders'"
            ).fetchall()
        )
    assert types == {
        "id": "BIGINT",
        "customer_id": "BIGINT",
        "amount": "DECIMAL(12,2)",
        "status": "VARCHAR",
        "placed_at": "TIMESTAMP",
    }


def test_pin_refuses_a_version_whose_files_were_vacuumed(
    replica: Replica, duckdb_path: str
) -> None:
    """A syncpoint recorded after a table's version at it was replaced and vacuumed (its
    slowest table passed it later than the retention): a clear PinError, not DuckDB's."""
    ts = replica.syncpoint()
    pinned = {p.table: p for p in pin_syncpoint(duckdb_path, replica.root, CF, ts).tables}
    victim = next(p for p in pinned.values() if p.files)
    os.remove(victim.files[0])  # what a vacuum past the retention does to a replaced file
    with pytest.raises(PinError, match=r"data file\(s\) are gone .* build a newer syncpoint"):
        pin_syncpoint(duckdb_path, replica.root, CF, ts)
