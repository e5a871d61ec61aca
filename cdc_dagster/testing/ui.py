"""What a user sees in the Dagster UI, read through its GraphQL endpoint (the webserver's
``/graphql``): the owner sensor's ticks and an asset check's latest evaluations."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

SENSOR_TICKS = """query($name: String!) { sensorOrError(sensorSelector: {
    repositoryName: "__repository__", repositoryLocationName: "cdc_dagster", sensorName: $name})
    { ... on Sensor { sensorState { ticks(limit: 10) { status timestamp } } } } }"""

CHECK_EVALUATIONS = """query($key: AssetKeyInput!, $check: String!, $limit: Int!) {
    assetCheckExecutions(assetKey: $key, checkName: $check, limit: $limit) {
      status timestamp evaluation { success description severity } } }"""


def graphql(web_url: str, query: str, variables: dict[str, Any] | None = None) -> Any:
    """The ``data`` of one GraphQL query to the webserver at ``web_url`` (None: unreachable or
    an error answer, as while it restarts)."""
    body = json.dumps({"query": query, "variables": variables or {}}).encode()
    request = urllib.request.Request(
        web_url.rstrip("/") + "/graphql", body, {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            answer = json.loads(resp.read())
    except (OSError, ValueError):
        return None
    return None if answer.get("errors") else answer.get("data")


def sensor_ticks(web_url: str, sensor: str = "cdc_owner") -> list[dict[str, Any]]:
    """The sensor's last ticks (``status``, ``timestamp``), newest first."""
    data = graphql(web_url, SENSOR_TICKS, {"name": sensor}) or {}
    state = (data.get("sensorOrError") or {}).get("sensorState") or {}
    return state.get("ticks") or []


def check_evaluations(
    web_url: str, asset_path: list[str], check: str, limit: int = 5
) -> list[dict[str, Any]]:
    """An asset check's last evaluations (``success``, ``description``, ``severity``), newest
    first, as the asset's Checks tab shows them."""
    variables = {"key": {"path": asset_path}, "check": check, "limit": limit}
    data = graphql(web_url, CHECK_EVALUATIONS, variables) or {}
    return [e["evaluation"] for e in data.get("assetCheckExecutions") or [] if e["evaluation"]]
