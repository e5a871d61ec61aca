"""Evaluating the project's sensors in a test the way the code server does: with the
resources they need (``build_sensor_context`` does not take them from ``definitions``)."""

from __future__ import annotations

from typing import Any

import dagster as dg

from cdc_dagster.defs.resources import CdcResource


def evaluate_sensor(
    sensor: dg.SensorDefinition,
    instance: dg.DagsterInstance,
    *,
    cursor: str | None = None,
    definitions: dg.Definitions | None = None,
) -> Any:
    """One evaluation of ``sensor`` (its result: a ``SensorResult`` or a ``SkipReason``)."""
    with dg.build_sensor_context(
        instance=instance, cursor=cursor, definitions=definitions, resources={"cdc": CdcResource()}
    ) as ctx:
        return sensor(ctx)
