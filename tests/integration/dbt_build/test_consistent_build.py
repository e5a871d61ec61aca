"""dbt builds on one syncpoint while the Delta tables keep being written."""

from __future__ import annotations

import threading
import time

import duckdb
import pytest

from cdc_dagster.dbt import run_build
from cdc_dagster.sinks.delta import read_table_at
from tests.integration.dbt_build.expected import built_models, expected_models
from tests.integration.dbt_build.replica import BALANCE, CF, TABLES, Replica

pytestmark = pytest.mark.slow  # each dbt build is a few seconds of subprocess


def test_build_ignores_versions_written_between_pin_and_build(
    replica: Replica, duckdb_path: str
) -> None:
    replica.transfer()
    replica.shop_step()
    ts = replica.syncpoint()
    total = BALANCE * 40

    def replicate_more(pinned) -> None:
        # Half a cross-table transfer and orders whose customer is not yet committed: the
        # latest Delta state is inconsistent, so a build reading it would fail the tests.
        replica.transfer_half(True)
        replica.shop_step_orders_only()
        latest = sum(
            (
                v
                for t in TABLES[:2]
                for v in read_table_at(replica.root, t).column("balance").to_pylist()
            ),
        )
        assert latest != total  # the negative control: the unpinned state is off

    result = run_build(replica.root, CF, duckdb_path, ts, after_pin=replicate_more)

    assert result.success and result.pinned.ts == ts
    assert result.pinned.versions() == {
        f"{t.database}.{t.table}": v
        for t, v in zip(TABLES, _syncpoint_versions(replica, ts), strict=True)
    }
    assert replica.bank_total(ts) == total
    assert built_models(duckdb_path, ts) == expected_models(replica.snapshots[ts])
    with duckdb.connect(duckdb_path, read_only=True) as con:
        assert con.execute(
            "select syncpoint_ts, success from cdc_meta.syncpoint_builds"
        ).fetchall() == [(ts, True)]


def test_builds_while_replication_runs_see_each_syncpoint_whole(
    replica: Replica, duckdb_path: str
) -> None:
    stop = threading.Event()
    errors: list[BaseException] = []

    def replicate() -> None:
        try:
            while not stop.is_set():
                for _ in range(3):
                    replica.transfer()
                    replica.shop_step()
                replica.syncpoint()
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    writer = threading.Thread(target=replicate, daemon=True)
    writer.start()
    built: list[int] = []
    seconds: list[float] = []
    try:
        for _ in range(2):
            deadline = time.monotonic() + 60
            while not [t for t in list(replica.snapshots) if not built or t > built[-1]]:
                assert time.monotonic() < deadline and not errors, errors
                time.sleep(0.05)
            ts = max(list(replica.snapshots))
            result = run_build(replica.root, CF, duckdb_path, ts)
            seconds.append(result.seconds)
            assert built_models(duckdb_path, ts) == expected_models(replica.snapshots[ts])
            built.append(ts)
    finally:
        stop.set()
        writer.join(60)
    assert not errors, errors
    with duckdb.connect(duckdb_path, read_only=True) as con:
        history = con.execute(
            "select syncpoint_ts, total_balance from main.bank_total_history order by 1"
        ).fetchall()
    assert history == [(ts, BALANCE * 40) for ts in built]
    print(f"build seconds per syncpoint: {[round(s, 2) for s in seconds]}")


def _syncpoint_versions(replica: Replica, ts: int) -> list[int]:
    from cdc_dagster.sinks.delta import read_syncpoint

    record = read_syncpoint(replica.root, CF, ts)
    return [record.versions[t.table_id] for t in TABLES]


def test_build_survives_upstream_dropping_and_renaming_optional_columns(
    replica: Replica, duckdb_path: str
) -> None:
    from dataclasses import replace

    orders = replica.schemas[4]
    dropped = replace(orders, columns=tuple(c for c in orders.columns if c.name != "status"))
    replica.alter("drop_column", dropped, "ALTER TABLE shop.orders DROP COLUMN status")
    renamed = replace(
        dropped,
        columns=tuple(
            replace(c, name="placed_at~1") if c.name == "placed_at" else c for c in dropped.columns
        ),
    )
    replica.alter(
        "rename_column", renamed, "ALTER TABLE shop.orders RENAME placed_at TO `placed_at~1`"
    )
    replica.shop_step()
    ts = replica.syncpoint()

    run_build(replica.root, CF, duckdb_path, ts)

    models = built_models(duckdb_path, ts)
    assert models == expected_models(replica.snapshots[ts])
    assert {(r[4], r[5]) for r in models["order_facts"]} == {(None, None)}  # status, placed_at
