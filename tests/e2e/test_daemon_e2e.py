"""End to end with the Dagster processes of `demo` (daemon running the owner sensor for real).

The demo workload replicates into Delta; each table equals the generator's oracle at the
last syncpoint; a table is moved to the other capture and keeps replicating.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

pytest.importorskip("cdc_dagster.runtime")

from cdc_dagster import admin
from cdc_dagster.defs.tables.checks import _compare_at_syncpoint
from cdc_dagster.services import stack, workload

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

    with stack.Stack(state, kind="demo", changelog=changelog, generator=generator) as st:
        etcd = st.etcd_endpoints
        workload.ensure_demo_changefeed(
            etcd, state, "demo", lake, stack.DEMO_CAPTURES, changelog, st.generator.start_ts
        )
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
