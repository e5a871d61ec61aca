"""The binlog puller: MariaDB/MySQL row binlog -> the change log (docs/mysql-postgres.md).

A thin, ordered reader: it cuts raw events off the dump connection (``binlog_wire``) and
writes each transaction's row events of the tables it replicates as they came, with the
transaction's commit ts (``TsAllocator``), into binlog event files; the data plane mounts
them into typed rows in parallel (``upstream.binlog_rows``). What it still reads itself:
GTIDs and positions, table-map names (the filter, and a check that their columns are the
schema's), DDL statements (the schema history), transaction ends and heartbeats.

Complete transactions are buffered per table and flushed: data files -> DDL records ->
state (position, last ts) -> resolved marks. A DDL flushes first, so files never span a
DDL. While idle, server heartbeats issue a fresh TS and advance every resolved mark to it.
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

from cdc_dagster import failpoints
from cdc_dagster.mysql import catalog, join, resnapshot, snapshot
from cdc_dagster.mysql.adoption import Adopter
from cdc_dagster.mysql.binlog_wire import (
    BinlogStream,
    mariadb_gtid,
    mysql_gtid,
    query_event,
    rotate_event,
)
from cdc_dagster.mysql.catalog import TableFilter
from cdc_dagster.mysql.changelog_io import truncate_above, writer
from cdc_dagster.mysql.context import PullerConfig, PullerStats, ResnapshotOutcome
from cdc_dagster.mysql.ddl import UnsupportedDDLError, is_ignored, parse_ddl
from cdc_dagster.mysql.ddl_records import ddl_record
from cdc_dagster.mysql.errors import PullerBusyError, PullerError
from cdc_dagster.mysql.join import PendingJoin
from cdc_dagster.mysql.snapshots import ChunkBell
from cdc_dagster.mysql.state import (
    PullerState,
    TsAllocator,
    load_state,
    parse_gtid_pos,
    save_state,
)
from cdc_dagster.mysql.upstream import check_upstream, connect
from cdc_dagster.upstream.binlog_rows import (
    EVENT_SCHEMA,
    ROW_EVENT_OPS,
    BinlogRowsError,
    parse_table_map,
    rows_payload,
    table_map_name,
)
from cdc_dagster.upstream.uri import UpstreamError, parse_uri

log = logging.getLogger(__name__)

# Binlog event types the puller looks at (the rest are skipped)
QUERY, ROTATE, XID, TABLE_MAP, HEARTBEAT = 2, 4, 16, 19, 27
MYSQL_GTID, MARIADB_GTID = 33, 162
REFUSED = {
    39: "MySQL partial JSON updates (binlog_row_value_options=PARTIAL_JSON): set it to ''",
    40: "MySQL binlog transaction compression: SET GLOBAL binlog_transaction_compression=OFF",
    **dict.fromkeys(range(165, 172), "MariaDB binlog compression: SET GLOBAL log_bin_compress=OFF"),
}

_Change = tuple[int, bytes, int, bytes]  # table id, table-map body, op, rows payload
_UNKNOWN = object()  # a table map not looked at since the plans were forgotten
FIRST_FLUSH_S = 0.25  # a pull's first flush, this long after it starts
# A snapshot chunk written (``ChunkBell``) brings the flush that places it forward, to no
# sooner than this after the last flush (a flush lists every pending snapshot's chunks).
BELL_GAP_S = 0.2
# ... and a flush that places chunks (the bell's, or the stream's passing a waiting chunk)
# begins no sooner than PLACING_SPAN x the last flush's duration after that flush began:
# the puller spends at most 1/PLACING_SPAN of its time in them. Each placed one table's
# chunk and took 0.05-1.5 s under a 100-table snapshot's load (fsyncs): one after another,
# 93 flushes took 15.6 of its 18 s of reads, the stream fell 1 s behind the chunks read at
# its head, and the last 17 tables were placed one flush each after the reads' end.
PLACING_SPAN = 3.0
# While some of the change log's tables are still snapshotted, a table this run released
# (its snapshot complete) that a flush wrote no rows of has its resolved mark advanced at
# most every RELEASED_MARKS_S, not every flush: the changefeed's checkpoint waits for the
# tables still read anyway, and a released table's bulk waits for the reads
# (``executor._reads_first``). 100 released tables' marks (two fsyncs each) made every
# regular flush of a 100-table snapshot take 0.2-1.0 s under its load: the puller spent half
# of the reads in them, and chunks read meanwhile waited for the next one (PLACING_SPAN).
# Once no table is snapshotted, every flush advances every mark again.
RELEASED_MARKS_S = 5.0
# Row-event bytes buffered when the stream has nothing more to send (a backlog's end) that
# are flushed at once, not at the interval's end: a drained backlog's last rows waited up
# to a second (or the next heartbeat) for it. A trickle flushes once per interval as before.
# Used only once the stream's ``backlog_end`` is read or not known (no binlog status grant):
# before it, a server pausing mid-backlog would look drained.
DRAINED_FLUSH_BYTES = 1 << 20
# Catching up with a backlog -- the stream has not yet read to where the server's binlog
# ended as it began (``BinlogStream.end``; when that is not known: the binlog's time read
# since the last flush ran more than CATCH_UP_RATIO times the clock's, plus its one-second
# resolution) -- the puller holds the rows of the backlog's last RECENT_S (binlog time)
# until it has read the backlog, at most HOLD_MAX_S and 4 x ``flush_bytes``, and flushes
# them the moment it has: the captures sink rows that recent at once (a caught-up stream;
# older ones gather for ``batch_behind_s``, 10 s by default), so a flush among them made
# every table sink the rest a moment later in a second MERGE. (The server pausing for a
# moment mid-backlog also looked drained.) A live stream, however busy or behind, flushes
# each interval as before.
CATCH_UP_RATIO = 3.0
RECENT_S = 15.0
HOLD_MAX_S = 5.0

__all__ = [
    "Puller",
    "PullerBusyError",
    "PullerConfig",
    "PullerError",
    "PullerStats",
    "run_puller",
]


class _Buffer:
    """One table's committed row events, column by column, until the next flush."""

    __slots__ = ("maps", "ops", "payloads", "seqs", "ts")

    def __init__(self) -> None:
        self.ts: list[int] = []
        self.seqs: list[int] = []
        self.ops: list[int] = []
        self.maps: list[bytes] = []
        self.payloads: list[bytes] = []

    def events(self, version: int) -> pa.Table:
        n = len(self.ts)
        return pa.Table.from_arrays(
            [
                pa.array(self.ts, pa.int64()),
                pa.array(self.seqs, pa.int32()),
                pa.array(self.ops, pa.int8()),
                pa.array([version] * n, pa.int64()),
                pa.array(self.maps, pa.binary()),
                pa.array(self.payloads, pa.binary()),
            ],
            schema=EVENT_SCHEMA,
        )


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
        self.info: Any = None
        self.buffers: dict[int, _Buffer] = {}
        self.buffered = 0  # payload bytes waiting for a flush
        self.trx: list[_Change] = []
        self.trx_gtid: str | None = None
        self.trx_standalone = True  # the GTID group is one statement (a CTAS is not)
        self.trx_domain = 0  # MariaDB: the GTID's domain
        # The first flush comes FIRST_FLUSH_S after the start, not a whole interval: after a
        # restart or a resume the captures get the backlog's first rows while it is pulled.
        self.last_flush = time.monotonic() - config.flush_interval_s + FIRST_FLUSH_S
        self.flush_took = 0.0  # the last flush's duration (s)
        self.last_full_marks = 0.0  # when a flush last advanced every table's resolved mark
        # tables this run released while others are still snapshotted -> when their resolved
        # mark was last advanced (RELEASED_MARKS_S); emptied once none is snapshotted
        self.released_marks: dict[int, float] = {}
        self.event_time = 0.0  # the binlog time of the last transaction read
        self.flushed_event_time = 0.0  # ... when the last flush came (0: none yet)
        # where the server's binlog ended as the stream began, until read (None: read, or
        # not known): the backlog, flushed at once when read (BinlogStream.end)
        self.backlog_end: tuple[str, int] | None = None
        self.log_file = ""  # the binlog file being read
        self.log_offset = 0  # where the stream is in it (0: not known on this stream yet)
        self.stream_server_id: int | None = None  # the server the stream reads
        # binlog table id (6 bytes) -> (table id, table-map body); None: not replicated
        self._maps: dict[bytes, tuple[int, bytes] | None] = {}
        # table-map body -> the same (table id, body) or None, its columns checked
        self._known: dict[bytes, tuple[int, bytes] | None] = {}
        self.join: PendingJoin | None = None  # tables joining at a snapshot's binlog position
        self.adopter = Adopter()  # snapshot chunks placed in the stream (mysql.snapshots)
        self.bell = ChunkBell(self.root)  # a reader wrote a chunk: place it now
        self.requests_seen = 0.0  # when re-snapshot requests were last looked at

    # -- start ------------------------------------------------------------------------

    def start(self) -> None:
        conn = connect(self.upstream)
        try:
            self.info = check_upstream(conn)
            state = load_state(self.root)
            bootstrapped = state is None
            if state is None and self.config.chunked_snapshot and self.info.is_mariadb:
                state = snapshot.bootstrap_chunked(self)
            elif state is None:
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
            self.log_file = state.log_file
            self.forget_table_plans(0)
            for tid in state.snapshots:
                self.adopter.track(self, tid)
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

    def need_join(self, name: tuple[str, str]) -> None:
        """A table came into the filter under ``name`` (a RENAME): it joins at a snapshot."""
        if self.state.flavor != "mariadb":
            join.refuse_on_mysql(self, [name])
        if self.join is None:
            self.join = join.open_join(self, f"RENAME into {name[0]}.{name[1]}")
        elif name not in self.join.candidates:
            self.join.again = True  # open another join once this one is done

    def skip_table(self, name: tuple[str, str]) -> None:
        """A table the filter selects has no key: it is not replicated (TiCDC skips
        ineligible tables the same way), and ``changefeed query`` lists it."""
        db, table = name
        message = (
            "it has no primary key and no NOT NULL unique key, so it is not replicated "
            "(skipped); to replicate it, add a primary key "
            f"or a NOT NULL unique key to {db}.{table} (it then joins the changefeed with a "
            "snapshot), or create the changefeed again with force-replicate=true on the "
            "upstream URI (rows keyed by their full image)"
        )
        if name not in self.state.skipped:
            log.warning("table %s.%s: %s", db, table, message)
        self.state.skipped[name] = message

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

    def resnapshot(self, name: str) -> ResnapshotOutcome:
        """Snapshot replicated table ``name`` (``db.table``) again from here, in chunks,
        replacing its downstream state (``mysql.resnapshot``); between transactions only."""
        why = resnapshot.refusal(self.state, name)
        if why is not None:
            return ResnapshotOutcome(name, False, f"re-snapshot of {name} refused: {why}")
        parts = resnapshot.split_name(name)
        assert parts is not None
        tid = self.state.table_id(*parts)
        assert tid is not None
        self.flush()  # everything before the truncate is durable; the table's mark below it
        record = resnapshot.truncate_record(self, tid)
        self.writer.write_ddl(record)
        self.state.set_table(tid, record.tables[tid], record.commit_ts)
        self.state.snapshots[tid] = record.commit_ts
        self.adopter.restart(self, tid)
        self.forget_table_plans(tid)
        self.stats.ddls += 1
        self.flush(force=True)
        note = (
            f"re-snapshot of {name} (table id {tid}) started at {self.state.gtid}: truncated "
            f"downstream at ts {record.commit_ts}, its rows placed again in chunks by the "
            "snapshot runs; its resolved mark waits until they are all placed"
        )
        return ResnapshotOutcome(name, True, note, tid, record.commit_ts)

    @property
    def binlog_at(self) -> tuple[str, int] | None:
        """The binlog file and offset the stream is past (None: not known yet)."""
        return (self.log_file, self.log_offset) if self.log_file and self.log_offset else None

    def gtid_at(self, server_id: int, log_file: str, offset: int) -> dict[int, str] | None:
        """The upstream's GTID per domain at ``log_file:offset`` (``BINLOG_GTID_POS``,
        which reads the file up to there); None: the upstream is not server ``server_id``
        or has no such binlog."""
        conn = connect(self.upstream)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT @@server_id, BINLOG_GTID_POS(%s, %s)", (log_file, offset))
                sid, text = cur.fetchone()
        finally:
            conn.close()
        return parse_gtid_pos(text) if sid == server_id and text else None

    def _take_requests(self) -> None:
        """Re-snapshot requests (``PullerConfig.requests``), looked at every
        ``requests_every_s``; each is forgotten only once its outcome is saved."""
        requests, now = self.config.requests, time.monotonic()
        if requests is None or now - self.requests_seen < self.config.requests_every_s:
            return
        self.requests_seen = now
        for name in requests.pending():
            outcome = self.resnapshot(name)
            (log.info if outcome.started else log.warning)("%s", outcome.note)
            requests.taken(outcome)

    def _join_due(self) -> bool:
        return (
            self.join is not None
            and self.trx_gtid is None
            and not self.trx
            and self.join.reached(self.state.position)
        )

    # -- running ----------------------------------------------------------------------

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
        path = lock_path(self.root)
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
        if self.info.is_mariadb != (self.state.flavor == "mariadb"):
            raise PullerError(
                f"the change log at {self.root} was pulled from a {self.state.flavor} upstream, "
                f"but the upstream is now {self.info.version}: re-snapshot into a new change log"
            )
        retries = 0
        while not stop(self.stats):
            try:
                stream = BinlogStream(self.upstream, self.state, self.config.heartbeat_s)
            except UpstreamError as exc:
                retries = self._lost(retries, exc)
                continue
            self.stream_server_id, self.log_offset = stream.server_id, 0
            self.backlog_end = stream.end
            self.adopter.forget_ends()
            try:
                if self._follow(stream, stop):
                    retries = 0
            except pymysql.err.OperationalError as exc:
                self._purged(exc)
                retries = self._lost(retries, exc)
            finally:
                stream.close()
        self.flush()
        return self.stats

    def _lost(self, retries: int, exc: Exception) -> int:
        """A lost connection: retried from the last committed position, 30 times at most."""
        retries += 1
        if retries > 30:
            raise PullerBusyError(f"lost the upstream connection 30 times: {exc}") from exc
        log.warning("upstream connection lost (%r); resuming at %s", exc, self.state.gtid)
        self.trx, self.trx_gtid = [], None
        self.forget_table_plans(0)
        time.sleep(min(1.0 * retries, 5.0))
        return retries

    def _purged(self, exc: pymysql.err.OperationalError) -> None:
        if exc.args and exc.args[0] == 1236:
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

    def _follow(self, stream: BinlogStream, stop: Callable[[PullerStats], bool]) -> bool:
        """Handle events until ``stop``; whether any event came (the connection works).

        Row events and table maps, eight in ten events of an OLTP stream, are handled inline
        (no call per event); ``_maps`` and ``_known`` are cleared in place, never replaced.
        """
        seen = False
        interval = self.config.flush_interval_s
        trailer = 4 if stream.checksum else 0  # an event's checksum
        row_ops, maps, known = ROW_EVENT_OPS, self._maps, self._known
        for batch in stream.batches():
            seen = True
            for typ, when, server_id, log_pos, body in batch:
                if typ in row_ops:
                    mapped = maps.get(body[:6])
                    if mapped is not None:
                        self.trx.append((*mapped, row_ops[typ], rows_payload(typ, body)))
                elif typ == TABLE_MAP:
                    entry = known.get(body, _UNKNOWN)
                    if entry is _UNKNOWN:
                        entry = self._table_map(body)
                    maps[body[:6]] = entry
                elif typ == MARIADB_GTID:
                    self.trx = []
                    if self.adopter.history:  # it begins where the transaction before ended
                        begin = log_pos - 19 - len(body) - trailer
                        if (self.log_file, begin) not in self.adopter.ends:  # a stream's start
                            self._begins(begin)
                    self.trx_domain, self.trx_gtid, self.trx_standalone = mariadb_gtid(
                        server_id, body
                    )
                elif typ == XID:
                    self._commit(when, log_pos)
                else:
                    self._other(typ, when, log_pos, body)
                if self.trx_gtid is None and not self.trx:  # between transactions
                    if stop(self.stats):
                        return seen
                    if self._join_due():
                        self._finish_join()
                    self._take_requests()
                    if (
                        self.backlog_end is not None
                        and (self.log_file, log_pos) >= self.backlog_end
                    ):
                        self.backlog_end = None
                        self.flush()  # the backlog is read: its rows go out now
                    elif time.monotonic() - self.last_flush >= interval and not self._holds(stream):
                        self.flush()
                    elif self._chunk_written(stream):
                        # a snapshot chunk: placed (its table released) now
                        self.flush(placing=True)
            if (
                self.buffered >= DRAINED_FLUSH_BYTES
                and self.trx_gtid is None
                and not self.trx
                and self.backlog_end is None
                and stream.drained(batch[-1][1])
            ):
                self.flush()  # caught up with a backlog: its rows go out now
        return seen

    def _other(self, typ: int, when: float, log_pos: int, body: bytes) -> None:
        """The events that are neither rows, table maps, MariaDB GTIDs nor XIDs."""
        if typ == QUERY:
            self._query(when, log_pos, body)
        elif typ == MYSQL_GTID:
            self.trx, self.trx_gtid, self.trx_standalone = [], mysql_gtid(body), True
        elif typ == HEARTBEAT and not self.trx:
            self.log_offset = log_pos  # the stream is idle there
            self.alloc.issue(time.time())
            self.flush()
        elif typ == ROTATE:
            # every event of the files before is behind (the first one of a stream, too:
            # the server starts it in the file holding its GTID position)
            self.log_file, self.log_offset = rotate_event(body)[0], 4
        elif typ in REFUSED:
            raise PullerError(f"the upstream writes events the puller cannot read: "
                              f"{REFUSED[typ]}")  # fmt: skip

    # -- events -------------------------------------------------------------------------

    def _table_map(self, body: bytes) -> tuple[int, bytes] | None:
        """A table map not seen since the plans were forgotten: which table it maps (its
        table id and the map; None: not replicated), once its columns are checked."""
        tid = self.state.table_id(*table_map_name(body))
        if tid is not None:
            self._check_columns(tid, body)
        entry = None if tid is None else (tid, body)
        self._known[body] = entry
        return entry

    def _check_columns(self, tid: int, body: bytes) -> None:
        t = self.state.tables[tid]
        try:
            tmap = parse_table_map(body, self.state.flavor.split("_")[0])
        except BinlogRowsError as exc:
            raise PullerError(f"table {t.qualified_name}: {exc}") from exc
        names = sorted(c.name for c in tmap.columns)
        if names != sorted(c.name for c in t.columns):
            raise PullerError(
                f"the binlog's columns of {t.qualified_name} ({names}) differ from its schema "
                f"({sorted(c.name for c in t.columns)}): binlog_row_metadata must be FULL, and "
                "the puller must not lag more than one DDL behind the upstream catalog"
            )

    def _begins(self, offset: int) -> None:
        """A transaction begins at ``offset``: the position there is the stream's now (the
        first one of a stream begins where the stream resumed)."""
        self.log_offset = offset
        self.adopter.ended(self.log_file, offset, self.state.position)

    def _advance(self, gtid: str | None, log_pos: int) -> None:
        """Our position moves past ``gtid`` (and, on MySQL, to file:pos after the event)."""
        if self.state.flavor == "mariadb":
            self.log_offset = log_pos
            if gtid is not None:
                self.state.position[self.trx_domain] = gtid
                if self.adopter.history:  # chunks' coordinates are turned into GTIDs by these
                    self.adopter.ended(self.log_file, log_pos, self.state.position)
        else:
            self.state.advance(gtid, self.log_file, log_pos)

    def _commit(self, event_time: float, log_pos: int) -> None:
        if self.trx_gtid is not None or self.state.flavor == "mysql_file":
            self._advance(self.trx_gtid, log_pos)
        if self.trx:
            if not self.stats.row_events:  # this pull's first rows: flushed FIRST_FLUSH_S on
                self._first_rows()
            ts = self.alloc.issue(event_time)
            buffers, size = self.buffers, 0
            for seq, (tid, tmap, op, payload) in enumerate(self.trx):
                buf = buffers.get(tid)
                if buf is None:
                    buf = buffers[tid] = _Buffer()
                buf.ts.append(ts)
                buf.seqs.append(seq)
                buf.ops.append(op)
                buf.maps.append(tmap)
                buf.payloads.append(payload)
                size += len(payload)
            self.buffered += size
            self.stats.row_events += len(self.trx)
            self.stats.transactions += 1
            if self.adopter.history:
                tids = {c[0] for c in self.trx}
                self.adopter.note(tids, self.trx_domain, self.trx_gtid or None, ts)
        self.trx, self.trx_gtid = [], None
        self.flushed_event_time = self.flushed_event_time or event_time  # a pull's first
        self.event_time = event_time
        if self.buffered >= self.config.flush_bytes and (
            self.buffered >= 4 * self.config.flush_bytes or not self._holds(None)
        ):
            self.flush()

    def _first_rows(self) -> None:
        """The first flush with rows comes FIRST_FLUSH_S after this pull's first rows at the
        latest: a flush before them (the interval's first check came first, while the
        stream was being set up or a backlog's first transactions were of other tables)
        wrote nothing but restarted the interval, and a resumed backlog's flushes then
        came a second in, in the last RECENT_S that is held until the backlog is read -- one
        flush at its end, and the captures mounted the whole backlog after it
        (bench/throughput_bench.py: 0.4-0.7 s more from the puller's end to readable)."""
        due = time.monotonic() - self.config.flush_interval_s + FIRST_FLUSH_S
        self.last_flush = min(self.last_flush, due)

    def _chunk_written(self, stream: BinlogStream) -> bool:
        """Whether a flush that places snapshot chunks may come now, none held (``_holds``):
        the stream has passed a chunk the last flush found ahead of it (a chunk is read at
        the binlog's head, the puller a little behind: its placing waited a whole flush
        interval, up to 1 s at a snapshot's end), or a reader wrote a chunk since the last
        look (``ChunkBell``), BELL_GAP_S after the last flush; either no sooner than
        PLACING_SPAN x the last flush's duration after it began -- unless a reader has
        written its last chunk since (``ChunkBell.ended``): nothing more to gather."""
        if not self.state.snapshots:
            return False
        now = time.monotonic()
        since = now - self.last_flush
        if since < PLACING_SPAN * self.flush_took and not self.bell.ended(now):
            return False  # the last flush was long: chunks gather for the next (PLACING_SPAN)
        if self.adopter.waiting is not None and self.adopter.passed(self.binlog_at):
            return not self._holds(stream)
        return since >= BELL_GAP_S and not self._holds(stream) and self.bell.rang(now)

    def _holds(self, stream: BinlogStream | None) -> bool:
        """Whether a due flush waits: the puller is catching up with a backlog (the stream's
        ``backlog_end`` not read yet; not known: see CATCH_UP_RATIO), the last rows read are
        of its last RECENT_S, it has held them less than HOLD_MAX_S, and (end not known,
        ``stream`` given) the server has more to send."""
        if not self.buffered or not self.flushed_event_time:
            return False
        held = time.monotonic() - self.last_flush
        if held >= HOLD_MAX_S or time.time() - self.event_time > RECENT_S:
            return False  # old rows: the captures gather them; staged while the rest is read
        if self.backlog_end is not None:
            return True
        if self.event_time - self.flushed_event_time <= CATCH_UP_RATIO * held + 1.0:
            return False
        return stream is None or not stream.drained(self.event_time)

    def _query(self, event_time: float, log_pos: int, body: bytes) -> None:
        db, q = query_event(body)
        q = q.strip()
        if q.upper() == "BEGIN":
            return
        if q.upper() == "COMMIT":
            self._commit(event_time, log_pos)
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
            self._ddl(q, db or None, event_time, gtid, log_pos)
        elif gtid is not None or self.state.flavor == "mysql_file":
            self._advance(gtid, log_pos)

    def _ddl(
        self, query: str, default_db: str | None, event_time: float, gtid: str | None, pos: int
    ) -> None:
        try:
            parsed = parse_ddl(query, default_db)
        except UnsupportedDDLError as exc:
            raise PullerError(f"changefeed stopped at a DDL it cannot replicate: {exc}") from exc
        self.flush()
        skipped = dict(self.state.skipped)
        conn = connect(self.upstream)
        try:
            record = ddl_record(self, conn, parsed, query, lambda: self.alloc.issue(event_time))
        finally:
            conn.close()
        if gtid is not None or self.state.flavor == "mysql_file":
            self._advance(gtid, pos)  # persisted with (not before) the DDL record's state write
        if record is None:
            if skipped != self.state.skipped:
                self.flush(force=True)  # the skipped list (changefeed query shows it)
            return
        self.writer.write_ddl(record)
        self.adopter.note(set(record.tables), self.trx_domain, gtid, record.commit_ts)
        for tid, schema in record.tables.items():
            self.state.set_table(tid, schema, record.commit_ts)
        self.forget_table_plans(0)
        self.stats.ddls += 1
        self.flush(force=True)

    def forget_table_plans(self, table_id: int) -> None:
        """Forget which binlog table ids are which tables and which table maps were checked
        (a table was created, joined, renamed or altered; ``table_id`` is not needed)."""
        self._maps.clear()
        self._known.clear()

    # -- flush ------------------------------------------------------------------------

    def flush(self, force: bool = False, placing: bool = False) -> None:
        """``_flush``, timed (``flush_took``: how soon a placing flush may follow)."""
        began = time.monotonic()
        if self.state.snapshots:
            self.bell.flushed()
        try:
            self._flush(force, placing)
        finally:
            self.flush_took = time.monotonic() - began

    def _flush(self, force: bool = False, placing: bool = False) -> None:
        """Data files, then state, then resolved marks (the durability order).

        ``placing``: a flush for snapshot chunks (``_chunk_written``), several a second
        while chunks are read. It advances the resolved marks of the tables it wrote rows
        of or released, and the others' only if the last flush that did was a flush interval
        ago: each mark is two fsyncs, and 100 tables' in every such flush (as their snapshots
        completed) made a flush take 0.1-1.5 s under a snapshot's load, the puller falling
        behind the chunks it placed (the last placed 7-14 s after the reads' end).
        """
        now = self.last_flush = time.monotonic()
        self.flushed_event_time = self.event_time or self.flushed_event_time
        snapshots = dict(self.state.snapshots)
        idle = not self.buffered and self.alloc.last == self.state.last_ts and not force
        if idle and not snapshots:
            return
        flavor = "mariadb" if self.state.flavor == "mariadb" else "mysql"
        written = set(self.buffers)
        for tid, buf in self.buffers.items():
            version = self.state.versions[tid]
            self.writer.write_binlog_events(tid, 0, version, buf.events(version), flavor)
        self.buffers = {}
        self.buffered = 0
        if snapshots:
            self.adopter.adopt(self)
            unchanged = self.alloc.last == self.state.last_ts and snapshots == self.state.snapshots
            if idle and unchanged and not self.adopter.placed:
                return
        self.state.last_ts = self.alloc.last
        failpoints.hit(failpoints.PULLER_AFTER_CHANGELOG_WRITE)
        save_state(self.root, self.state)
        self.adopter.after_save(self.writer.fsync)
        every = (
            not placing
            or not self.state.snapshots
            or now - self.last_full_marks >= self.config.flush_interval_s
        )
        if every:
            self.last_full_marks = now
        for tid, t in self.state.tables.items():
            if tid in self.state.snapshots:
                continue  # held until its snapshot is complete
            if not every and tid not in written and tid not in snapshots:
                continue  # neither written nor released now: at the next interval
            if tid not in written and not self._released_mark_due(tid, tid in snapshots, now):
                continue  # released earlier, others still snapshotted: RELEASED_MARKS_S
            for shard in range(t.shards):
                self.writer.advance_resolved(tid, shard, self.state.last_ts)
        self.writer.advance_ddl_resolved(self.state.last_ts)
        self.stats.flushes += 1
        self.stats.resolved_ts = self.state.last_ts
        self.stats.position = self.state.gtid

    def _released_mark_due(self, tid: int, released_now: bool, now: float) -> bool:
        """Whether a flush that wrote no rows of table ``tid`` advances its resolved mark:
        always, unless this run released the table (``released_now``: in this flush) while
        others are still snapshotted and advanced its mark less than RELEASED_MARKS_S ago."""
        if not self.state.snapshots:
            self.released_marks.clear()
            return True
        if released_now:
            self.released_marks[tid] = now
            return True
        last = self.released_marks.get(tid)
        if last is None:
            return True  # not released by this run: its stream's checkpoint moves each flush
        if now - last < RELEASED_MARKS_S:
            return False
        self.released_marks[tid] = now
        return True


def lock_path(root: str | Path) -> Path:
    """The change log's puller lock: a puller run holds an exclusive flock on it."""
    return Path(root) / "puller" / "lock"


def pulling(root: str | Path) -> bool:
    """Whether a puller holds the change log's puller lock at ``root`` (reads the binlog
    into it now; a run holding through a pause does not)."""
    path = lock_path(root)
    if not path.exists():
        return False
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
    return False


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
