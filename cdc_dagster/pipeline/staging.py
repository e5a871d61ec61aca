"""A capture's staging area: staged Parquet per table and the manifest that names them.

Layout: ``<area>/manifest.json`` and ``<area>/tables/<table_id>/<lo:020d>-<hi:020d>.parquet``
(the table's mounted changes with commit ts in ``(lo, hi]``, sorted by (commit ts, seq)),
where ``<area>`` is ``<staging>/<changefeed>/<capture>/reg-<registration>`` under a capture
registration (the runtime's case), else ``<staging>/<changefeed>/<capture>``. The
manifest is the truth: it is rewritten atomically (temp + rename + fsync) only after the
files it names are durable, and a staged file it does not name is an orphan of a crash.

One area per registration: a run of an expired registration that still runs (frozen past
its lease, then thawed) writes only into its own area. Shared, its late manifest and its
deletions of files with the same names (names are ts ranges, the same for both) damaged
the new registration's staging (the fault matrix's etcd kill -9 under load).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from dataclasses import dataclass, field
from typing import Any

from cdc_dagster.upstream.changelog import fsync_path
from scheduler_core.messages import Barrier
from scheduler_core.model import TableState

MANIFEST_VERSION = 1


@dataclass(slots=True)
class StagedFile:
    """One staged file: the table's mounted changes with commit ts in (lo, hi]."""

    name: str
    lo: int
    hi: int
    rows: int = 0  # mounted changes in it (0: a manifest from before they were counted)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "lo": self.lo, "hi": self.hi, "rows": self.rows}


@dataclass(slots=True)
class TableRecord:
    """Everything the executor knows about one held table (durable in the manifest)."""

    state: TableState
    checkpoint_ts: int
    resolved_ts: int
    prepared_from: int
    staged_upto: int
    token: int = 0  # 0: holds no fencing token (not sinking)
    error: str | None = None
    # The phase whose failure ``error`` is ("pull" or "sink"): only that phase's success
    # clears it (a sink that keeps refusing stays in error across ticks that pull fine).
    error_phase: str | None = None
    files: list[StagedFile] = field(default_factory=list)
    # The end ts of a sink write in flight: set and saved before the sink job, cleared
    # after it. A load that finds it asks the sink where the table really is.
    sink_intent: int = 0
    # Rows the sink wrote for the table since this capture took it (collapsed batch rows).
    rows_applied: int = 0
    # Wall ms of its last sink commit (or of its commit to sinking): a backlog's batches
    # gather until they are this old (SparkTableExecutor, batch_behind_s).
    sunk_at_ms: int = 0
    # Wall ms the writes of the sink phase that last wrote it took (its changefeed's tables
    # on this capture): its next waits in proportion (sink_duty).
    sink_ms: int = 0
    # The sink's committed ts for the table when it is below ``checkpoint_ts`` (0: at it):
    # a batch without a row change advances the checkpoint without a sink write (an idle
    # table costs no commit per tick), so the next write starts here (the sink's own
    # record), and nothing of the table lies in (sink_ts, checkpoint_ts].
    sink_ts: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state.name,
            "checkpoint_ts": self.checkpoint_ts,
            "resolved_ts": self.resolved_ts,
            "prepared_from": self.prepared_from,
            "staged_upto": self.staged_upto,
            "token": self.token,
            "error": self.error,
            "error_phase": self.error_phase,
            "files": [f.to_json() for f in self.files],
            "sink_intent": self.sink_intent,
            "rows_applied": self.rows_applied,
            "sunk_at_ms": self.sunk_at_ms,
            "sink_ms": self.sink_ms,
            "sink_ts": self.sink_ts,
        }

    @staticmethod
    def from_json(obj: dict[str, Any]) -> TableRecord:
        return TableRecord(
            state=TableState[obj["state"]],
            checkpoint_ts=obj["checkpoint_ts"],
            resolved_ts=obj["resolved_ts"],
            prepared_from=obj["prepared_from"],
            staged_upto=obj["staged_upto"],
            token=obj["token"],
            error=obj["error"],
            error_phase=obj.get("error_phase", "sink" if obj["error"] else None),
            files=[StagedFile(f["name"], f["lo"], f["hi"], f.get("rows", 0)) for f in obj["files"]],
            sink_intent=obj.get("sink_intent", 0),
            rows_applied=obj.get("rows_applied", 0),
            sunk_at_ms=obj.get("sunk_at_ms", 0),
            sink_ms=obj.get("sink_ms", 0),
            sink_ts=obj.get("sink_ts", 0),
        )


def registration_area(registration: str) -> str:
    """The name of a registration's staging area inside its capture's directory."""
    return f"reg-{registration}"


class Staging:
    """Paths and the manifest of one capture's staging area for one changefeed."""

    def __init__(
        self,
        staging_dir: str | os.PathLike[str],
        changefeed_id: str,
        capture_id: str,
        registration: str = "",
    ) -> None:
        self.root = os.path.join(os.fspath(staging_dir), changefeed_id, capture_id)
        if registration:
            self.root = os.path.join(self.root, registration_area(registration))
        self.manifest_path = os.path.join(self.root, "manifest.json")

    def table_dir(self, table_id: int) -> str:
        return os.path.join(self.root, "tables", str(table_id))

    def path(self, table_id: int, f: StagedFile) -> str:
        return os.path.join(self.table_dir(table_id), f.name)

    def save(self, tables: dict[int, TableRecord], barrier: Barrier) -> None:
        """Write the manifest atomically (the staged files it names are already durable)."""
        obj = {
            "version": MANIFEST_VERSION,
            "barrier": {
                "global": barrier.global_barrier_ts,
                "tables": {str(t): ts for t, ts in barrier.table_barriers.items()},
                "open_until": barrier.open_until_ts,
            },
            "tables": {str(t): rec.to_json() for t, rec in sorted(tables.items())},
        }
        os.makedirs(self.root, exist_ok=True)
        tmp = os.path.join(self.root, f".manifest.json.tmp-{uuid.uuid4().hex[:8]}")
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(obj, fh, separators=(",", ":"))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.manifest_path)
        fsync_path(self.root)

    def load(self) -> tuple[dict[int, TableRecord], Barrier] | None:
        """The manifest's tables and barrier, or None if there is none yet."""
        try:
            with open(self.manifest_path, encoding="utf-8") as fh:
                obj = json.load(fh)
        except FileNotFoundError:
            return None
        if obj.get("version") != MANIFEST_VERSION:
            raise ValueError(
                f"{self.manifest_path}: manifest version {obj.get('version')!r}, this code "
                f"reads {MANIFEST_VERSION}; run the matching cdc-dagster version"
            )
        tables = {int(t): TableRecord.from_json(r) for t, r in obj["tables"].items()}
        b = obj["barrier"]
        tables_b = {int(t): ts for t, ts in b["tables"].items()}
        barrier = Barrier(b["global"], tables_b, b.get("open_until", 0))
        return tables, barrier

    def remove_orphans(self, tables: dict[int, TableRecord]) -> int:
        """Delete staged files and table dirs the manifest does not name (a crash's leftovers)."""
        base = os.path.join(self.root, "tables")
        if not os.path.isdir(base):
            return 0
        removed = 0
        for entry in os.listdir(base):
            rec = tables.get(int(entry)) if entry.isdigit() else None
            if rec is None:
                shutil.rmtree(os.path.join(base, entry), ignore_errors=True)
                removed += 1
                continue
            named = {f.name for f in rec.files}
            for name in os.listdir(os.path.join(base, entry)):
                if name not in named:
                    os.remove(os.path.join(base, entry, name))
                    removed += 1
        return removed

    def drop_table(self, table_id: int) -> None:
        shutil.rmtree(self.table_dir(table_id), ignore_errors=True)

    def delete(self, table_id: int, files: list[StagedFile]) -> None:
        for f in files:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.path(table_id, f))
