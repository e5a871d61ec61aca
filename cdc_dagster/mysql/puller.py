"""The binlog puller: MariaDB/MySQL row binlog -> the change log (docs/mysql-postgres.md).

One transaction = one commit ts (``TsAllocator``). Complete transactions are buffered
per table and flushed: data files -> DDL records -> state (position, last ts) -> resolved
marks. A DDL flushes first, so files never span a DDL. While idle, server heartbeats
issue a fresh TS and advance every resolved mark to it.
"""

from __future__ import annotations

import fcntl
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pymysql
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.constants import FIELD_TYPE
from pymysqlreplication.event import (
    GtidEvent,
    HeartbeatLogEvent,
    MariadbGtidEvent,
    QueryEvent,
    RotateEvent,
    XidEvent,
)
from pymysqlreplication.row_event import (
    DeleteRowsEvent,
    TableMapEvent,
    UpdateRowsEvent,
    WriteRowsEvent,
)

from cdc_dagster import failpoints
from cdc_dagster.mysql import catalog, join, snapshot
from cdc_dagster.mysql.catalog import TableFilter, build_schema, read_table
from cdc_dagster.mysql.changelog_io import change_rows, truncate_above, writer
from cdc_dagster.mysql.context import PullerConfig, PullerStats
from cdc_dagster.mysql.ddl import ParsedDDL, UnsupportedDDLError, is_ignored, parse_ddl
from cdc_dagster.mysql.errors import PullerBusyError, PullerError
from cdc_dagster.mysql.evolve import NeedsCatalog, altered_schema, created_schema, renamed
from cdc_dagster.mysql.join import PendingJoin
from cdc_dagster.mysql.state import (
    PullerState,
    TsAllocator,
    load_state,
    save_state,
)
from cdc_dagster.mysql.types import converter, passthrough
from cdc_dagster.mysql.upstream import check_upstream, connect
from cdc_dagster.schema import DdlRecord, TableSchema
from cdc_dagster.upstream.uri import UpstreamError, parse_uri
from scheduler_core.ddl import DDLKind

log = logging.getLogger(__name__)

OP_INSERT, OP_UPDATE, OP_DELETE = 1, 2, 3


_Change = tuple[int, int, dict[int, Any] | None, dict[int, Any] | None]  # tid, op, after, before
_Plan = tuple[tuple[int, Callable[[Any], Any], type | None], ...]  # per column: id, fn, as-is type


__all__ = [
    "Puller",
    "PullerBusyError",
    "PullerConfig",
    "PullerError",
    "PullerStats",
    "run_puller",
    "stream_position",
]


class Puller:
    """One run of the binlog puller; ``run`` until ``stop`` says so."""

    def __init__(self, config: PullerConfig) -> None:
        self.config = config
        self.upstream = parse_uri(config.upstream_uri)
        self.filter = TableFilter(config.filters)
        self.root = config.changelog_root
        self.writer = writer(self.root)
        self.stats = PullerStats()
        self.state: PullerState
        self.alloc: TsAllocator
        self.buffers: dict[int, list[tuple]] = {}
        self.buffered = 0
        self.trx: list[_Change] = []
        self.trx_gtid: str | None = None
        self.last_flush = time.monotonic()
        self._conv: dict[int, dict[tuple[str, ...], _Plan]] = {}  # table id -> column list -> plan
        self.join: PendingJoin | None = None  # tables joining at a snapshot's binlog position
        self.trx_standalone = True  # the GTID group is one statement (a CTAS is not)

    # -- start ------------------------------------------------------------------------

    def start(self) -> None:
        conn = connect(self.upstream)
        try:
            self.info = check_upstream(conn)
            state = load_state(self.root)
            bootstrapped = state is None
            if state is None:
                state = snapshot.bootstrap(self)
            else:
                removed = truncate_above(self.root, state.last_ts)
                if removed:
                    log.info("removed %d change-log files above %d (unfinished flush)",
                             removed, state.last_ts)  # fmt: skip
                    # the writer caches the DDL records it found: one removed here and
                    # written again (the same record) would be taken as already there
                    self.writer.close()
                    self.writer = writer(self.root)
            self.state = state
            self.alloc = TsAllocator(state.last_ts)
            self._conv.clear()
            if not bootstrapped:
                if join.leave_unselected(self):
                    self.flush(force=True)  # the drop records and the state that forgot them
                self._start_join()
        finally:
            conn.close()

    def _start_join(self) -> None:
        """Tables the filter selects but the state does not track join at a snapshot (a
        widened filter, or a join an earlier run did not finish); see ``mysql.join``."""
        widened = self.state.filters is not None and self.state.filters != self.config.filters
        if self.state.flavor != "mariadb":
            if widened:
                join.refuse_widened_filter(self)
            self.state.filters = self.config.filters
            return
        self.join = join.open_join(self, "puller start" + (": filter changed" if widened else ""))
        if self.join is None:
            self.state.filters = self.config.filters

    def _need_join(self, name: tuple[str, str]) -> None:
        """A table came into the filter under ``name`` (a RENAME): it joins at a snapshot."""
        if self.state.flavor != "mariadb":
            join.refuse_on_mysql(self, [name])
        if self.join is None:
            self.join = join.open_join(self, f"RENAME into {name[0]}.{name[1]}")
        elif name not in self.join.candidates:
            self.join.again = True  # open another join once this one is done

    def _finish_join(self) -> None:
        """The stream passed the join point: write the joining tables, save the state."""
        pending = self.join
        assert pending is not None
        self.flush()
        try:
            self.stats.snapshot_rows += join.complete(self, pending)
        finally:
            pending.close()
            self.join = None
        self.state.filters = self.config.filters
        self.flush(force=True)
        if pending.again:
            self.join = join.open_join(self, "a table renamed into the filter during a join")

    def _join_due(self) -> bool:
        return (
            self.join is not None
            and self.trx_gtid is None
            and not self.trx
            and self.join.reached(self.state.position)
        )

    # -- streaming --------------------------------------------------------------------

    def _stream(self) -> BinLogStreamReader:
        if self.info.is_mariadb != (self.state.flavor == "mariadb"):
            raise PullerError(
                f"the change log at {self.root} was pulled from a {self.state.flavor} upstream, "
                f"but the upstream is now {self.info.version}: re-snapshot into a new change log"
            )
        kw = self.upstream.connect_kwargs()
        return BinLogStreamReader(
            connection_settings={**kw, "charset": "utf8mb4"},
            server_id=self.upstream.server_id,
            blocking=True,
            slave_heartbeat=self.config.heartbeat_s,
            only_events=[MariadbGtidEvent, GtidEvent, QueryEvent, XidEvent, WriteRowsEvent,
                         UpdateRowsEvent, DeleteRowsEvent, HeartbeatLogEvent, RotateEvent,
                         TableMapEvent],
            **stream_position(self.state),
        )  # fmt: skip

    def run(self, stop: Callable[[PullerStats], bool]) -> PullerStats:
        """Pull until ``stop(stats)``, and past it until an open join is done; then flush.
        Holds the change log's puller lock."""
        lock = self._lock()
        try:
            return self._run(lambda s: self.join is None and stop(s))
        finally:
            if self.join is not None:
                self.join.close()  # not done: nothing of it was saved; the next run joins
                self.join = None
            self.writer.close()  # its lock goes now, not when the object is collected
            lock.close()  # releases the flock

    def _lock(self):
        """One puller per change log: an exclusive flock on ``<root>/puller/lock``."""
        path = Path(self.root) / "puller" / "lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        f = open(path, "a+")  # noqa: SIM115 - held for the run
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            raise PullerBusyError(
                f"another puller is running on {self.root} (it holds {path}); run one per "
                "upstream and change log"
            ) from None
        return f

    def _run(self, stop: Callable[[PullerStats], bool]) -> PullerStats:
        self.start()
        retries = 0
        while not stop(self.stats):
            stream = self._stream()
            self._reader = stream
            try:
                while not stop(self.stats):
                    if self._join_due():
                        self._finish_join()
                        continue
                    ev = stream.fetchone()
                    if ev is None:
                        continue
                    retries = 0
                    if isinstance(ev, MariadbGtidEvent | GtidEvent):
                        self.trx, self.trx_gtid = [], ev.gtid
                        # MariaDB's FL_STANDALONE: a lone statement (DDL); CTAS has rows too
                        self.trx_standalone = bool(getattr(ev, "flags", 1) & 1)
                    elif isinstance(ev, WriteRowsEvent | UpdateRowsEvent | DeleteRowsEvent):
                        self._rows(ev)
                    elif isinstance(ev, XidEvent):
                        self._commit(ev.timestamp)
                    elif isinstance(ev, QueryEvent):
                        self._query(ev)
                    elif isinstance(ev, HeartbeatLogEvent) and not self.trx:
                        self.alloc.issue(time.time())
                        self.flush()
                    due = time.monotonic() - self.last_flush >= self.config.flush_interval_s
                    if due and not self.trx:
                        self.flush()
            except pymysql.err.OperationalError as exc:
                code = exc.args[0] if exc.args else None
                if code == 1236:
                    raise PullerError(
                        f"the upstream no longer has the binlog at {self.state.gtid} "
                        f"({exc.args[1] if len(exc.args) > 1 else exc}): the changes after "
                        f"that position (the change log's end, commit ts {self.state.last_ts}) "
                        "up to the oldest binlog the upstream still has were purged before "
                        "the puller read them, and are lost; re-snapshot: remove the "
                        f"changefeed and its change log {self.root}, then create the "
                        "changefeed again (a new initial snapshot), and keep binlogs longer "
                        "(binlog_expire_logs_seconds / expire_logs_days)"
                    ) from None
                retries += 1
                if retries > 30:
                    raise PullerBusyError(f"lost the upstream connection 30 times: {exc}") from exc
                log.warning("upstream connection lost (%r); resuming at %s", exc, self.state.gtid)
                self.trx = []
                time.sleep(min(1.0 * retries, 5.0))
            finally:
                stream.close()
        self.flush()
        return self.stats

    def _plan(self, tid: int, values: dict[str, Any]) -> _Plan:
        """How to convert rows whose columns are ``values``' names, in that order (checked
        once per table and column list: every row of an event has the event's columns)."""
        names = tuple(values)
        plans = self._conv.get(tid)
        if plans is None:
            plans = self._conv[tid] = {}
        plan = plans.get(names)
        if plan is None:
            t = self.state.tables[tid]
            by_name = {c.name: c for c in t.columns}
            if len(names) != len(by_name) or any(n not in by_name for n in names):
                raise PullerError(
                    f"the binlog's columns of {t.qualified_name} ({sorted(names)}) differ from "
                    f"its schema ({sorted(by_name)}): binlog_row_metadata must be FULL, and the "
                    "puller must not lag more than one DDL behind the upstream catalog"
                )
            plan = plans[names] = tuple(
                (by_name[n].id, converter(by_name[n].type), passthrough(by_name[n].type))
                for n in names
            )
        return plan

    def _convert(self, tid: int, values: dict[str, Any], plan: _Plan | None = None) -> dict:
        if plan is None:
            plan = self._plan(tid, values)
        # a value already of the column's Arrow-ready type is kept without a call
        return {
            cid: v if v is None or type(v) is ok else fn(v)
            for (cid, fn, ok), v in zip(plan, values.values(), strict=True)
        }

    def _rows(self, ev: Any) -> None:
        tid = self.state.table_id(ev.schema, ev.table)
        if tid is None:
            return
        key = self.state.tables[tid].primary_key
        pads = _binary_pads(ev, self.state.tables[tid])
        rows = ev.rows
        if not rows:
            return
        conv, trx = self._convert, self.trx
        if isinstance(ev, UpdateRowsEvent):
            plan = self._plan(tid, rows[0]["after_values"])
            for row in rows:
                if pads:
                    _pad(row["before_values"], pads)
                    _pad(row["after_values"], pads)
                after = conv(tid, row["after_values"], plan)
                before = conv(tid, row["before_values"], plan)
                moved = any(before[k] != after[k] for k in key)
                trx.append((tid, OP_UPDATE, after, before if moved else None))
            return
        plan = self._plan(tid, rows[0]["values"])
        op = OP_DELETE if isinstance(ev, DeleteRowsEvent) else OP_INSERT
        for row in rows:
            if pads:
                _pad(row["values"], pads)
            values = conv(tid, row["values"], plan)
            trx.append((tid, op, None, values) if op == OP_DELETE else (tid, op, values, None))

    def _advance(self, gtid: str | None) -> None:
        """Our position moves past ``gtid`` (and, on MySQL, to the reader's file:pos); so does
        the reader's own reconnect position with GTIDs (mysql-replication reconnects by itself
        after a lost connection, from ``auto_position``, which it never updates: without this
        it would replay). Without GTIDs it reconnects from its own last file:pos itself."""
        reader = getattr(self, "_reader", None)
        if self.state.flavor == "mariadb" or reader is None:
            self.state.advance(gtid)
        else:
            self.state.advance(gtid, reader.log_file or "", int(reader.log_pos or 0))
        if reader is not None and self.state.flavor != "mysql_file":
            reader.auto_position = self.state.gtid

    def _commit(self, event_time: float) -> None:
        if self.trx_gtid is not None or self.state.flavor == "mysql_file":
            self._advance(self.trx_gtid)
        if self.trx:
            ts = self.alloc.issue(event_time)
            for seq, (tid, op, after, before) in enumerate(self.trx):
                self.buffers.setdefault(tid, []).append((ts, seq, op, after, before))
            self.buffered += len(self.trx)
            self.stats.rows += len(self.trx)
            self.stats.transactions += 1
        self.trx, self.trx_gtid = [], None
        if self.buffered >= self.config.flush_rows:
            self.flush()

    def _query(self, ev: Any) -> None:
        q = ev.query.strip()
        if q.upper() == "BEGIN":
            return
        if q.upper() == "COMMIT":
            self._commit(ev.timestamp)
            return
        if not self.trx_standalone and self.state.flavor == "mariadb":
            # A statement inside a GTID group that ends with a commit (CREATE TABLE ...
            # SELECT: its rows follow; a SAVEPOINT): the transaction goes on, and the
            # position moves past it at that commit (a stop in between would lose rows)
            gtid = None
        else:
            gtid = self.trx_gtid
            self.trx, self.trx_gtid = [], None
        if not is_ignored(q):
            db = ev.schema.decode() if isinstance(ev.schema, bytes) else ev.schema
            self._ddl(q, db or None, ev.timestamp, gtid)
        elif gtid is not None or self.state.flavor == "mysql_file":
            self._advance(gtid)

    # -- DDL --------------------------------------------------------------------------

    def _ddl(self, query: str, default_db: str | None, event_time: float, gtid: str | None) -> None:
        try:
            parsed = parse_ddl(query, default_db)
        except UnsupportedDDLError as exc:
            raise PullerError(f"changefeed stopped at a DDL it cannot replicate: {exc}") from exc
        self.flush()
        conn = connect(self.upstream)
        try:
            record = self._ddl_record(conn, parsed, query, lambda: self.alloc.issue(event_time))
        finally:
            conn.close()
        if gtid is not None or self.state.flavor == "mysql_file":
            self._advance(gtid)  # persisted with (not before) the DDL record's state write
        if record is None:
            return
        self.writer.write_ddl(record)
        for tid, schema in record.tables.items():
            self.state.set_table(tid, schema, record.commit_ts)
            self.forget_table_plans(tid)
        self.stats.ddls += 1
        self.flush(force=True)

    def _ddl_record(
        self, conn: Any, p: ParsedDDL, query: str, issue: Callable[[], int]
    ) -> DdlRecord | None:
        st, force = self.state, self.upstream.force_replicate
        if p.action in ("create_schema", "drop_schema"):
            assert p.schema is not None
            if not self.filter(p.schema, "\x00any"):
                return None
            if p.action == "create_schema":
                return DdlRecord(issue(), DDLKind.CREATE_SCHEMA, p.action, query, schema=p.schema)
            gone = tuple(t for t, s in st.tables.items() if s.database == p.schema)
            return DdlRecord(issue(), DDLKind.DROP_SCHEMA, p.action, query, gone, drops=gone,
                             schema=p.schema, tables=dict.fromkeys(gone))  # fmt: skip
        if p.action == "create_table":
            (db, name) = p.creates[0]
            if p.replace and st.table_id(db, name) is not None:
                raise PullerError(
                    f"changefeed stopped at {query[:200]!r}: CREATE OR REPLACE of a replicated "
                    f"table is not supported; use DROP TABLE then CREATE TABLE, or re-snapshot"
                )
            if not self.filter(db, name) or st.table_id(db, name) is not None:
                return None  # outside the filter, or CREATE TABLE IF NOT EXISTS of one we have
            tid = st.ids.new_table_id()
            try:
                schema = created_schema(query, (db, name), tid, st.ids, force, self._mariadb)
            except NeedsCatalog:
                raw = read_table(conn, db, name)
                if raw is None:
                    return None  # dropped again before we read it: its drop is skipped too
                schema = build_schema(raw, tid, st.ids, None, force_replicate=force)
            return DdlRecord(issue(), DDLKind.CREATE_TABLE, p.action, query, creates=(tid,),
                             tables={tid: schema, **join.replaced(self, db, name)})  # fmt: skip
        if p.action == "drop_table":
            ids = tuple(t for t in (st.table_id(*n) for n in p.drops) if t is not None)
            if not ids:
                return None
            return DdlRecord(issue(), DDLKind.DROP_TABLE, p.action, query, ids,
                             drops=ids, tables=dict.fromkeys(ids))  # fmt: skip
        if p.action == "rename_table" and p.renames:
            return self._rename(conn, p, query, issue)
        tid = st.table_id(*p.tables[0])
        if tid is None:
            return None
        before = st.tables[tid]
        if p.action == "truncate_table":
            return DdlRecord(issue(), DDLKind.TRUNCATE_TABLE, p.action, query, (tid,),
                             tables={tid: before})  # fmt: skip
        after = self._altered(conn, query, before, p.column_renames)
        return DdlRecord(issue(), DDLKind.ALTER_TABLE, p.action, query, (tid,),
                         tables={tid: after})  # fmt: skip

    def _rename(self, conn: Any, p: ParsedDDL, query: str, issue: Callable[[], int]) -> Any:
        st = self.state
        touched, creates, drops, tables = [], [], [], {}
        for src, dst in p.renames:
            tid = st.table_id(*src)
            keep = self.filter(*dst)
            if tid is None and not keep:
                continue
            if tid is None:
                self._need_join(dst)  # its rows so far are not in the binlog we read
                continue
            touched.append(tid)
            if not keep:
                drops.append(tid)
                tables[tid] = None
            else:
                before = st.tables[tid]
                if p.is_alter:
                    tables[tid] = self._altered(conn, query, before, p.column_renames)
                else:
                    tables[tid] = renamed(before, *dst)
        if not touched and not creates:
            return None
        kind = DDLKind.RENAME_TABLES if touched else DDLKind.CREATE_TABLE
        return DdlRecord(issue(), kind, "rename_table" if touched else "create_table", query,
                         tuple(touched), tuple(creates), tuple(drops), tables=tables)  # fmt: skip

    def _altered(
        self, conn: Any, query: str, before: TableSchema, renames: dict[str, str]
    ) -> TableSchema:
        st, force = self.state, self.upstream.force_replicate
        try:
            return altered_schema(query, before, st.ids, force, self._mariadb)
        except NeedsCatalog:
            raw = read_table(conn, before.database, before.table)
            if raw is None:
                raise PullerError(
                    f"table {before.qualified_name} vanished after {query!r}"
                ) from None
            return build_schema(raw, before.table_id, st.ids, before, renames, force)

    def forget_table_plans(self, table_id: int) -> None:
        """Drop the cached row conversions of a table (its schema changed)."""
        self._conv.pop(table_id, None)

    @property
    def _mariadb(self) -> bool:
        return getattr(self, "info", None) is None or self.info.is_mariadb

    # -- flush ------------------------------------------------------------------------

    def flush(self, force: bool = False) -> None:
        """Data files, then state, then resolved marks (the durability order)."""
        self.last_flush = time.monotonic()
        if not self.buffered and self.alloc.last == self.state.last_ts and not force:
            return
        for tid, rows in self.buffers.items():
            if rows:
                self.writer.write_rows(tid, 0, self.state.versions[tid], self._arrow(tid, rows))
        self.buffers = {}
        self.buffered = 0
        self.state.last_ts = self.alloc.last
        failpoints.hit(failpoints.PULLER_AFTER_CHANGELOG_WRITE)
        save_state(self.root, self.state)
        for tid, t in self.state.tables.items():
            for shard in range(t.shards):
                self.writer.advance_resolved(tid, shard, self.state.last_ts)
        self.writer.advance_ddl_resolved(self.state.last_ts)
        self.stats.flushes += 1
        self.stats.resolved_ts = self.state.last_ts
        self.stats.position = self.state.gtid

    def _arrow(self, tid: int, rows: list[tuple]) -> pa.Table:
        return change_rows(self.state.tables[tid], self.state.versions[tid], rows)


def stream_position(state: PullerState) -> dict[str, Any]:
    """BinLogStreamReader's arguments that say where to start, per the state's flavor.

    MariaDB: ``auto_position`` = the GTID list (``domain-server-seq``); MySQL with GTIDs:
    ``auto_position`` = the executed GTID set (COM_BINLOG_DUMP_GTID sends what is not in it);
    MySQL without: ``log_file``/``log_pos`` with ``resume_stream``.
    """
    if state.flavor == "mariadb":
        return {"is_mariadb": True, "resume_stream": True, "auto_position": state.gtid or None}
    if state.flavor == "mysql_gtid":
        if not state.gtid_set:
            # An empty set would make mysql-replication ask for the current position instead.
            raise PullerError("the puller state holds an empty MySQL GTID set; re-snapshot")
        return {"is_mariadb": False, "resume_stream": True, "auto_position": state.gtid_set}
    if state.flavor == "mysql_file":
        if not state.log_file:
            raise PullerError("the puller state holds no binlog file:pos; re-snapshot")
        return {"is_mariadb": False, "resume_stream": True, "log_file": state.log_file,
                "log_pos": state.log_pos}  # fmt: skip
    raise PullerError(f"unknown upstream flavor {state.flavor!r} in the puller state")


def _binary_pads(ev: Any, t: TableSchema) -> dict[str, int]:
    """BINARY(n) columns: the binlog drops their trailing 0x00 padding; n per column name."""
    binary = {c.name for c in t.columns if c.type == "binary"}
    cols = ev.table_map[ev.table_id].columns
    return {c.name: c.max_length for c in cols if c.type == FIELD_TYPE.STRING and c.name in binary}


def _pad(values: dict[str, Any], pads: dict[str, int]) -> None:
    for name, n in pads.items():
        v = values.get(name)
        if v == "":  # mysql-replication gives an empty binary string as str
            v = b""
        if isinstance(v, bytes) and len(v) < n:
            values[name] = v.ljust(n, b"\0")


def run_puller(
    config: PullerConfig, stop_after: float | Callable[[PullerStats], bool] | None = None
) -> PullerStats:
    """Run the puller until ``stop_after`` (seconds, or a predicate on the stats) says stop."""
    if stop_after is None:
        stop: Callable[[PullerStats], bool] = lambda s: False  # noqa: E731
    elif callable(stop_after):
        stop = stop_after
    else:
        deadline = time.monotonic() + float(stop_after)
        stop = lambda s: time.monotonic() >= deadline  # noqa: E731
    try:
        return Puller(config).run(stop)
    except UpstreamError:
        raise
    except catalog.CatalogError as exc:
        raise PullerError(str(exc)) from exc
