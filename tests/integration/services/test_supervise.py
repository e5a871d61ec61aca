"""The supervisor on small real processes: a dead part is restarted with capped backoff and
logged with its exit code and count, the others keep running, shutdown is concurrent and
escalates to SIGKILL, and the signal wiring stops everything (also with SIGINT ignored)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from cdc_dagster.services import procs
from cdc_dagster.services.supervise import (
    Backoff,
    Part,
    PartState,
    ProcessHandle,
    Supervisor,
    describe_exit,
)

IGNORES_TERM = "trap '' TERM; sleep 1000 & wait"


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def sh_part(name: str, script: str, tmp_path: Path, **kw: object) -> Part:
    log = tmp_path / f"{name}.log"
    return Part(
        name,
        lambda: ProcessHandle(procs.launch(name, ["sh", "-c", script], log, os.environ)),
        log=str(log),
        **kw,  # type: ignore[arg-type]
    )


def wait_for(predicate, timeout_s: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_backoff_doubles_from_its_initial_delay_and_is_capped() -> None:
    b = Backoff(initial_s=1.0, factor=2.0, max_s=30.0)
    assert [b.delay(n) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]
    with pytest.raises(ValueError, match="bad backoff"):
        Backoff(initial_s=5.0, max_s=1.0)


def test_exit_codes_are_described_with_their_signal() -> None:
    assert describe_exit(0) == "exit code 0"
    assert describe_exit(3) == "exit code 3"
    assert describe_exit(-9) == "killed by SIGKILL (exit code -9)"
    assert describe_exit(137) == "exit code 137 (128+SIGKILL)"


def test_dead_part_restarts_with_backoff_logged_with_exit_code_and_count_others_untouched(
    tmp_path: Path,
) -> None:
    lines: list[str] = []
    clock = Clock()
    sup = Supervisor(
        lines.append, Backoff(initial_s=1, factor=2, max_s=4, stable_s=60), clock=clock
    )
    sup.add(sh_part("flaky", "sleep 1000", tmp_path))
    sup.add(sh_part("steady", "sleep 1000", tmp_path))
    sup.start(threading.Event())
    steady_pid = sup.slots["steady"].handle.pid  # type: ignore[union-attr]
    try:
        delays = []
        for n in range(1, 5):
            victim = sup.slots["flaky"].handle
            os.kill(victim.pid, signal.SIGKILL)  # type: ignore[union-attr]
            wait_for(lambda v=victim: v.exit_note() is not None)  # type: ignore[misc]
            sup.step()
            slot = sup.slots["flaky"]
            assert slot.state is PartState.BACKOFF and slot.restarts == n
            delays.append(slot.due - clock.now)
            clock.now = slot.due - 0.01
            sup.step()
            assert slot.state is PartState.BACKOFF  # not before its delay
            clock.now = slot.due
            sup.step()
            assert slot.state is PartState.STARTING and slot.handle is not victim
            sup.step()
            assert slot.state is PartState.RUNNING
        assert delays == [1, 2, 4, 4]  # doubling, capped
        ended = [line for line in lines if " ended: " in line]
        assert ended[0].startswith("flaky (pid ")
        assert "killed by SIGKILL (exit code -9)" in ended[0] and "restart 1 in 1s" in ended[0]
        assert "restart 4 in 4s (4 in a row)" in ended[3]
        assert any("flaky is back (pid" in line and "restart 4)" in line for line in lines)
        steady = sup.slots["steady"]
        assert steady.handle.pid == steady_pid and steady.restarts == 0  # type: ignore[union-attr]
        assert procs.pid_alive(steady_pid)
    finally:
        sup.shutdown(grace_s=1.0)


def test_a_part_up_for_its_stable_time_counts_failures_afresh(tmp_path: Path) -> None:
    clock = Clock()
    sup = Supervisor(lambda _: None, Backoff(initial_s=1, max_s=30, stable_s=60), clock=clock)
    sup.add(sh_part("p", "sleep 1000", tmp_path))
    sup.start(threading.Event())
    slot = sup.slots["p"]
    try:
        for expected_failures in (1, 2):
            old = slot.handle
            os.kill(old.pid, signal.SIGKILL)  # type: ignore[union-attr]
            wait_for(lambda o=old: o.exit_note() is not None)  # type: ignore[misc]
            sup.step()
            assert slot.failures == expected_failures
            clock.now = slot.due
            sup.step()
            sup.step()
        clock.now += 61  # stable for longer than stable_s
        old = slot.handle
        os.kill(old.pid, signal.SIGKILL)  # type: ignore[union-attr]
        wait_for(lambda: old.exit_note() is not None)  # type: ignore[union-attr]
        sup.step()
        assert slot.failures == 1 and slot.restarts == 3 and slot.due - clock.now == 1
    finally:
        sup.shutdown(grace_s=1.0)


def test_first_start_fails_loudly_when_a_part_ends_before_it_is_ready(tmp_path: Path) -> None:
    sup = Supervisor(lambda _: None)
    sup.add(sh_part("broken", "echo no java; exit 2", tmp_path, ready=lambda _: False))
    with pytest.raises(
        procs.ServiceError, match=r"broken ended before it was ready \(exit code 2\)"
    ):
        sup.start(threading.Event())
    sup.shutdown()


def test_a_restarted_part_not_ready_in_time_is_killed_and_restarted_again(tmp_path: Path) -> None:
    lines: list[str] = []
    clock = Clock()
    ready = {"yes": True}
    sup = Supervisor(lines.append, Backoff(initial_s=1), clock=clock)
    sup.add(
        sh_part("slow", "sleep 1000", tmp_path, ready=lambda _: ready["yes"], start_timeout_s=30)
    )
    sup.start(threading.Event())
    slot = sup.slots["slow"]
    try:
        ready["yes"] = False
        os.kill(slot.handle.pid, signal.SIGKILL)  # type: ignore[union-attr]
        wait_for(lambda: slot.handle.exit_note() is not None)  # type: ignore[union-attr]
        sup.step()
        clock.now = slot.due
        sup.step()
        hung = slot.handle
        assert slot.state is PartState.STARTING
        clock.now += 31
        sup.step()
        assert any("was not ready within 30s; killing it" in line for line in lines)
        wait_for(lambda: hung.exit_note() is not None)  # type: ignore[union-attr]
        sup.step()
        assert slot.state is PartState.BACKOFF and slot.restarts == 2
    finally:
        sup.shutdown(grace_s=1.0)


def test_shutdown_signals_all_parts_at_once_and_sigkills_those_ignoring_sigterm(
    tmp_path: Path,
) -> None:
    sup = Supervisor(lambda _: None)
    for name in ("a", "b", "c"):
        sup.add(sh_part(name, IGNORES_TERM, tmp_path))
    sup.start(threading.Event())
    groups = [s.handle.pid for s in sup.slots.values()]  # type: ignore[union-attr]
    wait_for(lambda: all(len(procs.group_members(g)) == 2 for g in groups))  # sh and sleep
    started = time.monotonic()
    sup.shutdown(grace_s=1.0)
    took = time.monotonic() - started
    assert 1.0 <= took < 2.0, took  # one grace for all three, not three in a row
    assert all(procs.group_members(g) == [] for g in groups)  # the sleeps too


_SCRIPT = textwrap.dedent(
    """
    import os, sys, threading
    from pathlib import Path
    from cdc_dagster.services import procs, stack
    from cdc_dagster.services.supervise import Part, ProcessHandle, Supervisor
    with stack.stop_on_signals() as stop:
        sup = Supervisor(stack.say)
        log = Path(sys.argv[1])
        sup.add(Part("child", lambda: ProcessHandle(
            procs.launch("child", ["sh", "-c", "trap '' TERM; sleep 1000 & wait"], log, os.environ))))
        sup.start(stop)
        print("child", sup.slots["child"].handle.pid, flush=True)
        sup.run(stop, interval_s=0.2)
        sup.shutdown(grace_s=1.0)
    print("done", flush=True)
    """
)


@pytest.mark.parametrize(
    "sig",
    [
        signal.SIGINT,
        pytest.param(signal.SIGTERM, marks=pytest.mark.slow),
        pytest.param(signal.SIGHUP, marks=pytest.mark.slow),
    ],
)
def test_supervisor_started_with_sigint_ignored_still_stops_everything_on_a_signal(
    sig: signal.Signals, tmp_path: Path
) -> None:
    # SIGINT ignored as in a background job of a script (nohup): set before an exec, which
    # keeps an ignored signal ignored -- not in a ``preexec_fn``, which runs between fork and
    # exec of this process, whose gRPC threads (earlier tests') once left the child dead there
    ignoring = (
        "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
        "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", ignoring, "-c", _SCRIPT, str(tmp_path / "child.log")],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    child = int(line.split()[1])
    assert procs.group_members(child)
    started = time.monotonic()
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=10)
    assert time.monotonic() - started < 5
    assert proc.returncode == 0 and "stopping everything" in out and "done" in out
    assert procs.group_members(child) == []


def test_what_a_dead_part_left_running_is_kept_and_stopped_at_shutdown(tmp_path: Path) -> None:
    # A killed code server's run workers go on and finish: not killed at the restart, but
    # not forgotten either.
    clock = Clock()
    sup = Supervisor(lambda _: None, Backoff(initial_s=1), clock=clock)
    sup.add(sh_part("server", "sleep 1000 & wait", tmp_path))
    sup.start(threading.Event())
    slot = sup.slots["server"]
    leader = slot.handle.pid  # type: ignore[union-attr]
    wait_for(lambda: len(procs.group_members(leader)) == 2)
    (worker,) = [p for p in procs.group_members(leader) if p != leader]
    os.kill(leader, signal.SIGKILL)
    wait_for(lambda: slot.handle.exit_note() is not None)  # type: ignore[union-attr]
    sup.step()
    clock.now = slot.due
    sup.step()
    assert procs.pid_alive(worker)  # the restart left it running
    assert [s.pid for s in sup.leftovers] == [worker]
    sup.shutdown(grace_s=0.5)
    assert not procs.pid_alive(worker)


def test_on_ready_is_called_at_each_start_of_a_part_not_when_adopted(tmp_path: Path) -> None:
    """``Part.on_ready`` (the stack warms Spark Connect's snapshot session with it) runs when
    the part is first ready and again after each restart; an adopted part was warmed by the
    supervisor that started it."""
    called: list[int] = []
    clock = Clock()
    sup = Supervisor(lambda _: None, Backoff(initial_s=1, factor=2, max_s=4), clock=clock)
    sup.add(sh_part("warm", "sleep 1000", tmp_path, on_ready=lambda h: called.append(h.pid)))
    sup.start(threading.Event())
    try:
        first = sup.slots["warm"].handle
        assert called == [first.pid]  # type: ignore[union-attr]
        os.kill(first.pid, signal.SIGKILL)  # type: ignore[union-attr]
        wait_for(lambda: first.exit_note() is not None)  # type: ignore[union-attr]
        sup.step()
        clock.now = sup.slots["warm"].due
        sup.step()
        sup.step()
        again = sup.slots["warm"].handle
        assert sup.slots["warm"].state is PartState.RUNNING
        assert called == [first.pid, again.pid]  # type: ignore[union-attr]
    finally:
        sup.shutdown(grace_s=1.0)
    adopter = Supervisor(lambda _: None, Backoff(initial_s=1, factor=2, max_s=4), clock=clock)
    part = sh_part("warm", "sleep 1000", tmp_path, on_ready=lambda h: called.append(-1))
    proc = procs.launch("warm", ["sh", "-c", "sleep 1000"], tmp_path / "a.log", os.environ)
    adopter.add(part)
    adopter.adopt("warm", ProcessHandle(proc))
    adopter.start(threading.Event())
    try:
        adopter.step()
        assert -1 not in called
    finally:
        adopter.shutdown(grace_s=1.0)
