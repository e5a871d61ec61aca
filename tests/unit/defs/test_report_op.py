"""The capture job's report op: a following run's first-tick materializations go to the
follow op (written beside its loop); a run that does not follow logs them itself."""

from __future__ import annotations

from typing import Any

import dagster as dg
import pytest

from cdc_dagster.defs.capture.job import build_report_op
from cdc_dagster.defs.catalog import Catalog, TableRef
from cdc_dagster.runtime import TableProgress
from scheduler_core.ts import compose

CATALOG = Catalog.of(TableRef(t, "db", f"t{t}") for t in (1, 2, 3))


class _Log:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, msg: str, *args: Any) -> None:
        self.lines.append(msg % args if args else msg)


class _Context:
    def __init__(self, run_config: dict[str, Any]) -> None:
        self.run_config = run_config
        self.log = _Log()
        self.events: list[Any] = []

    def log_event(self, event: Any) -> None:
        self.events.append(event)


def _progress() -> list[TableProgress]:
    ts = compose(1_700_000_000_000)
    return [TableProgress("cf", t.table_id, "replicating", "c1", ts, ts, ts, 0)
            for t in CATALOG.tables]  # fmt: skip


@pytest.mark.parametrize(
    "run_config, handed",
    [
        ({"ops": {"follow": {"config": {"seconds": 300.0}}}}, True),
        ({"ops": {"follow": {"config": {"seconds": 0}}}}, False),
        ({}, False),  # no follow config: seconds 0, one tick per run
    ],
)
def test_report_hands_a_following_runs_materializations_to_the_follow_op(
    run_config: dict[str, Any], handed: bool
) -> None:
    report = build_report_op(CATALOG).compute_fn.decorated_fn  # type: ignore[union-attr]
    ctx = _Context(run_config)
    out = report(ctx, None, _progress())
    keys = {CATALOG.replica_key(t) for t in CATALOG.tables}
    if handed:
        assert ctx.events == [] and {e.asset_key for e in out} == keys
        assert all(isinstance(e, dg.AssetMaterialization) for e in out)
    else:
        assert out == [] and {e.asset_key for e in ctx.events} == keys
