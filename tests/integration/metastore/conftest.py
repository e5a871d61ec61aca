"""A real etcd for every test: one private server per session, plus per-test clusters.

The generic etcd fixtures (``etcd_server``, ``etcd_endpoints``, ``cluster_id``, ``layout``,
``metastore``) live in ``tests/conftest.py``, shared with the runtime suite.
"""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cdc_dagster.metastore import TaskStatus
from scheduler_core.messages import Liveness, TableStatusBatch
from scheduler_core.model import TableState

OWNER_PROC = Path(__file__).with_name("owner_proc.py")


class Candidate:
    """An ``owner_proc.py`` process: send it commands, read its JSON answers with timeouts."""

    def __init__(self, endpoints: list[str], cluster_id: str, owner_id: str, ttl_s: int) -> None:
        self.owner_id = owner_id
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(OWNER_PROC),
                ",".join(endpoints),
                cluster_id,
                owner_id,
                str(ttl_s),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def send(self, command: str) -> None:
        """Write one command line."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def read(self, timeout_s: float) -> dict[str, Any]:
        """The next answer; fails the test if none comes within ``timeout_s``."""
        try:
            line = self._lines.get(timeout=timeout_s)
        except queue.Empty:
            pytest.fail(f"{self.owner_id} said nothing within {timeout_s}s")
        if line is None:
            pytest.fail(f"{self.owner_id} exited with {self.proc.wait()}")
        return dict(json.loads(line))

    def silent_for(self, seconds: float) -> bool:
        """True if no answer arrives within ``seconds``."""
        try:
            self._lines.put(self._lines.get(timeout=seconds))
        except queue.Empty:
            return True
        return False

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the process."""
        self.proc.send_signal(sig)

    def cleanup(self) -> None:
        """Kill the process whatever state it is in (stopped ones are continued first)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(timeout=10)


@pytest.fixture
def spawn_candidate(
    etcd_endpoints: list[str], cluster_id: str
) -> Iterator[Callable[[str, int], Candidate]]:
    """Start owner candidates in their own processes; every one is killed after the test."""
    started: list[Candidate] = []

    def spawn(owner_id: str, ttl_s: int) -> Candidate:
        candidate = Candidate(etcd_endpoints, cluster_id, owner_id, ttl_s)
        started.append(candidate)
        assert candidate.read(timeout_s=30)["event"] == "ready"
        return candidate

    try:
        yield spawn
    finally:
        for candidate in started:
            candidate.cleanup()


@pytest.fixture
def make_task_status() -> Callable[..., TaskStatus]:
    """Build a TaskStatus of replicating tables, all at checkpoint = resolved = ``ts``."""

    def make(*table_ids: int, ts: int = 100, owner_rev: int = 7) -> TaskStatus:
        n = len(table_ids)
        col = np.full(n, ts, dtype=np.int64)
        batch = TableStatusBatch(list(table_ids), np.full(n, int(TableState.REPLICATING)), col, col)
        return TaskStatus(owner_rev, 1, Liveness.ALIVE, batch)

    return make
