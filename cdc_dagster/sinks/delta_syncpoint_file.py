"""Where the Delta sink records a syncpoint and how its file reads back.

A syncpoint is one JSON file, ``<root>/_cdc_dagster/syncpoints/<changefeed>/<ts:020d>.json``
(the changefeed's name encoded as a path component), written by ``DeltaSink`` and read by
the sink, the dbt pin and the vacuum (which keeps the versions syncpoints name):
``{"changefeed", "ts", "tables": {"<table id>": {"version", "location", ...}}}``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from cdc_dagster.sinks.base import SyncpointRecord
from cdc_dagster.sinks.delta_paths import META_DIR, encode_component


def syncpoint_path(root: str, changefeed_id: str, ts: int) -> str:
    """``<root>/_cdc_dagster/syncpoints/<changefeed>/<ts:020d>.json`` (changefeed encoded)."""
    return os.path.join(
        root, META_DIR, "syncpoints", encode_component(changefeed_id), f"{ts:020d}.json"
    )


def syncpoint_record(doc: Mapping[str, Any]) -> SyncpointRecord:
    """The record a syncpoint file's JSON holds (KeyError/TypeError/ValueError if malformed)."""
    tables = doc["tables"]
    return SyncpointRecord(
        changefeed_id=doc["changefeed"],
        ts=int(doc["ts"]),
        versions={int(k): int(v["version"]) for k, v in tables.items()},
        locations={int(k): v["location"] for k, v in tables.items()},
    )
