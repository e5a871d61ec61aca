"""kill -9 between the sink write and the save: a fresh process continues, nothing lost or doubled."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from scenario import Workload, ts
from test_executor import OPEN, assert_replicated, make, start

CRASH_PROC = Path(__file__).with_name("crash_proc.py")


@pytest.mark.slow
def test_sigkill_between_sink_write_and_save_then_a_new_process_continues(
    tmp_path: Path, spark: Any, writer: Any
) -> None:
    w = Workload(writer, [1, 2])
    w.write(steps=2)
    ex = make(tmp_path, spark)
    ex.set_barrier(OPEN)
    start(ex, [1, 2], ts(1))
    ex.sink_phase()
    saved = ex.status(1).checkpoint.checkpoint_ts
    top = w.write(steps=2)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [sys.executable, str(CRASH_PROC), str(tmp_path)], env=env, capture_output=True, timeout=300
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    manifest = json.loads((tmp_path / "staging" / "cf" / "c1" / "manifest.json").read_text())
    assert manifest["tables"]["1"]["checkpoint_ts"] == saved  # the save never happened
    again = make(tmp_path, spark)  # a fresh executor: the sink's committed ts is the truth
    assert again.status(1).checkpoint.checkpoint_ts == top
    assert again.status(2).checkpoint.checkpoint_ts == top
    more = w.write(steps=2)
    again.advance()
    assert again.status(1).checkpoint.checkpoint_ts == more
    assert_replicated(tmp_path, w, more)
