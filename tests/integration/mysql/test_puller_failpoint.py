"""The puller's failpoint fires between the change-log write and the position save: a puller
process crashed there leaves data files its state does not cover; the next run drops them
and pulls the same rows again, exactly once."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from test_binlog_puller import changes, execute, pull_until_caught_up, table_id

from cdc_dagster import failpoints

_PULL = """
import sys
from cdc_dagster.mysql.puller import PullerConfig, run_puller
uri, root, db = sys.argv[1:4]
run_puller(PullerConfig(uri, root, (db + ".*",), heartbeat_s=0.5), stop_after=60)
"""


@pytest.mark.slow
def test_crash_after_changelog_write_before_position_save_pulls_the_rows_once(
    mariadb, mydb, tmp_path
):
    root = tmp_path / "cl"
    execute(mariadb, mydb, "CREATE TABLE t (id INT PRIMARY KEY, v INT)")
    pull_until_caught_up(mariadb, root, mydb)
    tid = table_id(root, "t")
    state = root / "puller" / "state.json"
    saved = state.read_bytes()
    execute(mariadb, mydb, *[f"INSERT INTO t VALUES ({i}, {i})" for i in range(50)])
    proc = subprocess.run(
        [sys.executable, "-c", _PULL, mariadb.uri(), str(root), mydb],
        env={**os.environ, failpoints.ENV: "puller.after_changelog_write=crash"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == failpoints.CRASH_EXIT_CODE, proc.stderr[-2000:]
    assert sorted(r["c1"] for r in changes(root, tid)) == list(range(50))  # files written
    assert state.read_bytes() == saved  # ... the position not saved
    pull_until_caught_up(mariadb, root, mydb)
    rows = changes(root, tid)
    assert sorted(r["c1"] for r in rows) == list(range(50))  # once each, not twice
