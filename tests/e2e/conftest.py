"""Shared pieces of the end-to-end tests: a Dagster webserver over the production workspace."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdc_dagster.services import procs
from cdc_dagster.services.dagster_home import WORKSPACE_YAML, dagster_home

ARTEFACTS = Path(
    os.environ.get("CDC_DAGSTER_TEST_ARTEFACTS", WORKSPACE_YAML.parent / "test-artefacts")
)
BIN = Path(sys.executable).parent


@pytest.fixture(scope="session")
def artefacts() -> Path:
    """Where screenshots and logs of the e2e tests are saved (kept after the run)."""
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    return ARTEFACTS


def start_webserver(state_dir: Path, env: dict[str, str]) -> tuple[str, int]:
    """``dagster-webserver`` over workspace.yaml; returns (url, pid)."""
    port = procs.free_port()
    log = state_dir / "webserver.log"
    full_env = {
        **os.environ,
        **env,
        "DAGSTER_HOME": str(dagster_home(state_dir)),
        "PYTHONPATH": str(WORKSPACE_YAML.parent),
    }
    argv = [
        str(BIN / "dagster-webserver"),
        "-w",
        str(WORKSPACE_YAML),
        "-h",
        "127.0.0.1",
        "-p",
        str(port),
    ]
    proc = procs.launch("webserver", argv, log, full_env, cwd=WORKSPACE_YAML.parent)
    url = f"http://127.0.0.1:{port}"
    procs.wait_http(f"{url}/server_info", proc, "dagster-webserver", log, 180)
    return url, proc.pid


@pytest.fixture
def stop_later() -> Iterator[list[int]]:
    """Process groups to stop after the test."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        procs.terminate(pid)
