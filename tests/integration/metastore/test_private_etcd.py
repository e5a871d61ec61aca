"""``connect(None, state_dir)``: the private etcd the CLI uses when no --etcd is given."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

from cdc_dagster.metastore import connect
from cdc_dagster.metastore.embedded import ENDPOINT_FILE, running_endpoint


def test_first_process_starts_a_private_etcd_and_later_ones_attach_to_it(tmp_path: Path) -> None:
    first = connect(None, tmp_path, keep_etcd_running=True)
    try:
        endpoints = first.client.endpoints
        first.client.put("/probe", b"1")
        with connect(None, tmp_path) as second:
            assert second.client.endpoints == endpoints
            assert second.embedded is None, "an attaching process does not own the server"
            assert second.client.get("/probe").value == b"1"
    finally:
        first.close()
        pid = _stop_kept_server(tmp_path)
    assert not _alive(pid)


def test_private_etcd_started_without_keep_running_stops_on_close(tmp_path: Path) -> None:
    ms = connect(None, tmp_path)
    assert ms.embedded is not None
    pid = ms.embedded.pid
    assert running_endpoint(tmp_path / "etcd") == ms.client.endpoints
    ms.close()
    assert running_endpoint(tmp_path / "etcd") is None
    assert pid is not None and not _alive(pid)


def _stop_kept_server(state_dir: Path) -> int:
    pid = int(json.loads((state_dir / "etcd" / ENDPOINT_FILE).read_text())["pid"])
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return pid


def _alive(pid: int) -> bool:
    _reap(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
