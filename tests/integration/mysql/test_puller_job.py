"""The binlog puller as Dagster runs: the owner sensor (real owner tick, real etcd) requests
them, execute_in_process runs them against a private MariaDB, and they resume, report and
fail the way docs/mysql-postgres.md says."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.test_utils import create_run_for_test
from test_binlog_puller import changes, execute, gtid_now, table_id

from cdc_dagster import admin
from cdc_dagster.defs import build_definitions
from cdc_dagster.defs.catalog import Catalog
from cdc_dagster.defs.handoff import AHEAD_TAG, handoff_s
from cdc_dagster.defs.mysql.job import binlog_asset_key
from cdc_dagster.defs.mysql.requests import (
    CHANGEFEED_TAG,
    PULLER_JOB,
    SNAPSHOT_JOB,
    UPSTREAM_TAG,
)
from cdc_dagster.metastore.changefeeds import ChangefeedState
from cdc_dagster.mysql.snapshot_runner import run_snapshot_reads
from cdc_dagster.testing.dagster import evaluate_sensor, owner_ticked


@pytest.fixture
def defs() -> dg.Definitions:
    return build_definitions(Catalog(()))


def _tick(
    defs: dg.Definitions, instance: dg.DagsterInstance, cursor: str | None
) -> dg.SensorResult:
    sensor = defs.get_repository_def().get_sensor_def("cdc_owner")
    result = evaluate_sensor(sensor, instance, cursor=cursor, definitions=defs)
    assert owner_ticked(result), result.skip_reason
    return result


def _pullers(result: dg.SensorResult) -> list[dg.RunRequest]:
    return [r for r in result.run_requests or [] if r.job_name == PULLER_JOB]


def _execute(defs: dg.Definitions, instance: dg.DagsterInstance, req: dg.RunRequest):
    return defs.get_job_def(PULLER_JOB).execute_in_process(
        run_config=req.run_config, instance=instance, tags=req.tags, raise_on_error=False
    )


def _create(metastore, mariadb, db: str, root: Path, cf: str = "shop") -> object:
    return admin.create_changefeed(
        metastore, cf, f"delta://{root.parent / 'lake'}", table_filter=(f"{db}.*",),
        upstream_uri=mariadb.uri(query="server-id=4242"), changelog_root=str(root),
    )  # fmt: skip


def test_owner_sensor_launches_bounded_puller_runs_that_resume_and_report(
    mariadb, mydb, metastore, dagster_env, defs, tmp_path, monkeypatch
):
    monkeypatch.setenv("CDC_DAGSTER_MYSQL_PULL_S", "3")
    execute(mariadb, mydb, "CREATE TABLE t (id INT PRIMARY KEY, v INT)",
            "INSERT INTO t VALUES (1, 1), (2, 2)")  # fmt: skip
    root = tmp_path / "cl"
    cf = _create(metastore, mariadb, mydb, root)
    tid = table_id(root, "t")
    assert changes(root, tid) == []  # create returns at once: no rows yet
    execute(mariadb, mydb, "INSERT INTO t VALUES (3, 3)", "UPDATE t SET v = 20 WHERE id = 2")
    with dg.instance_for_test() as instance:
        first = _tick(defs, instance, None)
        (snap,) = [r for r in first.run_requests or [] if r.job_name == SNAPSHOT_JOB]
        assert snap.tags[CHANGEFEED_TAG] == "shop"
        # the snapshot's chunks (read here, not as Spark tasks), placed by the puller run
        run_snapshot_reads(cf.info.upstream_uri, str(root), parallelism=1)
        (req,) = _pullers(first)
        assert req.tags[UPSTREAM_TAG] == f"127.0.0.1:{mariadb.port}/4242"
        assert req.tags[CHANGEFEED_TAG] == "shop"
        out = _execute(defs, instance, req)
        assert out.success, [e.message for e in out.all_events if e.is_failure]
        rows = changes(root, tid)
        # the chunk was read after both writes: placed after them, what the rows held then
        assert [(r["_op"], r["c1"], r["c2"]) for r in rows] == [
            (1, 3, 3), (2, 2, 20), (1, 1, 1), (1, 2, 20), (1, 3, 3)
        ]  # fmt: skip

        # Progress: an observation per run, and tags in the runs list.
        (event,) = instance.fetch_observations(binlog_asset_key("shop"), limit=10).records
        obs = event.asset_observation
        assert obs.metadata["row_events"].value == 2  # two single-row statements
        assert obs.metadata["binlog_position"].value == gtid_now(mariadb)
        assert isinstance(obs.metadata["row_events_per_s"].value, float)
        assert obs.metadata["resolved_ts_raw"].value > cf.info.start_ts
        run = instance.get_run_by_id(out.run_id)
        assert run.tags["cdc/binlog_position"] == gtid_now(mariadb)

        # A running (or queued) puller of the changefeed: no second request.
        queued = create_run_for_test(
            instance, job_name=PULLER_JOB, tags=req.tags, status=dg.DagsterRunStatus.STARTED
        )
        assert _pullers(_tick(defs, instance, "1")) == []
        instance.report_run_failed(queued)  # it ends

        # The next run resumes at the persisted position: nothing twice.
        execute(mariadb, mydb, "DELETE FROM t WHERE id = 1")
        (req,) = _pullers(_tick(defs, instance, "2"))
        assert _execute(defs, instance, req).success
        rows = changes(root, tid)
        assert [(r["_op"], r["c1"]) for r in rows[5:]] == [(3, None)]
        assert [r["b1"] for r in rows if r["_op"] == 3] == [1]

        # Paused: no puller runs.
        metastore.changefeeds.pause("shop")
        assert _pullers(_tick(defs, instance, "3")) == []


def test_puller_run_that_cannot_go_on_fails_the_changefeed_with_the_reason(
    mariadb, mydb, metastore, dagster_env, defs, tmp_path, monkeypatch
):
    monkeypatch.setenv("CDC_DAGSTER_MYSQL_PULL_S", "3")
    execute(mariadb, mydb, "CREATE TABLE p (id INT PRIMARY KEY)")
    _create(metastore, mariadb, mydb, tmp_path / "cl")
    execute(mariadb, mydb, "ALTER TABLE p PARTITION BY HASH(id) PARTITIONS 2")
    with dg.instance_for_test() as instance:
        (req,) = _pullers(_tick(defs, instance, None))
        out = _execute(defs, instance, req)
        assert not out.success
        (failure,) = [e for e in out.all_events if e.is_step_failure]
        assert "PARTITION" in failure.message or "PARTITION" in str(failure.event_specific_data)
        # The owner's next tick reads the puller's fatal problem: failed, no relaunch.
        assert _pullers(_tick(defs, instance, "1")) == []
        status = metastore.changefeeds.get("shop").status
        assert status.state is ChangefeedState.FAILED
        assert "binlog puller" in status.last_error and "PARTITION" in status.last_error
        assert "resume" in status.last_error
        assert _pullers(_tick(defs, instance, "2")) == []  # no relaunch until resumed


def test_a_following_puller_run_holds_through_a_pause_and_pulls_again_on_resume(
    mariadb, mydb, metastore, dagster_env, defs, tmp_path, monkeypatch
):
    """Paused, the run stops pulling within seconds and waits (CDC_DAGSTER_MYSQL_PAUSE_HOLD_S)
    for the resume, on which the same run pulls again at once; with no hold left it ends
    within seconds of the pause."""
    monkeypatch.setenv("CDC_DAGSTER_MYSQL_PULL_S", "120")
    monkeypatch.setenv("CDC_DAGSTER_MYSQL_PAUSE_HOLD_S", "60")
    execute(mariadb, mydb, "CREATE TABLE t (id INT PRIMARY KEY, v INT)")
    root = tmp_path / "cl"
    _create(metastore, mariadb, mydb, root)
    tid = table_id(root, "t")

    def ids() -> set[int]:
        return {r["c1"] for r in changes(root, tid)}  # column 1: id

    def within(seconds: float, cond) -> bool:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + seconds
        while not cond() and time.monotonic() < deadline:
            time.sleep(0.1)
        return bool(cond())

    with dg.instance_for_test() as instance:
        (req,) = _pullers(_tick(defs, instance, None))
        assert req.tags["dagster/max_runtime"] == str(120 + 600)
        done: list = []
        runner = threading.Thread(target=lambda: done.append(_execute(defs, instance, req)))
        runner.start()
        deadline = time.monotonic() + 60
        while not changes(root, tid) and time.monotonic() < deadline:  # the run follows
            execute(mariadb, mydb, f"INSERT INTO t VALUES ({int(time.monotonic() * 1000)}, 1)")
            time.sleep(0.5)
        assert changes(root, tid), "the following run wrote nothing in 60 s"
        metastore.changefeeds.pause("shop")
        time.sleep(3.0)  # the run looks at its changefeed every second
        execute(mariadb, mydb, "INSERT INTO t VALUES (1, 1)")  # written while paused
        time.sleep(2.0)
        assert 1 not in ids(), "a paused changefeed's run went on pulling"
        assert runner.is_alive(), "the run ended at the pause instead of holding"
        metastore.changefeeds.resume("shop")
        assert within(5.0, lambda: 1 in ids()), "the held run did not pull again on resume"
        assert runner.is_alive()  # the same run: no owner tick, no run launch
        monkeypatch.setenv("CDC_DAGSTER_MYSQL_PAUSE_HOLD_S", "0")  # read at the next pause
        metastore.changefeeds.pause("shop")
        paused = time.monotonic()
        runner.join(timeout=30)
        assert not runner.is_alive() and done[0].success
        assert time.monotonic() - paused < 5.0
        logs = [e.user_message for e in instance.all_logs(done[0].run_id)]
        assert any("waiting up to 60 s for `changefeed resume`" in m for m in logs), logs
        assert any("resumed: pulling again" in m for m in logs), logs


def test_a_puller_run_hands_over_to_the_next_without_a_gap_or_a_duplicate(
    mariadb, mydb, metastore, dagster_env, defs, tmp_path, monkeypatch
):
    """The rollover (defs/handoff.py): the owner requests the upstream's next puller run
    only as the running one's follow time nears its end; the next waits in its op while the
    first follows on past its time until the next has started; then it resumes where the
    first persisted. Rows written all along land once each."""
    follow_s = 8.0
    monkeypatch.setenv("CDC_DAGSTER_MYSQL_PULL_S", str(follow_s))
    execute(mariadb, mydb, "CREATE TABLE t (id INT PRIMARY KEY, v INT)")
    root = tmp_path / "cl"
    _create(metastore, mariadb, mydb, root)
    tid = table_id(root, "t")
    written: list[int] = []
    writing = threading.Event()

    def writer() -> None:  # ~20 single-row transactions a second, all through the handover
        n = 0
        while not writing.is_set():
            n += 1
            execute(mariadb, mydb, f"INSERT INTO t VALUES ({n}, 1)")
            written.append(n)
            time.sleep(0.05)

    with dg.instance_for_test() as instance:
        (first,) = _pullers(_tick(defs, instance, None))
        done: dict[str, object] = {}

        def run(name: str, req: dg.RunRequest) -> threading.Thread:
            t = threading.Thread(target=lambda: done.update({name: _execute(defs, instance, req)}))
            t.start()
            return t

        writes = threading.Thread(target=writer)
        writes.start()
        started = time.monotonic()
        runner_a = run("a", first)
        started_runs = dg.RunsFilter(job_name=PULLER_JOB, statuses=[dg.DagsterRunStatus.STARTED])
        while not instance.get_runs_count(started_runs) and time.monotonic() - started < 30:
            time.sleep(0.05)
        assert instance.get_runs_count(started_runs) == 1
        n, second = 0, None
        while second is None and time.monotonic() - started < follow_s + 30:
            n += 1
            reqs = _pullers(_tick(defs, instance, str(n)))
            if reqs:
                (second,) = reqs
                # not before the first run's follow time nears its end (handoff_s: 2 s)
                assert time.monotonic() - started > follow_s - handoff_s(follow_s) - 1.0
                assert second.tags[UPSTREAM_TAG] == first.tags[UPSTREAM_TAG]
                # asked for ahead of its need: it takes the newest warm worker
                assert second.tags.get(AHEAD_TAG) == "1" and AHEAD_TAG not in first.tags
            time.sleep(0.3)
        assert second is not None, "no next puller run requested near the end of the first"
        runner_b = run("b", second)
        runner_a.join(timeout=60)
        assert not runner_a.is_alive()
        # while the second run waits for nothing more, no third run is requested
        assert _pullers(_tick(defs, instance, str(n + 1))) == []
        time.sleep(2.0)
        writing.set()
        writes.join()
        runner_b.join(timeout=60)
        assert not runner_b.is_alive()
        a, b = done["a"], done["b"]
        assert a.success and b.success, [e.message for e in b.all_events if e.is_failure]
        logs_a = [e.user_message for e in instance.all_logs(a.run_id)]
        logs_b = [e.user_message for e in instance.all_logs(b.run_id)]
        assert any(f"handed over to run {b.run_id}" in m for m in logs_a), logs_a
        assert any("waiting for its earlier run" in m for m in logs_b), logs_b
        assert any("taking over after" in m for m in logs_b), logs_b
        ids = [r["c1"] for r in changes(root, tid)]
        assert sorted(ids) == written, "rows lost or pulled twice across the handover"


def test_remove_deletes_the_pullers_change_log_and_staging_unless_asked_to_keep_them(
    mariadb, mydb, metastore, tmp_path
):
    execute(mariadb, mydb, "CREATE TABLE r (id INT PRIMARY KEY)")
    kept, gone = tmp_path / "kept", tmp_path / "gone"
    _create(metastore, mariadb, mydb, kept, cf="keep")
    _create(metastore, mariadb, mydb, gone, cf="drop")
    staging = tmp_path / "staging"
    (staging / "drop" / "capture-1").mkdir(parents=True)
    assert (gone / "FORMAT").exists() and (kept / "FORMAT").exists()
    removed = admin.remove_changefeed(metastore, "drop", staging_root=staging)
    assert set(removed) == {gone, staging / "drop"}
    assert not gone.exists() and not (staging / "drop").exists()
    assert admin.remove_changefeed(metastore, "keep", keep_state=True, staging_root=staging) == []
    assert (kept / "FORMAT").exists()
    assert metastore.changefeeds.list() == []


def test_remove_waits_for_the_pullers_lock_before_deleting_its_change_log(
    mariadb, mydb, metastore, tmp_path, monkeypatch
):
    """A puller run sees the removal within a second and stops; its change log was deleted
    under it before, and the run failed (``UnknownTableError``). A puller that does not let
    go within ``REMOVE_WAIT_S`` does not hold the remove up for ever."""
    import fcntl
    import threading

    execute(mariadb, mydb, "CREATE TABLE r (id INT PRIMARY KEY)")
    root = tmp_path / "log"
    _create(metastore, mariadb, mydb, root, cf="busy")
    (root / "puller").mkdir(exist_ok=True)
    holder = open(root / "puller" / "lock", "a+")  # noqa: SIM115 - the puller's flock
    fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
    seen: dict[str, bool] = {}

    def puller_stops() -> None:
        seen["still there"] = (root / "FORMAT").exists()
        holder.close()

    threading.Timer(1.5, puller_stops).start()
    t0 = time.monotonic()
    assert admin.remove_changefeed(metastore, "busy") == [root]
    assert time.monotonic() - t0 >= 1.4
    assert seen == {"still there": True} and not root.exists()
    # One that never lets go: removed anyway once the wait is over.
    other = tmp_path / "other"
    _create(metastore, mariadb, mydb, other, cf="stuck")
    (other / "puller").mkdir(exist_ok=True)
    stuck = open(other / "puller" / "lock", "a+")  # noqa: SIM115
    fcntl.flock(stuck, fcntl.LOCK_EX | fcntl.LOCK_NB)
    monkeypatch.setattr(admin, "REMOVE_WAIT_S", 0.5)
    t0 = time.monotonic()
    try:
        assert admin.remove_changefeed(metastore, "stuck") == [other]
    finally:
        stuck.close()
    assert 0.5 <= time.monotonic() - t0 < 5 and not other.exists()
