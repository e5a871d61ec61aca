"""Asset checks on replicated tables: lag bound, equality with the upstream at the last
syncpoint, and the bank workload's invariant total."""

import json
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import dagster as dg

from cdc_dagster.defs.catalog import Catalog
from cdc_dagster.defs.resources import CdcResource

LAG_CHECK = "lag_within_bound"
SYNCPOINT_CHECK = "equals_upstream_at_syncpoint"
BANK_CHECK = "bank_total_invariant"


def lag_check_result(key: dg.AssetKey, lag_s: float | None, bound_s: float) -> dg.AssetCheckResult:
    """Pass while the latest ``lag_seconds`` is within ``bound_s``."""
    if lag_s is None:
        return dg.AssetCheckResult(
            asset_key=key,
            check_name=LAG_CHECK,
            passed=False,
            description="no progress reported yet",
        )
    return dg.AssetCheckResult(
        asset_key=key,
        check_name=LAG_CHECK,
        passed=lag_s <= bound_s,
        metadata={"lag_seconds": float(lag_s), "bound_seconds": float(bound_s)},
    )


def _latest_float(instance: dg.DagsterInstance, key: dg.AssetKey, name: str) -> float | None:
    event = instance.get_latest_materialization_event(key)
    if event is None or event.asset_materialization is None:
        return None
    value = event.asset_materialization.metadata.get(name)
    return float(value.value) if value is not None else None


def _last_syncpoint(lake: Path, changefeed_id: str) -> dict[str, Any] | None:
    folder = lake / "_cdc_dagster" / "syncpoints" / changefeed_id
    files = sorted(folder.glob("*.json")) if folder.is_dir() else []
    return json.loads(files[-1].read_text()) if files else None


def _delta_at(location: str, version: int) -> Any:
    # Read through file_uris(), not to_pyarrow_table() (FACTS: delta-rs#2184 aborts at exit).
    import pyarrow.parquet as pq
    from deltalake import DeltaTable

    dt = DeltaTable(location, version=version)
    tables = [pq.read_table(uri) for uri in dt.file_uris()]
    import pyarrow as pa

    return pa.concat_tables(tables, promote_options="default") if tables else None


def build_checks(catalog: Catalog) -> list[dg.AssetChecksDefinition]:
    """The checks over ``catalog``'s replica assets (none without tables)."""
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

    checks = [lag_checks]
    if not catalog.grouped:
        checks.append(_syncpoint_checks(catalog))
    bank = [t for t in catalog.tables if t.database == "bank"]
    if bank:
        checks.append(
            _bank_check(catalog, catalog.replica_key(bank[0]), [t.table_id for t in bank])
        )
    return checks


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
        from cdc_dagster.upstream.oracle import Oracle, fingerprint

        s = cdc.settings()
        with cdc.metastore() as ms:
            feeds = ms.changefeeds.list()
        for key, ref in refs.items():
            yield _compare_at_syncpoint(key, ref.table_id, feeds, s.changelog, Oracle, fingerprint)

    return syncpoint_checks


def _compare_at_syncpoint(
    key: dg.AssetKey,
    table_id: int,
    feeds: list[Any],
    changelog: Path | None,
    oracle_cls: Any,
    fingerprint: Any,
) -> dg.AssetCheckResult:
    for cf in feeds:
        uri = cf.info.sink_uri
        if not uri.startswith("delta://"):
            continue
        sp = _last_syncpoint(Path(uri.removeprefix("delta://")), cf.changefeed_id)
        if sp is None or str(table_id) not in sp.get("versions", {}):
            continue
        upstream = getattr(cf.info, "upstream_uri", "") or (
            f"changelog://{changelog}" if changelog else ""
        )
        ts, version = int(sp["ts"]), int(sp["versions"][str(table_id)])
        downstream = _delta_at(sp["locations"][str(table_id)], version)
        expected = oracle_cls(upstream.removeprefix("changelog://")).table_at(table_id, ts)
        got = (
            fingerprint(
                downstream,
                ignore_columns=[c for c in downstream.column_names if c.startswith("_cdc")],
            )
            if downstream is not None
            else "empty"
        )
        want = fingerprint(expected)
        return dg.AssetCheckResult(
            asset_key=key,
            check_name=SYNCPOINT_CHECK,
            passed=got == want,
            metadata={
                "syncpoint_ts": ts,
                "delta_version": version,
                "downstream": got,
                "oracle": want,
            },
        )
    return dg.AssetCheckResult(
        asset_key=key,
        check_name=SYNCPOINT_CHECK,
        passed=True,
        description="no syncpoint recorded yet",
        metadata={"syncpoint_ts": 0},
    )


def _bank_check(
    catalog: Catalog, key: dg.AssetKey, table_ids: list[int]
) -> dg.AssetChecksDefinition:
    @dg.asset_check(
        asset=key,
        name=BANK_CHECK,
        description="sum of balances over every bank table at the last syncpoint equals the workload's constant",
    )
    def bank_total(context: dg.AssetCheckExecutionContext, cdc: CdcResource) -> dg.AssetCheckResult:
        with cdc.metastore() as ms:
            feeds = [cf for cf in ms.changefeeds.list() if cf.info.sink_uri.startswith("delta://")]
        for cf in feeds:
            sp = _last_syncpoint(Path(cf.info.sink_uri.removeprefix("delta://")), cf.changefeed_id)
            if sp is None:
                continue
            total = Decimal("0.00")
            for tid in table_ids:
                if str(tid) in sp["versions"]:
                    table = _delta_at(sp["locations"][str(tid)], int(sp["versions"][str(tid)]))
                    if table is not None and "balance" in table.column_names:
                        total += sum(
                            (v for v in table.column("balance").to_pylist() if v is not None),
                            Decimal("0.00"),
                        )
            expected = Decimal("1000.00") * _rows_per_table(cdc) * len(table_ids)
            return dg.AssetCheckResult(
                passed=total == expected,
                metadata={
                    "total": float(total),
                    "expected": float(expected),
                    "syncpoint_ts": int(sp["ts"]),
                },
            )
        return dg.AssetCheckResult(passed=True, description="no syncpoint recorded yet")

    return bank_total


def _rows_per_table(cdc: CdcResource) -> int:
    from cdc_dagster.upstream.generator import WorkloadConfig

    return WorkloadConfig().rows_per_table
