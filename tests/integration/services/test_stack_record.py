"""``server status`` and ``server stop`` on what ``services.json`` records, with small real
processes standing in for the parts: exit codes name what is down, stop takes one grace
period for everything and leaves no process, kept ports stay, recycled pids are not ours."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdc_dagster.cli import main
from cdc_dagster.services import procs, stack


@pytest.fixture
def spawn() -> Iterator:  # type: ignore[type-arg]
    """Start ``sh -c script`` in its own group; killed after the test."""
    started: list[subprocess.Popen[bytes]] = []

    def run(script: str) -> procs.Service:
        proc = subprocess.Popen(["sh", "-c", script], start_new_session=True)
        started.append(proc)
        return procs.Service(
            f"p{len(started)}", proc.pid, pgid=proc.pid, started=procs.start_ticks(proc.pid)
        )

    yield run
    for proc in started:
        procs.stop_all([procs.Target(proc.pid, proc.pid)], grace_s=0.2)
        proc.wait()


def _record(state: Path, supervisor: procs.Service | None, *parts: procs.Service) -> None:
    procs.write_record(state, procs.StackRecord(supervisor, "server", "127.0.0.1:1", parts))


def test_kept_ports_are_reused_and_replaced_only_when_taken(tmp_path: Path) -> None:
    first = procs.kept_ports(tmp_path, {"a": 0, "b": 0}, {})
    assert procs.kept_ports(tmp_path, {"a": 0, "b": 0}, {}) == first
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", first["a"]))
        busy.listen()
        again = procs.kept_ports(tmp_path, {"a": 0, "b": 0}, {})
        assert again["a"] != first["a"] and again["b"] == first["b"]
        # a part that still runs (adopted) keeps its port even though it is taken (by it)
        assert procs.kept_ports(tmp_path, {"a": 0}, {"a": first["a"]}) == {"a": first["a"]}
    assert procs.kept_ports(tmp_path, {"a": 4321}, {}) == {"a": 4321}  # asked for


def test_status_exits_3_when_nothing_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--state-dir", str(tmp_path), "server", "status"]) == 3
    assert "nothing runs" in capsys.readouterr().out


def test_status_exits_1_and_names_each_part_that_is_down(
    tmp_path: Path,
    spawn,
    capsys: pytest.CaptureFixture[str],  # type: ignore[no-untyped-def]
) -> None:
    sup, up, gone = spawn("sleep 1000"), spawn("sleep 1000"), spawn("exit 0")
    wait_gone(gone)
    _record(tmp_path, sup, up, gone)
    lines, code = stack.status(tmp_path)
    assert code == 1 and lines[-1] == f"down: {gone.name}"
    assert f"{gone.name}: dead (pid {gone.pid})" in lines
    _record(tmp_path, sup, up)
    assert stack.status(tmp_path)[1] == 0
    assert main(["--state-dir", str(tmp_path), "server", "status"]) == 0
    assert f"{up.name}: running (pid {up.pid})" in capsys.readouterr().out
    os.kill(sup.pid, signal.SIGKILL)
    wait_gone(sup)
    lines, code = stack.status(tmp_path)
    assert code == 1 and lines[-1] == "down: supervisor"
    assert "nothing restarts a part that dies" in lines[0]


def test_a_recycled_pid_is_neither_running_nor_stopped(tmp_path: Path, spawn) -> None:  # type: ignore[no-untyped-def]
    stranger = spawn("sleep 1000")
    recorded = procs.Service("p", stranger.pid, pgid=stranger.pid, started=stranger.started - 1)
    assert not recorded.alive()
    _record(tmp_path, None, recorded)
    stack.stop(tmp_path)
    assert procs.group_members(stranger.pid)  # not ours: left alone


def test_stop_stops_supervisor_and_parts_together_within_5s_and_leaves_no_process(
    tmp_path: Path,
    spawn,  # type: ignore[no-untyped-def]
) -> None:
    ignoring = "trap '' TERM; sleep 1000 & wait"
    sup = spawn("sleep 1000")
    parts = [spawn(ignoring) for _ in range(3)]
    wait_until(lambda: all(len(procs.group_members(p.pgid)) == 2 for p in parts))
    leftover = spawn("exec sleep 1000")  # of a part that died: still finishing
    record = procs.StackRecord(
        procs.Service("supervisor", sup.pid, started=sup.started),
        "server",
        "127.0.0.1:1",
        tuple(parts),
        (procs.Service("code-server (left over)", leftover.pid, started=leftover.started),),
    )
    procs.write_record(tmp_path, record)
    assert "still finishing, from parts that died" in stack.status(tmp_path)[0][-1]
    started = time.monotonic()
    assert main(["--state-dir", str(tmp_path), "server", "stop"]) == 0
    took = time.monotonic() - started
    assert took < 5, took
    assert not procs.pid_alive(sup.pid)
    assert all(procs.group_members(p.pgid) == [] for p in parts)
    assert not leftover.alive()
    assert procs.read_record(tmp_path) == procs.StackRecord()


def wait_gone(service: procs.Service) -> None:
    wait_until(lambda: not service.alive())


def wait_until(predicate, timeout_s: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_server_start_while_a_supervisor_runs_says_so_and_starts_nothing(
    tmp_path: Path,
    spawn,
    capsys: pytest.CaptureFixture[str],  # type: ignore[no-untyped-def]
) -> None:
    sup = spawn("sleep 1000")
    record = procs.StackRecord(
        procs.Service("supervisor", sup.pid, started=sup.started), "server", "127.0.0.1:1"
    )
    procs.write_record(tmp_path, record)
    handler = signal.getsignal(signal.SIGINT)
    assert main(["--state-dir", str(tmp_path), "server", "start"]) == 0
    out = capsys.readouterr().out
    assert f"a supervisor (pid {sup.pid}, server) already runs" in out
    assert procs.read_record(tmp_path) == record  # untouched
    assert not (tmp_path / "etcd").exists()  # nothing started
    assert signal.getsignal(signal.SIGINT) is handler  # the CLI's handlers are gone again


def test_reload_definitions_kills_the_supervised_code_server_only(tmp_path: Path, spawn) -> None:  # type: ignore[no-untyped-def]
    """After ``changefeed create`` the code server of a local supervised stack is restarted
    (its supervisor starts it again; the webserver reloads a location whose server changed);
    without a live supervisor nothing is killed and the user is told what to restart."""
    sup, code, web = spawn("sleep 60"), spawn("sleep 60"), spawn("sleep 60")
    code = procs.Service(stack.CODE, code.pid, pgid=code.pgid, started=code.started)
    web = procs.Service(stack.WEB, web.pid, pgid=web.pgid, started=web.started)
    _record(tmp_path, None, code, web)
    assert "restart it" in stack.reload_definitions(tmp_path)
    assert code.alive() and web.alive()  # no supervisor: not killed, nobody would restart it
    _record(tmp_path, sup, code, web)
    assert "restarting the Dagster code server" in stack.reload_definitions(tmp_path)
    deadline = time.monotonic() + 5
    while code.alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not code.alive() and web.alive() and sup.alive()


def test_spark_connects_niceness_defaults_to_10_and_a_bad_value_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``CDC_DAGSTER_SPARK_NICE``: the autogroup niceness ``server start`` gives the Spark
    Connect server's session (0: none); a value that is not 0-19 stops the start, named."""
    monkeypatch.delenv(stack.SPARK_NICE_ENV, raising=False)
    assert stack.spark_nice() == 10
    for raw, want in (("0", 0), (" 19 ", 19), ("", 10)):
        monkeypatch.setenv(stack.SPARK_NICE_ENV, raw)
        assert stack.spark_nice() == want
    for raw in ("abc", "-1", "20", "1.5"):
        monkeypatch.setenv(stack.SPARK_NICE_ENV, raw)
        with pytest.raises(procs.ServiceError, match=f"CDC_DAGSTER_SPARK_NICE='{raw}'"):
            stack.spark_nice()
