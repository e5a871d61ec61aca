"""dbt on a PostgreSQL downstream: builds on the copies taken at each syncpoint.

The real ``PostgresSink`` writes the four tables into a private PostgreSQL; syncpoints are
recorded the way the owner records them (every table committed up to the barrier, then
``record_syncpoint``), which copies the tables the models read. Builds run while a writer
thread keeps replicating, and between pinning and building half a transfer lands.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest

from cdc_dagster.dbt import pg
from cdc_dagster.metastore import Metastore
from cdc_dagster.sinks.postgres import PostgresSink
from cdc_dagster.testing.dagster import evaluate_sensor
from cdc_dagster.testing.servers import EmbeddedServerError, PrivatePostgres
from tests.integration.dbt_build.expected import built_pg_models, expected_models
from tests.integration.dbt_build.replica import BALANCE, CF, TABLES, Replica

pytestmark = pytest.mark.slow
SOURCES = {(t.database, t.table) for t in TABLES}


@pytest.fixture(scope="module")
def pg_server() -> Iterator[PrivatePostgres]:
    base = os.environ.get("CDC_DBT_TEST_TMP", "/tmp/h-dbt")
    os.makedirs(base, exist_ok=True)
    import tempfile

    server = PrivatePostgres(tempfile.mkdtemp(prefix="pg-", dir=base))
    try:
        server.start()
    except EmbeddedServerError as exc:
        pytest.skip(f"no private PostgreSQL: {exc}")
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture()
def pg_uri(pg_server: PrivatePostgres) -> Iterator[str]:
    """A fresh database per test."""
    name = f"dbt_{time.monotonic_ns()}"
    with psycopg.connect(pg_server.dsn(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    yield pg_server.uri(name)


def _replica(uri: str, register: bool = True) -> Replica:
    if register:  # what the dbt sensor does on its first tick
        assert pg.register_and_list(uri, CF, SOURCES) == []
    return Replica("unused", sink=PostgresSink(uri))


def test_build_reads_the_syncpoint_copy_not_later_commits(pg_uri: str) -> None:
    replica = _replica(pg_uri)
    replica.transfer()
    replica.shop_step()
    ts = replica.syncpoint()

    def replicate_more(pinned) -> None:
        replica.transfer_half(True)  # the live tables now hold money that vanished
        replica.shop_step_orders_only()  # and orders whose customer has not landed
        with pg.connect(pg_uri) as conn:
            (live,) = conn.execute(
                "select (select sum(balance) from bank.accounts_0)"
                " + (select sum(balance) from bank.accounts_1)"
            ).fetchone()
        assert live != BALANCE * 40  # the negative control: the live state is off

    result = pg.run_pg_build(pg_uri, CF, ts, after_pin=replicate_more)

    assert result.success and result.pinned.ts == ts
    assert {t.qualified_name for t in result.pinned.tables} == {f"{d}.{t}" for d, t in SOURCES}
    with pg.connect(pg_uri) as conn:
        assert built_pg_models(conn, ts) == expected_models(replica.snapshots[ts])
        assert conn.execute(
            "select syncpoint_ts, success from cdc_meta.syncpoint_builds"
        ).fetchall() == [(ts, True)]


def test_builds_while_replication_runs_see_each_syncpoint_whole(pg_uri: str) -> None:
    replica = _replica(pg_uri)
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
    seconds: list[tuple[float, float]] = []
    try:
        for _ in range(2):
            deadline = time.monotonic() + 60
            while not [t for t in list(replica.snapshots) if not built or t > built[-1]]:
                assert time.monotonic() < deadline and not errors, errors
                time.sleep(0.05)
            ts = max(list(replica.snapshots))
            result = pg.run_pg_build(pg_uri, CF, ts)
            seconds.append((result.pin_seconds, result.dbt_seconds))
            with pg.connect(pg_uri) as conn:
                assert built_pg_models(conn, ts) == expected_models(replica.snapshots[ts])
            built.append(ts)
    finally:
        stop.set()
        writer.join(60)
    assert not errors, errors
    with pg.connect(pg_uri) as conn:
        history = conn.execute(
            "select syncpoint_ts, total_balance from cdc_models.bank_total_history order by 1"
        ).fetchall()
    assert history == [(ts, BALANCE * 40) for ts in built]
    print(f"PostgreSQL build (pin s, dbt s) per syncpoint: {seconds}")


def test_no_copy_when_a_table_is_not_at_the_syncpoint(pg_uri: str) -> None:
    replica = _replica(pg_uri)
    ts = replica.syncpoint()
    # accounts_0 moves past ts + 1 (two commits, at ts + 1 and ts + 2) with no copy made
    # at ts + 1: a late record of ts + 1 must not copy (a table whose last commit is at or
    # below the record's ts is at it, idle since, and would be copied).
    replica.transfer_half(True)
    replica.transfer_half(True)
    replica.sink.record_syncpoint(CF, ts + 1, list(replica.schemas.values()))
    with pg.connect(pg_uri) as conn:
        assert pg.list_pinned_syncpoints(conn, CF) == [ts]


def test_syncpoint_record_cost_with_and_without_copies(pg_uri: str) -> None:
    """The lag cost: the copy happens while the changefeed waits at the barrier."""
    plain = _replica(pg_uri, register=False)
    for _ in range(20):
        plain.transfer()
        plain.shop_step()

    def record_seconds(n: int) -> list[float]:
        out = []
        for _ in range(n):
            plain.ts += 1
            for t in plain.schemas.values():
                plain.write(t, [], end_ts=plain.ts)
            t0 = time.perf_counter()
            plain.sink.record_syncpoint(CF, plain.ts, list(plain.schemas.values()))
            out.append(time.perf_counter() - t0)
        return out

    without = record_seconds(5)
    pg.register_and_list(pg_uri, CF, SOURCES)
    with_copies = record_seconds(5)
    with pg.connect(pg_uri) as conn:
        assert len(pg.list_pinned_syncpoints(conn, CF)) == 5
        (n,) = conn.execute(
            "select count(*) from cdc_dagster.syncpoint_copies where changefeed = %s", (CF,)
        ).fetchone()
    assert n == 5 * len(TABLES)  # pruning keeps the newest KEEP syncpoints
    print(
        f"record_syncpoint median: {statistics.median(without) * 1000:.1f} ms without copies, "
        f"{statistics.median(with_copies) * 1000:.1f} ms with copies "
        f"({sum(len(v) for v in plain.rows.values())} rows)"
    )


def test_production_sensor_and_run_build_a_postgres_changefeed(
    pg_uri: str,
    monkeypatch: pytest.MonkeyPatch,
    metastore: Metastore,
    etcd_endpoints: list[str],
    cluster_id: str,
) -> None:
    import dagster as dg

    from cdc_dagster.defs import build_definitions
    from tests.integration.dbt_build.test_definitions import catalog

    replica = _replica(pg_uri, register=False)
    metastore.changefeeds.create(CF, pg_uri, sync_point_interval_s=10)  # what the sensor finds
    monkeypatch.setenv("CDC_DAGSTER_ETCD", ",".join(etcd_endpoints))
    monkeypatch.setenv("CDC_DAGSTER_CLUSTER_ID", cluster_id)
    for k in ("CDC_DAGSTER_DBT_DELTA_ROOT", "CDC_DAGSTER_DBT_CHANGEFEED"):
        monkeypatch.delenv(k, raising=False)
    defs = build_definitions(catalog())
    sensor = defs.resolve_sensor_def("dbt_syncpoint_sensor")
    with dg.instance_for_test() as instance:
        first = evaluate_sensor(sensor, instance, definitions=defs)
        assert not first.run_requests  # registered now; copies start at the next syncpoint
        replica.transfer()
        ts = replica.syncpoint()
        result = evaluate_sensor(sensor, instance, definitions=defs, cursor=first.cursor)
        assert [r.tags["cdc/syncpoint_ts"] for r in result.run_requests] == [str(ts)]
        run = defs.resolve_job_def("dbt_build").execute_in_process(
            run_config=result.run_requests[0].run_config, instance=instance
        )
        assert run.success
        mats = run.get_asset_materialization_events()
        assert len(mats) == 8
        for event in mats:
            meta = event.materialization.metadata
            assert meta["syncpoint_ts"].value == ts
            assert meta["downstream"].value == "postgres"
            assert set(meta["table_sources"].value) == {f"{d}.{t}" for d, t in SOURCES}
        assert all(c.passed for c in run.get_asset_check_evaluations())
    with pg.connect(pg_uri) as conn:
        assert built_pg_models(conn, ts) == expected_models(replica.snapshots[ts])
