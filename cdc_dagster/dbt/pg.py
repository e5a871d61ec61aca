"""The dbt downstream on a PostgreSQL sink: builds on the copies taken at each syncpoint.

The PostgreSQL sink copies the tables the models read at each syncpoint, in the same
REPEATABLE READ transaction as the syncpoint row, while the changefeed is held at the
syncpoint barrier (``cdc_dagster.sinks.pg_syncpoint``: the copy is checked to be the state
at that ts). A build then, under a session advisory lock (one build at a time, and no
pruning of copies meanwhile):

1. points views ``"cdc_pinned__<database>"."<table>"`` (the dbt sources' schema on the
   ``postgres`` target) at that syncpoint's copies, and records ``cdc_meta.pinned_syncpoint``,
   in one transaction;
2. runs ``dbt build --target postgres``; models land in schema ``cdc_models``.

Replication never waits for a build: its only cost is the copy, inside the syncpoint
record (docs/dbt.md gives the measured lag cost).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from cdc_dagster.dbt.build import (
    PROJECT_DIR,
    BuildResult,
    load_manifest,
    optional_sources,
    pinned_sources,
    run_dbt,
    source_tables,
)
from cdc_dagster.dbt.errors import BuildError, PinError, SyncpointNotFoundError
from cdc_dagster.dbt.pin import META_SCHEMA, PinnedSyncpoint, PinnedTable
from cdc_dagster.sinks import pg_syncpoint
from cdc_dagster.sinks.postgres import connect_kwargs

PINNED_PREFIX = "cdc_pinned__"  # sources.yml: schema on target.type == 'postgres'
PASSWORD_ENV = "CDC_DBT_PG_PASSWORD"  # profiles.yml reads the password from here
TARGET = "postgres"


def connect(sink_uri: str) -> psycopg.Connection:
    """An autocommit connection to the sink's database (``${ENV}`` references resolved)."""
    return psycopg.connect(**connect_kwargs(sink_uri), connect_timeout=10, autocommit=True)


def register_and_list(
    sink_uri: str, changefeed_id: str, tables: Collection[tuple[str, str]]
) -> list[int]:
    """Ask the sink for copies of ``tables``; the syncpoints that have copies, oldest first."""
    with connect(sink_uri) as conn:
        pg_syncpoint.register(conn, changefeed_id, sorted(tables))
        return list_pinned_syncpoints(conn, changefeed_id)


def list_pinned_syncpoints(conn: psycopg.Connection, changefeed_id: str) -> list[int]:
    """Syncpoints of ``changefeed_id`` whose copies exist (oldest first)."""
    rows = conn.execute(
        f"SELECT DISTINCT upstream_ts FROM {pg_syncpoint.META}.syncpoint_copies "
        "WHERE changefeed = %s ORDER BY 1",
        (changefeed_id,),
    ).fetchall()
    return [int(r[0]) for r in rows]


@contextlib.contextmanager
def build_lock(sink_uri: str) -> Iterator[psycopg.Connection]:
    """A connection holding the build lock: one build at a time, copies not pruned."""
    with connect(sink_uri) as conn:
        conn.execute(pg_syncpoint.BUILD_LOCK_SQL)
        try:
            yield conn
        finally:
            if not conn.closed:
                conn.execute(
                    f"SELECT pg_advisory_unlock(hashtext('{pg_syncpoint.BUILD_LOCK_KEY}'))"
                )


def pin(
    conn: psycopg.Connection,
    changefeed_id: str,
    ts: int,
    tables: Collection[tuple[str, str]],
    optional: Collection[tuple[str, str]] = (),
) -> PinnedSyncpoint:
    """Point the source views at syncpoint ``ts``'s copies (one transaction); what they read."""
    copies = conn.execute(
        f"SELECT table_id, database, table_name, copy_table FROM {pg_syncpoint.META}."
        "syncpoint_copies WHERE changefeed = %s AND upstream_ts = %s ORDER BY table_id",
        (changefeed_id, ts),
    ).fetchall()
    if not copies:
        raise SyncpointNotFoundError(
            f"changefeed {changefeed_id!r} has no copies at syncpoint {ts} (known: "
            f"{list_pinned_syncpoints(conn, changefeed_id)[-5:]}); build a newer syncpoint"
        )
    have = {(d, t) for _, d, t, _ in copies}
    missing = sorted(set(tables) - have - set(optional))
    if missing:
        raise PinError(
            f"syncpoint {ts} of changefeed {changefeed_id!r} has no copy of {missing} (has "
            f"{sorted(have)}); is the table in the changefeed's filter?"
        )
    pinned = tuple(
        PinnedTable(int(tid), d, t, ts, f"{pg_syncpoint.COPY_SCHEMA}.{c}", ())
        for tid, d, t, c in copies
        if (d, t) in set(tables)
    )
    with conn.transaction():
        for p in pinned:
            _pin_view(conn, p)
        conn.execute(
            f"UPDATE {pg_syncpoint.META}.syncpoint_copy_requests SET pinned_ts = %s "
            "WHERE changefeed = %s",
            (ts, changefeed_id),
        )
        _record_pin(conn, changefeed_id, ts, pinned)
    return PinnedSyncpoint(changefeed_id, ts, pinned)


def _pin_view(conn: psycopg.Connection, p: PinnedTable) -> None:
    schema = PINNED_PREFIX + p.database
    view = sql.Identifier(schema, p.table)
    copy_schema, copy_table = p.location.split(".", 1)
    conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
    # CASCADE: dbt's staging views over the source are recreated by the build that follows.
    conn.execute(sql.SQL("DROP VIEW IF EXISTS {} CASCADE").format(view))
    conn.execute(
        sql.SQL("CREATE VIEW {} AS TABLE {}").format(view, sql.Identifier(copy_schema, copy_table))
    )


def _record_pin(
    conn: psycopg.Connection, changefeed_id: str, ts: int, pinned: tuple[PinnedTable, ...]
) -> None:
    conn.execute(f"CREATE SCHEMA IF NOT EXISTS {META_SCHEMA}")
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {META_SCHEMA}.pinned_syncpoint (changefeed text, "
        "syncpoint_ts bigint, table_id bigint, database text, table_name text, "
        "copy_table text, pinned_at timestamptz)"
    )
    conn.execute(f"DELETE FROM {META_SCHEMA}.pinned_syncpoint")
    now = dt.datetime.now(dt.UTC)
    with conn.cursor() as cur:
        cur.executemany(
            f"INSERT INTO {META_SCHEMA}.pinned_syncpoint VALUES (%s, %s, %s, %s, %s, %s, %s)",
            [(changefeed_id, ts, p.table_id, p.database, p.table, p.location, now) for p in pinned],
        )


def record_build(
    conn: psycopg.Connection, pinned: PinnedSyncpoint, success: bool, seconds: float
) -> None:
    """Append the build to ``cdc_meta.syncpoint_builds`` in the sink's database."""
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {META_SCHEMA}.syncpoint_builds (changefeed text, "
        "syncpoint_ts bigint, tables jsonb, success boolean, seconds double precision, "
        "built_at timestamptz)"
    )
    conn.execute(
        f"INSERT INTO {META_SCHEMA}.syncpoint_builds VALUES (%s, %s, %s, %s, %s, now())",
        (
            pinned.changefeed_id,
            pinned.ts,
            json.dumps({t.qualified_name: t.location for t in pinned.tables}),
            success,
            seconds,
        ),
    )


def dbt_args(sink_uri: str, pinned: PinnedSyncpoint, extra: Mapping[str, Any] | None) -> list[str]:
    """``--target postgres --vars ...``: where to connect (no password: see :func:`dbt_env`)."""
    kw = connect_kwargs(sink_uri)
    conn_vars = {
        "pg_host": kw.get("host", "127.0.0.1"),
        "pg_port": int(kw.get("port", 5432)),
        "pg_user": kw.get("user", "postgres"),
        "pg_dbname": kw.get("dbname", "postgres"),
    }
    vars_ = {**(extra or {}), **conn_vars, "pinned_sources": pinned_sources(pinned)}
    return ["--target", TARGET, "--vars", json.dumps(vars_, sort_keys=True)]


def dbt_env(sink_uri: str) -> dict[str, str]:
    """The password for dbt's profile, from the sink URI (never on a command line)."""
    pw = connect_kwargs(sink_uri).get("password")
    return {PASSWORD_ENV: pw} if pw else {}


def target_path(project_dir: Path, changefeed_id: str) -> Path:
    """dbt's target dir of PostgreSQL builds (one per changefeed, partial parsing kept)."""
    return Path(project_dir) / "target" / f"pg-{changefeed_id}"


def set_password_env(sink_uri: str) -> None:
    """Export the password for a dbt run started by dagster-dbt (it passes os.environ)."""
    os.environ.update(dbt_env(sink_uri))


def run_pg_build(
    sink_uri: str,
    changefeed_id: str,
    ts: int | None = None,
    project_dir: Path = PROJECT_DIR,
    extra_vars: Mapping[str, Any] | None = None,
    after_pin: Callable[[PinnedSyncpoint], None] | None = None,
) -> BuildResult:
    """Pin syncpoint ``ts`` (newest copied if None) and ``dbt build --target postgres``."""
    manifest = load_manifest(project_dir, os.path.join(str(project_dir), "target", "parse.duckdb"))
    tables = source_tables(manifest)
    with build_lock(sink_uri) as conn:
        pg_syncpoint.register(conn, changefeed_id, sorted(tables))
        if ts is None:
            known = list_pinned_syncpoints(conn, changefeed_id)
            if not known:
                raise SyncpointNotFoundError(
                    f"changefeed {changefeed_id!r} has no syncpoint copied yet"
                )
            ts = known[-1]
        t0 = time.monotonic()
        pinned = pin(conn, changefeed_id, ts, tables, optional_sources(manifest))
        t1 = time.monotonic()
        if after_pin is not None:
            after_pin(pinned)
        t2 = time.monotonic()
        proc = run_dbt(
            project_dir,
            ["build", *dbt_args(sink_uri, pinned, extra_vars)],
            {**dbt_env(sink_uri), "DBT_TARGET_PATH": str(target_path(project_dir, changefeed_id))},
        )
        t3 = time.monotonic()
        result = BuildResult(pinned, t1 - t0, t3 - t2, proc.returncode == 0, proc.stdout[-4000:])
        record_build(conn, pinned, result.success, result.seconds)
    if not result.success:
        raise BuildError(
            f"dbt build on syncpoint {ts} of changefeed {changefeed_id!r} (PostgreSQL) "
            f"failed:\n{result.log_tail}"
        )
    return result
