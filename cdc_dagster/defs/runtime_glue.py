"""The one place the control plane meets ``cdc_dagster.runtime`` (docs/dataplane.md section 4).

The sensor and the ops work on the small views below; this module builds them from the
runtime's objects, so a change of the runtime's shapes is absorbed here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cdc_dagster.defs.settings import Settings


@dataclass(frozen=True, slots=True)
class DdlToRun:
    """A DDL whose gate the owner opened this tick."""

    changefeed_id: str
    commit_ts: int
    table_ids: tuple[int, ...]  # the tables it blocks; empty: every table (global)
    query: str = ""


@dataclass(frozen=True, slots=True)
class TickView:
    """What one owner tick means for Dagster."""

    is_owner: bool
    owner: str  # who is the owner (for the skip reason)
    owner_rev: int = 0
    captures: tuple[str, ...] = ()  # alive captures
    work: Mapping[str, list[dict[str, Any]]] = field(default_factory=dict)  # capture -> wire msgs
    ddls: tuple[DdlToRun, ...] = ()
    progress: Mapping[str, tuple[int, int]] = field(default_factory=dict)  # cf -> (ckpt, resolved)
    duration_s: float = 0.0


@dataclass(frozen=True, slots=True)
class TableReport:
    """One table's progress after a capture's commit."""

    changefeed_id: str
    table_id: int
    state: str
    checkpoint_ts: int
    resolved_ts: int
    barrier_ts: int
    rows_applied: int


# The explicit, rebuildable cache of owner loops (one per etcd/cluster/owner in this code
# server process). Losing it (a code-server restart) is an owner switch: the next tick
# rebuilds from etcd.
_LOOPS: dict[tuple[str, ...], Any] = {}
_LOOPS_LOCK = threading.Lock()


def _owner_loop(settings: Settings) -> Any:
    from cdc_dagster.metastore import connect
    from cdc_dagster.runtime import OwnerLoop

    key = (*settings.etcd, str(settings.state_dir), settings.cluster_id, settings.owner_id)
    with _LOOPS_LOCK:
        loop = _LOOPS.get(key)
        if loop is None:
            ms = connect(
                list(settings.etcd) or None, settings.state_dir, cluster_id=settings.cluster_id
            )
            loop = OwnerLoop(ms, settings.owner_id)
            _LOOPS[key] = loop
        return loop


def forget_owner_loops() -> None:
    """Drop the cache (tests; the same as a code-server restart)."""
    with _LOOPS_LOCK:
        _LOOPS.clear()


def owner_tick(settings: Settings, admin_requests: Sequence[Any] = ()) -> TickView:
    """Run one ``OwnerLoop.tick()`` and describe it."""
    from cdc_dagster.runtime import wire

    started = time.perf_counter()
    loop = _owner_loop(settings)
    if admin_requests and hasattr(loop, "apply_admin"):
        loop.apply_admin(list(admin_requests))
    tick = loop.tick()
    duration = time.perf_counter() - started
    if not getattr(tick, "is_owner", True):
        return TickView(False, str(getattr(tick, "owner", "") or "nobody"), duration_s=duration)
    messages = getattr(tick, "messages", {}) or {}
    work = {capture: wire.encode(msgs) for capture, msgs in messages.items() if msgs}
    ddls = tuple(
        DdlToRun(
            str(getattr(d, "changefeed_id", "")),
            int(d.commit_ts),
            tuple(int(t) for t in (getattr(d, "table_ids", ()) or ())),
            str(getattr(d, "query", "")),
        )
        for d in getattr(tick, "ddls", ()) or ()
    )
    progress = {
        cf: (int(p.checkpoint_ts), int(p.resolved_ts))
        for cf, p in (getattr(tick, "progress", {}) or {}).items()
    }
    return TickView(
        True,
        settings.owner_id,
        int(getattr(tick, "owner_rev", 0)),
        tuple(sorted(getattr(tick, "captures", ()) or messages.keys())),
        work,
        ddls,
        progress,
        duration,
    )


def run_capture_prepare(
    settings: Settings, spark: Any, capture_id: str, wire_messages: list[dict[str, Any]]
) -> Any:
    """Phase 1 for ``capture_id`` (fencing + receive inside the runtime)."""
    from cdc_dagster.runtime import CaptureContext, capture_prepare, wire

    ctx = CaptureContext.for_capture(settings, capture_id, spark=spark)
    return ctx, capture_prepare(ctx, wire.decode(wire_messages))


def run_capture_commit(ctx: Any) -> tuple[Any, list[TableReport]]:
    """Phase 2; the per-table reports for asset materializations."""
    from cdc_dagster.runtime import capture_commit

    outcome = capture_commit(ctx)
    reports = [
        TableReport(
            str(t.changefeed_id),
            int(t.table_id),
            str(t.state),
            int(t.checkpoint_ts),
            int(t.resolved_ts),
            int(getattr(t, "barrier_ts", 0)),
            int(getattr(t, "rows_applied", 0)),
        )
        for t in getattr(outcome, "tables", ()) or ()
    ]
    return outcome, reports


def run_apply_ddl(settings: Settings, changefeed_id: str, commit_ts: int) -> str:
    """Apply the DDL at ``commit_ts`` of ``changefeed_id`` (idempotent at the sink)."""
    from cdc_dagster.runtime import apply_ready_ddl

    return str(apply_ready_ddl(settings, changefeed_id, commit_ts))
