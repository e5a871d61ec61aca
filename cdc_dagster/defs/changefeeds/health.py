"""Changefeeds in the UI: one asset per changefeed whose ``changefeed_healthy`` check is the
changefeed's state, evaluated by the owner sensor on every tick it changes (and once a minute
while it does not), so the checks column is a live health view.

A warning fails the check with severity WARN and the whole message (what, where, what to
do); a failed changefeed fails it with severity ERROR; normal passes. Launched by hand, the
check reads the changefeed's state from etcd (the same verdict, as of now).
"""

from collections.abc import Iterator, Mapping

import dagster as dg

from cdc_dagster.defs.catalog import Catalog
from cdc_dagster.defs.resources import CdcResource
from cdc_dagster.defs.tables.assets import ObservationBudget
from cdc_dagster.metastore import ChangefeedState
from cdc_dagster.metastore.errors import ChangefeedNotFoundError
from cdc_dagster.runtime import OwnerTick
from cdc_dagster.runtime.health import Health

GROUP = "changefeeds"
HEALTH_CHECK = "changefeed_healthy"
REFRESH_S = 60.0  # an unchanged verdict is evaluated again this often (a fresh timestamp)


def changefeed_specs(catalog: Catalog) -> list[dg.AssetSpec]:
    """One asset per changefeed of the catalog."""
    return [
        dg.AssetSpec(
            catalog.changefeed_key(cf),
            group_name=GROUP,
            description=(
                f"changefeed {cf}: its {HEALTH_CHECK} check is its state (normal, warning, "
                "failed) with the message of what keeps it from moving"
            ),
            kinds={"cdc"},
            metadata={"changefeed": cf},
        )
        for cf in catalog.changefeeds
    ]


def verdict(
    key: dg.AssetKey, state: str, message: str, metadata: Mapping[str, float | int | str]
) -> dg.AssetCheckEvaluation:
    """The health check's evaluation for a changefeed in ``state``."""
    passed = state in (ChangefeedState.NORMAL, ChangefeedState.FINISHED, ChangefeedState.STOPPED)
    severity = (
        dg.AssetCheckSeverity.ERROR
        if state == ChangefeedState.FAILED
        else dg.AssetCheckSeverity.WARN
    )
    return dg.AssetCheckEvaluation(
        asset_key=key,
        check_name=HEALTH_CHECK,
        passed=passed,
        severity=severity,
        description=message or f"{state}: replicating",
        # str(): a ChangefeedState (an enum) in metadata fails the sensor tick's serialization
        metadata={"state": str(state), **metadata},
    )


class HealthReporter:
    """Which changefeeds' verdicts the owner sensor reports this tick: those whose state or
    message changed, then those not reported for ``REFRESH_S``. Lives in the code server's
    memory: losing it only reports every changefeed again."""

    def __init__(self, refresh_s: float = REFRESH_S) -> None:
        self._budget = ObservationBudget(1 << 30, refresh_s)  # changed, then stale: no cap

    def evaluations(
        self, catalog: Catalog, tick: OwnerTick, now_s: float
    ) -> list[dg.AssetCheckEvaluation]:
        """This tick's evaluations, for the changefeeds the catalog has an asset of."""
        known = {cf: h for cf, h in tick.health.items() if cf in catalog.changefeeds}
        signatures = {
            catalog.changefeed_key(cf): (_state(h), h.message or "") for cf, h in known.items()
        }
        chosen = set(self._budget.select(signatures, now_s))
        out = []
        for cf, h in known.items():
            key = catalog.changefeed_key(cf)
            if key in chosen:
                lag = tick.changefeeds[cf].lag_s if cf in tick.changefeeds else None
                metadata = {"lag_seconds": float(lag)} if lag is not None else {}
                out.append(verdict(key, _state(h), h.message or "", metadata))
        return out


def _state(health: Health) -> str:
    if health.failed:
        return ChangefeedState.FAILED
    return ChangefeedState.WARNING if health.message else ChangefeedState.NORMAL


def build_health_checks(catalog: Catalog) -> list[dg.AssetChecksDefinition]:
    """The check over every changefeed asset (launched by hand: read from etcd now)."""
    if not catalog.changefeeds:
        return []
    keys = {catalog.changefeed_key(cf): cf for cf in catalog.changefeeds}

    @dg.multi_asset_check(
        specs=[
            dg.AssetCheckSpec(HEALTH_CHECK, asset=k, description="the changefeed moves")
            for k in keys
        ],
        name="changefeed_health_checks",
    )
    def health(
        context: dg.AssetCheckExecutionContext, cdc: CdcResource
    ) -> Iterator[dg.AssetCheckResult]:
        ms = cdc.metastore()
        for key, cf in keys.items():
            yield _result(key, *_stored(ms, cf))

    return [health]


def _stored(ms: object, changefeed_id: str) -> tuple[str, str]:
    try:
        status = ms.changefeeds.get(changefeed_id).status  # type: ignore[attr-defined]
    except ChangefeedNotFoundError:
        return ChangefeedState.FAILED, f"changefeed {changefeed_id} was removed"
    return str(status.state), status.last_error


def _result(key: dg.AssetKey, state: str, message: str) -> dg.AssetCheckResult:
    evaluation = verdict(key, state, message, {})
    return dg.AssetCheckResult(
        asset_key=key,
        check_name=HEALTH_CHECK,
        passed=evaluation.passed,
        severity=evaluation.severity,
        description=evaluation.description,
        metadata={"state": str(state)},
    )
