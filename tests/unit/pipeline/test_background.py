"""Bulk tick phases run in a background worker process at low priority."""

from __future__ import annotations

import os
import signal

import pytest

from cdc_dagster.pipeline import background


def _where(_: int) -> tuple[int, int]:
    return os.getpid(), os.getpriority(os.PRIO_PROCESS, 0)


def _die(_: int) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.fixture(autouse=True)
def _fresh_worker() -> object:
    background.shutdown()
    yield
    background.shutdown()


def test_bulk_work_runs_in_another_process_at_background_priority_in_order() -> None:
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    got = background.run_in_background(_where, [1, 2, 3])
    pids = {pid for pid, _ in got}
    assert len(got) == 3 and len(pids) == 1 and os.getpid() not in pids
    assert all(nice == max(mine, background.BULK_NICE) for _, nice in got)
    assert background.run_in_background(abs, [-4, 5, -6]) == [4, 5, 6]  # order kept
    # the worker is kept for the next phases
    assert {pid for pid, _ in background.run_in_background(_where, [1])} == pids
    assert background.run_in_background(abs, []) == []


def test_a_worker_that_dies_fails_that_phase_and_the_next_starts_a_new_one() -> None:
    (first,) = background.run_in_background(_where, [1])
    with pytest.raises(RuntimeError, match="background worker running bulk tick phases died"):
        background.run_in_background(_die, [1])
    (again,) = background.run_in_background(_where, [1])
    assert again[0] != first[0]


def test_a_change_log_is_snapshotting_while_a_generation_directory_is_there(tmp_path) -> None:
    from cdc_dagster.upstream.changelog import SNAPSHOT_DIR, snapshots_in_flight

    assert not snapshots_in_flight(tmp_path)  # never snapshotted
    (tmp_path / SNAPSHOT_DIR / "7").mkdir(parents=True)
    (tmp_path / SNAPSHOT_DIR / "7" / ".released-123-0f").mkdir()  # a removal cut short
    assert not snapshots_in_flight(tmp_path)  # released tables leave their table dirs
    (tmp_path / SNAPSHOT_DIR / "7" / "123").mkdir()
    assert snapshots_in_flight(tmp_path)


def test_a_bulk_pull_waits_for_the_snapshot_reads_of_its_change_log(tmp_path, monkeypatch) -> None:
    """Until the puller released the last snapshotted table (its generation directory
    gone), at most ``max_s``; a change log without snapshots is not waited for."""
    import threading

    from cdc_dagster.upstream.changelog import SNAPSHOT_DIR

    monkeypatch.setattr(background, "SNAPSHOT_POLL_S", 0.05)
    busy, idle = tmp_path / "busy", tmp_path / "idle"
    gen = busy / SNAPSHOT_DIR / "3" / "42"
    gen.mkdir(parents=True)
    idle.mkdir()
    assert background.wait_for_snapshot_reads([str(idle)], max_s=5) < 0.05
    assert 0.3 <= background.wait_for_snapshot_reads([str(busy)], max_s=0.3) < 1.0
    threading.Timer(0.4, gen.rmdir).start()  # released
    waited = background.wait_for_snapshot_reads([str(idle), str(busy)], max_s=10)
    assert 0.4 <= waited < 2.0


def test_only_bulk_pulls_wait_for_snapshot_reads(monkeypatch) -> None:
    """Pulls that move ``bulk_rows`` or more wait; small pulls and sinks do not."""
    from cdc_dagster.pipeline import job, spark_tasks

    waited: list[list[str]] = []
    monkeypatch.setattr(background, "wait_for_snapshot_reads", lambda r: waited.append(list(r)))
    monkeypatch.setattr(background, "run_in_background", lambda fn, items: [{} for _ in items])
    monkeypatch.setattr(spark_tasks, "pull_table", lambda spec: {})
    monkeypatch.setattr(spark_tasks, "sink_table", lambda spec: {})
    big = [{"changelog_root": "/cl", "rows": 60_000}]
    small = [{"changelog_root": "/cl", "rows": 10}]
    job.run(None, "pull", small, local_max_bytes=0, bulk_rows=50_000)
    job.run(None, "sink", big, local_max_bytes=0, bulk_rows=50_000)
    assert waited == []
    job.run(None, "pull", big, local_max_bytes=0, bulk_rows=50_000)
    assert waited == [["/cl"]]
