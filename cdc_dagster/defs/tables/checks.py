"""Asset checks on replicated tables: lag bound, equality with the upstream at the last
syncpoint, and the bank workload's invariant total.

Table ids are per change log: a table is compared only against its own changefeed's
syncpoints and change log (``TableRef.changefeed_id``; a table of no changefeed, from
CDC_DAGSTER_CHANGELOG, against any changefeed reading that log).
"""

from collections.abc import Iterable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import dagster as dg
from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition

from cdc_dagster.defs.catalog import Catalog, TableRef
from cdc_dagster.defs.resources import CdcResource
from cdc_dagster.defs.tables.assets import ObservationBudget
from cdc_dagster.runtime import TableProgress
from cdc_dagster.sinks.delta import read_syncpoint, read_table_at
from cdc_dagster.sinks.delta_syncpoint_file import list_syncpoints
from cdc_dagster.sinks.uri import delta_root, is_delta
from cdc_dagster.upstream.generator import WorkloadConfig
from cdc_dagster.upstream.oracle import Oracle, fingerprint
from cdc_dagster.upstream.uri import UpstreamError, changelog_path

LAG_CHECK = "lag_within_bound"
SYNCPOINT_CHECK = "equals_upstream_at_syncpoint"
BANK_CHECK = "bank_total_invariant"


def _lag_verdict(lag_s: float | None, bound_s: float) -> dict[str, Any]:
    if lag_s is None or lag_s == float("inf"):
        return {"passed": False, "description": "no progress reported yet"}
    return {
        "passed": lag_s <= bound_s,
        "metadata": {"lag_seconds": float(lag_s), "bound_seconds": float(bound_s)},
    }


def lag_check_result(key: dg.AssetKey, lag_s: float | None, bound_s: float) -> dg.AssetCheckResult:
    """Pass while the latest ``lag_seconds`` is within ``bound_s``."""
    return dg.AssetCheckResult(asset_key=key, check_name=LAG_CHECK, **_lag_verdict(lag_s, bound_s))


def lag_evaluations(
    catalog: Catalog,
    tables: Iterable[TableProgress],
    now_ms: int,
    bound_s: float,
    budget: ObservationBudget,
) -> list[dg.AssetCheckEvaluation]:
    """The lag check of every replica asset as the owner sees it this tick (the worst table
    of a grouped schema), for the assets ``budget`` picks: a verdict that changed first, then
    those not evaluated for its refresh time. The owner sensor reports them each tick, so the
    checks column shows lag without anyone launching a check."""
    worst: dict[dg.AssetKey, float] = {}
    for t in tables:
        key = catalog.replica_key_for(t.changefeed_id, t.table_id)
        if key is not None:
            worst[key] = max(worst.get(key, 0.0), t.lag_s(now_ms))
    verdicts = {key: _lag_verdict(lag, bound_s) for key, lag in worst.items()}
    signatures = {key: (str(v["passed"]), "") for key, v in verdicts.items()}
    return [
        dg.AssetCheckEvaluation(asset_key=key, check_name=LAG_CHECK, **verdicts[key])
        for key in budget.select(signatures, now_ms / 1000.0)
    ]


def _latest_float(instance: dg.DagsterInstance, key: dg.AssetKey, name: str) -> float | None:
    event = instance.get_latest_materialization_event(key)
    if event is None or event.asset_materialization is None:
        return None
    value = event.asset_materialization.metadata.get(name)
    return float(value.value) if value is not None else None


def _last_syncpoint(sink_uri: str, changefeed_id: str) -> Any:
    """The changefeed's last syncpoint record at a Delta sink (None if none)."""
    if not is_delta(sink_uri):
        return None
    root = delta_root(sink_uri)
    points = list_syncpoints(root, changefeed_id)
    return read_syncpoint(root, changefeed_id, points[-1]) if points else None


def _table_at_syncpoint(sink_uri: str, sp: Any, table_id: int) -> Any:
    return read_table_at(delta_root(sink_uri), sp.locations[table_id], sp.versions[table_id])


def lag_checks(catalog: Catalog) -> list[dg.AssetChecksDefinition]:
    """The lag check over ``catalog``'s replica assets (none without tables); the owner
    sensor reports it every tick, and launched by hand it reads the latest materializations."""
    keys = catalog.replica_keys()
    if not keys:
        return []

    @dg.multi_asset_check(
        specs=[
            dg.AssetCheckSpec(
                LAG_CHECK, asset=k, description="checkpoint lag within the configured bound"
            )
            for k in keys
        ],
        name="replica_lag_checks",
    )
    def lag_checks(
        context: dg.AssetCheckExecutionContext, cdc: CdcResource
    ) -> Iterator[dg.AssetCheckResult]:
        bound = cdc.settings().lag_bound_s
        for key in keys:
            yield lag_check_result(key, _latest_float(context.instance, key, "lag_seconds"), bound)

    return [lag_checks]


def syncpoint_checks(catalog: Catalog) -> list[dg.AssetChecksDefinition]:
    """The checks that read the downstream at the last syncpoint (equality with the upstream,
    the bank total): the owner sensor runs them each time a syncpoint is recorded."""
    checks = [] if catalog.grouped else [_syncpoint_checks(catalog)]
    bank = [t for t in catalog.tables if t.database == "bank"]
    if bank:
        checks.append(_bank_check(catalog, catalog.replica_key(bank[0]), bank))
    return checks


SYNCPOINT_CHECKS_JOB = "check_at_syncpoint"


def syncpoint_checks_job(checks: list[dg.AssetChecksDefinition]) -> UnresolvedAssetJobDefinition:
    """The job that runs the syncpoint checks (requested by the owner sensor)."""
    return dg.define_asset_job(
        SYNCPOINT_CHECKS_JOB,
        selection=dg.AssetSelection.checks(*checks),
        executor_def=dg.in_process_executor,
        description="the replicas against the upstream at the last syncpoint (after each one)",
    )


def _syncpoint_checks(catalog: Catalog) -> dg.AssetChecksDefinition:
    refs = {catalog.replica_key(t): t for t in catalog.tables}

    @dg.multi_asset_check(
        specs=[
            dg.AssetCheckSpec(
                SYNCPOINT_CHECK,
                asset=k,
                description="downstream fingerprint equals the upstream oracle at the last syncpoint",
            )
            for k in refs
        ],
        name="replica_syncpoint_checks",
    )
    def syncpoint_checks(
        context: dg.AssetCheckExecutionContext, cdc: CdcResource
    ) -> Iterator[dg.AssetCheckResult]:
        s = cdc.settings()
        feeds = cdc.metastore().changefeeds.list()
        for key, ref in refs.items():
            yield _compare_at_syncpoint(key, ref, feeds, s.changelog, Oracle, fingerprint)

    return syncpoint_checks


def _feeds_of(ref: TableRef, feeds: list[Any], changelog: Path | None) -> list[Any]:
    """The changefeeds whose table ``ref`` is: its own, or (no changefeed) every one
    reading CDC_DAGSTER_CHANGELOG's change log."""
    if ref.changefeed_id:
        return [cf for cf in feeds if cf.changefeed_id == ref.changefeed_id]
    if changelog is None:
        return feeds
    return [cf for cf in feeds if _changelog_of(cf) == changelog.resolve()]


def _changelog_of(cf: Any) -> Path | None:
    try:
        return Path(changelog_path(getattr(cf.info, "upstream_uri", "") or "")).resolve()
    except UpstreamError:
        return None


def _compare_at_syncpoint(
    key: dg.AssetKey,
    ref: TableRef | int,  # an int: a table id of CDC_DAGSTER_CHANGELOG's log
    feeds: list[Any],
    changelog: Path | None,
    oracle_cls: Any,
    fingerprint: Any,
) -> dg.AssetCheckResult:
    if isinstance(ref, int):
        ref = TableRef(ref, "", "")
    table_id = ref.table_id
    for cf in _feeds_of(ref, feeds, changelog):
        sp = _last_syncpoint(cf.info.sink_uri, cf.changefeed_id)
        root = _changelog_of(cf) or changelog
        if sp is None or table_id not in sp.versions or root is None:
            continue
        downstream = _table_at_syncpoint(cf.info.sink_uri, sp, table_id)
        expected = oracle_cls(str(root)).table_at(table_id, sp.ts)
        ignore = [c for c in downstream.column_names if c.startswith("_cdc")]
        got, want = fingerprint(downstream, ignore_columns=ignore), fingerprint(expected)
        return dg.AssetCheckResult(
            asset_key=key,
            check_name=SYNCPOINT_CHECK,
            passed=got == want,
            metadata={
                "syncpoint_ts": sp.ts,
                "delta_version": sp.versions[table_id],
                "rows": downstream.num_rows,
                "downstream_fingerprint": got,
                "oracle_fingerprint": want,
            },
        )
    return dg.AssetCheckResult(
        asset_key=key,
        check_name=SYNCPOINT_CHECK,
        passed=True,
        description="no syncpoint recorded yet",
        metadata={"syncpoint_ts": 0},
    )


def _bank_total(feeds: list[Any], table_ids: list[int]) -> tuple[Decimal, int] | None:
    """The bank tables' total at the first of ``feeds`` with a syncpoint."""
    for cf in feeds:
        sp = _last_syncpoint(cf.info.sink_uri, cf.changefeed_id)
        if sp is None:
            continue
        total = Decimal("0.00")
        for tid in table_ids:
            if tid in sp.versions:
                table = _table_at_syncpoint(cf.info.sink_uri, sp, tid)
                if "balance" in table.column_names:
                    total += sum(
                        (v for v in table.column("balance").to_pylist() if v is not None),
                        Decimal("0.00"),
                    )
        return total, sp.ts
    return None


def _bank_check(
    catalog: Catalog, key: dg.AssetKey, bank: list[TableRef]
) -> dg.AssetChecksDefinition:
    # the bank tables of one change log (the first one's): ids of two logs never add up
    first = bank[0].changefeed_id
    table_ids = [t.table_id for t in bank if t.changefeed_id == first]

    @dg.asset_check(
        asset=key,
        name=BANK_CHECK,
        description="sum of balances over every bank table at the last syncpoint equals the workload's constant",
    )
    def bank_total(context: dg.AssetCheckExecutionContext, cdc: CdcResource) -> dg.AssetCheckResult:
        feeds = _feeds_of(bank[0], cdc.metastore().changefeeds.list(), cdc.settings().changelog)
        found = _bank_total(feeds, table_ids)
        if found is None:
            return dg.AssetCheckResult(passed=True, description="no syncpoint recorded yet")
        total, ts = found
        config = WorkloadConfig()
        expected = config.initial_balance * config.rows_per_table * len(table_ids)
        return dg.AssetCheckResult(
            passed=total == expected,
            metadata={"total": float(total), "expected": float(expected), "syncpoint_ts": ts},
        )

    return bank_total
