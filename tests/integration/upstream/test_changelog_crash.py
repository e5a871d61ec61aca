"""A producer killed with SIGKILL mid-write leaves a change log every reader can use."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path

from cdc_dagster.upstream.changelog import ChangeLog
from cdc_dagster.upstream.oracle import Oracle

PRODUCER = """
import sys
from cdc_dagster.upstream.generator import Workload, WorkloadConfig
cfg = WorkloadConfig(seed=11, bank_tables=2, rows_per_table=20, txns_per_step=40, ddl_every=10)
w = Workload(cfg, sys.argv[1])
print("ready", flush=True)
while True:
    w.step()
    w.advance_resolved()
"""


def _run_and_kill(root: Path, after_s: float) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    proc = subprocess.Popen(
        [sys.executable, "-c", PRODUCER, str(root)], stdout=subprocess.PIPE, env=env
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        time.sleep(after_s)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def test_reader_and_oracle_work_after_the_producer_is_killed(tmp_path: Path) -> None:
    _run_and_kill(tmp_path, 2.0)
    log, oracle = ChangeLog(tmp_path), Oracle(tmp_path)
    resolved = log.ddl_resolved_ts()
    assert resolved > 0 and len(log.ddl_records()) > 4
    for table_id in log.tables_at(resolved):
        table_resolved = log.table_resolved_ts(table_id)
        for f in log.data_files(table_id, 0, table_resolved):
            assert log.read_data_file(f).num_rows > 0
    bank_ts = min(log.table_resolved_ts(t) for t in (1, 2))
    assert oracle.bank_total_at(bank_ts, (1, 2)) == Decimal("40000.00")
    leftovers = [p for p in tmp_path.rglob("*") if ".tmp-" in p.name]
    assert all(p.name.startswith(".") for p in leftovers)  # temp files stay invisible
