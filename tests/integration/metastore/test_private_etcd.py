"""The private etcd of a state dir: started explicitly, shared by processes, outliving them.

Every scenario runs the starting and the client processes as real subprocesses, since
the bugs were about process (and thread) lifetimes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdc_dagster.metastore import (
    EtcdNotRunningError,
    connect,
    private_etcd_status,
    start_private_etcd,
    stop_private_etcd,
)

REPO = Path(__file__).resolve().parents[3]


def _python(code: str, timeout_s: float = 60) -> dict[str, object]:
    """Run ``code`` in a fresh interpreter; it prints one JSON line, which is returned."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
        check=True,
    ).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def _spawn(code: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE, text=True, env=env
    )


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    """A state dir whose private etcd is stopped after the test, whoever started it."""
    try:
        yield tmp_path
    finally:
        stop_private_etcd(tmp_path)


START_FROM_A_THREAD_AND_EXIT = """
    import json, sys, threading
    from cdc_dagster.metastore import start_private_etcd
    out = {}
    t = threading.Thread(target=lambda: out.update(pid=start_private_etcd(sys.argv[-1]).pid))
    t.start(); t.join()
    print(json.dumps(out))
"""


def test_private_etcd_started_from_a_worker_thread_survives_the_starting_process(
    state_dir: Path,
) -> None:
    started = _python(START_FROM_A_THREAD_AND_EXIT.replace("sys.argv[-1]", repr(str(state_dir))))

    status = private_etcd_status(state_dir)
    assert status.running and status.pid == started["pid"]
    with connect(None, state_dir) as ms:
        ms.client.put("/probe", b"alive")
        assert ms.client.get("/probe").value == b"alive"


def test_a_client_process_that_closes_does_not_stop_the_etcd_others_use(state_dir: Path) -> None:
    server = start_private_etcd(state_dir)
    with connect(None, state_dir) as mine:
        mine.client.put("/mine", b"1")
        _python(
            f"""
            import json
            from cdc_dagster.metastore import connect
            ms = connect(None, {str(state_dir)!r})
            ms.client.put("/theirs", b"2")
            ms.close()
            print(json.dumps({{}}))
            """
        )
        assert private_etcd_status(state_dir).pid == server.pid
        assert mine.client.get("/theirs").value == b"2"


def test_restarted_private_etcd_keeps_its_ports_and_an_attached_client_reconnects(
    state_dir: Path,
) -> None:
    first = start_private_etcd(state_dir)
    with connect(None, state_dir, retry_timeout_s=20) as client:
        client.client.put("/before", b"1")
        assert stop_private_etcd(state_dir)
        second = _python(
            f"""
            import json
            from cdc_dagster.metastore import start_private_etcd
            s = start_private_etcd({str(state_dir)!r})
            print(json.dumps({{"url": s.client_url, "pid": s.pid, "started": s.started}}))
            """
        )
        assert second["started"] and second["pid"] != first.pid
        assert second["url"] == first.client_url
        assert client.client.get("/before").value == b"1"
        client.client.put("/after", b"2")


CONCURRENT_START = """
    import json, time
    from cdc_dagster.metastore import start_private_etcd
    called = time.time()
    s = start_private_etcd({state_dir!r})
    print(json.dumps({{"pid": s.pid, "started": s.started, "called": called, "at": time.time()}}))
"""


def test_two_processes_starting_at_once_share_one_etcd_and_the_loser_attaches_within_a_second(
    state_dir: Path,
) -> None:
    procs = [_spawn(CONCURRENT_START.format(state_dir=str(state_dir))) for _ in range(2)]
    results = [json.loads(p.communicate(timeout=60)[0].strip().splitlines()[-1]) for p in procs]

    winner, loser = sorted(results, key=lambda r: not r["started"])
    assert (winner["started"], loser["started"]) == (True, False)
    assert winner["pid"] == loser["pid"] == private_etcd_status(state_dir).pid
    # From when the winner's etcd was ready (or the loser asked, if later) to the loser's return.
    assert loser["at"] - max(winner["at"], loser["called"]) < 1.0


def test_stop_stops_the_server_and_connect_then_says_how_to_start_it(state_dir: Path) -> None:
    pid = start_private_etcd(state_dir).pid
    assert pid is not None

    assert stop_private_etcd(state_dir) is True

    assert not private_etcd_status(state_dir).running
    assert (
        not Path(f"/proc/{pid}/cmdline").exists() or not Path(f"/proc/{pid}/cmdline").read_bytes()
    )
    assert stop_private_etcd(state_dir) is False
    with pytest.raises(EtcdNotRunningError, match="cdc-dagster server start"):
        connect(None, state_dir)


def test_connect_with_start_etcd_starts_a_server_that_outlives_the_client(
    state_dir: Path,
) -> None:
    with connect(None, state_dir, start_etcd=True) as ms:
        ms.client.put("/k", b"v")
    status = private_etcd_status(state_dir)
    assert status.running
    assert status.version is not None and status.binary is not None
