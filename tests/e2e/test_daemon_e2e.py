"""End to end with the Dagster processes of `demo` (daemon running the owner sensor for real).

The demo workload replicates into Delta; each table equals the generator's oracle at the
last syncpoint; a table is moved to the other capture and keeps replicating. Then the sink
goes away (its root replaced by a file): ``changefeed query`` says "warning" with the sink's
error and the UI's ``changefeed_healthy`` check fails with it (read through GraphQL, as the
asset's Checks tab shows it); the root put back, both return to normal by themselves.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("cdc_dagster.runtime")

from cdc_dagster import admin
from cdc_dagster.defs.changefeeds.health import HEALTH_CHECK
from cdc_dagster.defs.tables.checks import _compare_at_syncpoint
from cdc_dagster.services import procs, stack, workload
from cdc_dagster.testing.ui import check_evaluations

pytestmark = pytest.mark.slow


def _wait(what: str, predicate, timeout_s: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(2)
    pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}")


def test_demo_replicates_equals_oracle_and_moves_a_table(tmp_path: Path) -> None:
    import dagster as dg

    from cdc_dagster.metastore import connect
    from cdc_dagster.upstream.oracle import Oracle, fingerprint

    state = tmp_path / "state"
    changelog, lake = state / "changelog", state / "lake"

    def generator() -> workload.GeneratorThread:
        return workload.GeneratorThread(changelog, 3, interval_s=1.0, txns_per_step=10)

    def create_changefeed(st: stack.Stack) -> None:
        # Before Dagster starts, as `demo` does: its asset and health check are in the catalog
        workload.ensure_demo_changefeed(
            st.etcd_endpoints, state, "demo", lake, stack.DEMO_CAPTURES, changelog,
            st.generator.start_ts,
        )  # fmt: skip

    with stack.Stack(
        state,
        kind="demo",
        changelog=changelog,
        generator=generator,
        before_dagster=create_changefeed,
    ) as st:
        etcd = st.etcd_endpoints
        with connect(etcd.split(","), state) as ms:
            start = ms.changefeeds.get("demo").status.checkpoint_ts
            _wait(
                "the checkpoint to move",
                lambda: ms.changefeeds.get("demo").status.checkpoint_ts > start,
                400,
            )
            _wait(
                "a syncpoint",
                lambda: list((lake / "_cdc_dagster" / "syncpoints").rglob("*.json")),
                200,
            )
            feeds = ms.changefeeds.list()
            for table_id in (1, 2, 3):
                result = _compare_at_syncpoint(
                    dg.AssetKey(["t", str(table_id)]),
                    table_id,
                    feeds,
                    changelog,
                    Oracle,
                    fingerprint,
                )
                assert result.passed, result.metadata
            admin.move_table(ms, "demo", 1, "capture-2")
            before = ms.changefeeds.get("demo").status.checkpoint_ts
            _wait(
                "replication to go on after the move",
                lambda: ms.changefeeds.get("demo").status.checkpoint_ts > before,
                300,
            )
            _sink_goes_away_then_comes_back(state, lake)


def _query(state: Path) -> dict:
    """``cdc-dagster changefeed query demo``, as a user runs it."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "cdc_dagster.cli",
            "--state-dir",
            str(state),
            "changefeed",
            "query",
            "-c",
            "demo",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _sink_goes_away_then_comes_back(state: Path, lake: Path) -> None:
    web = next(p.address for p in procs.read_record(state).parts if p.name == stack.WEB)

    def ui_check() -> dict:
        found = check_evaluations(web, ["changefeed", "demo"], HEALTH_CHECK, limit=1)
        return found[0] if found else {}

    aside = lake.with_name("lake.aside")
    lake.rename(aside)
    lake.write_text("not a directory: the sink's root is gone")
    _wait("changefeed query to say warning", lambda: _query(state)["state"] == "warning", 300)
    row = _query(state)
    assert "lake" in row["error"], row  # the whole message names what is wrong
    assert row["warning_since"], row
    _wait("the UI's health check to fail", lambda: ui_check().get("success") is False, 120)
    failing = ui_check()
    assert failing["severity"] == "WARN", failing  # a warning, retried; not failed
    assert "lake" in failing["description"], failing

    lake.unlink()
    aside.rename(lake)
    _wait("changefeed query back to normal", lambda: _query(state)["state"] == "normal", 300)
    assert _query(state)["error"] == ""
    _wait("the UI's health check to pass", lambda: ui_check().get("success") is True, 120)
