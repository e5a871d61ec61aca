"""Owner switches: a new OwnerLoop (code-server restart) and a new owner in a new process
rebuild from etcd and the change log and continue; captures fence the old owner out."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from upstream_helpers import Upstream, check_downstream

from cdc_dagster.runtime.capture import capture_prepare
from cdc_dagster.runtime.owner import OwnerLoop
from cdc_dagster.runtime.wire import decode
from cdc_dagster.testing.driver import Driver
from cdc_dagster.testing.fake_runtime import FileDownstream

PROC = Path(__file__).with_name("driver_proc.py")


def check_downstream_writes(sink_uri: str) -> list[dict]:
    return FileDownstream(sink_uri[len("file://") :]).writes()


def test_new_owner_loop_in_the_same_process_rebuilds_and_continues(
    make_driver: Callable[..., Driver], upstream: Upstream
) -> None:
    driver = make_driver(captures=2)
    first = upstream.ts(3000)
    upstream.advance(first)
    driver.run_until(lambda t: driver.caught_up(t, first), max_ticks=30)
    rev = driver.owner.tick().owner_rev
    driver.owner = OwnerLoop(driver.ms, "owner-0")  # the sensor's code server restarted
    target = upstream.ts(6000)
    upstream.advance(target)
    t = driver.tick()
    assert t.owner.owner_rev == rev and t.owner.changefeeds["cf"].rebuilt
    # Rebuilt from the captures' reports: no table is re-added (no new token).
    assert t.owner.changefeeds["cf"].scheduler is None
    driver.run_until(lambda t: driver.caught_up(t, target), max_ticks=20)


def test_owner_killed_new_owner_in_new_process_continues_and_old_rev_is_fenced(
    make_driver: Callable[..., Driver],
    upstream: Upstream,
    sink_uri: str,
    etcd_endpoints: list[str],
    cluster_id: str,
    tmp_path: Path,
) -> None:
    driver = make_driver(captures=2, owner_lease_ttl_s=2)
    first = upstream.ts(3000)
    upstream.advance(first)
    driver.run_until(lambda t: driver.caught_up(t, first), max_ticks=30)
    old = driver.tick().owner
    tokens_before = {w["table_id"]: w["token"] for w in check_downstream_writes(sink_uri)}
    stale_config = old.run_config("capture-0")
    # The owner process dies (its lease lapses); a new owner in a new process takes over.
    driver.owner._session = None
    time.sleep(3.5)
    target = upstream.ts(8000)
    upstream.advance(target)
    argv = [
        sys.executable,
        str(PROC),
        ",".join(etcd_endpoints),
        cluster_id,
        str(tmp_path / "state"),
    ]
    argv += [str(upstream.root), sink_uri, "owner-1", str(target), "40"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(x) for x in proc.stdout.splitlines()]
    assert lines[0]["is_owner"] and lines[0]["owner_rev"] > old.owner_rev
    assert lines[0]["rebuilt"]
    assert lines[-1]["checkpoint"] >= target
    check_downstream(sink_uri)
    # Rebuilt from the captures' reports: no table was re-added (no new fencing token).
    tokens_after = {w["table_id"]: w["token"] for w in check_downstream_writes(sink_uri)}
    assert tokens_after == tokens_before
    # The old owner's messages are refused by the capture (registry owner_rev is higher).
    out = capture_prepare(driver.context("capture-0"), decode(stale_config["cf"]))
    assert out.rejected.get("rejected_stale_owner", 0) == len(stale_config["cf"])
    assert out.owner_rev == lines[0]["owner_rev"]


def test_a_second_candidate_is_not_owner_and_names_the_owner(
    make_driver: Callable[..., Driver],
) -> None:
    driver = make_driver(captures=1)
    first = driver.tick().owner
    assert first.is_owner
    other = OwnerLoop(driver.ms, "owner-9").tick()
    assert not other.is_owner and other.owner_id == "owner-0"
    assert other.owner_rev == first.owner_rev and "owner-0" in other.reason
    assert not other.messages and not other.ready_ddls
