"""Asset specs of upstream and replicated tables, and the materializations a report makes."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import dagster as dg

from cdc_dagster.defs.catalog import Catalog, TableRef
from cdc_dagster.runtime import TableProgress
from scheduler_core.ts import physical_ms

UPSTREAM_GROUP = "upstream"
REPLICA_GROUP = "replica"


def upstream_specs(catalog: Catalog) -> list[dg.AssetSpec]:
    """Upstream tables (or schemas, when grouped) as external assets."""
    specs: dict[dg.AssetKey, dg.AssetSpec] = {}
    for ref in catalog.tables:
        key = catalog.upstream_key(ref)
        if key not in specs:
            specs[key] = dg.AssetSpec(
                key,
                group_name=UPSTREAM_GROUP,
                description=f"upstream {ref.database if catalog.grouped else ref.name}",
                kinds={"mysql"},
            )
    return list(specs.values())


def replica_specs(catalog: Catalog) -> list[dg.AssetSpec]:
    """Replicated tables (or schemas), each depending on its upstream."""
    specs: dict[dg.AssetKey, dg.AssetSpec] = {}
    for ref in catalog.tables:
        key = catalog.replica_key(ref)
        if key not in specs:
            specs[key] = dg.AssetSpec(
                key,
                deps=[catalog.upstream_key(ref)],
                group_name=REPLICA_GROUP,
                description=(
                    f"replica of {ref.database if catalog.grouped else ref.name}, written by the "
                    "capture holding it; metadata: checkpoint/resolved/barrier ts, lag_seconds"
                ),
                kinds={"delta"},
                metadata={"table_id": ref.table_id} if not catalog.grouped else {},
            )
    return list(specs.values())


def _ts_meta(name: str, ts: int) -> dict[str, dg.MetadataValue]:
    return {
        name: dg.MetadataValue.timestamp(physical_ms(ts) / 1000.0),
        f"{name}_raw": dg.MetadataValue.int(ts),
    }


def table_materialization(
    key: dg.AssetKey, reports: Sequence[TableProgress], now_ms: int
) -> dg.AssetMaterialization:
    """One materialization for ``reports`` (one table, or every table of a grouped schema)."""
    capture_id = ",".join(sorted({r.capture_id for r in reports}))
    checkpoint = min(r.checkpoint_ts for r in reports)
    resolved = min(r.resolved_ts for r in reports)
    barrier = min(r.barrier_ts for r in reports)
    lag_s = max(0.0, (now_ms - physical_ms(checkpoint)) / 1000.0)
    metadata: dict[str, dg.MetadataValue] = {
        **_ts_meta("checkpoint_ts", checkpoint),
        **_ts_meta("resolved_ts", resolved),
        **_ts_meta("barrier_ts", barrier),
        "lag_seconds": dg.MetadataValue.float(lag_s),
        "rows_applied": dg.MetadataValue.int(sum(r.rows_applied for r in reports)),
        "capture": dg.MetadataValue.text(capture_id),
        "changefeed": dg.MetadataValue.text(reports[0].changefeed_id),
        "state": dg.MetadataValue.text(",".join(sorted({r.state for r in reports}))),
    }
    if len(reports) == 1:
        metadata["table_id"] = dg.MetadataValue.int(reports[0].table_id)
    else:
        metadata["tables"] = dg.MetadataValue.int(len(reports))
    return dg.AssetMaterialization(asset_key=key, metadata=metadata)


def materializations(
    catalog: Catalog, reports: Iterable[TableProgress], now_ms: int
) -> list[dg.AssetMaterialization]:
    """The report's materializations: one per asset key (tables of a group merged)."""
    grouped: dict[dg.AssetKey, list[TableProgress]] = {}
    for report in reports:
        key = catalog.replica_key_for(report.changefeed_id, report.table_id)
        if key is None:  # created after the catalog was loaded
            key = catalog.replica_key(
                TableRef(report.table_id, "unknown", f"table_{report.table_id}")
            )
        grouped.setdefault(key, []).append(report)
    return [table_materialization(k, rs, now_ms) for k, rs in grouped.items()]


class MaterializationThrottle:
    """Which of a follow tick's materializations to log, for a capture holding many assets.

    Each materialization is one event-log write (~12 ms on SQLite, most of an idle
    capture's CPU: 50 quiet tables took ~0.2 core of one); a run following its mailbox
    ticks every sensor interval, so a capture holding 2,000 table assets would write 2,000
    events every 5 s. An asset is logged when its state or holder changed, when it stopped
    at its barrier (a DDL gate reads its checkpoint metadata: it opens at once), and, while
    the tick has at most ``free`` assets, when rows were applied to it since it was last
    logged (a busy table's lag plot keeps a point per tick); else at most every
    ``idle_every_s`` (``every_s`` past ``free`` assets): an idle table's checkpoint only
    follows its resolved ts. A table whose checkpoint has not moved since it was logged
    (waiting for its turn to be sunk, as a snapshot's released tables do for tens of
    seconds; or stalled) has only its lag to tell: at most every ``still_every_s``. (A
    snapshot's changefeed ticks every 10-20 s while its 100 tables are sunk, and each tick
    logged all 50 of a capture's: ~0.13 core of each capture in event-log writes.) One per
    run, in memory.
    """

    def __init__(
        self,
        free: int = 200,
        every_s: float = 15.0,
        idle_every_s: float = 10.0,
        still_every_s: float = 30.0,
    ) -> None:
        self.free = free
        self.every_s = every_s
        self.idle_every_s = idle_every_s
        self.still_every_s = still_every_s
        # asset -> (state|holder, when logged, rows applied, checkpoint) as last logged
        self._last: dict[dg.AssetKey, tuple[str, float, object, object]] = {}

    def select(
        self, events: Sequence[dg.AssetMaterialization], now_s: float
    ) -> list[dg.AssetMaterialization]:
        """The events to log now."""
        few = len(events) <= self.free
        every = self.idle_every_s if few else self.every_s
        out = []
        for event in events:
            md = event.metadata
            sig = f"{metadata_value(md, 'state')}|{metadata_value(md, 'capture')}"
            rows, checkpoint = (
                metadata_value(md, "rows_applied"),
                metadata_value(md, "checkpoint_ts_raw"),
            )
            # stopped at its barrier short of its resolved ts: a DDL waits for it
            held = checkpoint is not None and checkpoint == metadata_value(md, "barrier_ts_raw")
            held = held and (metadata_value(md, "resolved_ts_raw") or 0) > checkpoint
            last = self._last.get(event.asset_key)
            still = last is not None and checkpoint is not None and last[3] == checkpoint
            if (
                last is None
                or last[0] != sig
                or (held and last[3] != checkpoint)
                or (few and (rows is None or last[2] != rows))
                or now_s - last[1] >= (max(every, self.still_every_s) if still else every)
            ):
                self._last[event.asset_key] = (sig, now_s, rows, checkpoint)
                out.append(event)
        return out


def metadata_value(metadata: Mapping[str, Any], name: str) -> Any:
    """A metadata entry's value (None when absent)."""
    entry = metadata.get(name)
    return getattr(entry, "value", entry)


class ObservationBudget:
    """Which replica assets get an owner observation this tick, at most ``per_tick`` of them.

    The sensor daemon stores every observation as its own event-log write (~12 ms each on
    SQLite here), and a sensor's reply carries ~2 KB per observation: one per asset per
    tick made a 2,000-asset catalog's tick 1.2 s in the code server and 24 s of the
    daemon's time every 5 s (bench/sensor_tick_bench.py). The lag plot comes from the
    capture runs' materializations; the owner's observation says what the owner thinks
    (state, holders), so an asset whose states or holders changed goes first, then those
    not observed for ``refresh_s`` (longest first). Kept in the code server's memory, like
    the Outbox: losing it only observes everything again.
    """

    def __init__(self, per_tick: int | None = 50, refresh_s: float = 60.0) -> None:
        self.per_tick = per_tick  # None: every asset every tick (the old behaviour)
        self.refresh_s = refresh_s
        self._last: dict[dg.AssetKey, tuple[tuple[str, str], float]] = {}

    def select(
        self, signatures: dict[dg.AssetKey, tuple[str, str]], now_s: float
    ) -> list[dg.AssetKey]:
        """The keys to observe now (and remember them as observed)."""
        if self.per_tick is None:
            chosen = list(signatures)
        else:
            changed, stale = [], []
            for key, sig in signatures.items():
                last = self._last.get(key)
                if last is None or last[0] != sig:
                    changed.append(key)
                elif now_s - last[1] >= self.refresh_s:
                    stale.append((last[1], key))
            stale.sort(key=lambda x: x[0])
            chosen = (changed + [k for _, k in stale])[: self.per_tick]
        for key in chosen:
            self._last[key] = (signatures[key], now_s)
        return chosen


def progress_observations(
    catalog: Catalog,
    tables: Iterable[TableProgress],
    now_ms: int,
    budget: ObservationBudget | None = None,
) -> list[dg.AssetObservation]:
    """The owner's view of each table (state, primary capture, barrier, lag) as observations,
    one per asset key (tables of a group merged), for the keys ``budget`` picks (all of
    them without one)."""
    grouped: dict[dg.AssetKey, list[TableProgress]] = {}
    for t in tables:
        key = catalog.replica_key_for(t.changefeed_id, t.table_id)
        if key is not None:
            grouped.setdefault(key, []).append(t)
    keys = list(grouped)
    if budget is not None:
        signatures = {
            key: (
                ",".join(sorted({r.state for r in reports})),
                ",".join(sorted({r.capture_id for r in reports})),
            )
            for key, reports in grouped.items()
        }
        keys = budget.select(signatures, now_ms / 1000.0)
    out = []
    for key in keys:
        reports = grouped[key]
        m = table_materialization(key, reports, now_ms)
        metadata = {k: v for k, v in m.metadata.items() if k != "rows_applied"}
        metadata["source"] = dg.MetadataValue.text("owner")
        out.append(dg.AssetObservation(asset_key=key, metadata=metadata))
    return out


def latest_checkpoint(instance: dg.DagsterInstance, key: dg.AssetKey) -> int | None:
    """The ``checkpoint_ts_raw`` of the asset's latest materialization (None if none)."""
    event = instance.get_latest_materialization_event(key)
    if event is None or event.asset_materialization is None:
        return None
    value = event.asset_materialization.metadata.get("checkpoint_ts_raw")
    return int(value.value) if value is not None else None
