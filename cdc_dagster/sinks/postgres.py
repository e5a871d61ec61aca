"""PostgreSQL sink: COPY + MERGE + checkpoint row in one transaction per table and batch.

Tables land as ``"<database>"."<table>"``. Bookkeeping lives in the ``cdc_dagster``
schema: ``checkpoints`` (changefeed, table id -> committed ts, fencing token),
``ddl_applied`` (each DDL record applied, so a replay skips it) and ``syncpoints``.

Fencing: ``write`` locks the table's checkpoint row (``SELECT ... FOR UPDATE``) before
touching data and compares the token on that locked row; ``acquire`` bumps the token
with a single ``INSERT ... ON CONFLICT DO UPDATE`` on the same row. Whichever commits
first wins; the other sees the committed row (READ COMMITTED re-reads a row after
waiting on its lock), so two writers can never both pass.
"""

from __future__ import annotations

import hashlib
import json
import os
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
import pyarrow as pa
from psycopg import sql

from cdc_dagster.schema import DdlRecord, TableSchema
from cdc_dagster.secrets import SecretReferenceError, redact_uri, resolve_uri
from cdc_dagster.sinks import pg_ddl, pg_syncpoint
from cdc_dagster.sinks.base import (
    COMMIT_TS_COLUMN,
    OP_COLUMN,
    Committed,
    FencedError,
    SinkDDLError,
    SinkError,
    SinkGapError,
    SinkSchemaError,
    SyncpointRecord,
)

META_SCHEMA = "cdc_dagster"

_BOOTSTRAP = [
    f"CREATE SCHEMA IF NOT EXISTS {META_SCHEMA}",
    f"""CREATE TABLE IF NOT EXISTS {META_SCHEMA}.checkpoints (
        changefeed text NOT NULL, table_id bigint NOT NULL,
        committed_ts bigint NOT NULL DEFAULT 0, token bigint NOT NULL DEFAULT 0,
        location text, updated_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (changefeed, table_id))""",
    f"""CREATE TABLE IF NOT EXISTS {META_SCHEMA}.ddl_applied (
        changefeed text NOT NULL, commit_ts bigint NOT NULL, query_sha1 text NOT NULL,
        action text NOT NULL, table_ids bigint[] NOT NULL, query text NOT NULL,
        applied_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (changefeed, commit_ts, query_sha1))""",
    f"""CREATE TABLE IF NOT EXISTS {META_SCHEMA}.syncpoints (
        changefeed text NOT NULL, upstream_ts bigint NOT NULL,
        downstream_time timestamptz NOT NULL DEFAULT now(), tables jsonb NOT NULL,
        PRIMARY KEY (changefeed, upstream_ts))""",
]


def connect_kwargs(uri: str, resolve: bool = True) -> dict[str, Any]:
    """psycopg connection arguments of a ``postgresql://`` URI, ``${ENV}`` resolved now."""
    if resolve:
        try:
            uri = resolve_uri(uri, os.environ)
        except SecretReferenceError as exc:
            raise SinkError(str(exc)) from None
    parts = urllib.parse.urlsplit(uri)
    if parts.scheme not in ("postgresql", "postgres"):
        raise SinkError(f"not a PostgreSQL URI: {redact_uri(uri)!r} (want postgresql://...)")
    un = urllib.parse.unquote
    kw: dict[str, Any] = {}
    try:
        port = parts.port
    except ValueError as exc:
        raise SinkError(f"bad port in sink URI {redact_uri(uri)!r}: {exc}") from None
    if parts.hostname:
        kw["host"] = un(parts.hostname)
    if port:
        kw["port"] = port
    if parts.username:
        kw["user"] = un(parts.username)
    if parts.password is not None:
        kw["password"] = un(parts.password)
    db = un(parts.path.lstrip("/"))
    if db:
        kw["dbname"] = db
    for k, v in urllib.parse.parse_qsl(parts.query):
        kw[k] = v
    return kw


def probe(uri: str, timeout_s: int = 5) -> None:
    """Reach the database before a changefeed is created: connect, the database exists, and
    the user may create schemas (and so tables in them). SinkError with one line if not."""
    kw = connect_kwargs(uri)
    shown = redact_uri(uri)
    try:
        conn = psycopg.connect(**kw, connect_timeout=timeout_s, autocommit=True)
    except psycopg.Error as exc:
        reason = " ".join(PostgresSink._scrub(str(exc), kw).split())
        raise SinkError(f"sink {shown}: cannot connect: {reason}") from None
    with conn:
        user, db, may_create = conn.execute(
            "SELECT current_user, current_database(), "
            "has_database_privilege(current_user, current_database(), 'CREATE')"
        ).fetchone()  # type: ignore[misc]
    if not may_create:
        raise SinkError(
            f"sink {shown}: user {user!r} may not create schemas in database {db!r}; "
            f'GRANT CREATE ON DATABASE "{db}" TO "{user}" (the sink creates a schema per '
            "upstream database and its own cdc_dagster schema)"
        )


class PostgresSink:
    """The PostgreSQL downstream (``postgresql://user:${PW}@host:port/db``); picklable."""

    def __init__(self, uri: str, *, schema_check: bool = True) -> None:
        connect_kwargs(
            uri, resolve=False
        )  # validate the shape early (env refs are resolved at connect)
        self.uri = uri
        self.schema_check = schema_check
        self._conn: psycopg.Connection | None = None
        self._ensured: set[tuple[str, str]] = set()

    def __repr__(self) -> str:
        return f"PostgresSink({redact_uri(self.uri)!r})"

    def __getstate__(self) -> dict[str, Any]:
        return {"uri": self.uri, "schema_check": self.schema_check}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["uri"], schema_check=state["schema_check"])  # type: ignore[misc]

    # -- connection -------------------------------------------------------------------

    def _connect(self) -> psycopg.Connection:
        if self._conn is not None and not self._conn.closed:
            return self._conn
        kw = connect_kwargs(self.uri)
        try:
            conn = psycopg.connect(**kw, connect_timeout=10, autocommit=True)
        except psycopg.Error as exc:
            raise SinkError(
                f"cannot connect to {redact_uri(self.uri)}: {self._scrub(str(exc), kw)}"
            ) from None
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtext('cdc_dagster.bootstrap'))")
            for stmt in _BOOTSTRAP:
                conn.execute(stmt)
        self._conn = conn
        self._ensured = set()
        return conn

    @staticmethod
    def _scrub(msg: str, kw: Mapping[str, Any]) -> str:
        pw = kw.get("password")
        return msg.replace(pw, "***") if pw else msg

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _run(self, fn, *args):
        try:
            return fn(self._connect(), *args)
        except psycopg.OperationalError:
            if self._conn is not None and not self._conn.closed:
                raise
            self._conn = None
            return fn(self._connect(), *args)

    # -- protocol ---------------------------------------------------------------------

    def committed(self, changefeed_id: str, table: TableSchema) -> Committed:
        """The table's committed ts and current token ((0, 0) for a table never written)."""

        def go(conn: psycopg.Connection) -> Committed:
            row = conn.execute(
                f"SELECT committed_ts, token FROM {META_SCHEMA}.checkpoints "
                "WHERE changefeed = %s AND table_id = %s",
                (changefeed_id, table.table_id),
            ).fetchone()
            return Committed(*row) if row else Committed(0, 0)

        return self._run(go)

    def acquire(self, changefeed_id: str, table: TableSchema) -> int:
        """A new fencing token (one atomic upsert on the table's checkpoint row)."""

        def go(conn: psycopg.Connection) -> int:
            with conn.transaction():
                (token,) = conn.execute(
                    f"INSERT INTO {META_SCHEMA}.checkpoints AS c "
                    "(changefeed, table_id, token, location) VALUES (%s, %s, 1, %s) "
                    "ON CONFLICT (changefeed, table_id) DO UPDATE "
                    "SET token = c.token + 1, updated_at = now() RETURNING token",
                    (changefeed_id, table.table_id, table.qualified_name),
                ).fetchone()
            return int(token)

        return self._run(go)

    def write(
        self,
        changefeed_id: str,
        table: TableSchema,
        batch: pa.Table,
        start_ts: int,
        end_ts: int,
        token: int,
        *,
        at_syncpoint: bool = False,
    ) -> int:
        """Commit the batch and ``(end_ts, token)`` in one transaction; return the committed ts.

        ``at_syncpoint``: ``end_ts`` is a syncpoint TS; the same transaction copies the table
        if a reader registered it (``pg_syncpoint.copy_table``).
        """
        cols = self._check_batch(changefeed_id, table, batch)
        span = (start_ts, end_ts, token, at_syncpoint)
        try:
            return self._run(self._write, changefeed_id, table, batch, cols, span)
        except BaseException as exc:
            self._ensured.clear()  # a rolled-back transaction may have held the CREATE
            if isinstance(exc, psycopg.DataError | psycopg.errors.UndefinedColumn):
                raise SinkSchemaError(
                    f"{self._where(changefeed_id, table)}: PostgreSQL refused the batch "
                    f"({start_ts}, {end_ts}]: {exc}; nothing was written"
                ) from exc
            raise

    def _write(
        self,
        conn: psycopg.Connection,
        changefeed_id: str,
        table: TableSchema,
        batch: pa.Table,
        cols: list[str],
        span: tuple[int, int, int, bool],
    ) -> int:
        start_ts, end_ts, token, at_syncpoint = span
        where = self._where(changefeed_id, table)
        with conn.transaction():
            row = conn.execute(
                f"SELECT committed_ts, token FROM {META_SCHEMA}.checkpoints "
                "WHERE changefeed = %s AND table_id = %s FOR UPDATE",
                (changefeed_id, table.table_id),
            ).fetchone()
            committed, current = row if row else (0, 0)
            if token != current:
                raise FencedError(
                    f"{where}: write with fencing token {token} refused, the table's token is "
                    f"{current} (another capture owns it); nothing was written — stop this "
                    "table here"
                )
            if end_ts <= committed:
                return int(committed)  # replay after a crash: already in
            if committed > 0 and start_ts > committed:
                raise SinkGapError(
                    f"{where}: batch ({start_ts}, {end_ts}] starts above the committed ts "
                    f"{committed}; changes in between would be lost — restart the table "
                    f"from {committed}"
                )
            self._ensure_table(conn, table)
            if batch.num_rows:
                self._merge(conn, table, batch, cols)
            conn.execute(
                f"UPDATE {META_SCHEMA}.checkpoints SET committed_ts = %s, location = %s, "
                "updated_at = now() WHERE changefeed = %s AND table_id = %s",
                (end_ts, table.qualified_name, changefeed_id, table.table_id),
            )
            if at_syncpoint:
                pg_syncpoint.copy_table(conn, changefeed_id, end_ts, table)
        return end_ts

    @staticmethod
    def _where(changefeed_id: str, table: TableSchema) -> str:
        return f"changefeed {changefeed_id}, table {table.qualified_name} (id {table.table_id})"

    def _check_batch(self, changefeed_id: str, table: TableSchema, batch: pa.Table) -> list[str]:
        names = [c.name for c in table.columns]
        have = set(batch.column_names)
        missing = [n for n in [*names, OP_COLUMN] if n not in have]
        extra = sorted(have - set(names) - {OP_COLUMN, COMMIT_TS_COLUMN})
        if missing or extra:
            raise SinkSchemaError(
                f"{self._where(changefeed_id, table)}: batch columns do not fit the table "
                f"schema (missing {missing}, unexpected {extra}); was a DDL skipped?"
            )
        return names

    def _ensure_table(self, conn: psycopg.Connection, table: TableSchema) -> None:
        key = (table.database, table.table)
        if key in self._ensured:
            return
        try:
            with conn.transaction():
                # Two tables of one schema written first at once (two Spark tasks) would race
                # on CREATE SCHEMA IF NOT EXISTS (a unique violation in pg_namespace): create
                # one at a time. The lock is held until the batch's transaction ends.
                conn.execute("SELECT pg_advisory_xact_lock(hashtext('cdc_dagster.create'))")
                for stmt in pg_ddl.create_table(table):
                    conn.execute(stmt)
        except (psycopg.Error, pg_ddl.PgDDLError) as exc:
            raise SinkSchemaError(
                f"table {table.qualified_name} (id {table.table_id}): cannot create it "
                f"downstream: {exc}"
            ) from exc
        self._ensured.add(key)

    def _merge(
        self, conn: psycopg.Connection, table: TableSchema, batch: pa.Table, cols: list[str]
    ) -> None:
        stage = sql.Identifier("_cdc_batch")
        types = {c.name: c.type for c in table.columns}
        conn.execute(
            sql.SQL("CREATE TEMP TABLE {} ({}, _cdc_op smallint NOT NULL) ON COMMIT DROP").format(
                stage,
                sql.SQL(", ").join(
                    sql.SQL("{} {}").format(pg_ddl.ident(n), sql.SQL(pg_ddl.staging_type(types[n])))
                    for n in cols
                ),
            )
        )
        collist = sql.SQL(", ").join(pg_ddl.ident(n) for n in [*cols, OP_COLUMN])
        copy_sql = sql.SQL("COPY {} ({}) FROM STDIN").format(stage, collist)
        with conn.cursor() as cur, cur.copy(copy_sql) as copy:
            for row in _rows(batch, cols, types):
                copy.write_row(row)
        conn.execute(_merge_sql(table, stage))

    def apply_ddl(
        self, changefeed_id: str, record: DdlRecord, before: Mapping[int, TableSchema | None]
    ) -> None:
        """Apply one DDL record in one transaction with its ``ddl_applied`` row; skip a replay."""
        self._run(self._apply_ddl, changefeed_id, record, before)

    def _apply_ddl(
        self,
        conn: psycopg.Connection,
        changefeed_id: str,
        record: DdlRecord,
        before: Mapping[int, TableSchema | None],
    ) -> None:
        sha = hashlib.sha1(record.query.encode()).hexdigest()
        try:
            stmts = ddl_statements(record, before)
        except pg_ddl.PgDDLError as exc:
            raise SinkDDLError(self._ddl_where(changefeed_id, record) + f": {exc}") from exc
        try:
            with conn.transaction():
                done = conn.execute(
                    f"INSERT INTO {META_SCHEMA}.ddl_applied "
                    "(changefeed, commit_ts, query_sha1, action, table_ids, query) "
                    "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING 1",
                    (
                        changefeed_id,
                        record.commit_ts,
                        sha,
                        record.action,
                        sorted({*record.table_ids, *record.creates}),
                        record.query,
                    ),
                ).fetchone()
                if done is None:
                    return  # applied before (replay)
                for stmt in stmts:
                    conn.execute(stmt)
                # A table's last batch before the DDL claims T - 1 (every row change below
                # T; none shares T): with the DDL applied, the table holds T.
                conn.execute(
                    f"UPDATE {META_SCHEMA}.checkpoints SET committed_ts = %s, updated_at = now() "
                    "WHERE changefeed = %s AND table_id = ANY(%s) AND committed_ts = %s",
                    (record.commit_ts, changefeed_id, list(record.table_ids), record.commit_ts - 1),
                )
        except psycopg.Error as exc:
            raise SinkDDLError(
                self._ddl_where(changefeed_id, record) + f": PostgreSQL refused it: {exc}; "
                "nothing was applied — fix the downstream table or filter it out"
            ) from exc
        self._ensured.clear()

    @staticmethod
    def _ddl_where(changefeed_id: str, record: DdlRecord) -> str:
        names = [f"{t.qualified_name} (id {i})" for i, t in record.tables.items() if t]
        return (
            f"changefeed {changefeed_id}: DDL {record.action} at {record.commit_ts} "
            f"on {names or record.table_ids} ({record.query[:200]!r})"
        )

    def record_syncpoint(
        self, changefeed_id: str, ts: int, tables: Sequence[TableSchema]
    ) -> SyncpointRecord:
        """Record (changefeed, upstream ts, downstream commit time, tables)."""
        locations = {t.table_id: f"{t.database}.{t.table}" for t in tables}

        def go(conn: psycopg.Connection) -> None:
            with conn.transaction():
                # Copies were made by the writes that ended at ts; the ones missing are
                # made now where the table is still at ts, in the snapshot of the row.
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                pg_syncpoint.copy_missing(conn, changefeed_id, ts, tables)
                conn.execute(
                    f"INSERT INTO {META_SCHEMA}.syncpoints (changefeed, upstream_ts, tables) "
                    "VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
                    (changefeed_id, ts, json.dumps({str(k): v for k, v in locations.items()})),
                )

        self._run(go)
        return SyncpointRecord(changefeed_id, ts, {t: 0 for t in locations}, locations)


def ddl_statements(
    record: DdlRecord, before: Mapping[int, TableSchema | None]
) -> list[sql.Composable]:
    """The PostgreSQL statements of one DDL record, from the schemas before and after it."""
    if record.action == "create_schema":
        return [pg_ddl.create_schema(record.schema or "")]
    if record.action == "drop_schema":
        return [
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(pg_ddl.ident(record.schema or ""))
        ]
    stmts: list[sql.Composable] = []
    missing = [t for t in record.table_ids if before.get(t) is None]
    if missing:
        raise pg_ddl.PgDDLError(
            f"no schema before the DDL for existing tables {missing}: pass each touched "
            "table's schema at commit_ts - 1 (ChangeLog.schema_at) in `before`"
        )
    for table_id in sorted({*record.table_ids, *record.creates, *record.tables}):
        old = before.get(table_id)
        new = record.tables.get(table_id)
        if table_id in record.drops or (new is None and old is not None):
            if old is not None:
                stmts.append(pg_ddl.drop_table(old))
        elif old is None or table_id in record.creates:
            if new is not None:
                if record.replaces and table_id in record.creates:
                    # a table that left the changefeed had this name: start over (its rows
                    # and columns are those of before it left)
                    stmts.append(pg_ddl.drop_table(new))
                stmts += pg_ddl.create_table(new)
        elif new is not None:
            if record.action == "truncate_table":
                stmts.append(pg_ddl.truncate_table(old))
            stmts += pg_ddl.alter_table(old, new)
    return stmts


def _merge_sql(table: TableSchema, stage: sql.Identifier) -> sql.Composed:
    target = pg_ddl.table_ident(table)
    key = sql.SQL(" AND ").join(
        sql.SQL("t.{0} = s.{0}").format(pg_ddl.ident(c.name)) for c in table.key_columns
    )

    def src(c: Any) -> sql.Composable:
        if c.type == "time":
            return sql.SQL("(s.{} * interval '1 microsecond')").format(pg_ddl.ident(c.name))
        return sql.SQL("s.{}").format(pg_ddl.ident(c.name))

    non_key = [c for c in table.columns if c.id not in table.primary_key]
    update = (
        sql.SQL("WHEN MATCHED THEN UPDATE SET {} ").format(
            sql.SQL(", ").join(
                sql.SQL("{} = {}").format(pg_ddl.ident(c.name), src(c)) for c in non_key
            )
        )
        if non_key
        else sql.SQL("")
    )
    return sql.SQL(
        "MERGE INTO {} AS t USING {} AS s ON {} "
        "WHEN MATCHED AND s._cdc_op = 1 THEN DELETE "
        "{}"
        "WHEN NOT MATCHED AND s._cdc_op = 0 THEN INSERT ({}) VALUES ({})"
    ).format(
        target,
        stage,
        key,
        update,
        sql.SQL(", ").join(pg_ddl.ident(c.name) for c in table.columns),
        sql.SQL(", ").join(src(c) for c in table.columns),
    )


def _rows(batch: pa.Table, cols: list[str], types: Mapping[str, str]):
    """Python rows for COPY (JSON stays text: the jsonb column parses it)."""
    columns = [batch.column(n).to_pylist() for n in cols]
    columns.append(batch.column(OP_COLUMN).to_pylist())
    return zip(*columns, strict=True)
