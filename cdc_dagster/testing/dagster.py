"""Evaluating the project's sensors in a test the way the code server does: with the
resources they need (``build_sensor_context`` does not take them from ``definitions``)."""

from __future__ import annotations

from typing import Any

import dagster as dg
from dagster._serdes import serialize_value

from cdc_dagster.defs.owner.plan import IDLE_PREFIX
from cdc_dagster.defs.resources import CdcResource


def evaluate_sensor(
    sensor: dg.SensorDefinition,
    instance: dg.DagsterInstance,
    *,
    cursor: str | None = None,
    definitions: dg.Definitions | None = None,
) -> Any:
    """One evaluation of ``sensor`` (its result: a ``SensorResult`` or a ``SkipReason``), whose
    asset events and run requests are serialized as the code server serializes them (an event
    Dagster cannot serialize fails every tick of the real daemon, not an in-process call)."""
    with dg.build_sensor_context(
        instance=instance, cursor=cursor, definitions=definitions, resources={"cdc": CdcResource()}
    ) as ctx:
        result = sensor(ctx)
    for item in [*(getattr(result, "asset_events", None) or [])]:
        serialize_value(item)
    for request in getattr(result, "run_requests", None) or []:
        serialize_value(request)
    return result


def owner_ticked(result: dg.SensorResult) -> bool:
    """The owner sensor's evaluation was an owner's tick: runs requested, or the owner's own
    summary of a tick with nothing to launch; not a skip (not the owner, an error)."""
    reason = result.skip_reason
    return reason is None or (reason.skip_message or "").startswith(IDLE_PREFIX)
