"""The puller's durable state: binlog position, last TS issued, table schemas and ids.

Stored at ``<change-log root>/puller/state.json`` (atomic rename + fsync). It is written
only after the change-log files it covers are durable, and the resolved marks move only
after it; so a restart resumes from ``position`` and first removes any change-log file
above ``last_ts`` (a flush that never reached its state write), and nothing is lost or
doubled.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pymysqlreplication.gtid import Gtid, GtidSet

from cdc_dagster.mysql.catalog import IdRegistry
from cdc_dagster.schema import TableSchema
from cdc_dagster.upstream.changelog import write_json
from scheduler_core.ts import compose


@dataclass(slots=True)
class PullerState:
    """Everything the puller needs to resume exactly where the change log ends."""

    position: dict[int, str]  # MariaDB: GTID per domain ("d-s-n"); MySQL: unused ({})
    last_ts: int  # every change with commit ts <= last_ts is durable in the change log
    tables: dict[int, TableSchema] = field(default_factory=dict)
    versions: dict[int, int] = field(default_factory=dict)  # table id -> schema version ts
    ids: IdRegistry = field(default_factory=IdRegistry)
    # how it resumes: "mariadb" (GTID per domain), "mysql_gtid" (MySQL's GTID set, with
    # gtid_mode=ON), "mysql_file" (MySQL's binlog file:pos, without GTIDs)
    flavor: str = "mariadb"
    gtid_set: str = ""  # mysql_gtid: the executed GTID set ("uuid:1-9,...")
    log_file: str = ""  # mysql_file (kept on mysql_gtid too): binlog file and position
    log_pos: int = 0
    # the table filter the tracked tables were chosen by (None: a state from before it was kept)
    filters: tuple[str, ...] | None = None
    # tables that left the changefeed (the filter stopped selecting them): name -> the id
    # they had; a table created or joining under that name replaces it downstream
    left: dict[tuple[str, str], int] = field(default_factory=dict)
    # tables being snapshotted in chunks (``mysql.snapshots``): table id -> the ts its
    # resolved mark is held at until the snapshot is complete (also the generation)
    snapshots: dict[int, int] = field(default_factory=dict)
    # tables the filter selects that are not replicated because they have no key (created,
    # renamed in or joining while the changefeed runs; force-replicate off): name -> why
    skipped: dict[tuple[str, str], str] = field(default_factory=dict)
    _by_name: dict[tuple[str, str], int] | None = field(default=None, repr=False, compare=False)

    @property
    def gtid(self) -> str:
        """The resume position as text: MariaDB's GTID list, MySQL's GTID set, or file:pos."""
        if self.flavor == "mariadb":
            return ",".join(self.position[d] for d in sorted(self.position))
        if self.flavor == "mysql_gtid":
            return self.gtid_set
        return f"{self.log_file}:{self.log_pos}" if self.log_file else ""

    def advance(self, gtid: str | None, log_file: str = "", log_pos: int = 0) -> None:
        """Move past one transaction: its GTID (MariaDB ``d-s-n``, MySQL ``uuid:n``) and/or,
        on MySQL, the binlog file and position after it."""
        if self.flavor == "mariadb":
            if gtid:
                self.position.update(parse_gtid_pos(gtid))
            return
        if gtid and self.flavor == "mysql_gtid":
            self.gtid_set = add_mysql_gtid(self.gtid_set, gtid)
        if log_file:
            self.log_file, self.log_pos = log_file, log_pos

    def table_id(self, database: str, table: str) -> int | None:
        """The id of the table now called ``database.table`` (None: not replicated)."""
        if self._by_name is None:
            self._by_name = {(t.database, t.table): tid for tid, t in self.tables.items()}
        return self._by_name.get((database, table))

    def set_table(self, table_id: int, schema: TableSchema | None, version: int) -> None:
        """Record a table's schema after a DDL (None: dropped)."""
        if schema is None:
            self.tables.pop(table_id, None)
            self.versions.pop(table_id, None)
        else:
            self.tables[table_id] = schema
            self.versions[table_id] = version
        self._by_name = None

    def to_json(self) -> dict[str, Any]:
        return {
            "position": {str(k): v for k, v in self.position.items()},
            "last_ts": self.last_ts,
            "tables": {str(k): v.to_json() for k, v in self.tables.items()},
            "versions": {str(k): v for k, v in self.versions.items()},
            "ids": self.ids.to_json(),
            "flavor": self.flavor,
            "gtid_set": self.gtid_set,
            "log_file": self.log_file,
            "log_pos": self.log_pos,
            "filters": None if self.filters is None else list(self.filters),
            "left": [[d, t, tid] for (d, t), tid in sorted(self.left.items())],
            "snapshots": {str(k): v for k, v in sorted(self.snapshots.items())},
            "skipped": [[d, t, why] for (d, t), why in sorted(self.skipped.items())],
        }

    @staticmethod
    def from_json(obj: dict[str, Any]) -> PullerState:
        return PullerState(
            {int(k): v for k, v in obj["position"].items()},
            obj["last_ts"],
            {int(k): TableSchema.from_json(v) for k, v in obj["tables"].items()},
            {int(k): v for k, v in obj["versions"].items()},
            IdRegistry.from_json(obj["ids"]),
            obj.get("flavor", "mariadb"),
            obj.get("gtid_set", ""),
            obj.get("log_file", ""),
            int(obj.get("log_pos", 0)),
            None if obj.get("filters") is None else tuple(obj["filters"]),
            {(d, t): int(tid) for d, t, tid in obj.get("left", ())},
            {int(k): int(v) for k, v in obj.get("snapshots", {}).items()},
            {(d, t): why for d, t, why in obj.get("skipped", ())},
        )


def skipped_tables(root: str | Path) -> dict[str, str]:
    """``db.table`` -> why, of the tables a changefeed's puller skips (no key); {} when the
    change log has no puller state (not pulled yet, or not readable from here)."""
    try:
        state = load_state(root)
    except (OSError, ValueError, KeyError):
        return {}
    if state is None:
        return {}
    return {f"{d}.{t}": why for (d, t), why in sorted(state.skipped.items())}


def state_path(root: str | Path) -> Path:
    return Path(root) / "puller" / "state.json"


def load_state(root: str | Path) -> PullerState | None:
    p = state_path(root)
    if not p.exists():
        return None
    return PullerState.from_json(json.loads(p.read_text()))


def save_state(root: str | Path, state: PullerState) -> None:
    write_json(state_path(root), state.to_json())


def parse_gtid_pos(text: str) -> dict[int, str]:
    """``"0-1-5,1-2-9"`` -> {0: "0-1-5", 1: "1-2-9"}."""
    out: dict[int, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        out[int(part.split("-")[0])] = part
    return out


def add_mysql_gtid(gtid_set: str, gtid: str) -> str:
    """MySQL's executed GTID set with one more transaction (``uuid:n``), normalised."""
    return str(GtidSet(gtid_set or None) + Gtid(gtid))


SLOTS = 1 << 10  # every issued TS is a multiple of this: the TSs below one are free slots


class TsAllocator:
    """Strictly increasing commit TS: physical from the event time, never behind one issued.

    Every TS it issues is a multiple of ``SLOTS``, so the ``SLOTS - 1`` TSs just below each
    one belong to no transaction: a snapshot chunk read at a binlog position between two
    transactions is placed there (``mysql.snapshots``), between the rows it must follow and
    those it must precede. (The logical part has 2^18 values per ms: 256 transactions per
    ms of event time before a TS runs ahead of its event's clock.)
    """

    def __init__(self, last: int) -> None:
        self.last = last

    def issue(self, event_time_s: float) -> int:
        ts = max(compose(int(event_time_s * 1000)), self.last + 1)
        ts = -(-ts // SLOTS) * SLOTS  # up to the next multiple
        self.last = ts
        return ts
