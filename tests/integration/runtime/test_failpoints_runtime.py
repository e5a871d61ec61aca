"""Each failpoint of the runtime fires where its name says, and replication carries on after it.

The capture ones crash a capture run in its own process (``capture_proc.py``) at the real
failpoint, as ``CDC_DAGSTER_FAILPOINTS`` would on a deployment; the DDL and owner ones raise
in process, between the two writes they name.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from upstream_helpers import Upstream, check_downstream

from cdc_dagster import failpoints
from cdc_dagster.metastore import Metastore
from cdc_dagster.metastore.problems import DDL
from cdc_dagster.runtime.capture import CaptureContext
from cdc_dagster.runtime.owner import ddl_marker
from cdc_dagster.testing.driver import Driver
from cdc_dagster.testing.fake_runtime import FileDownstream

PROC = Path(__file__).with_name("capture_proc.py")


def _crashing_runner(endpoints: list[str], cluster_id: str, env: str, codes: list[int]):  # type: ignore[no-untyped-def]
    def run(ctx: CaptureContext, config: dict) -> None:
        argv = [sys.executable, str(PROC), ",".join(endpoints), cluster_id, ctx.changefeed_id]
        argv += [ctx.capture_id, str(ctx.staging_root), json.dumps(config), "none"]
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, failpoints.ENV: env},
        )
        codes.append(proc.returncode)
        if proc.returncode not in (0, failpoints.CRASH_EXIT_CODE):
            raise AssertionError(proc.stderr[-3000:])

    return run


def _reported(ms: Metastore, capture_id: str) -> dict[int, tuple[int, int]]:
    """Table -> (checkpoint, resolved) in the capture's task status key (its report)."""
    status = ms.read_owner_snapshot().tasks["cf"][capture_id].tables
    return {
        int(t): (int(c), int(r))
        for t, c, r in zip(status.table_ids, status.checkpoint_ts, status.resolved_ts, strict=True)
    }


@pytest.fixture
def caught_up(make_driver: Callable[..., Driver], upstream: Upstream) -> Driver:
    """Two captures replicating every table up to 3 s after t0."""
    driver = make_driver(captures=2)
    first = upstream.ts(3000)
    upstream.advance(first)
    driver.run_until(lambda t: driver.caught_up(t, first), max_ticks=30)
    return driver


def test_crash_at_sink_after_write_leaves_the_sink_written_and_the_report_not(
    caught_up: Driver, upstream: Upstream, sink_uri: str, etcd_endpoints: list[str], cluster_id: str
) -> None:
    driver, ms = caught_up, caught_up.ms
    before = _reported(ms, "capture-1")
    target = upstream.ts(9000)
    upstream.advance(target)
    codes: list[int] = []
    crash = _crashing_runner(etcd_endpoints, cluster_id, "sink.after_write=crash", codes)
    driver.tick(runner={"capture-1": crash})
    assert codes == [failpoints.CRASH_EXIT_CODE]
    ds = FileDownstream(sink_uri[len("file://") :])
    assert before and all(ds.committed(t) == target for t in before)  # the sink wrote
    assert {t: cp for t, (cp, _) in _reported(ms, "capture-1").items()} == {
        t: cp for t, (cp, _) in before.items()
    }  # the checkpoint was not reported
    driver.run_until(lambda t: driver.caught_up(t, target), max_ticks=30)
    check_downstream(sink_uri)  # replayed batch refused or skipped: no double write
    assert {t: ds.committed(t) for t in upstream.table_ids} == dict.fromkeys(
        upstream.table_ids, target
    )


@pytest.mark.slow
def test_crash_at_capture_prepare_persists_nothing_and_the_next_run_carries_on(
    caught_up: Driver, upstream: Upstream, sink_uri: str, etcd_endpoints: list[str], cluster_id: str
) -> None:
    driver, ms = caught_up, caught_up.ms
    before = _reported(ms, "capture-1")
    target = upstream.ts(9000)
    upstream.advance(target)
    codes: list[int] = []
    crash = _crashing_runner(etcd_endpoints, cluster_id, "capture.prepare=crash", codes)
    driver.tick(runner={"capture-1": crash})
    assert codes == [failpoints.CRASH_EXIT_CODE]
    # prepare pulled to the target but died before its persist: the report is as it was
    assert _reported(ms, "capture-1") == before
    assert all(resolved < target for _, resolved in before.values())
    ds = FileDownstream(sink_uri[len("file://") :])
    assert all(ds.committed(t) < target for t in before)  # commit never ran
    driver.run_until(lambda t: driver.caught_up(t, target), max_ticks=30)
    check_downstream(sink_uri)


def test_error_at_ddl_after_apply_leaves_the_ddl_applied_and_unmarked_then_runs_it_once(
    make_driver: Callable[..., Driver], upstream: Upstream, sink_uri: str
) -> None:
    driver = make_driver(captures=2)
    upstream.advance(upstream.ts(3000))
    driver.run_until(lambda t: driver.caught_up(t, upstream.resolved), max_ticks=30)
    created_at = upstream.ts(4000)
    record = upstream.create(5, created_at)
    upstream.table_ids.append(5)
    target = upstream.ts(9000)
    upstream.advance(target)
    ds = FileDownstream(sink_uri[len("file://") :])
    # The error is the changefeed's problem (retried with backoff), not the owner's.
    with failpoints.configured("ddl.after_apply=error(injected mid-DDL)"):
        driver.run_until(lambda t: bool(driver.ms.problems.get("cf", DDL)), max_ticks=30)
    assert "injected mid-DDL" in driver.ms.problems.get("cf", DDL).message
    assert [d[0] for d in ds.state()["ddls"]] == [created_at]  # applied at the sink
    marker = ddl_marker(driver.ms, "cf", record.to_event())
    assert driver.ms.client.get(marker) is None  # ... and not marked
    deadline = time.monotonic() + 60
    while not (
        driver.caught_up(t := driver.tick(), target) and len(t.owner.changefeeds["cf"].tables) == 5
    ):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert driver.ms.client.get(marker) is not None
    assert [d[0] for d in ds.state()["ddls"]] == [created_at]  # once
    assert driver.ms.problems.get("cf", DDL) is None
    check_downstream(sink_uri)


def test_error_at_owner_before_write_leaves_the_checkpoint_unwritten(
    caught_up: Driver, upstream: Upstream
) -> None:
    driver, ms = caught_up, caught_up.ms
    target = upstream.ts(9000)
    upstream.advance(target)
    driver.tick()  # the captures sink to the target and report it
    stored = ms.changefeeds.get("cf").status.checkpoint_ts
    assert stored < target
    with (
        failpoints.configured("owner.before_write=error(injected before the owner write)"),
        pytest.raises(failpoints.FailpointError, match="before the owner write"),
    ):
        driver.tick()
    assert ms.changefeeds.get("cf").status.checkpoint_ts == stored
    driver.run_until(lambda t: driver.caught_up(t, target), max_ticks=5)
    assert ms.changefeeds.get("cf").status.checkpoint_ts >= target
