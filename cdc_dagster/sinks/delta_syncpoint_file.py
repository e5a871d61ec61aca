"""Where the Delta sink records a syncpoint and how its file reads back.

A syncpoint is one JSON file, ``<root>/_cdc_dagster/syncpoints/<changefeed>/<ts:020d>.json``
(the changefeed's name encoded as a path component), written by ``DeltaSink`` and read by
the sink, the dbt pin and the vacuum (which keeps the versions syncpoints name):
``{"changefeed", "ts", "tables": {"<table id>": {"version", "location", ...}}}``.

Syncpoints are kept ``DEFAULT_SYNCPOINT_RETENTION_HOURS`` (the sink URI's
``?syncpoint_retention_hours=N|off``; TiCDC's ``sync-point-retention``, 24 h): recording one
removes the changefeed's syncpoints more than that older than it (by their ts, so a
changefeed that stood still keeps the ones before its pause). Each syncpoint pins its
tables' versions against the vacuum, so without it a copy-on-write table kept one copy of
its files per syncpoint for ever.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from cdc_dagster.sinks.base import SyncpointRecord
from cdc_dagster.sinks.delta_paths import META_DIR, encode_component
from scheduler_core.ts import physical_ms

log = logging.getLogger(__name__)

DEFAULT_SYNCPOINT_RETENTION_HOURS = 24


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


def list_syncpoints(root: str, changefeed_id: str) -> list[int]:
    """The ts of every syncpoint recorded for ``changefeed_id``, ascending."""
    d = os.path.dirname(syncpoint_path(root, changefeed_id, 0))
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return []
    return sorted(int(n[:-5]) for n in names if n.endswith(".json") and not n.startswith("."))


def prune_syncpoints(
    root: str, changefeed_id: str, newest_ts: int, retention_hours: int | None
) -> list[int]:
    """Remove the changefeed's syncpoints more than ``retention_hours`` older than
    ``newest_ts`` (None: keep every one); the ts removed. One that cannot be removed is
    logged and tried again with the next syncpoint."""
    if retention_hours is None:
        return []
    horizon_ms = physical_ms(newest_ts) - retention_hours * 3_600_000
    removed = []
    for ts in list_syncpoints(root, changefeed_id):
        if ts >= newest_ts or physical_ms(ts) >= horizon_ms:
            break
        try:
            os.unlink(syncpoint_path(root, changefeed_id, ts))
            removed.append(ts)
        except FileNotFoundError:
            pass  # another writer pruned it
        except OSError as exc:
            log.warning(
                "syncpoint %d of %s past its retention not removed: %s", ts, changefeed_id, exc
            )
    return removed
