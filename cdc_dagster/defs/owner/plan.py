"""Turn one owner tick into a ``SensorResult``: pure, so it is tested without Dagster running."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping

import dagster as dg

from cdc_dagster.defs.catalog import Catalog
from cdc_dagster.defs.partitions import CAPTURES
from cdc_dagster.defs.runtime_glue import DdlToRun, TickView
from cdc_dagster.defs.tables.gate import gate_status

CAPTURE_JOB = "capture_tick"
DDL_JOB = "apply_ddl"


def capture_run_request(capture_id: str, view: TickView, tick: int) -> dg.RunRequest:
    """One capture tick: its owner messages, ``owner_rev`` and the tick in the run config."""
    config = {
        "capture_id": capture_id,
        "owner_rev": view.owner_rev,
        "tick": tick,
        "messages_json": json.dumps(view.work.get(capture_id, {}), separators=(",", ":")),
    }
    return dg.RunRequest(
        # run keys are deduplicated forever: owner_rev and the tick make each one new.
        run_key=f"capture:{capture_id}:{view.owner_rev}:{tick}",
        partition_key=capture_id,
        job_name=CAPTURE_JOB,
        run_config={"ops": {"receive": {"config": config}}},
        tags={"cdc/owner_rev": str(view.owner_rev), "cdc/tick": str(tick)},
    )


DDL_RETRY_TICKS = 6  # a DDL still ready this many ticks later gets a new run (~30 s)


def ddl_run_request(ddl: DdlToRun, view: TickView, tick: int) -> dg.RunRequest:
    """The run applying one DDL whose gate is open (again after a failed run, every ~30 s)."""
    config = {
        "changefeed_id": ddl.changefeed_id,
        "commit_ts": ddl.commit_ts,
        "table_ids": list(ddl.table_ids),
    }
    return dg.RunRequest(
        run_key=f"ddl:{ddl.changefeed_id}:{ddl.commit_ts}:{view.owner_rev}:{tick // DDL_RETRY_TICKS}",
        job_name=DDL_JOB,
        run_config={"ops": {"ddl_gate": {"config": config}, "ddl_apply": {"config": config}}},
        tags={"cdc/changefeed": ddl.changefeed_id, "cdc/ddl_commit_ts": str(ddl.commit_ts)},
    )


def plan(
    view: TickView,
    tick: int,
    known_captures: Collection[str],
    catalog: Catalog,
    checkpoint_of: Callable[[int], int | None],
) -> dg.SensorResult:
    """The sensor's answer for one tick.

    A run per capture with work (a heartbeat is work: it renews the lease); partitions
    follow the alive captures; a DDL run only when the tables' checkpoint metadata has
    reached its commit ts (the gate op re-checks inside the run).
    """
    if not view.is_owner:
        return dg.SensorResult(
            skip_reason=f"not the owner: {view.owner} holds the election", cursor=str(tick)
        )
    alive = set(view.captures)
    partition_requests: list[
        dg.AddDynamicPartitionsRequest | dg.DeleteDynamicPartitionsRequest
    ] = []
    added = sorted(alive - set(known_captures))
    gone = sorted(set(known_captures) - alive)
    if added:
        partition_requests.append(CAPTURES.build_add_request(added))
    if gone:
        partition_requests.append(CAPTURES.build_delete_request(gone))
    runs = [
        capture_run_request(c, view, tick) for c, m in sorted(view.work.items()) if m and c in alive
    ]
    for ddl in view.ddls:
        is_open, _ = gate_status(ddl, catalog, checkpoint_of)
        if is_open:
            runs.append(ddl_run_request(ddl, view, tick))
    return dg.SensorResult(
        run_requests=runs,
        dynamic_partitions_requests=partition_requests,
        cursor=str(tick),
    )


def progress_lines(view: TickView) -> Mapping[str, str]:
    """Per changefeed, one log line of its progress."""
    from scheduler_core.ts import format_ts

    return {
        cf: f"checkpoint {format_ts(ckpt)} resolved {format_ts(res)}"
        for cf, (ckpt, res) in view.progress.items()
    }
