"""The runtime with the real SparkTableExecutor and Delta sink: replicate, move, crash."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from upstream_helpers import RowUpstream

pytest.importorskip("cdc_dagster.pipeline.executor")
from cdc_dagster.metastore import Metastore
from cdc_dagster.runtime import spark_executor_factory
from cdc_dagster.testing.driver import Driver

pytestmark = pytest.mark.slow  # a Spark session and a Spark job per capture half


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from cdc_dagster.pipeline.engine import spark_session

    yield spark_session(
        os.environ.get("CDC_SPARK_MASTER", "local[2]"),
        conf={"spark.sql.shuffle.partitions": "2"},
    )


def delta_content(root: Path, table_id: int) -> dict[int, str]:
    """A table's rows read through file_uris() (not to_pyarrow_table: delta-rs#2184)."""
    import pyarrow.parquet as pq
    from deltalake import DeltaTable

    dt = DeltaTable(str(root / "db" / f"t{table_id}"))
    out: dict[int, str] = {}
    for uri in dt.file_uris():
        t = pq.read_table(uri.removeprefix("file://"), columns=["id", "v"])
        out.update(zip(t["id"].to_pylist(), t["v"].to_pylist(), strict=True))
    return out


def _driver(
    spark: Any, metastore: Metastore, tmp_path: Path, up: RowUpstream, lake: Path, captures: int = 2
) -> Driver:
    """The in-process driver on the Spark executor into Delta at ``lake``, from ``up``."""
    return Driver(
        tmp_path / "state",
        up.root,
        f"delta://{lake}",
        captures,
        spark_executor_factory(spark),
        metastore=metastore,
        start_ts=up.start_ts,
        lease_ttl_s=60,  # a driver tick of Spark jobs takes seconds per capture
    )


def test_spark_executor_replicates_to_delta_with_a_move_mid_load(
    spark: Any, metastore: Metastore, tmp_path: Path
) -> None:
    up = RowUpstream(tmp_path / "changelog", tables=3)
    lake = tmp_path / "lake"
    driver = _driver(spark, metastore, tmp_path, up, lake)
    for _ in range(3):
        up.write_step()
    driver.run_until(lambda t: driver.caught_up(t, up.resolved), max_ticks=30)
    tables = driver.tick().owner.changefeeds["cf"].tables
    moved = next(t.table_id for t in tables if t.capture_id == "capture-0")
    driver.move_table(moved, "capture-1")
    for _ in range(4):
        up.write_step()
        driver.tick()
    driver.run_until(lambda t: driver.caught_up(t, up.resolved), max_ticks=30)
    final = {t.table_id: t.capture_id for t in driver.tick().owner.changefeeds["cf"].tables}
    assert final[moved] == "capture-1"
    for tid in up.table_ids:
        assert delta_content(lake, tid) == up.content[tid], tid


def test_spark_capture_killed_after_its_delta_write_carries_on_in_a_new_process(
    spark: Any, metastore: Metastore, tmp_path: Path, etcd_endpoints: list[str], cluster_id: str
) -> None:
    import json
    import signal
    import subprocess
    import sys

    proc_py = Path(__file__).with_name("capture_proc.py")
    codes: list[int] = []

    def in_subprocess(kill: str):  # type: ignore[no-untyped-def]
        def run(ctx: Any, config: dict) -> None:
            argv = [sys.executable, str(proc_py), ",".join(etcd_endpoints), cluster_id]
            argv += [ctx.changefeed_id, ctx.capture_id, str(ctx.staging_root)]
            argv += [json.dumps(config), kill, "spark"]
            p = subprocess.run(argv, capture_output=True, text=True, timeout=300)
            codes.append(p.returncode)
            assert p.returncode in (0, -signal.SIGKILL), (
                p.stderr[:3000] + " ... " + p.stderr[-3000:]
            )

        return run

    up = RowUpstream(tmp_path / "changelog", tables=2)
    lake = tmp_path / "lake"
    driver = _driver(spark, metastore, tmp_path, up, lake)
    for _ in range(2):
        up.write_step()
    driver.run_until(lambda t: driver.caught_up(t, up.resolved), max_ticks=30)
    up.write_step()
    up.write_step()
    driver.tick(runner={"capture-1": in_subprocess("commit-before-save")})
    driver.tick(runner={"capture-1": in_subprocess("none")})
    assert codes == [-signal.SIGKILL, 0]
    driver.run_until(lambda t: driver.caught_up(t, up.resolved), max_ticks=30)
    for tid in up.table_ids:
        assert delta_content(lake, tid) == up.content[tid], tid


def test_generator_workload_with_ddls_through_the_driver_equals_the_oracle(
    spark: Any, metastore: Metastore, tmp_path: Path
) -> None:
    import time

    from cdc_dagster.sinks.delta import read_table_at
    from cdc_dagster.upstream.changelog import ChangeLog
    from cdc_dagster.upstream.generator import Workload, WorkloadConfig
    from cdc_dagster.upstream.oracle import Oracle, fingerprint
    from scheduler_core.ts import compose

    start_ms = int(time.time() * 1000) - 600_000
    cfg = WorkloadConfig(
        seed=3,
        bank_tables=2,
        rows_per_table=10,
        shards_per_table=2,
        txns_per_step=25,
        ddl_every=6,
        ms_per_txn=40,  # 75 transactions span 3 s: at least two 1 s syncpoints fall inside
        start_physical_ms=start_ms,
        fsync=False,
    )
    root = tmp_path / "changelog"
    workload = Workload(cfg, root)
    workload.advance_resolved()
    lake = tmp_path / "lake"
    driver = Driver(
        tmp_path / "state",
        root,
        f"delta://{lake}",
        2,
        spark_executor_factory(spark),
        metastore=metastore,
        # Just before the bootstrap's first rows (the tables' creates come first).
        start_ts=compose(start_ms + cfg.bank_tables + 3) - 1,
        lease_ttl_s=120,
        sync_point_interval_s=1,
    )
    for _ in range(3):
        workload.step()
        workload.advance_resolved()
        driver.tick()
    target = workload.advance_resolved()
    driver.run_until(lambda t: driver.caught_up(t, target), max_ticks=60)
    oracle = Oracle(root)
    log = ChangeLog(root)
    tables = log.tables_at(target)
    ddls = log.ddl_records(after_ts=compose(start_ms + cfg.bank_tables + 3))
    assert len(ddls) >= 3, "the workload should have run DDLs through their gates"
    for tid, schema in tables.items():
        actual = read_table_at(str(lake), schema)
        cdc = [c for c in actual.column_names if c.startswith("_cdc")]
        expected = fingerprint(oracle.table_at(tid, target))
        assert fingerprint(actual, ignore_columns=cdc) == expected, schema.qualified_name
    # Every syncpoint: each table at its recorded Delta version equals the oracle at the
    # syncpoint's ts, and the bank total (transfers only move money) is the same at all.
    import pyarrow.compute as pc

    from cdc_dagster.sinks.delta import read_syncpoint
    from cdc_dagster.sinks.delta_syncpoint_file import list_syncpoints
    from scheduler_core.ts import MAX_TS

    points = list_syncpoints(str(lake), "cf")
    assert len(points) >= 2, "the workload should span several syncpoints"
    # The bootstrap funds each bank table in a transaction of its own: the total is constant
    # (transfers only move money) from the last table's funding on, not before.
    funded_at = max(
        min(pc.min(log.read_data_file(f).column("_commit_ts")).as_py()
            for f in log.data_files(tid, 0, MAX_TS))
        for tid, s in tables.items() if s.database == "bank"
    )  # fmt: skip
    assert any(ts >= funded_at for ts in points), "no syncpoint after the bootstrap"
    totals = set()
    for ts in points:
        record = read_syncpoint(str(lake), "cf", ts)
        assert record is not None
        # Every table that existed at the syncpoint, and only those: a 1 s syncpoint may
        # fall between the bootstrap's creates of the bank tables.
        at_ts = log.tables_at(ts)
        assert sorted(record.locations) == sorted(at_ts), ts
        bank = [t for t, s in at_ts.items() if s.database == "bank"]
        total = 0
        for tid, location in record.locations.items():
            at = read_table_at(str(lake), location, record.versions[tid])
            cdc = [c for c in at.column_names if c.startswith("_cdc")]
            assert fingerprint(at, ignore_columns=cdc) == fingerprint(oracle.table_at(tid, ts)), (
                ts,
                location,
            )
            if tid in bank:
                total += sum(v for v in at.column("balance").to_pylist() if v is not None)
        # A syncpoint may fall between the bootstrap's creates and its funding inserts (a
        # 1 s interval): there the upstream itself holds less money (or none) yet.
        assert total == oracle.bank_total_at(ts, bank), ts
        if ts >= funded_at:
            totals.add(total)
    assert len(totals) == 1, f"bank total differs between funded syncpoints: {totals}"


def test_a_corrupt_change_log_file_warns_naming_table_and_file_and_heals_when_restored(
    spark: Any, metastore: Metastore, tmp_path: Path
) -> None:
    """Issue 18: the stall is seen in the changefeed's state (not an INFO line in a run that
    stays green), with the table, the file and what to do; the other table goes on; putting
    the file back heals it with no one touching the changefeed."""
    import shutil

    from cdc_dagster.metastore import ChangefeedState

    up = RowUpstream(tmp_path / "changelog", tables=2)
    lake = tmp_path / "lake"
    driver = _driver(spark, metastore, tmp_path, up, lake, captures=1)
    up.write_step()
    driver.run_until(lambda t: driver.caught_up(t, up.resolved), max_ticks=30)
    up.write_step()
    victim = sorted((up.root / "tables" / "1" / "data").rglob("*.parquet"))[-1]
    backup = tmp_path / "backup.parquet"
    shutil.copy(victim, backup)
    victim.write_bytes(victim.read_bytes()[:40])  # truncated
    other = up.write_step()

    def warned(_: Any) -> bool:
        return metastore.changefeeds.get("cf").status.state is ChangefeedState.WARNING

    driver.run_until(warned, max_ticks=10)
    error = metastore.changefeeds.get("cf").status.last_error
    assert "table 1" in error and victim.name in error, error
    assert "restore" in error or "rewrite" in error, error  # what to do
    assert not error.endswith("tha"), error  # the whole message, not a cut-off one

    def other_caught_up(tick: Any) -> bool:
        feed = tick.owner.changefeeds.get("cf")
        return any(t.table_id == 2 and t.checkpoint_ts >= other for t in feed.tables)

    driver.run_until(other_caught_up, max_ticks=10)  # the other table goes on meanwhile

    shutil.copy(backup, victim)  # the cause goes away
    driver.run_until(lambda t: driver.caught_up(t, up.resolved), max_ticks=30)
    driver.tick()
    status = metastore.changefeeds.get("cf").status
    assert (status.state, status.last_error) == (ChangefeedState.NORMAL, ""), status
    for tid in up.table_ids:
        assert delta_content(lake, tid) == up.content[tid], tid


def test_in_process_ticks_never_ask_for_the_spark_session_and_jobs_do(
    spark: Any, metastore: Metastore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Small ticks run in the capture run's process: with Spark Connect down (the session
    function fails) replication goes on; a tick that needs a job asks for the session, and
    so does one small in bytes that moves more rows than the in-process limit; a bulk one
    runs in the background worker."""
    up = RowUpstream(tmp_path / "changelog", tables=2)
    lake = tmp_path / "lake"
    asked: list[str] = []

    def spark_is_down() -> Any:
        asked.append("in process")
        raise RuntimeError("Spark Connect is down")

    driver = Driver(
        tmp_path / "state", up.root, f"delta://{lake}", 1,
        spark_executor_factory(spark_is_down, local_max_bytes=1 << 30, local_max_rows=10**6),
        metastore=metastore, start_ts=up.start_ts, lease_ttl_s=60,
    )  # fmt: skip
    for _ in range(3):
        up.write_step()
    driver.run_until(lambda t: driver.caught_up(t, up.resolved), max_ticks=30)
    assert asked == []
    for tid in up.table_ids:
        assert delta_content(lake, tid) == up.content[tid], tid

    def session() -> Any:
        asked.append("job")
        return spark

    driver.executor_factory = spark_executor_factory(session, local_max_bytes=0)
    up.write_step()
    driver.run_until(lambda t: driver.caught_up(t, up.resolved), max_ticks=30)
    assert "job" in asked and "in process" not in asked
    for tid in up.table_ids:
        assert delta_content(lake, tid) == up.content[tid], tid

    # Bulk phases (here: every phase) run in the background worker, niced; still no Spark.
    from cdc_dagster.pipeline import background

    bulk: list[int] = []
    real = background.run_in_background

    def spy(fn: Any, items: Any) -> Any:
        bulk.append(len(items))
        return real(fn, items)

    monkeypatch.setattr(background, "run_in_background", spy)
    asked.clear()
    driver.executor_factory = spark_executor_factory(
        spark_is_down, local_max_bytes=1 << 30, bulk_rows=1
    )
    up.write_step()
    driver.run_until(lambda t: driver.caught_up(t, up.resolved), max_ticks=30)
    assert asked == [] and bulk, bulk
    for tid in up.table_ids:
        assert delta_content(lake, tid) == up.content[tid], tid
    background.shutdown()

    asked.clear()
    driver.executor_factory = spark_executor_factory(
        session, local_max_bytes=1 << 30, local_max_rows=1
    )
    up.write_step()
    driver.run_until(lambda t: driver.caught_up(t, up.resolved), max_ticks=30)
    assert "job" in asked and "in process" not in asked
    for tid in up.table_ids:
        assert delta_content(lake, tid) == up.content[tid], tid


def test_a_failing_delta_vacuum_warns_its_changefeed_and_heals_once_one_succeeds(
    spark: Any, metastore: Metastore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The vacuum's clock cannot be kept (a file where its directory goes): every write's
    vacuum fails in the Spark tasks, the data still lands, and the owner says so in the
    changefeed's state; once the cause is gone and a vacuum succeeds, the state is normal."""
    import time

    from cdc_dagster.metastore import ChangefeedState
    from cdc_dagster.runtime import owner
    from cdc_dagster.sinks import delta_vacuum

    monkeypatch.setattr(owner, "SINK_LOOK_S", 0.0)  # look every tick (30 s otherwise)
    up = RowUpstream(tmp_path / "changelog", tables=2)
    lake = tmp_path / "lake"
    blocker = lake / "_cdc_dagster" / "vacuum"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("in the vacuum's way")
    driver = _driver(spark, metastore, tmp_path, up, lake)
    for _ in range(2):
        up.write_step()
    driver.run_until(lambda t: driver.caught_up(t, up.resolved), max_ticks=30)
    driver.tick()
    status = metastore.changefeeds.get("cf").status
    assert status.state is ChangefeedState.WARNING, status
    assert status.last_error.startswith("[vacuum] the Delta VACUUM of 2 table(s) fails")
    assert "NotADirectoryError" in status.last_error and "Replication goes on" in status.last_error
    assert "vacuum_retention_hours=off" in status.last_error
    for tid in up.table_ids:
        assert delta_content(lake, tid) == up.content[tid], tid

    blocker.unlink()  # the cause goes; the next writes start the tables' clocks
    up.write_step()
    driver.run_until(lambda t: driver.caught_up(t, up.resolved), max_ticks=30)
    markers = [
        os.path.join(d, n) for d, _, names in os.walk(blocker) for n in names
    ]  # fmt: skip
    assert len(markers) == 2
    old = time.time() - delta_vacuum.VACUUM_EVERY_S - 1
    for m in markers:  # as if the interval had passed
        os.utime(m, (old, old))
    up.write_step()
    driver.run_until(lambda t: driver.caught_up(t, up.resolved), max_ticks=30)
    driver.tick()
    status = metastore.changefeeds.get("cf").status
    assert (status.state, status.last_error) == (ChangefeedState.NORMAL, ""), status
    assert delta_vacuum.failures(str(lake)) == []
    for tid in up.table_ids:
        assert delta_content(lake, tid) == up.content[tid], tid
