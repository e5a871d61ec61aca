"""Two code servers on one host with the default settings: one owner, the other refused
(issue 17 item 3). Each runs the owner loop the sensor runs (``CdcResource.owner_loop``) in
its own process against the session's real etcd; neither sets ``CDC_DAGSTER_OWNER_ID``."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdc_dagster.metastore import Metastore

PROC = Path(__file__).with_name("owner_tick_proc.py")
ROOT = Path(__file__).resolve().parents[3]


class CodeServer:
    """One owner-loop process (see owner_tick_proc.py)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(PROC)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        ready = self._read()
        assert ready["event"] == "ready", ready
        self.owner_id: str = ready["owner_id"]

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"the owner process ended (exit {self.proc.poll()})"
        return json.loads(line)

    def tick(self) -> dict[str, Any]:
        """One owner tick; what it said."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("tick\n")
        self.proc.stdin.flush()
        return self._read()

    def stop(self) -> None:
        """Kill the process (no resign: its lease just lapses)."""
        self.proc.kill()
        self.proc.wait(timeout=30)


@pytest.fixture
def default_env(etcd_endpoints: list[str], cluster_id: str, tmp_path: Path) -> dict[str, str]:
    """The environment ``server start`` would give a code server, minus any owner id."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDC_DAGSTER_")}
    env.update(
        CDC_DAGSTER_ETCD=",".join(etcd_endpoints),
        CDC_DAGSTER_CLUSTER_ID=cluster_id,
        CDC_DAGSTER_STATE_DIR=str(tmp_path),
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p),
    )
    return env


@pytest.fixture
def code_servers(default_env: dict[str, str]) -> Iterator[list[CodeServer]]:
    started: list[CodeServer] = []
    try:
        started += [CodeServer(default_env), CodeServer(default_env)]
        yield started
    finally:
        for server in started:
            server.stop()


def test_two_default_owners_on_one_host_one_is_refused(
    code_servers: list[CodeServer], metastore: Metastore
) -> None:
    a, b = code_servers
    host = "".join(c if c.isalnum() or c in "._-" else "-" for c in socket.gethostname())
    assert a.owner_id != b.owner_id, "the default owner id must be unique per process"
    assert a.owner_id.startswith(f"dagster-{host[:80]}-") and b.owner_id.startswith(
        f"dagster-{host[:80]}-"
    )

    first, second = a.tick(), b.tick()
    assert first["is_owner"] and first["owner_rev"] > 0, first
    assert not second["is_owner"], f"both default owners hold the election: {first} {second}"
    assert second["current"] == a.owner_id and second["owner_rev"] == first["owner_rev"]

    # Ticking on, side by side: the first keeps its owner_rev, the second stays refused.
    for _ in range(3):
        again_a, again_b = a.tick(), b.tick()
        assert again_a["is_owner"] and again_a["owner_rev"] == first["owner_rev"], again_a
        assert not again_b["is_owner"] and again_b["current"] == a.owner_id, again_b

    owner = metastore.election.current_owner()
    assert owner is not None
    assert (owner.owner_id, owner.owner_rev) == (a.owner_id, first["owner_rev"])
