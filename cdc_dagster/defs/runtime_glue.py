"""The one place the control plane meets ``cdc_dagster.runtime`` (docs/dataplane.md section 4).

The sensor and the ops work on the small views below; this module builds them from the
runtime's objects, so a change of the runtime's shapes is absorbed here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
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
class TableReport:
    """One table's progress (from a capture's commit, or the owner's view)."""

    changefeed_id: str
    table_id: int
    state: str
    checkpoint_ts: int
    resolved_ts: int
    barrier_ts: int
    rows_applied: int
    capture_id: str = ""


@dataclass(frozen=True, slots=True)
class TickView:
    """What one owner tick means for Dagster."""

    is_owner: bool
    owner: str  # who is the owner (for the skip reason)
    owner_rev: int = 0
    captures: tuple[str, ...] = ()  # alive captures
    work: Mapping[str, Any] = field(default_factory=dict)  # capture -> {cf: [wire msgs]}
    ddls: tuple[DdlToRun, ...] = ()
    progress: Mapping[str, tuple[int, int]] = field(default_factory=dict)  # cf -> (ckpt, resolved)
    tables: tuple[TableReport, ...] = ()  # the owner's view of each table
    notes: tuple[str, ...] = ()  # admin errors, syncpoints recorded, why nothing happened
    duration_s: float = 0.0


# The explicit, rebuildable cache of owner loops (one per etcd/cluster/owner in this code
# server process). Losing it (a code-server restart) is an owner switch: the next tick
# rebuilds from etcd.
_LOOPS: dict[tuple[str, ...], Any] = {}
_LOOPS_LOCK = threading.Lock()


def open_metastore(settings: Settings) -> Any:
    """A metastore connection per the settings (the caller closes it)."""
    from cdc_dagster.metastore import connect

    return connect(list(settings.etcd) or None, settings.state_dir, cluster_id=settings.cluster_id)


def _owner_loop(settings: Settings) -> Any:
    from cdc_dagster.runtime import OwnerLoop
    from scheduler_core.coordinator import CoordinatorConfig

    key = (*settings.etcd, str(settings.state_dir), settings.cluster_id, settings.owner_id)
    with _LOOPS_LOCK:
        loop = _LOOPS.get(key)
        if loop is None:
            loop = OwnerLoop(
                open_metastore(settings),
                settings.owner_id,
                lease_ttl_s=settings.owner_ttl_s,
                config=CoordinatorConfig(add_table_batch_size=settings.add_table_batch),
            )
            _LOOPS[key] = loop
        return loop


def owner_metastore(settings: Settings) -> Any:
    """The metastore connection of this process's owner loop (the sensor's)."""
    return _owner_loop(settings).metastore


def forget_owner_loops() -> None:
    """Drop the cache (tests; the same as a code-server restart)."""
    with _LOOPS_LOCK:
        _LOOPS.clear()


def reported_checkpoints(tasks: Any) -> dict[int, int]:
    """Each table's checkpoint as the capture replicating it reports it in ``tasks`` (one
    changefeed's task statuses by capture, as ``ms.task_statuses.read`` returns them; the min
    should two report it: never more than one would admit)."""
    from scheduler_core.model import TableState

    out: dict[int, int] = {}
    for status in tasks.values():
        batch = status.tables
        mask = batch.states == TableState.REPLICATING
        for t, c in zip(
            batch.table_ids[mask].tolist(), batch.checkpoint_ts[mask].tolist(), strict=True
        ):
            out[t] = min(c, out.get(t, c))
    return out


def _tables(tick: Any) -> tuple[TableReport, ...]:
    return tuple(
        TableReport(
            cf,
            int(t.table_id),
            str(t.state).lower(),
            int(t.checkpoint_ts),
            int(t.resolved_ts),
            int(t.barrier_ts),
            0,
            str(t.capture_id or ""),
        )
        for cf, cft in tick.changefeeds.items()
        for t in cft.tables
    )


def owner_tick(settings: Settings) -> TickView:
    """Run one ``OwnerLoop.tick()`` (and record the syncpoints it reached) and describe it."""
    from cdc_dagster.runtime import apply_ready_ddl, apply_syncpoint

    started = time.perf_counter()
    loop = _owner_loop(settings)
    tick = loop.tick()
    if not tick.is_owner:
        owner = f"{tick.owner_id} (owner_rev {tick.owner_rev})" if tick.owner_id else "nobody"
        reason = f"; {tick.reason}" if tick.reason else ""
        return TickView(False, owner + reason, duration_s=time.perf_counter() - started)
    notes = [f"admin request refused: {e}" for e in tick.admin_errors]
    for ready in tick.syncpoints:
        apply_syncpoint(loop.metastore, ready)
        notes.append(
            f"syncpoint {ready.ts} of {ready.changefeed_id} recorded ({len(ready.table_ids)} tables)"
        )
    work = {c: tick.run_config(c) for c in tick.messages}
    ddls = []
    for d in tick.ready_ddls:
        if not d.record.table_ids:
            # A DDL that touches no existing table (CREATE TABLE / SCHEMA) has no table
            # checkpoint to gate on, and nothing writes its new table before it ran: like
            # a syncpoint, the owner applies it now instead of a gated run per CREATE.
            apply_ready_ddl(loop.metastore, d)
            notes.append(f"DDL at {d.commit_ts} of {d.changefeed_id} applied: {d.query}")
            continue
        ddls.append(
            DdlToRun(
                d.changefeed_id,
                int(d.record.commit_ts),
                tuple(int(t) for t in d.record.table_ids),
                d.record.query,
            )
        )
    progress = {
        cf: (int(t.checkpoint_ts), int(t.resolved_ts)) for cf, t in tick.changefeeds.items()
    }
    return TickView(
        True,
        str(tick.owner_id),
        int(tick.owner_rev),
        tuple(sorted(tick.captures)),
        {c: w for c, w in work.items() if w},
        tuple(ddls),
        progress,
        _tables(tick),
        tuple(notes),
        time.perf_counter() - started,
    )


def _barrier_of(messages: list[dict[str, Any]], table_id: int) -> int:
    for m in reversed(messages):
        barrier = m.get("barrier")
        if barrier:
            per_table = barrier.get("table_barriers", {}).get(str(table_id))
            return int(per_table if per_table is not None else barrier.get("global_barrier_ts", 0))
    return 0


class CaptureTick:
    """One capture run's two halves over every changefeed it has messages for."""

    def __init__(
        self,
        ms: Any,
        settings: Settings,
        capture_id: str,
        spark: Any,
        work: Mapping[str, list[dict[str, Any]]],
    ) -> None:
        from cdc_dagster.runtime import CaptureContext, spark_executor_factory

        factory = spark_executor_factory(spark) if spark is not None else None
        self.work = dict(work)
        self.contexts = {
            cf: CaptureContext(
                ms,
                capture_id,
                cf,
                settings.staging_dir(),
                **({"executor_factory": factory} if factory is not None else {}),
                lease_ttl_s=settings.capture_ttl_s,
            )
            for cf in self.work
        }

    def prepare(self) -> list[str]:
        """Phase 1 per changefeed; the run-log lines."""
        from cdc_dagster.runtime import capture_prepare, wire

        lines = []
        for cf, ctx in self.contexts.items():
            outcome = capture_prepare(ctx, wire.decode(self.work[cf]))
            lines += [f"{cf}: {line}" for line in outcome.lines()]
        return lines

    def commit(self) -> tuple[list[str], list[TableReport]]:
        """Phase 2 per changefeed; the run-log lines and per-table reports."""
        from cdc_dagster.runtime import capture_commit

        lines: list[str] = []
        reports: list[TableReport] = []
        for cf, ctx in self.contexts.items():
            outcome = capture_commit(ctx)
            lines += [f"{cf}: {line}" for line in outcome.lines()]
            reports += [
                TableReport(
                    cf,
                    int(t.table_id),
                    str(t.state).lower(),
                    int(t.checkpoint_ts),
                    int(t.resolved_ts),
                    _barrier_of(self.work[cf], int(t.table_id)),
                    int(t.rows_applied),
                    ctx.capture_id,
                )
                for t in outcome.tables
            ]
        return lines, reports


def apply_ddl(ms: Any, changefeed_id: str, commit_ts: int) -> list[str]:
    """Apply the DDL(s) at ``commit_ts`` of ``changefeed_id`` (idempotent at the sink)."""
    from cdc_dagster.runtime import apply_ddl_at

    return [str(q) for q in apply_ddl_at(ms, changefeed_id, commit_ts)]
