"""A capture run that outlives its Spark Connect server (killed, restarted by the supervisor
on the same port) opens a new session instead of failing every tick on the dead one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cdc_dagster.services import procs
from cdc_dagster.services.stack import spark_connect_part

REPO = Path(__file__).resolve().parents[3]

CLIENT = textwrap.dedent(
    """
    import sys
    from cdc_dagster.defs.resources import SparkResource
    spark = SparkResource(remote=sys.argv[1])
    first = spark.live_session()
    print("before", first.range(3).count(), flush=True)
    sys.stdin.readline()  # the server is killed and started again meanwhile
    second = spark.live_session()
    print("after", second.range(5).count(), second is not first, flush=True)
    """
)


def _start(tmp_path: Path, port: int) -> subprocess.Popen[bytes]:
    handle = spark_connect_part(tmp_path, port).launch()
    deadline = time.monotonic() + 240
    while not procs.listening(port):
        assert time.monotonic() < deadline, "Spark Connect did not start"
        time.sleep(1)
    return handle.proc  # type: ignore[attr-defined,no-any-return]


@pytest.mark.slow
def test_a_dead_spark_connect_session_is_replaced_by_a_new_one(tmp_path: Path) -> None:
    port = procs.free_port()
    server = _start(tmp_path, port)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    client = subprocess.Popen(
        [sys.executable, "-c", CLIENT, f"sc://127.0.0.1:{port}"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert client.stdout is not None and client.stdin is not None
        assert client.stdout.readline().split() == ["before", "3"]
        os.killpg(server.pid, signal.SIGKILL)  # the server dies with the session
        server.wait()
        while procs.listening(port):
            time.sleep(0.2)
        server = _start(tmp_path, port)  # what the supervisor does: the same port
        client.stdin.write("go\n")
        client.stdin.flush()
        assert client.stdout.readline().split() == ["after", "5", "True"]
    finally:
        client.kill()
        os.killpg(server.pid, signal.SIGKILL)
