"""Resuming the embedded workload on the change log it wrote before (``Workload.open``).

The log is the only state: a resumed producer rebuilds its model from it and goes on.

* **The cut.** The *frontier* is the max over the DDL mark and every shard mark. The
  workload writes a mark only in ``advance_resolved``, after flushing every change up to
  the mark's ts, so every transaction at or below the frontier is whole in data files.
  Rows above it are the tail of a run that stopped before resolving them: possibly parts
  of transactions (a transfer's debit without its credit), never promised to a reader.
  The resumed producer **discards them** (``ChangeLogWriter.discard_above``) instead of
  rewriting them: it cannot regenerate the same rows, and different rows at the same
  ``(_commit_ts, _seq)`` would break the readers' rule that equal keys are one change.
  DDL records above the frontier are kept: each one is whole, a reader may have seen
  it, and the model replays it like any other.
* **The model** is the oracle's replay of every kept table at the last ts (schemas,
  rows, keys in key order); next ids are one past the highest table id, column id
  (dropped ones too) and primary key the log holds; rename / scratch counters count
  their DDL records; resolved marks are read back.
* **The clock** goes on above everything the log ever held, discarded rows included, so
  TS strictly increase across runs (wall-clock mode: never behind the last TS issued).
* **Randomness** restarts from ``(seed, last ts)``: a resumed run is deterministic for
  the log it resumes, but not the run an uninterrupted producer would have written.
* A log never resolved (frontier 0: the producer died during its set-up or before its
  first ``advance_resolved``) keeps its DDL records; the set-up's missing tables are
  created and its initial rows written again, so the bank total is the configured one.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from cdc_dagster.schema import DdlRecord
from cdc_dagster.upstream.changelog import ChangeLog, ChangeLogWriter, write_json
from cdc_dagster.upstream.oracle import Oracle
from cdc_dagster.upstream.workload_model import TableModel, WorkloadConfig, WorkloadError

CONFIG_PATH = Path("producer") / "workload.json"
PRODUCER = "cdc-dagster-workload"
# Config fields that shape the log already written (table ids, shards, names, the bank
# total): a resumed producer must use the same values. The others (rate, DDL mix, clock,
# lagging shards, fsync) may change from run to run.
IDENTITY_FIELDS = (
    "seed",
    "bank_tables",
    "rows_per_table",
    "shards_per_table",
    "odd_identifiers",
    "initial_balance",
)


def config_to_json(config: WorkloadConfig) -> dict[str, Any]:
    """The config as JSON values (Decimal as text, lagging shards as objects)."""
    out = {f.name: getattr(config, f.name) for f in fields(config)}
    out["initial_balance"] = str(config.initial_balance)
    out["lagging"] = [asdict(g) for g in config.lagging]
    return out


def save_config(root: Path, config: WorkloadConfig, fsync: bool) -> None:
    """Record the config a fresh log is written with (before its first DDL)."""
    write_json(
        root / CONFIG_PATH, {"producer": PRODUCER, "config": config_to_json(config)}, fsync=fsync
    )


def check_config(root: Path, config: WorkloadConfig, has_ddls: bool) -> bool:
    """True: resume the log at ``root``; False: it is empty, start afresh. Else WorkloadError."""
    path = root / CONFIG_PATH
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        if not has_ddls:
            return False
        raise WorkloadError(
            f"change log {root} has DDL records but no {path}: it was not written by a "
            "Workload (or by one older than resume support); a Workload continues only its "
            "own logs: give it an empty directory"
        ) from None
    except ValueError as exc:
        raise WorkloadError(f"{path} is not valid JSON ({exc}); restore or remove it") from exc
    old = saved.get("config") if isinstance(saved, dict) else None
    if saved.get("producer") != PRODUCER or not isinstance(old, dict):
        raise WorkloadError(f"{path} holds {str(saved)[:200]}, not a {PRODUCER} config")
    new = config_to_json(config)
    diff = [
        f"{k}: log {old.get(k)!r}, given {new[k]!r}"
        for k in IDENTITY_FIELDS
        if old.get(k) != new[k]
    ]
    if diff:
        raise WorkloadError(
            f"change log {root} was written with another workload config ({'; '.join(diff)}); "
            f"these fields shape the tables already written, so it cannot be continued: pass "
            f"the same values for {', '.join(IDENTITY_FIELDS)}, or use an empty directory"
        )
    return True


@dataclass(slots=True)
class ResumedModel:
    """The workload's model rebuilt from its log, for ``Workload.open`` to take over."""

    last_ts: int  # the clock goes on above it
    rng: random.Random
    tables: dict[int, TableModel]
    next_table_id: int
    scratch_count: int
    renames: int
    marks: dict[tuple[int, int], int]  # (table id, shard) -> resolved mark
    dropped: list[int] = field(default_factory=list)  # dropped tables with marks still due
    discarded_above: int | None = None  # rows above this ts were cut
    never_resolved: bool = False  # frontier 0: the set-up must run again


def resume(config: WorkloadConfig, writer: ChangeLogWriter) -> ResumedModel:
    """Rebuild the model from ``writer``'s log and cut the unresolved tail (module doc)."""
    log = writer.log
    if log.gc_safepoint():
        raise WorkloadError(
            f"change log {log.root} was garbage-collected up to {log.gc_safepoint()}: the "
            "workload rebuilds its model by replaying the whole log, so it cannot continue "
            "a GC'd log; start a fresh one in an empty directory"
        )
    frontier = writer.resolved_frontier()
    discarded_top = writer.discard_above(frontier)
    records = log.ddl_records()
    last = max([frontier, discarded_top, *(r.commit_ts for r in records[-1:])])
    ids = {t for r in records for t in r.tables}
    model = ResumedModel(
        last_ts=last,
        rng=random.Random(f"{config.seed}/resumed-at/{last}"),
        tables=_rebuild_tables(config, log, last),
        next_table_id=max([config.wide_id, *ids]) + 1,
        scratch_count=sum(1 for r in records for t in r.creates if t > config.wide_id),
        renames=sum(1 for r in records if r.action in ("rename_table", "rename_column")),
        marks={},
        discarded_above=frontier if discarded_top else None,
        never_resolved=frontier == 0,
    )
    _rebuild_marks(model, log, records, ids)
    return model


def _rebuild_tables(config: WorkloadConfig, log: ChangeLog, last: int) -> dict[int, TableModel]:
    oracle = Oracle(log.root)
    tables: dict[int, TableModel] = {}
    for table_id, schema in sorted(log.tables_at(last).items()):
        role, protected = config.role(table_id)
        version = log.schema_version_at(table_id, last)
        assert version is not None
        history = [s for r in log.ddl_records() if (s := r.tables.get(table_id)) is not None]
        t = TableModel(
            schema,
            version,
            role,
            next_column=max(c.id for s in history for c in s.columns) + 1,
            protected=protected,
        )
        rows, top_key = oracle.rows_at(table_id, last)
        for key, row in rows.items():
            t.put(key, row)
        # Keys are never reused, not even those of deleted or truncated rows.
        t.next_key = top_key + 1
        tables[table_id] = t
    return tables


def _rebuild_marks(
    model: ResumedModel, log: ChangeLog, records: list[DdlRecord], ids: set[int]
) -> None:
    drop_ts = {t: r.commit_ts for r in records for t in r.drops}
    for table_id in sorted(ids):
        shards = log.shards(table_id)
        marks = [log.shard_resolved_ts(table_id, s) for s in range(shards)]
        for shard, mark in enumerate(marks):
            if mark:
                model.marks[(table_id, shard)] = mark
        if table_id not in model.tables and min(marks) < drop_ts.get(table_id, 0):
            model.dropped.append(table_id)  # its final marks are still due


__all__ = [
    "CONFIG_PATH",
    "IDENTITY_FIELDS",
    "ResumedModel",
    "check_config",
    "config_to_json",
    "resume",
    "save_config",
]
