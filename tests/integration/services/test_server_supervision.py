"""``server start --detach`` on the real stack: each part killed with SIGKILL comes back (on
its port) while the others keep running; the owner sensor ticks again after the code server
or the daemon died; after the supervisor itself died, ``server status`` says so and a new
``server start`` starts only what is missing; ``server stop`` leaves no process.

The tests share one server (it takes a minute to start on 2 cores) and run in this order;
the last ones kill the supervisor and stop everything.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cdc_dagster.services import procs, stack
from cdc_dagster.testing.ui import sensor_ticks

pytestmark = pytest.mark.slow

BACK_S = 180.0  # a restart on 2 shared cores: Spark Connect takes longest


def cli(state: Path, *argv: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cdc_dagster.cli", "--state-dir", str(state), *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    state = tmp_path_factory.mktemp("server") / "state"
    started = cli(state, "server", "start", "--detach")
    try:
        assert started.returncode == 0, started.stdout[-4000:] + started.stderr[-2000:]
        assert "running in the background" in started.stdout
        yield state
    finally:
        cli(state, "server", "stop", timeout=60)
        for pid in _ours(state):  # nothing must be left; if it is, do not leak it either
            os.kill(pid, signal.SIGKILL)


def parts(state: Path) -> dict[str, procs.Service]:
    return {p.name: p for p in procs.read_record(state).parts}


def wait_until(what: str, predicate: Callable[[], object], timeout_s: float = BACK_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(0.5)


def kill_and_wait_back(state: Path, name: str) -> tuple[procs.Service, procs.Service]:
    """SIGKILL part ``name``; wait until it runs again; (before, after)."""
    before = parts(state)
    victim = before[name]
    os.kill(victim.pid, signal.SIGKILL)

    def back() -> bool:
        now = parts(state).get(name)
        return bool(
            now
            and now.pid != victim.pid
            and now.state == "running"
            and stack.part_state(now) == "running"
        )

    wait_until(f"{name} to come back", back)
    after = parts(state)
    for other, service in before.items():  # the others kept running, untouched
        if other != name:
            assert after[other].pid == service.pid and service.alive(), other
    return victim, after[name]


def owner_ticks_since(state: Path, since: float) -> list[dict]:
    """The owner sensor's ticks after ``since`` that did not fail, through the UI's GraphQL."""
    ticks = sensor_ticks(parts(state)[stack.WEB].address)
    return [t for t in ticks if t["timestamp"] > since and t["status"] in ("SKIPPED", "SUCCESS")]


def _autogroup_nice(pid: int) -> int | None:
    """The niceness of process ``pid``'s autogroup (None: a kernel without autogroups)."""
    try:
        with open(f"/proc/{pid}/autogroup") as f:
            return int(f.read().split()[-1])
    except OSError:
        return None


def assert_spark_yields_to_the_daemon(state: Path) -> None:
    """Spark Connect's session -- its wrapper and JVM -- has the autogroup niceness
    ``stack.spark_nice()``; the daemon's session (the capture runs) keeps its own."""
    spark, daemon = parts(state)[stack.SPARK], parts(state)[stack.DAEMON]
    members = procs.group_members(spark.pgid)
    assert len(members) >= 2, "the JVM under spark-connect's wrapper"
    nice = {_autogroup_nice(p) for p in members}
    if nice == {None}:
        return  # no autogroups here: nothing to lower
    assert nice == {stack.spark_nice()} == {10}
    assert _autogroup_nice(daemon.pid) == 0  # a new session starts at 0


def test_detached_server_runs_every_part_and_status_exits_0(state: Path) -> None:
    assert set(parts(state)) == {stack.ETCD, stack.SPARK, stack.CODE, stack.DAEMON, stack.WEB}
    assert_spark_yields_to_the_daemon(state)
    status = cli(state, "server", "status")
    assert status.returncode == 0, status.stdout
    wait_until("the owner sensor to tick", lambda: owner_ticks_since(state, 0))


def test_killed_code_server_comes_back_on_its_port_and_the_owner_sensor_ticks_again(
    state: Path,
) -> None:
    victim, back = kill_and_wait_back(state, stack.CODE)
    assert back.address == victim.address and back.restarts == 1
    since = time.time()
    wait_until(
        "an owner sensor tick after the restart", lambda: owner_ticks_since(state, since), 90
    )
    log = (state / stack.SERVER_LOG).read_text()
    assert f"code-server (pid {victim.pid}) ended: killed by SIGKILL (exit code -9)" in log


def test_killed_daemon_comes_back_and_the_owner_sensor_ticks_again(state: Path) -> None:
    kill_and_wait_back(state, stack.DAEMON)
    since = time.time()
    wait_until(
        "an owner sensor tick after the restart", lambda: owner_ticks_since(state, since), 90
    )


def test_killed_webserver_comes_back_on_its_port(state: Path) -> None:
    victim, back = kill_and_wait_back(state, stack.WEB)
    assert back.address == victim.address
    assert procs.http_ok(f"{back.address}/server_info")


def test_killed_spark_connect_comes_back_on_its_port_and_runs_a_query(state: Path) -> None:
    before = parts(state)[stack.SPARK]
    java = [p for p in procs.group_members(before.pgid) if p != before.pid]
    assert java, "the JVM under spark-connect's wrapper"
    os.kill(java[0], signal.SIGKILL)  # the server itself; its wrapper exits 137
    wait_until(
        "spark-connect to come back",
        lambda: (
            parts(state)[stack.SPARK].pid != before.pid
            and stack.part_state(parts(state)[stack.SPARK]) == "running"
        ),
    )
    assert parts(state)[stack.SPARK].address == before.address
    # "running" is the process; its gRPC port answers a moment later. A new session each try
    # (create(), never a global default another test left behind).
    wait_until("a query on the restarted spark-connect", lambda: _count_on(before.address) == 5)
    assert "exit code 137 (128+SIGKILL)" in (state / stack.SERVER_LOG).read_text()
    assert_spark_yields_to_the_daemon(state)  # the relaunched server's session too


def _count_on(address: str) -> int | None:
    from pyspark.sql import SparkSession

    try:
        spark = SparkSession.builder.remote(address).create()
    except Exception:
        return None
    try:
        return spark.range(5).count()
    except Exception:
        return None
    finally:
        spark.stop()


def test_killed_private_etcd_comes_back_on_its_port_with_its_data(state: Path) -> None:
    from cdc_dagster.metastore import connect

    with connect(None, state) as ms:
        ms.client.put("/supervision-test/key", b"kept")
    victim, back = kill_and_wait_back(state, stack.ETCD)
    assert back.address == victim.address
    with connect(None, state) as ms:
        assert ms.client.get("/supervision-test/key").value == b"kept"


def test_with_the_supervisor_dead_status_exits_1_and_names_what_is_down(state: Path) -> None:
    record = procs.read_record(state)
    assert record.supervisor is not None
    os.kill(record.supervisor.pid, signal.SIGKILL)
    spark = parts(state)[stack.SPARK]
    os.killpg(spark.pgid, signal.SIGKILL)  # and a part, whole: nobody restarts it now
    wait_until("spark-connect to be gone", lambda: not procs.group_members(spark.pgid), 30)
    status = cli(state, "server", "status")
    assert status.returncode == 1
    assert status.stdout.splitlines()[-1] == "down: supervisor, spark-connect"


def test_server_start_after_a_partial_death_starts_only_what_is_missing(state: Path) -> None:
    before = parts(state)
    started = cli(state, "server", "start", "--detach")
    assert started.returncode == 0, started.stdout[-4000:]
    after = parts(state)
    for name in (stack.CODE, stack.DAEMON, stack.WEB):
        assert after[name].pid == before[name].pid, name  # adopted, not restarted
        assert f"{name} still runs (pid {before[name].pid}): adopted" in started.stdout
    assert after[stack.ETCD].pid == before[stack.ETCD].pid
    assert after[stack.SPARK].pid != before[stack.SPARK].pid  # the missing one
    assert after[stack.SPARK].address == before[stack.SPARK].address
    assert cli(state, "server", "status").returncode == 0
    # an adopted part is supervised too
    kill_and_wait_back(state, stack.DAEMON)
    assert "ended: gone (exit code unknown" in (state / stack.SERVER_LOG).read_text()


def test_server_stop_takes_under_5s_and_leaves_no_process(
    state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = procs.read_record(state)
    assert record.supervisor is not None and _ours(state)
    # In this process: the stop itself, not the CLI's start-up (its imports take 1-4 s on
    # 2 shared cores; test_stack_record runs `server stop` through the CLI's main()).
    started = time.monotonic()
    stack.stop(state)
    took = time.monotonic() - started
    assert took < 5, (took, capsys.readouterr().out)
    assert _ours(state) == []
    assert all(procs.group_members(p.pgid) == [] for p in record.parts if p.pgid)
    assert cli(state, "server", "status").returncode == 3


def _ours(state: Path) -> list[int]:
    """Processes that belong to this state dir (its path in their command line or env)."""
    needle = str(state).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            text = (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in text and procs.pid_alive(int(entry.name)):
            found.append(int(entry.name))
    return found
