"""Pin one syncpoint's table versions in DuckDB: the sources of a consistent dbt build.

A syncpoint (``DeltaSink.record_syncpoint``) maps every table of a changefeed to the Delta
version that holds exactly its changes up to the syncpoint ts. For each source table we
create ``"<database>"."<table>"`` in the DuckDB file as a view over the Parquet files of
*that* version (``DeltaTable(path, version=v).file_uris()``): the view names files, not
the table, so commits that land after pinning are invisible to the build, and every
source shows the same moment. No DuckDB extension is needed (``read_parquet`` is built in).

Delta data files are immutable and only removed by VACUUM or a table drop, so the pinned
files stay readable for the build: the sink's vacuum keeps every version a recorded
syncpoint names (``cdc_dagster.sinks.delta_vacuum``).
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass

import duckdb
import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from cdc_dagster.dbt.errors import PinError, SyncpointNotFoundError
from cdc_dagster.sinks.delta import local_path
from cdc_dagster.sinks.delta_syncpoint_file import list_syncpoints, syncpoint_path

META_SCHEMA = "cdc_meta"


@dataclass(frozen=True, slots=True)
class PinnedTable:
    """One source table as a build reads it: the Delta version and its data files."""

    table_id: int
    database: str
    table: str
    version: int
    location: str  # relative to the Delta root
    files: tuple[str, ...]

    @property
    def qualified_name(self) -> str:
        """``database.table`` (for messages and metadata, not SQL)."""
        return f"{self.database}.{self.table}"


@dataclass(frozen=True, slots=True)
class PinnedSyncpoint:
    """What one build reads: a syncpoint ts and each source table's pinned version."""

    changefeed_id: str
    ts: int
    tables: tuple[PinnedTable, ...]

    def versions(self) -> dict[str, int]:
        """``database.table`` -> Delta version (build metadata)."""
        return {t.qualified_name: t.version for t in self.tables}


def quote_ident(name: str) -> str:
    """A DuckDB identifier: double quotes, embedded quotes doubled (any character allowed)."""
    return '"' + name.replace('"', '""') + '"'


def _quote_str(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def latest_syncpoint(delta_root: str, changefeed_id: str) -> int:
    """The ts of the newest syncpoint recorded for ``changefeed_id``."""
    found = list_syncpoints(delta_root, changefeed_id)
    if not found:
        raise SyncpointNotFoundError(
            f"changefeed {changefeed_id!r} has no syncpoint under {delta_root}; wait for the "
            "owner to record one (sync_point_interval) before building the dbt models"
        )
    return found[-1]


def read_syncpoint_tables(delta_root: str, changefeed_id: str, ts: int) -> list[dict]:
    """The syncpoint file's table entries (id, database, table, version, location)."""
    path = syncpoint_path(delta_root, changefeed_id, ts)
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except FileNotFoundError:
        raise SyncpointNotFoundError(
            f"changefeed {changefeed_id!r} has no syncpoint at ts {ts} ({path}); known: "
            f"{list_syncpoints(delta_root, changefeed_id)[-5:]} (newest last)"
        ) from None
    return [{"table_id": int(k), **v} for k, v in sorted(doc["tables"].items())]


def resolve_table(delta_root: str, entry: Mapping) -> tuple[PinnedTable, pa.Schema]:
    """``entry``'s table at its syncpoint version: that version's files and its schema."""
    path = os.path.join(delta_root, entry["location"])
    name = f"{entry['database']}.{entry['table']}"
    try:
        table = DeltaTable(path, version=int(entry["version"]))
    except (TableNotFoundError, DeltaError, OSError) as exc:
        raise PinError(
            f"cannot open {name} at Delta version {entry['version']} ({path}): {exc}; was it "
            "dropped, renamed or vacuumed after the syncpoint? build a newer syncpoint"
        ) from exc
    features = set(table.protocol().reader_features or [])
    if {"deletionVectors", "columnMapping"} & features:
        raise PinError(
            f"{name} at version {entry['version']} uses reader features {sorted(features)}: "
            "its Parquet files alone do not give its rows; disable them on the sink's tables"
        )
    files = tuple(local_path(u) for u in table.file_uris())
    missing = [f for f in files if not os.path.exists(f)]
    if missing:
        raise PinError(
            f"{name} at Delta version {entry['version']}: {len(missing)} of its {len(files)} "
            f"data file(s) are gone (first: {missing[0]}); they were vacuumed after the "
            "syncpoint (recorded once its slowest table passed it, later than the sink's "
            "?vacuum_retention_hours= for this one) — build a newer syncpoint"
        )
    return PinnedTable(
        table_id=int(entry["table_id"]),
        database=str(entry["database"]),
        table=str(entry["table"]),
        version=int(entry["version"]),
        location=str(entry["location"]),
        files=files,
    ), pa.schema(table.schema().to_arrow())


def _view_sql(con: duckdb.DuckDBPyConnection, pinned: PinnedTable, schema: pa.Schema) -> str:
    """The SELECT of one pinned view: its files' rows, or no rows of the right types."""
    cols = ", ".join(quote_ident(n) for n in schema.names)
    if pinned.files:
        files = ", ".join(_quote_str(f) for f in pinned.files)
        return f"SELECT {cols} FROM read_parquet([{files}], union_by_name = true)"
    types = con.from_arrow(schema.empty_table()).types  # the DuckDB types of an empty version
    nulls = ", ".join(
        f"CAST(NULL AS {t}) AS {quote_ident(n)}" for n, t in zip(schema.names, types, strict=True)
    )
    return f"SELECT {nulls} WHERE false"


def pin_syncpoint(
    duckdb_path: str,
    delta_root: str,
    changefeed_id: str,
    ts: int,
    tables: Collection[tuple[str, str]] | None = None,
    optional: Collection[tuple[str, str]] = (),
) -> PinnedSyncpoint:
    """Create the pinned views of syncpoint ``ts`` in ``duckdb_path``; return what they read.

    ``tables`` limits the views to these (database, table) names (a dbt project's sources);
    each must be in the syncpoint unless listed in ``optional``. All views and the ``cdc_meta.pinned_syncpoint`` record
    change in one DuckDB transaction: a reader sees the old pin or the new one.
    """
    entries = read_syncpoint_tables(delta_root, changefeed_id, ts)
    if tables is not None:
        have = {(e["database"], e["table"]) for e in entries}
        missing = sorted(set(tables) - have - set(optional))
        if missing:
            raise PinError(
                f"syncpoint {ts} of changefeed {changefeed_id!r} has no table {missing} "
                f"(it has {sorted(have)}); fix the dbt sources or the changefeed's table filter"
            )
        entries = [e for e in entries if (e["database"], e["table"]) in set(tables)]
    resolved = [resolve_table(delta_root, e) for e in entries]
    os.makedirs(os.path.dirname(os.path.abspath(duckdb_path)), exist_ok=True)
    with duckdb.connect(duckdb_path) as con:
        con.execute("BEGIN TRANSACTION")
        for pinned, schema in resolved:
            con.execute(f"CREATE SCHEMA IF NOT EXISTS {quote_ident(pinned.database)}")
            con.execute(
                f"CREATE OR REPLACE VIEW {quote_ident(pinned.database)}."
                f"{quote_ident(pinned.table)} AS {_view_sql(con, pinned, schema)}"
            )
        _record_pin(con, changefeed_id, ts, [p for p, _ in resolved])
        con.execute("COMMIT")
    return PinnedSyncpoint(changefeed_id, ts, tuple(p for p, _ in resolved))


def _record_pin(
    con: duckdb.DuckDBPyConnection, changefeed_id: str, ts: int, pinned: list[PinnedTable]
) -> None:
    """``cdc_meta.pinned_syncpoint``: the one syncpoint the views show now, per table."""
    con.execute(f"CREATE SCHEMA IF NOT EXISTS {META_SCHEMA}")
    con.execute(
        f"CREATE OR REPLACE TABLE {META_SCHEMA}.pinned_syncpoint (changefeed VARCHAR, "
        "syncpoint_ts BIGINT, table_id BIGINT, database VARCHAR, table_name VARCHAR, "
        "delta_version BIGINT, n_files BIGINT, pinned_at TIMESTAMPTZ)"
    )
    now = dt.datetime.now(dt.UTC)
    con.executemany(
        f"INSERT INTO {META_SCHEMA}.pinned_syncpoint VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (changefeed_id, ts, p.table_id, p.database, p.table, p.version, len(p.files), now)
            for p in pinned
        ],
    )
