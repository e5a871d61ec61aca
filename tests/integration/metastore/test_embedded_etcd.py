"""The test-owned etcd: lives as long as its process, whichever thread started it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from cdc_dagster.metastore.etcd_process import is_healthy

REPO = Path(__file__).resolve().parents[3]

START_IN_A_THREAD = """
    import json, sys, threading, time
    from cdc_dagster.metastore.etcd_process import is_healthy
    from cdc_dagster.testing.etcd import EmbeddedEtcd
    box = {}
    t = threading.Thread(target=lambda: box.update(e=EmbeddedEtcd(sys.argv[1]).start()))
    t.start(); t.join()
    time.sleep(0.5)  # PR_SET_PDEATHSIG would have killed it when the thread ended
    e = box["e"]
    print(json.dumps({"pid": e.pid, "url": e.client_url, "healthy": is_healthy(e.client_url)}))
    sys.stdout.flush()
    sys.stdin.readline()  # the test lets this process exit without stopping the server
"""


def test_etcd_started_from_a_worker_thread_outlives_the_thread_and_dies_with_the_process(
    tmp_path: Path,
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(START_IN_A_THREAD), str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.stdout is not None and proc.stdin is not None
    report = json.loads(proc.stdout.readline())
    assert report["healthy"], "the server died with the thread that started it"

    proc.stdin.close()
    proc.wait(timeout=30)
    deadline = time.monotonic() + 10
    while is_healthy(report["url"], 0.2) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not is_healthy(report["url"], 0.2), "the server outlived the process that owned it"
