"""WarmRunLauncher: runs in warm workers, cold when none is ready, watched and terminated."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from dagster._core.definitions.reconstruct import ReconstructableRepository
from dagster._core.launcher.base import WorkerStatus

from cdc_dagster.services.run_launcher import (
    AHEAD_TAG,
    QUIET_POLL_S,
    WORKER_TAG,
    WarmRunLauncher,
    worker_alive,
)

pytestmark = pytest.mark.slow

JOBS = """
import os, time
from pathlib import Path
import dagster as dg

@dg.op
def note_pid(context):
    Path(os.environ["LAUNCHER_TEST_DIR"], context.run_id + ".comm").write_text(
        Path("/proc/self/comm").read_text().strip() if Path("/proc/self/comm").exists() else "")
    Path(os.environ["LAUNCHER_TEST_DIR"], context.run_id).write_text(str(os.getpid()))

@dg.op
def wait_long(context):
    Path(os.environ["LAUNCHER_TEST_DIR"], context.run_id).write_text(str(os.getpid()))
    for _ in range(600):
        time.sleep(0.1)

@dg.op
def note_nice(context):
    import threading
    seen = []
    t = threading.Thread(target=lambda: seen.append(os.getpriority(os.PRIO_PROCESS, 0)))
    t.start(); t.join()
    Path(os.environ["LAUNCHER_TEST_DIR"], context.run_id + ".nice").write_text(
        f"{os.getpriority(os.PRIO_PROCESS, 0)} {seen[0]}")
    Path(os.environ["LAUNCHER_TEST_DIR"], context.run_id).write_text(str(os.getpid()))

@dg.job(executor_def=dg.in_process_executor)
def quick():
    note_pid()

@dg.job(executor_def=dg.in_process_executor)
def nice():
    note_nice()

@dg.job(executor_def=dg.in_process_executor)
def long():
    wait_long()

@dg.job(name="capture_tick", executor_def=dg.in_process_executor)
def capture_like():
    wait_long()

defs = dg.Definitions(jobs=[quick, nice, long, capture_like])
"""


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    yield from _env(tmp_path, monkeypatch, {"warm_workers": 1, "kill_after_s": 3})


@pytest.fixture
def pool_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: Any) -> Any:
    """A launcher keeping ``request.param`` warm workers."""
    yield from _env(tmp_path, monkeypatch, {"warm_workers": request.param, "kill_after_s": 3})


@pytest.fixture
def busy_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: Any) -> Any:
    """A launcher whose workers import for themselves (no zygote) and whose refills wait
    for more idle CPUs than the machine has, at most ``request.param`` s."""
    config = {"warm_workers": 1, "kill_after_s": 3, "quiet_max_s": float(request.param),
              "quiet_idle_cores": float((os.cpu_count() or 1) + 1), "fork_workers": False}  # fmt: skip
    yield from _env(tmp_path, monkeypatch, config)


@pytest.fixture
def quiet_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: Any) -> Any:
    """A launcher whose workers import for themselves (no zygote) and whose refills wait
    for ``long`` runs, at most ``request.param`` s."""
    config = {"warm_workers": 1, "kill_after_s": 3, "quiet_jobs": ["long"],
              "quiet_max_s": float(request.param), "fork_workers": False}  # fmt: skip
    yield from _env(tmp_path, monkeypatch, config)


def _env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config: dict[str, Any]) -> Any:
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / "launcher_test_jobs.py").write_text(textwrap.dedent(JOBS))
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setenv("LAUNCHER_TEST_DIR", str(out))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(code), os.environ.get("PYTHONPATH", "")]))
    overrides = {
        "run_launcher": {
            "module": "cdc_dagster.services.run_launcher",
            "class": "WarmRunLauncher",
            "config": config,
        }
    }
    (tmp_path / "home").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "home"), overrides=overrides) as instance:
        assert isinstance(instance.run_launcher, WarmRunLauncher)
        repo = ReconstructableRepository.for_module(
            "launcher_test_jobs", "defs", working_directory=str(code)
        )
        yield instance, repo, out, code
        instance.run_launcher.dispose()


def launch(
    instance: dg.DagsterInstance,
    repo: ReconstructableRepository,
    job: str,
    tags: dict[str, str] | None = None,
) -> str:
    recon = repo.get_reconstructable_job(job)
    run = instance.create_run_for_job(
        job_def=recon.get_definition(), job_code_origin=recon.get_python_origin(), tags=tags
    )
    instance.launch_run(run.run_id, workspace=None)  # type: ignore[arg-type]
    return run.run_id


def wait_status(instance: dg.DagsterInstance, run_id: str, timeout_s: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        run = instance.get_run_by_id(run_id)
        if run is not None and run.is_finished:
            return run
        time.sleep(0.1)
    raise AssertionError(f"run {run_id} did not finish: {instance.get_run_by_id(run_id)}")


def worker_line(instance: dg.DagsterInstance, run_id: str) -> str:
    lines = [m for m in messages(instance, run_id) if m.startswith("Run worker pid")]
    assert len(lines) == 1, lines
    return lines[0]


def messages(instance: dg.DagsterInstance, run_id: str) -> list[str]:
    """Every event's message of the run (engine events carry theirs in the Dagster event)."""
    out = []
    for r in instance.all_logs(run_id):
        if r.dagster_event is not None and r.dagster_event.message:
            out.append(r.dagster_event.message)
        elif r.user_message:
            out.append(r.user_message)
    return out


def wait_file(path: Path, timeout_s: float = 60.0) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return int(path.read_text())
        time.sleep(0.05)
    raise AssertionError(f"{path} was not written")


def wait_warm(launcher: WarmRunLauncher, timeout_s: float = 60.0) -> None:
    """Until the pool holds live idle workers (a run handed to one still mid-import waits in
    its input pipe, so the run is warm either way)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        idle = [w for ws in launcher._pool.idle.values() for w in ws]
        if idle and all(w.proc.poll() is None for w in idle):
            return
        time.sleep(0.1)
    raise AssertionError("no warm worker was started")


def test_first_run_is_forked_for_it_then_runs_take_warm_workers_each_in_its_own_process(env):
    """No worker is idle at the first launch: the zygote is started, waited for, and forks
    one for the run (not a cold ``dagster api execute_run``); later runs take idle ones."""
    instance, repo, out, _ = env
    first = launch(instance, repo, "quick")
    assert wait_status(instance, first).status == dg.DagsterRunStatus.SUCCESS
    assert "warm: forked for it from the zygote" in worker_line(instance, first)
    wait_warm(instance.run_launcher)
    pids = []
    for _ in range(2):
        run_id = launch(instance, repo, "quick")
        assert wait_status(instance, run_id).status == dg.DagsterRunStatus.SUCCESS
        line = worker_line(instance, run_id)
        assert "warm" in line, line
        pid = wait_file(out / run_id)
        assert line.startswith(f"Run worker pid {pid} ")  # the op ran in the worker it names
        if Path("/proc/self/comm").exists():  # named after its job: `top` tells runs apart
            assert (out / f"{run_id}.comm").read_text() == "quick"
        tag = instance.get_run_by_id(run_id).tags[WORKER_TAG]
        assert tag.startswith(f"{pid}:")
        pids.append(pid)
        wait_warm(instance.run_launcher)
    assert len(set(pids)) == 2  # one run per process
    assert os.getpid() not in pids


def test_a_warm_worker_of_older_sources_is_retired_unused(env):
    """Edited sources: the idle workers and their zygote are retired unused; the run is
    forked by a new zygote, which imported the new sources."""
    instance, repo, _, code = env
    assert wait_status(instance, launch(instance, repo, "quick")).is_success
    wait_warm(instance.run_launcher)
    stale = [w.proc for ws in instance.run_launcher._pool.idle.values() for w in ws]
    old_zygote = _zygote_pid(instance.run_launcher)
    time.sleep(1.1)  # past the fingerprint's cache
    src = code / "launcher_test_jobs.py"
    os.utime(src, ns=(time.time_ns(), time.time_ns()))
    run_id = launch(instance, repo, "quick")
    assert wait_status(instance, run_id).is_success
    assert "warm: forked for it from the zygote" in worker_line(instance, run_id)
    assert _zygote_pid(instance.run_launcher) != old_zygote
    for proc in stale:
        assert proc.wait(timeout=30) == 0  # ended without a run


def test_terminate_cancels_the_run_and_its_worker_exits(env):
    instance, repo, out, _ = env
    run_id = launch(instance, repo, "long")
    pid = wait_file(out / run_id)
    health = instance.run_launcher.check_run_worker_health(instance.get_run_by_id(run_id))
    assert health.status == WorkerStatus.RUNNING
    assert instance.run_launcher.terminate(run_id)
    assert wait_status(instance, run_id, 30).status == dg.DagsterRunStatus.CANCELED
    tag = instance.get_run_by_id(run_id).tags[WORKER_TAG]
    assert tag.startswith(f"{pid}:")
    deadline = time.monotonic() + 20
    while worker_alive(tag) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not worker_alive(tag)  # the worker ended with its run, no SIGKILL needed
    said = messages(instance, run_id)
    assert not any("SIGKILL" in m for m in said), said


def test_a_frozen_worker_is_killed_after_kill_after_s_and_its_run_canceled(env):
    instance, repo, out, _ = env
    run_id = launch(instance, repo, "long")
    pid = wait_file(out / run_id)
    os.kill(pid, signal.SIGSTOP)
    started = time.monotonic()
    assert instance.run_launcher.terminate(run_id)
    run = wait_status(instance, run_id, 30)
    assert run.status == dg.DagsterRunStatus.CANCELED
    assert time.monotonic() - started >= 2.5  # SIGINT first; SIGKILL only after kill_after_s
    said = messages(instance, run_id)
    assert any("did not stop within 3 s" in m and "SIGKILL" in m for m in said), said


def test_a_worker_killed_mid_run_fails_its_run_with_the_signal(env):
    """The worker is forked (no worker idle yet: forked for the run); not the launcher's
    child, its exit status comes from its zygote."""
    instance, repo, out, _ = env
    run_id = launch(instance, repo, "long")
    assert "warm: forked" in worker_line(instance, run_id)
    pid = wait_file(out / run_id)
    os.kill(pid, signal.SIGKILL)
    run = wait_status(instance, run_id, 30)
    assert run.status == dg.DagsterRunStatus.FAILURE
    said = messages(instance, run_id)
    assert any(f"Run worker pid {pid} was killed by SIGKILL" in m for m in said), said
    health = instance.run_launcher.check_run_worker_health(run)
    assert health.status == WorkerStatus.FAILED and str(pid) in (health.msg or "")


def test_a_run_of_another_python_starts_cold(env):
    instance, repo, _, _ = env
    names = {"python", "python3", f"python3.{sys.version_info.minor}"}
    others = [Path(sys.executable).parent / n for n in sorted(names)]
    others = [p for p in others if p.exists() and str(p) != sys.executable]
    assert others, "the venv has python, python3 and python3.N"
    other = others[0]  # the same environment, another path: not what the pool runs
    recon = ReconstructableRepository.for_module(
        "launcher_test_jobs", "defs", working_directory=str(repo.pointer.working_directory)
    )
    recon = recon._replace(executable_path=str(other))  # type: ignore[attr-defined]
    job = recon.get_reconstructable_job("quick")
    run = instance.create_run_for_job(
        job_def=job.get_definition(), job_code_origin=job.get_python_origin()
    )
    instance.launch_run(run.run_id, workspace=None)  # type: ignore[arg-type]
    assert wait_status(instance, run.run_id).is_success
    assert "cold" in worker_line(instance, run.run_id)


def test_kill_worker_ends_a_frozen_worker_at_once(env):
    instance, repo, out, _ = env
    run_id = launch(instance, repo, "long")
    pid = wait_file(out / run_id)
    os.kill(pid, signal.SIGSTOP)
    run = instance.get_run_by_id(run_id)
    instance.report_run_canceled(run, "hung")  # as force_cancel_hung_runs does, first
    assert instance.run_launcher.kill_worker(run) == f"run worker pid {pid} killed (SIGKILL)"
    deadline = time.monotonic() + 10
    while worker_alive(run.tags[WORKER_TAG]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not worker_alive(run.tags[WORKER_TAG])
    assert instance.run_launcher.kill_worker(run) == ""  # nothing left to kill
    time.sleep(1.0)  # the watcher saw the exit: the run stays canceled, said once
    said = messages(instance, run_id)
    assert instance.get_run_by_id(run_id).status == dg.DagsterRunStatus.CANCELED
    assert sum("was killed" in m or m == "hung" for m in said) == 1, said


def test_a_hung_capture_run_marked_canceled_by_the_owner_has_its_worker_killed(env):
    from cdc_dagster.defs.owner.stale_runs import force_cancel_hung_runs

    instance, repo, out, _ = env
    run_id = launch(instance, repo, "capture_tick")
    pid = wait_file(out / run_id)
    os.kill(pid, signal.SIGSTOP)  # frozen: it never sees its cancellation
    instance.report_run_canceling(instance.get_run_by_id(run_id))
    (line,) = force_cancel_hung_runs(instance, grace_s=0)
    assert line.endswith(f"canceled, run worker pid {pid} killed (SIGKILL)"), line
    assert instance.get_run_by_id(run_id).status == dg.DagsterRunStatus.CANCELED
    deadline = time.monotonic() + 10
    tag = instance.get_run_by_id(run_id).tags[WORKER_TAG]
    while worker_alive(tag) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not worker_alive(tag)


def test_a_warm_worker_imports_at_a_lower_priority_and_runs_at_its_own(env):
    """Workers refilling the pool import at niceness ``PRELOAD_NICE`` (beside the runs
    going); the run they take runs, every thread of it, at the daemon's niceness."""
    from cdc_dagster.services.run_worker import PRELOAD_NICE, lower_priority, restore_priority

    base = os.getpriority(os.PRIO_PROCESS, 0)
    probe = lower_priority()  # what a worker may do here (root, or RLIMIT_NICE)
    restore_priority(probe)
    if probe is None:
        pytest.skip("this user may not raise a priority back: workers import at their own")
    instance, repo, out, _ = env
    assert wait_status(instance, launch(instance, repo, "quick")).is_success
    wait_warm(instance.run_launcher)
    idle = [w for ws in instance.run_launcher._pool.idle.values() for w in ws]
    deadline = time.monotonic() + 30
    while os.getpriority(os.PRIO_PROCESS, idle[0].proc.pid) != PRELOAD_NICE:
        assert time.monotonic() < deadline, "the idle worker was not niced"
        time.sleep(0.05)
    run_id = launch(instance, repo, "nice")
    assert wait_status(instance, run_id).is_success
    assert "warm" in worker_line(instance, run_id)
    assert wait_file(out / run_id) == idle[0].proc.pid
    assert (out / f"{run_id}.nice").read_text() == f"{base} {base}"


SLOW_PRELOAD = """
import os, time
from pathlib import Path
# An import that lasts until the worker is given its priority back (at most 20 s): what a
# replacement's imports are when a run is handed to it before they are done.
base, started = int(os.environ["LAUNCHER_BASE_NICE"]), time.monotonic()
while os.getpriority(os.PRIO_PROCESS, 0) != base and time.monotonic() - started < 20:
    time.sleep(0.05)
Path(os.environ["LAUNCHER_TEST_DIR"], f"preload-{os.getpid()}").write_text(
    f"{os.getpriority(os.PRIO_PROCESS, 0)} {time.monotonic() - started:.1f}")
"""


@pytest.fixture
def slow_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A launcher whose workers import for themselves (no zygote), ``slow_preload``
    (``SLOW_PRELOAD``) among their modules."""
    monkeypatch.setenv("LAUNCHER_BASE_NICE", str(os.getpriority(os.PRIO_PROCESS, 0)))
    config = {"warm_workers": 1, "kill_after_s": 3, "preload_modules": ["slow_preload"],
              "fork_workers": False}  # fmt: skip
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "slow_preload.py").write_text(textwrap.dedent(SLOW_PRELOAD))
    yield from _env(tmp_path, monkeypatch, config)


def test_a_run_handed_to_a_worker_mid_import_finishes_the_imports_at_its_priority(slow_env):
    """A worker still importing when a run is handed to it (the replacement of one taken a
    moment before) gets its priority back at once, not after its imports."""
    from cdc_dagster.services.run_worker import lower_priority, restore_priority

    base = os.getpriority(os.PRIO_PROCESS, 0)
    probe = lower_priority()
    restore_priority(probe)
    if probe is None:
        pytest.skip("this user may not raise a priority back: workers import at their own")
    instance, repo, out, _ = slow_env
    assert wait_status(instance, launch(instance, repo, "quick")).is_success  # cold
    wait_warm(instance.run_launcher)
    worker = idle_workers(instance.run_launcher)[0].proc.pid
    time.sleep(1.0)  # it is in its slow import, niced
    assert not (out / f"preload-{worker}").exists()
    run_id = launch(instance, repo, "nice")
    assert wait_status(instance, run_id).is_success
    assert "warm" in worker_line(instance, run_id)
    assert wait_file(out / run_id) == worker
    nice, waited = (out / f"preload-{worker}").read_text().split()
    assert int(nice) == base and float(waited) < 15, (nice, waited)
    assert (out / f"{run_id}.nice").read_text() == f"{base} {base}"


@pytest.mark.parametrize("pool_env", [2], indirect=True)
def test_a_run_asked_for_ahead_takes_the_newest_worker_the_others_the_oldest(pool_env):
    """A lane's next run (``AHEAD_TAG``: it waits for the run it follows) takes the worker
    started last, which may still be importing; a run that is awaited takes the one
    started first, the likeliest done."""
    instance, repo, out, _ = pool_env
    launcher = instance.run_launcher
    assert wait_status(instance, launch(instance, repo, "quick")).is_success  # forked for it
    deadline = time.monotonic() + 60
    while len(idle_workers(launcher)) < 2:
        assert time.monotonic() < deadline, "the pool was not refilled"
        time.sleep(0.1)
    oldest, newest = (w.proc.pid for w in idle_workers(launcher))
    ahead = launch(instance, repo, "quick", tags={AHEAD_TAG: "1"})
    assert wait_file(out / ahead) == newest
    awaited = launch(instance, repo, "quick")
    assert wait_file(out / awaited) == oldest
    for run_id in (ahead, awaited):
        assert wait_status(instance, run_id).is_success
        assert "warm" in worker_line(instance, run_id)


GATED_PRELOAD = """
import os, time
from pathlib import Path
# An import that lasts while the test keeps its gate closed (at most 60 s).
gate, started = Path(os.environ["LAUNCHER_TEST_DIR"], "gate-open"), time.monotonic()
while not gate.exists() and time.monotonic() - started < 60:
    time.sleep(0.05)
"""


@pytest.fixture
def gated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A launcher keeping 3 warm workers importing for themselves (no zygote), whose
    imports (``gated_preload``) end only while ``out/gate-open`` exists."""
    config = {"warm_workers": 3, "kill_after_s": 3, "preload_modules": ["gated_preload"],
              "fork_workers": False}  # fmt: skip
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "gated_preload.py").write_text(textwrap.dedent(GATED_PRELOAD))
    yield from _env(tmp_path, monkeypatch, config)


def test_runs_asked_for_ahead_take_workers_done_importing_while_one_stays_for_an_awaited_run(
    gated_env,
):
    """Two lanes' next runs launched together (two captures' successors) each take a worker
    done importing, not the replacement the first launch just started (its imports took
    20 s under load: the second successor started after its predecessor's time was up); a
    third takes one still importing, so the last one done stays for a run that is awaited."""
    instance, repo, out, _ = gated_env
    launcher = instance.run_launcher
    gate = out / "gate-open"
    gate.touch()
    assert wait_status(instance, launch(instance, repo, "quick")).is_success  # cold
    deadline = time.monotonic() + 90
    while len([w for w in idle_workers(launcher) if w.ready()]) < 3:
        assert time.monotonic() < deadline, "the pool's workers did not finish importing"
        time.sleep(0.1)
    first, second, third = (w.proc.pid for w in idle_workers(launcher))
    gate.unlink()  # replacements started from now on go on importing
    ahead = []
    for _ in range(3):
        ahead.append(launch(instance, repo, "quick", tags={AHEAD_TAG: "1"}))
        wait_refilled(launcher, 3)  # its replacement started (and importing)
    awaited = launch(instance, repo, "quick")
    gate.touch()
    pids = [wait_file(out / run_id) for run_id in [*ahead, awaited]]
    assert pids[:2] == [third, second]  # the newest done, while another done stays
    assert pids[2] not in (first, second, third)  # a replacement, still importing then
    assert pids[3] == first  # the awaited run: the one done importing left for it
    for run_id in [*ahead, awaited]:
        assert wait_status(instance, run_id).is_success
        assert "warm" in worker_line(instance, run_id)


def wait_refilled(launcher: WarmRunLauncher, n: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while len(idle_workers(launcher)) < n:
        assert time.monotonic() < deadline, "the pool was not refilled"
        time.sleep(0.05)


def idle_workers(launcher: WarmRunLauncher) -> list[Any]:
    return [w for ws in launcher._pool.idle.values() for w in ws if w.proc.poll() is None]


@pytest.mark.parametrize("quiet_env", [300], indirect=True)
def test_the_pool_is_refilled_once_the_quiet_jobs_run_ended(quiet_env):
    """A ``long`` run (a snapshot's reads, in the stack) takes the warm worker: no
    replacement imports while it runs; once it ended, the pool is refilled."""
    instance, repo, out, _ = quiet_env
    launcher = instance.run_launcher
    assert wait_status(instance, launch(instance, repo, "quick")).is_success
    wait_warm(launcher)
    run_id = launch(instance, repo, "long")
    assert "warm" in worker_line(instance, run_id)
    wait_file(out / run_id)  # the run is going
    time.sleep(3 * QUIET_POLL_S)
    assert idle_workers(launcher) == []  # not refilled while it runs
    # a run of another job meanwhile starts cold: no worker was left for it
    other = launch(instance, repo, "quick")
    assert wait_status(instance, other).is_success
    assert "cold" in worker_line(instance, other)
    assert idle_workers(launcher) == []  # ... and its launch refills nothing either
    assert launcher.terminate(run_id)
    assert wait_status(instance, run_id).status == dg.DagsterRunStatus.CANCELED
    wait_warm(launcher, timeout_s=30)  # refilled once the long run ended
    assert len(idle_workers(launcher)) == 1


@pytest.mark.parametrize("quiet_env", [2], indirect=True)
def test_a_refill_waits_at_most_quiet_max_s(quiet_env):
    instance, repo, out, _ = quiet_env
    launcher = instance.run_launcher
    assert wait_status(instance, launch(instance, repo, "quick")).is_success
    wait_warm(launcher)
    # from the launch: the refill waits quiet_max_s (2 s) for the long run, then imports
    # (timed from the run's start instead, a start slowed by load left less than 0.5 s)
    started = time.monotonic()
    run_id = launch(instance, repo, "long")
    wait_file(out / run_id)
    wait_warm(launcher, timeout_s=30)  # while the long run still goes
    assert time.monotonic() - started >= launcher.quiet_max_s
    assert not instance.get_run_by_id(run_id).is_finished
    assert launcher.terminate(run_id)
    wait_status(instance, run_id)


@pytest.mark.parametrize("busy_env", [15], indirect=True)
def test_a_refill_waits_for_idle_cpus_at_most_quiet_max_s(busy_env):
    """The replacement of a worker taken waits while fewer than ``quiet_idle_cores`` CPUs
    were idle (here more than the machine has: always), then imports anyway."""
    instance, repo, _, _ = busy_env
    launcher = instance.run_launcher
    started = time.monotonic()
    first = launch(instance, repo, "quick")
    assert wait_status(instance, first).is_success
    assert "cold" in worker_line(instance, first)
    while not idle_workers(launcher):
        assert time.monotonic() - started < 75, "the pool was not refilled"
        time.sleep(0.05)
    assert time.monotonic() - started >= launcher.quiet_max_s  # from the launch
    run_id = launch(instance, repo, "quick")
    assert wait_status(instance, run_id).is_success
    assert "warm" in worker_line(instance, run_id)


# -- workers forked from a zygote (the default) -------------------------------------------


@pytest.fixture
def fork_quiet_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The default (forked workers), with ``long`` as a quiet job."""
    config = {"warm_workers": 1, "kill_after_s": 3, "quiet_jobs": ["long"], "quiet_max_s": 300.0}
    yield from _env(tmp_path, monkeypatch, config)


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _zygote_pid(launcher: WarmRunLauncher) -> int:
    (z,) = launcher._pool.zygotes.values()
    return z.proc.pid


def test_forked_workers_refill_at_once_even_while_a_quiet_jobs_run_goes(fork_quiet_env):
    """A worker forked from the zygote costs no imports: the pool is refilled as soon as a
    run takes a worker, a ``long`` (quiet) run going or not, and the next run is warm too."""
    instance, repo, out, _ = fork_quiet_env
    launcher = instance.run_launcher
    assert wait_status(instance, launch(instance, repo, "quick")).is_success  # forked for it
    wait_warm(launcher)
    (worker,) = idle_workers(launcher)
    zygote = _zygote_pid(launcher)
    assert worker.forked and _parent(worker.proc.pid) == zygote != os.getpid()
    run_id = launch(instance, repo, "long")
    assert "warm: forked" in worker_line(instance, run_id)
    assert wait_file(out / run_id) == worker.proc.pid
    wait_refilled(launcher, 1, timeout_s=15)  # while the long run goes
    other = launch(instance, repo, "quick")
    assert wait_status(instance, other).is_success
    assert "warm: forked" in worker_line(instance, other)
    assert launcher.terminate(run_id)  # SIGINT: a forked worker handles it as Dagster's
    assert wait_status(instance, run_id).status == dg.DagsterRunStatus.CANCELED
    said = messages(instance, run_id)
    assert not any("SIGKILL" in m for m in said), said
    assert _zygote_pid(launcher) == zygote  # one zygote did it all


def test_a_forked_workers_run_outlives_its_zygote_and_a_new_zygote_takes_over(env):
    """The zygote killed: a run it forked goes on; that worker killed later, its run fails
    saying its exit status is unknown; the next refill starts a new zygote."""
    instance, repo, out, _ = env
    launcher = instance.run_launcher
    assert wait_status(instance, launch(instance, repo, "quick")).is_success  # forked for it
    wait_warm(launcher)
    zygote = _zygote_pid(launcher)
    run_id = launch(instance, repo, "long")
    pid = wait_file(out / run_id)
    wait_refilled(launcher, 1)
    os.kill(zygote, signal.SIGKILL)
    time.sleep(1.0)
    assert not instance.get_run_by_id(run_id).is_finished
    assert worker_alive(instance.get_run_by_id(run_id).tags[WORKER_TAG])
    os.kill(pid, signal.SIGKILL)
    run = wait_status(instance, run_id, 30)
    assert run.status == dg.DagsterRunStatus.FAILURE
    said = messages(instance, run_id)
    assert any(f"Run worker pid {pid} ended (its exit status is unknown" in m for m in said), said
    # the idle worker it forked still takes a run; its refill comes from a new zygote
    nxt = launch(instance, repo, "quick")
    assert wait_status(instance, nxt).is_success
    assert "warm: forked" in worker_line(instance, nxt)
    wait_refilled(launcher, 1)
    (worker,) = idle_workers(launcher)
    assert _parent(worker.proc.pid) == _zygote_pid(launcher) != zygote
