"""`cdc-dagster changefeed create` with a mysql:// upstream, end to end.

The CLI runs in a subprocess against a private MariaDB, etcd and PostgreSQL: it checks the
upstream (privileges, keyless tables) and refuses with what to change, takes the initial
snapshot with progress, and never prints a literal password. Then the Dagster plane (the
owner sensor with build_sensor_context; puller, capture and DDL runs executed in process
with a local Spark session) replicates snapshot, stream and a DDL into PostgreSQL until the
replica equals the upstream, through capture runs that die between prepare and commit and an
owner restart mid-stream.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import psycopg
import pytest
from test_binlog_puller import execute

from cdc_dagster import admin
from cdc_dagster.defs import build_definitions
from cdc_dagster.defs.catalog import catalog_from_changelog
from cdc_dagster.defs.partitions import CAPTURES
from cdc_dagster.defs.resources import CdcResource
from cdc_dagster.testing.dagster import evaluate_sensor, owner_ticked

REPO = Path(__file__).resolve().parents[3]
PASSWORD = "Lit3ral-s3cret"


@pytest.fixture
def cdc_user(mariadb) -> Iterator[str]:
    """A replication user with exactly the privileges the docs list."""
    name = f"cdc_{uuid.uuid4().hex[:6]}"
    c = mariadb.connect()
    with c.cursor() as cur:
        cur.execute(f"CREATE USER '{name}'@'%' IDENTIFIED BY '{PASSWORD}'")
        cur.execute(f"GRANT SELECT, REPLICATION SLAVE, BINLOG MONITOR ON *.* TO '{name}'@'%'")
    c.close()
    yield name
    c = mariadb.connect()
    c.cursor().execute(f"DROP USER IF EXISTS '{name}'@'%'")
    c.close()


def _cli(etcd: list[str], cluster: str, state: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "CDC_PW": PASSWORD, "PG_PW": "unused-by-trust"}
    cmd = [sys.executable, "-m", "cdc_dagster.cli", "--etcd", ",".join(etcd),
           "--cluster-id", cluster, "--state-dir", str(state), *argv]  # fmt: skip
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180, check=False)


def _create(etcd, cluster, state, upstream: str, sink: str, *filters: str):
    flags = [x for f in filters for x in ("--filter", f)]
    return _cli(etcd, cluster, state, "changefeed", "create", "-c", "shop",
                "--upstream-uri", upstream, "--sink-uri", sink, *flags)  # fmt: skip


def test_create_refuses_with_what_to_change_and_never_prints_a_literal_password(
    mariadb, mydb, cdc_user, etcd_endpoints, cluster_id, metastore, tmp_path
):
    execute(mariadb, mydb, "CREATE TABLE orders (id INT PRIMARY KEY)",
            "CREATE TABLE nokey (a INT, b INT)", "CREATE TABLE tmp_x (a INT)")  # fmt: skip
    state = tmp_path / "state"
    sink = f"delta://{tmp_path / 'lake'}"  # reachable: the upstream's checks are what fail
    literal = f"mysql://{cdc_user}:{PASSWORD}@127.0.0.1:{mariadb.port}/?server-id=4242"
    res = _create(etcd_endpoints, cluster_id, state, literal, sink, f"{mydb}.*", f"!{mydb}.tmp_*")
    assert res.returncode == 1
    assert f"tables without a primary key or NOT NULL unique key: {mydb}.nokey;" in res.stderr
    assert "tmp_x" not in res.stderr  # filtered out, so not refused
    assert PASSWORD not in res.stdout + res.stderr
    assert metastore.changefeeds.list() == []
    assert not (state / "mysql" / "shop").exists()  # nothing half-written

    c = mariadb.connect()
    c.cursor().execute(f"REVOKE REPLICATION SLAVE, BINLOG MONITOR ON *.* FROM '{cdc_user}'@'%'")
    c.close()
    ref = f"mysql://{cdc_user}:${{CDC_PW}}@127.0.0.1:{mariadb.port}/?server-id=4242"
    res = _create(etcd_endpoints, cluster_id, state, ref, sink, f"{mydb}.orders")
    assert res.returncode == 1
    assert (
        "the user lacks REPLICATION SLAVE, BINLOG MONITOR: GRANT REPLICATION SLAVE, "
        "BINLOG MONITOR ON *.* TO the puller's user" in res.stderr
    )
    assert "${CDC_PW}" in res.stderr and PASSWORD not in res.stdout + res.stderr

    wrong = literal.replace(PASSWORD, PASSWORD + "x")
    res = _create(etcd_endpoints, cluster_id, state, wrong, sink, f"{mydb}.orders")
    assert res.returncode == 1 and "Access denied" in res.stderr
    assert PASSWORD not in res.stdout + res.stderr


@pytest.fixture(scope="module")
def spark() -> Iterator[object]:
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["PG_PW"] = "unused-by-trust"  # the sink connects in Spark's python workers
    session = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.executorEnv.PG_PW", "unused-by-trust")
        .getOrCreate()
    )
    # Not stopped: getOrCreate gives this process's one local session, which other modules'
    # session fixtures hold too (stopped here, their tests failed when pytest-xdist ran
    # this module first); the process's end stops it.
    yield session


def _fingerprint(rows: list[tuple]) -> str:
    """Order-independent: the XOR of each row's hash."""
    acc = 0
    for r in rows:
        acc ^= int.from_bytes(hashlib.sha256(repr(tuple(r)).encode()).digest()[:16], "big")
    return f"{len(rows)}:{acc:032x}"


def _upstream_rows(mariadb, db: str, table: str) -> list[tuple]:
    c = mariadb.connect(database=db)
    with c.cursor() as cur:
        cur.execute(f"SELECT * FROM `{table}`")
        rows = [tuple(r) for r in cur.fetchall()]
    c.close()
    return rows


def _pg_rows(pg, db: str, table: str) -> list[tuple] | None:
    with psycopg.connect(pg.dsn("analytics"), autocommit=True) as conn:
        try:
            return [tuple(r) for r in conn.execute(f'SELECT * FROM "{db}"."{table}"').fetchall()]
        except psycopg.errors.UndefinedTable:
            return None


snapshots: list[bool] = []  # per run executed: a snapshot run?


def _round(defs, instance, cursor: str | None, crash_capture: bool = False) -> tuple[str, int]:
    """One owner tick, and every run it requests executed in process. ``crash_capture``: each
    capture run dies after its prepare (phase 1), before it commits. Returns the cursor and
    how many puller runs there were."""
    sensor = defs.get_repository_def().get_sensor_def("cdc_owner")
    result = evaluate_sensor(sensor, instance, cursor=cursor, definitions=defs)
    assert owner_ticked(result), result.skip_reason
    for req in result.dynamic_partitions_requests or []:
        if isinstance(req, dg.AddDynamicPartitionsRequest):
            instance.add_dynamic_partitions(CAPTURES.name, list(req.partition_keys))
    pullers = 0
    for run in result.run_requests or []:
        crash = crash_capture and run.job_name == "capture_tick"
        out = defs.get_job_def(run.job_name).execute_in_process(
            run_config=run.run_config, partition_key=run.partition_key, instance=instance,
            tags=run.tags, raise_on_error=False,
            op_selection=["receive", "prepare"] if crash else None,
        )  # fmt: skip
        assert out.success, (run.job_name, [e.message for e in out.all_events if e.is_failure])
        pullers += run.job_name == "mysql_puller"
        snapshots.append(run.job_name == "mysql_snapshot")
    return result.cursor, pullers


@pytest.mark.slow
def test_create_snapshots_then_the_dagster_plane_replicates_into_postgres(
    mariadb, mydb, cdc_user, pg_server, etcd_endpoints, cluster_id, metastore, dagster_env,
    spark, tmp_path, monkeypatch,
):  # fmt: skip
    execute(mariadb, mydb,
            "CREATE TABLE orders (id INT PRIMARY KEY, qty INT NOT NULL, note VARCHAR(20))",
            "CREATE TABLE items (o INT NOT NULL, n INT NOT NULL, sku VARCHAR(10), PRIMARY KEY (o, n))",
            "CREATE TABLE tmp_scratch (a INT)",
            *[f"INSERT INTO orders VALUES {', '.join(f'({i}, {i % 7}, NULL)' for i in range(k, k + 500))}"
              for k in range(0, 2500, 500)],
            "INSERT INTO items VALUES (1, 1, 'a'), (1, 2, 'b'), (2, 1, '😀')")  # fmt: skip
    with psycopg.connect(pg_server.dsn(), autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS analytics WITH (FORCE)")
        conn.execute("CREATE DATABASE analytics")
    state = tmp_path / "state"
    upstream = f"mysql://{cdc_user}:${{CDC_PW}}@127.0.0.1:{mariadb.port}/?server-id=4242"
    sink = f"postgresql://postgres:${{PG_PW}}@127.0.0.1:{pg_server.port}/analytics"
    res = _create(etcd_endpoints, cluster_id, state, upstream, sink, f"{mydb}.*", f"!{mydb}.tmp_*")
    assert res.returncode == 0, res.stderr
    assert "binlog settings and privileges OK" in res.stdout
    # create returns at once: the rows come in chunks from the Dagster snapshot runs
    assert f"snapshot {mydb}.orders" not in res.stdout
    assert "created changefeed shop" in res.stdout and PASSWORD not in res.stdout + res.stderr
    info = metastore.changefeeds.get("shop").info
    assert "${CDC_PW}" in info.upstream_uri  # the reference is stored, never the secret

    changelog = state / "mysql" / "shop"
    monkeypatch.setenv("CDC_DAGSTER_CHANGELOG", str(changelog))
    monkeypatch.setenv("CDC_DAGSTER_MYSQL_PULL_S", "2")
    monkeypatch.setenv("CDC_PW", PASSWORD)  # where the puller runs (here: in process)
    admin.add_capture(metastore, "c1")
    defs = build_definitions(catalog_from_changelog(changelog, 2000))
    # Writes after the snapshot: streamed by the puller runs, with a DDL in the middle.
    execute(mariadb, mydb, "INSERT INTO orders VALUES (9000, 1, 'new')",
            "UPDATE orders SET qty = 99 WHERE id < 10", "DELETE FROM orders WHERE id = 42",
            "UPDATE items SET n = 3 WHERE o = 1 AND n = 2")  # fmt: skip
    execute(mariadb, mydb, "ALTER TABLE orders ADD COLUMN region VARCHAR(5) NOT NULL DEFAULT 'eu'")
    execute(mariadb, mydb, "UPDATE orders SET region = 'us' WHERE id = 9000",
            "INSERT INTO tmp_scratch VALUES (1)")  # fmt: skip
    want = {t: _fingerprint(_upstream_rows(mariadb, mydb, t)) for t in ("orders", "items")}
    with dg.instance_for_test() as instance:
        cursor, got, rounds, pullers = None, {}, 0, 0
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            rounds += 1
            if rounds == 4:
                CdcResource.forget_owner_loops()  # the owner restarts mid-stream: rebuilt from etcd
            cursor, n = _round(defs, instance, cursor, crash_capture=rounds in (3, 5))
            pullers += n
            got = {t: (_pg_rows(pg_server, mydb, t) or []) for t in want}
            if {t: _fingerprint(r) for t, r in got.items()} == want:
                break
        assert {t: _fingerprint(r) for t, r in got.items()} == want, {
            t: len(r) for t, r in got.items()
        }
    assert _pg_rows(pg_server, mydb, "tmp_scratch") is None  # filtered out
    assert rounds > 5 and pullers >= 2  # the crashes happened; the stream came in several runs
    assert any(snapshots)  # the tables' rows came from a snapshot run
