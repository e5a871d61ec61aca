"""Bulk tick phases run in a background worker process at low priority."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from cdc_dagster.pipeline import background


def _where(_: int) -> tuple[int, int]:
    return os.getpid(), os.getpriority(os.PRIO_PROCESS, 0)


def _loaded(_: int) -> tuple[int, bool]:
    import sys

    from cdc_dagster.sinks import delta

    return os.getpid(), all(
        m in sys.modules for m in ("deltalake", "cdc_dagster.sinks.delta", "pandas")
    ) and os.getpid() == delta._WARMED_PID  # and its first MERGE's set-up was paid


def _die(_: int) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.fixture(autouse=True)
def _fresh_worker() -> object:
    background.shutdown()
    yield
    background.shutdown()


def _span(seconds: float) -> tuple[int, float, float]:
    began = time.time()
    time.sleep(seconds)
    return os.getpid(), began, time.time()


def test_bulk_work_runs_in_other_processes_at_background_priority_in_order() -> None:
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    got = background.run_in_background(_where, [1, 2, 3])
    pids = {pid for pid, _ in got}
    assert len(got) == 3 and 1 <= len(pids) <= background.bulk_workers({})
    assert os.getpid() not in pids
    assert all(nice == max(mine, background.BULK_NICE) for _, nice in got)
    assert background.run_in_background(abs, [-4, 5, -6]) == [4, 5, 6]  # order kept
    # the workers are kept for the next phases: no new process across them
    for _ in range(3):
        pids |= {pid for pid, _ in background.run_in_background(_where, [1, 2, 3, 4])}
    assert len(pids) <= background.bulk_workers({})
    assert background.run_in_background(abs, []) == []


def test_a_phases_tables_run_side_by_side_on_the_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    """One worker wrote a backlog's tables one after another; two write them at once."""
    monkeypatch.setattr(background, "cores", lambda: 2)  # one capture: a worker per core
    background.warm()
    (a_pid, a_began, a_ended), (b_pid, b_began, b_ended) = background.run_in_background(
        _span, [1.5, 1.5]
    )
    assert a_pid != b_pid
    assert max(a_began, b_began) < min(a_ended, b_ended), "the two tables did not overlap"


def test_one_worker_when_configured_runs_them_one_after_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CDC_DAGSTER_BULK_WORKERS", "1")
    (a_pid, _, a_ended), (b_pid, b_began, _) = background.run_in_background(_span, [0.3, 0.3])
    assert a_pid == b_pid and b_began >= a_ended


@pytest.mark.parametrize("bad", ["0", "-1", "two", "65"])
def test_a_bad_worker_count_is_named(bad: str) -> None:
    with pytest.raises(ValueError, match=f"CDC_DAGSTER_BULK_WORKERS='{bad}': expected an integer"):
        background.bulk_workers({"CDC_DAGSTER_BULK_WORKERS": bad})
    assert background.bulk_workers({}) == max(1, background.cores())


def test_a_worker_that_dies_fails_that_phase_and_the_next_starts_a_new_one() -> None:
    (first,) = background.run_in_background(_where, [1])
    with pytest.raises(RuntimeError, match="background worker running bulk tick phases died"):
        background.run_in_background(_die, [1])
    (again,) = background.run_in_background(_where, [1])
    assert again[0] != first[0]


def test_warm_starts_the_workers_with_the_phases_modules_before_the_first_bulk_phase() -> None:
    """A capture run that follows warms the workers as it begins: its first bulk phase (a
    backlog after a resume) found none and paid the start and imports before its work."""
    background.warm()  # returns at once: the workers start beside the caller
    got = background.run_in_background(_loaded, [1, 2, 3, 4])
    assert all(loaded for _, loaded in got), (
        "a worker had not loaded the phases' modules or run its warm-up MERGE"
    )
    pids = {pid for pid, _ in got}
    assert os.getpid() not in pids and len(pids) <= background.bulk_workers({})
    # the same workers serve the phases after it: no new process
    for _ in range(3):
        pids |= {pid for pid, _ in background.run_in_background(_where, [1, 2])}
    assert len(pids) <= background.bulk_workers({})


def test_warm_when_idle_waits_for_idle_cpus_at_most_its_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A capture's next run asks for its workers while it waits for the earlier run: they
    start once a CPU was idle over a look, or when its time is up however busy the
    machine; it returns at once either way."""
    monkeypatch.setattr(background, "IDLE_LOOK_S", 0.1)
    monkeypatch.setattr(background.IdleCores, "MIN_LOOK_S", 0.05)
    warmed: list[float] = []
    monkeypatch.setattr(background, "warm", lambda workers=True: warmed.append(time.monotonic()))
    started = time.monotonic()
    background.warm_when_idle(1.5, idle_cores=(os.cpu_count() or 1) + 1)  # never idle enough
    assert time.monotonic() - started < 0.5 and not warmed
    time.sleep(0.8)
    assert not warmed  # still waiting for idle CPUs
    deadline = time.monotonic() + 10
    while not warmed and time.monotonic() < deadline:
        time.sleep(0.05)
    assert warmed and warmed[0] - started >= 1.5  # its time was up: started anyway
    warmed.clear()
    started = time.monotonic()
    background.warm_when_idle(30.0, idle_cores=0.0)  # not asked to wait: at the first look
    deadline = time.monotonic() + 10
    while not warmed and time.monotonic() < deadline:
        time.sleep(0.05)
    assert warmed and warmed[0] - started < 5.0


class _ScriptedIdle:
    """``IdleCores`` whose looks find the CPUs idle or not as scripted (then idle)."""

    script: list[bool] = []
    looks = 0

    def fewer_than(self, cores: float) -> bool:
        type(self).looks += 1
        return not (self.script.pop(0) if self.script else True)


def test_wait_for_idle_cpus_wants_them_idle_for_steady_s_in_a_row(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A second of idle CPUs between a workload's end and a backlog's drain is no reason to
    start work: the CPUs must be idle at every look over ``steady_s`` (three looks here)."""
    monkeypatch.setattr(background, "IdleCores", _ScriptedIdle)
    look = {"look_s": 0.001, "steady_s": 0.003}
    # idle, busy, idle, idle, busy, then idle: three looks in a row only at the end
    _ScriptedIdle.script, _ScriptedIdle.looks = (
        [True, False, True, True, False, True, True, True],
        0,
    )
    background.wait_for_idle_cpus(1.0, 60.0, **look)
    assert _ScriptedIdle.looks == 8 and not _ScriptedIdle.script  # at the third in a row
    # busy() resets the stretch too (it is asked before the CPUs are looked at)
    _ScriptedIdle.script, _ScriptedIdle.looks = [True, True, True, True], 0
    busy = iter([False, True, False, False, False])
    background.wait_for_idle_cpus(1.0, 60.0, busy=lambda: next(busy, False), **look)
    assert _ScriptedIdle.looks == 4
    # cores <= 0 does not look at all
    _ScriptedIdle.looks = 0
    background.wait_for_idle_cpus(0.0, 60.0, **look)
    assert _ScriptedIdle.looks == 0


def _session(_: int) -> tuple[int, int, str]:
    try:
        with open("/proc/self/autogroup") as f:
            group = f.read().strip()
    except OSError:
        group = ""
    return os.getpid(), os.getsid(0), group if background.AUTOGROUP_NICE else ""


def test_the_worker_is_a_session_of_its_own_whose_autogroup_yields_to_other_sessions() -> None:
    """Under autogroup scheduling a niceness counts only inside a session: the worker has
    its own, at the bulk niceness, so it yields to MariaDB's and Spark's readers too."""
    ((pid, sid, group),) = background.run_in_background(_session, [1])
    assert sid == pid and sid != os.getsid(0)
    if group:  # a kernel with autogroups that let the worker set its niceness
        assert group.endswith(f"nice {background.BULK_NICE}")


def _comm(_: int) -> tuple[int, str]:
    with open("/proc/self/comm") as f:
        return os.getpid(), f.read().strip()


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="Linux's /proc")
def test_a_worker_is_named_so_top_tells_it_from_its_capture_run() -> None:
    """Every worker is named ``cdc bulk`` (``top``, ``ps -o comm``, the benches' CPU by
    role); the process that started them keeps its own name."""
    with open("/proc/self/comm") as f:
        mine = f.read().strip()
    got = background.run_in_background(_comm, [1, 2, 3, 4])
    assert {name for _, name in got} == {background.WORKER_NAME}
    assert os.getpid() not in {pid for pid, _ in got}
    with open("/proc/self/comm") as f:
        assert f.read().strip() == mine


def _parent_then_worker(out: str) -> None:
    """A capture run's stand-in: starts the worker, writes its pid, then waits to be killed."""
    ((pid, _, _),) = background.run_in_background(_session, [1])
    with open(out, "w") as f:
        f.write(str(pid))
    time.sleep(120)


def test_the_worker_ends_when_its_parent_is_killed(tmp_path: Path) -> None:
    """Out of the daemon's process group a stop does not reach it, and a pool worker holds
    its own queue's pipe: it must notice its parent's end itself."""
    out = tmp_path / "pid"
    parent = multiprocessing.get_context("spawn").Process(target=_parent_then_worker,
                                                          args=(str(out),))  # fmt: skip
    parent.start()
    deadline = time.monotonic() + 60
    while not (out.exists() and out.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    worker = int(out.read_text())
    os.kill(parent.pid, signal.SIGKILL)
    parent.join(10)
    deadline = time.monotonic() + 10
    while _running(worker) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = _running(worker)
    if alive:
        os.kill(worker, signal.SIGKILL)
    assert not alive, "the worker outlived its killed parent"


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie of init's has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _autogroup(pid: int) -> str:
    with open(f"/proc/{pid}/autogroup") as f:
        return f.read().strip()


def test_a_sessions_autogroup_niceness_reaches_every_process_it_starts_later() -> None:
    """What the stack does to Spark Connect (``stack.spark_nice``): a process started in a
    session of its own, then its autogroup given a niceness, and a child it starts after
    that -- the wrapper's JVM -- shares it; this process's own group is untouched."""
    if not os.path.exists("/proc/self/autogroup"):
        pytest.skip("a kernel without autogroup scheduling")
    ours = _autogroup(os.getpid())
    proc = subprocess.Popen(["bash", "-c", "read _; sleep 30 & echo $!; wait"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        assert background.set_autogroup_nice(proc.pid, 7)
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
        child = int(proc.stdout.readline())  # started after the write
        assert _autogroup(proc.pid).endswith(" nice 7")
        assert _autogroup(child) == _autogroup(proc.pid)
        assert _autogroup(os.getpid()) == ours
        assert not background.set_autogroup_nice(2**22 + 12345, 7)  # no such process
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_idle_cores_from_proc_stat(tmp_path: Path) -> None:
    """Idle and iowait time over all time, since the last look, as CPUs; a look too short
    says "fewer" (look again), an unknown machine never does."""
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 100 800 0 0 0 0 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")
    idle = background.IdleCores(str(stat))
    assert idle.fewer_than(0.1)  # just looked: not known yet
    assert not idle.fewer_than(0)  # not asked
    # 1000 more jiffies, 250 of them idle or iowait: a quarter of the machine's CPUs
    stat.write_text("cpu  700 0 250 1000 50 0 0 0 0 0\n")
    idle.looked -= background.IdleCores.MIN_LOOK_S
    cpus = os.cpu_count() or 1
    assert idle.since_last() == pytest.approx(cpus * 0.25)
    assert idle.since_last() is None  # nothing more since: not known
    idle.last, idle.looked = (800, 1000), idle.looked - background.IdleCores.MIN_LOOK_S  # the first
    assert idle.fewer_than(cpus * 0.25 + 0.01)
    idle.last, idle.looked = (800, 1000), idle.looked - background.IdleCores.MIN_LOOK_S
    assert not idle.fewer_than(cpus * 0.25 - 0.01)
    stat.write_text("cpu  700 0 250 2000 50 0 0 0 0 0\n")  # then all idle
    idle.looked -= background.IdleCores.MIN_LOOK_S
    assert not idle.fewer_than(cpus * 0.99)
    missing = background.IdleCores(str(tmp_path / "absent"))
    missing.looked -= background.IdleCores.MIN_LOOK_S
    assert not missing.fewer_than(1.0)


def test_warm_pays_this_processs_first_merge_in_a_thread_and_without_workers_only_that(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A capture run's in-process phases MERGE in the run's own process: ``warm`` runs its
    warm-up there too (in a thread: it returns at once), also when bulk phases are off."""
    from cdc_dagster.sinks import delta

    ran: list[int] = []
    monkeypatch.setattr(delta, "warm_up", lambda: ran.append(os.getpid()))
    background.warm(workers=False)
    deadline = time.monotonic() + 10
    while not ran and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ran == [os.getpid()]
    assert background._pool is None  # no worker was started


def test_by_default_the_captures_share_the_cores_between_their_workers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two captures on 2 cores had four workers MERGE a backlog's four tables at once, each
    slower than two workers of two tables each; one capture keeps a worker per core."""
    monkeypatch.setattr(background, "cores", lambda: 2)
    assert background.bulk_workers({}) == 2
    assert background.bulk_workers({}, captures=2) == 1
    assert background.bulk_workers({}, captures=3) == 1  # at least one
    monkeypatch.setattr(background, "cores", lambda: 8)
    assert background.bulk_workers({}, captures=3) == 2
    assert background.bulk_workers({"CDC_DAGSTER_BULK_WORKERS": "4"}, captures=8) == 4  # set
    monkeypatch.setattr(background, "cores", lambda: 1000)
    assert background.bulk_workers({}) == background.MAX_BULK_WORKERS


def test_the_pool_started_after_share_has_the_shared_number_of_workers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(background, "cores", lambda: 2)
    monkeypatch.setattr(background, "_captures", 1)
    background.share(2)
    pids = {pid for pid, _ in background.run_in_background(_where, [1, 2, 3, 4])}
    assert len(pids) == 1 and background._pool_size == 1
    background.shutdown()
    background.share(0)  # at least one capture
    assert background._captures == 1
    pids = {pid for pid, _, _ in background.run_in_background(_span, [0.5, 0.5])}
    assert len(pids) == 2
