"""The same pipeline over Spark Connect: a private Connect server from the pyspark wheel.

The executor tests run in a subprocess against the server (``CDC_SPARK_MASTER=sc://...``),
so this process's local session and the Connect client never share one interpreter.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def connect_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    import pyspark

    home = Path(pyspark.__file__).parent
    logs = tmp_path_factory.mktemp("connect")
    port = _free_port()
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "SPARK_LOG_DIR": str(logs),
        "SPARK_PID_DIR": str(logs),
        "SPARK_IDENT_STRING": f"cdc-test-{port}",
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": str(REPO),  # the server's Python workers import cdc_dagster
    }
    sbin = home / "sbin"
    subprocess.run(
        [
            "bash",
            str(sbin / "start-connect-server.sh"),
            "--master",
            "local[2]",
            "--conf",
            f"spark.connect.grpc.binding.port={port}",
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            "spark.sql.shuffle.partitions=2",
        ],
        env=env,
        check=True,
        capture_output=True,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            out = "".join(p.read_text() for p in logs.glob("*.out"))
            if "Spark Connect server started" in out:
                break
            time.sleep(1)
        else:
            pytest.fail(f"the Spark Connect server did not start: {out[-2000:]}")
        yield f"sc://localhost:{port}"
    finally:
        subprocess.run(["bash", str(sbin / "stop-connect-server.sh")], env=env, capture_output=True)


@pytest.mark.slow
def test_executor_scenarios_pass_over_spark_connect(connect_url: str, tmp_path: Path) -> None:
    here = Path(__file__).parent
    env = {**os.environ, "CDC_SPARK_MASTER": connect_url, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--basetemp={tmp_path / 'pt'}",
            str(here / "test_executor.py"),
            str(here / "test_bad_input.py"),
            "-k",
            "several_tables or move or stale_token or corrupt",
        ],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "4 passed" in proc.stdout


_SHARED = r"""
import json, os, sys
import pyarrow as pa
from cdc_dagster.pipeline.engine import shared_session

def pids(batches):
    for _ in batches:
        pass
    yield pa.RecordBatch.from_pylist([{"pid": os.getpid()}], schema=pa.schema([("pid", pa.int64())]))

url, name, release = sys.argv[1], sys.argv[2], sys.argv[3] == "release"
spark = shared_session(url, name)
got = sorted(r.pid for r in spark.range(0, 2, 1, 2).mapInArrow(pids, "pid long").collect())
sid = spark.client._session_id
if release:
    spark.client.release_session()  # as a `stop()` of an unshared session would
spark.stop()
print(json.dumps({"session": sid, "pids": got}))
"""


def _shared(url: str, name: str, release: bool = False) -> dict:
    import json

    proc = subprocess.run(
        [sys.executable, "-c", _SHARED, url, name, "release" if release else "keep"],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_shared_session_keeps_its_python_workers_between_processes(connect_url: str) -> None:
    """Two processes asking for one shared session run on the same Python workers (no new
    daemon, no imports again); its `stop()` does not release it. Once released on the server
    (gone for good there), the name gets a session again, under the next id."""
    first = _shared(connect_url, "test-shared")
    second = _shared(connect_url, "test-shared", release=True)
    assert second == first
    third = _shared(connect_url, "test-shared")
    assert third["session"] != first["session"]
    assert third["pids"] != first["pids"]  # a new session: new workers
    assert _shared(connect_url, "test-shared")["session"] == third["session"]
    assert _shared(connect_url, "test-other")["session"] not in (first["session"], third["session"])


@pytest.mark.slow
def test_server_start_warms_the_snapshot_session_out_of_this_process(
    connect_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stack warms the snapshot runs' shared session when Spark Connect is ready, in a
    process of its own (a Connect client in this process would switch PySpark into Connect
    mode here: local sessions made after it fail with CONNECT_URL_NOT_SET). Its workers have
    then taken the snapshot readers' priority; a remote it cannot use is logged, not raised."""
    from cdc_dagster.mysql.chunk_reader import SNAPSHOT_NICE
    from cdc_dagster.mysql.snapshot_runner import SNAPSHOT_SESSION
    from cdc_dagster.services import stack

    lines: list[str] = []
    monkeypatch.setattr(stack, "say", lines.append)
    mode = os.environ.get("SPARK_CONNECT_MODE_ENABLED")
    for remote in (connect_url, "sc://nohost:notaport"):
        keeper = stack._warm_snapshot_session(remote)
        deadline = time.monotonic() + 240
        while not any(line.startswith("spark-connect: snapshot session") for line in lines):
            assert time.monotonic() < deadline, "no word of the warm-up"
            time.sleep(0.2)
        if remote == connect_url:
            assert lines[-1].startswith("spark-connect: snapshot session warmed in"), lines
            pids = _shared(connect_url, SNAPSHOT_SESSION)["pids"]
            assert {os.getpriority(os.PRIO_PROCESS, p) for p in pids} == {SNAPSHOT_NICE}
        else:
            assert lines[-1].startswith("spark-connect: snapshot session not warmed ("), lines
        assert keeper.stdin is not None
        keeper.stdin.close()  # the keeper ends with its input (the stack's supervisor)
        assert keeper.wait(timeout=60) in (0, 1)
        lines.clear()
    assert os.environ.get("SPARK_CONNECT_MODE_ENABLED") == mode


@pytest.mark.slow
def test_the_snapshot_session_is_kept_warm_past_sparks_idle_minute(
    connect_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spark retires a Python worker idle for 60 s; the stack's keeper runs the warm-up job
    every ``keep_s`` while the stack lives, so a snapshot an hour later reads on workers
    that imported the chunk readers. Its input closed (the supervisor gone), it exits."""
    from cdc_dagster.mysql.snapshot_runner import SNAPSHOT_SESSION
    from cdc_dagster.services import stack

    lines: list[str] = []
    monkeypatch.setattr(stack, "say", lines.append)
    keeper = stack._warm_snapshot_session(connect_url, keep_s=15.0)
    deadline = time.monotonic() + 240
    while not lines:
        assert time.monotonic() < deadline, "no word of the warm-up"
        time.sleep(0.2)
    assert lines[-1].startswith("spark-connect: snapshot session warmed in"), lines
    before = _shared(connect_url, SNAPSHOT_SESSION)["pids"]
    time.sleep(80)  # past Spark's idle minute
    assert _shared(connect_url, SNAPSHOT_SESSION)["pids"] == before
    assert keeper.poll() is None
    assert keeper.stdin is not None
    keeper.stdin.close()
    assert keeper.wait(timeout=30) == 0
    time.sleep(0.5)  # the watcher's last word, if any
    assert not any("no longer" in line for line in lines), lines


def test_a_keeper_whose_supervisor_is_gone_exits_even_while_its_server_does_not_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The keeper opens its session and runs its first job with Spark Connect's client,
    which retries an unreachable server for minutes; its input's end (the supervisor gone)
    still ends it at once. (One from a test whose server had stopped lingered past the
    suite: it watched its input only once its first job had answered.)"""
    from cdc_dagster.services import stack

    lines: list[str] = []
    monkeypatch.setattr(stack, "say", lines.append)
    keeper = stack._warm_snapshot_session(f"sc://127.0.0.1:{_free_port()}", keep_s=40.0)
    time.sleep(5.0)
    assert keeper.poll() is None  # retrying: nothing listens there
    assert keeper.stdin is not None
    closed = time.monotonic()
    keeper.stdin.close()
    assert keeper.wait(timeout=10) == 0
    assert time.monotonic() - closed < 5.0
