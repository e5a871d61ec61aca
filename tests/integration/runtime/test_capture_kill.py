"""A capture process killed with SIGKILL between and inside its tick halves: the next tick,
in a new process, carries on with nothing lost or doubled (a move in flight, too)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from upstream_helpers import Upstream, check_downstream

from cdc_dagster.runtime.capture import CaptureContext
from cdc_dagster.testing.driver import Driver
from cdc_dagster.testing.fake_runtime import FileDownstream

PROC = Path(__file__).with_name("capture_proc.py")


def _runner(endpoints: list[str], cluster_id: str, kill: str, codes: list[int]):  # type: ignore[no-untyped-def]
    def run(ctx: CaptureContext, config: dict) -> None:
        argv = [sys.executable, str(PROC), ",".join(endpoints), cluster_id, ctx.changefeed_id]
        argv += [ctx.capture_id, str(ctx.staging_root), json.dumps(config), kill]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        codes.append(proc.returncode)
        if proc.returncode not in (0, -signal.SIGKILL):
            raise AssertionError(proc.stderr[-3000:])

    return run


@pytest.mark.parametrize(
    "kill",
    [
        pytest.param("between", marks=pytest.mark.slow),
        pytest.param("prepare-before-save", marks=pytest.mark.slow),
        pytest.param("prepare-after-save", marks=pytest.mark.slow),
        "commit-before-save",  # the sink wrote; no manifest, no report
        pytest.param("commit-after-save", marks=pytest.mark.slow),
    ],
)
def test_capture_killed_mid_tick_carries_on_in_a_new_process(
    kill: str,
    make_driver: Callable[..., Driver],
    upstream: Upstream,
    sink_uri: str,
    etcd_endpoints: list[str],
    cluster_id: str,
) -> None:
    driver = make_driver(captures=2)
    first = upstream.ts(3000)
    upstream.advance(first)
    driver.run_until(lambda t: driver.caught_up(t, first), max_ticks=30)
    tables = driver.tick().owner.changefeeds["cf"].tables
    on_1 = [t.table_id for t in tables if t.capture_id == "capture-1"]
    assert on_1
    driver.move_table(on_1[0], "capture-0")  # a move in flight while capture-1 dies
    target = upstream.ts(9000)
    upstream.advance(target)
    codes: list[int] = []
    for mode in (kill, kill, "none", "none"):
        driver.tick(runner={"capture-1": _runner(etcd_endpoints, cluster_id, mode, codes)})
    assert codes[:2] == [-signal.SIGKILL] * 2 and codes[2:] == [0, 0]
    driver.run_until(lambda t: driver.caught_up(t, target), max_ticks=40)
    ds = FileDownstream(sink_uri[len("file://") :])
    assert {t: ds.committed(t) for t in upstream.table_ids} == dict.fromkeys(
        upstream.table_ids, target
    )
    check_downstream(sink_uri)  # contiguous, increasing, tokens never go back
    final = {t.table_id: t.capture_id for t in driver.tick().owner.changefeeds["cf"].tables}
    assert final[on_1[0]] == "capture-0"
