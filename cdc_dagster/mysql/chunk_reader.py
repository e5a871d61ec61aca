"""Reading a snapshot range in chunks, each at its own short consistent snapshot.

What one Spark task (or any worker) does for one key range of a table
(``mysql.snapshots``): for each chunk, take the table's metadata lock (a transaction that
opened it, on a connection kept for the range: DDL waits, writes do not), check the
catalog's columns are the change log's schema, read the next keys (keyset, in key order)
in a ``START TRANSACTION WITH CONSISTENT SNAPSHOT`` whose binlog position comes with the
rows (``mysql.chunk_select``), end both transactions, and write the chunk's rows in the
data-file layout (no ``_commit_ts``: the puller places them) in a thread while the next chunk
is read (``ChunkWriter``). A killed reader loses at most the chunk it was reading and the one
being written: the next one starts at the first key not in a file.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa

from cdc_dagster.mysql.catalog import quote_ident as _q
from cdc_dagster.mysql.catalog import read_columns
from cdc_dagster.mysql.chunk_select import ChunkClient, client_for
from cdc_dagster.mysql.errors import PullerBusyError
from cdc_dagster.mysql.snapshots import (
    Chunk,
    Key,
    NextRead,
    Plan,
    decode_key,
    done_chunks,
    encode_key,
    generation_dir,
    gtid_positions,
    next_read,
    pending_chunks,
    read_plan,
    ring_reads_ended,
    write_chunk,
    write_plan,
)
from cdc_dagster.mysql.upstream import connect
from cdc_dagster.schema import TableSchema
from cdc_dagster.upstream.changelog import ChangeLog
from cdc_dagster.upstream.uri import UpstreamConfig, parse_uri

# one row per (table, range) a task read: its rows and when (wall clock) it began and ended
RESULT = pa.schema([("table_id", pa.int64()), ("range", pa.int64()), ("rows", pa.int64()),
                    ("chunks", pa.int64()), ("task", pa.int64()), ("began", pa.float64()),
                    ("ended", pa.float64())])  # fmt: skip
RESULT_DDL = (
    "table_id long, range long, rows long, chunks long, task long, began double, ended double"
)
SCHEMA_WAIT_S = 60.0  # a DDL the puller has not written yet: wait this long for it
EXACT_COUNT_BELOW = 1_000_000  # tables InnoDB estimates larger are planned on the estimate
EXACT_COUNT_SMALL = 20_000  # ... and those it estimates smaller are counted (a few ms)
# Rows per chunk. A chunk's rows are held in memory once (~40 MB here). (Chunks were 50,000
# rows while each one's position cost MariaDB a BINLOG_GTID_POS, which reads the binlog
# file up to the snapshot's offset: 0.26 s at 848 MB, 0.44 s at 1.08 GB; the readers now
# give binlog coordinates, which the puller turns into GTIDs: ``mysql.adoption``.)
CHUNK_ROWS = 200_000
Progress = Callable[[Chunk], None]


class ReadSession:
    """What the ranges one worker reads one after another share: the change log's reader
    and the connection that takes each chunk's metadata lock (a pymysql connection costs
    0.05-0.15 s to open here, most of a small table's read)."""

    def __init__(self, upstream: UpstreamConfig, root: str) -> None:
        self.upstream, self.root = upstream, root
        self.log = ChangeLog(root)
        self._lock: Any = None
        self.writer = ChunkWriter()

    @property
    def lock(self) -> Any:
        """The metadata lock's connection, not in autocommit: a chunk's first statement on it
        begins the transaction that holds the lock (no ``START TRANSACTION`` round trip)."""
        if self._lock is None:
            self._lock = connect(self.upstream)
            self._lock.autocommit(False)
        return self._lock

    def close(self) -> None:
        """The chunks written (their error raised, if one failed), the connection closed."""
        try:
            self.writer.close()
        finally:
            if self._lock is not None:
                self._lock.close()
                self._lock = None


class ChunkWriter:
    """Writes a reader's chunks (Parquet, fsync, rename: ``snapshots.write_chunk``) in a
    thread of its own, one at a time, while the reader reads the next one: a chunk's write
    took ~20% of a reader's time under load (the fsync ~5%), the upstream idle meanwhile.
    At most two chunks are held (the one written, the one read). A chunk handed over and
    not yet in its file is ``in_flight``: a reader counts it read (``read_range``)."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._pending: Future[None] | None = None
        self._guard = threading.Lock()
        self._in_flight: dict[tuple[Path, int, int], Chunk] = {}

    def write(self, gen_dir: Path, chunk: Chunk, rows: pa.Table) -> None:
        """Hand the chunk over once the one before is written (its error raised here)."""
        self.wait()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="chunk-writer")
        key = (gen_dir, chunk.range_no, chunk.chunk_no)
        with self._guard:
            self._in_flight[key] = chunk
        self._pending = self._pool.submit(self._write, key, chunk, rows)

    def _write(self, key: tuple[Path, int, int], chunk: Chunk, rows: pa.Table) -> None:
        try:
            write_chunk(key[0], chunk, rows)
        finally:
            with self._guard:
                del self._in_flight[key]

    def in_flight(self, gen_dir: Path, range_no: int) -> dict[tuple[int, int], Chunk]:
        """The range's chunks handed over and not yet in their files."""
        with self._guard:
            return {(r, n): c for (g, r, n), c in self._in_flight.items()
                    if g == gen_dir and r == range_no}  # fmt: skip

    def wait(self) -> None:
        """Until the chunk handed over last is written (its error raised here)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None


def read_range(
    upstream: UpstreamConfig,
    root: str,
    table_id: int,
    generation: int,
    range_no: int,
    chunk_rows: int = CHUNK_ROWS,
    progress: Progress | None = None,
    client: str = "auto",
    session: ReadSession | None = None,
) -> int:
    """Read range ``range_no`` of the table's snapshot plan to its end; rows read.
    ``client``: which client reads the rows (``chunk_select.client_for``); ``session``:
    shared with other ranges read before or after (None: one of its own)."""
    plan = read_plan(root, table_id, generation)
    if plan is None:
        raise PullerBusyError(f"table {table_id}: no snapshot plan of generation {generation}")
    gen_dir = generation_dir(root, table_id, generation)
    own = session is None
    shared = ReadSession(upstream, root) if session is None else session
    reader: tuple[int, bool, ChunkClient] | None = None  # (schema version, GTIDs?, client)
    total = 0
    try:
        while True:
            # in flight, then pending: a chunk written meanwhile is in a file, and the puller
            # marks a chunk done before it removes its file
            flying = shared.writer.in_flight(gen_dir, range_no)
            pending = {(c.range_no, c.chunk_no): c for _, c in pending_chunks(gen_dir, range_no)}
            records = done_chunks(gen_dir, range_no) | pending | flying
            if not gen_dir.exists():
                return total  # released meanwhile: every chunk was placed
            nr = next_read(plan, range_no, records, chunk_rows)
            if nr is None:
                return total
            lock = shared.lock
            schema, version = _lock_and_check(lock, shared.log, table_id)
            try:
                gtids = gtid_positions(gen_dir)
                if reader is None or reader[:2] != (version, gtids):
                    if reader is not None:
                        reader[2].close()
                    made = client_for(upstream, schema, version, client, gtid_positions=gtids)
                    reader = (version, gtids, made)
                chunk, rows = _read_chunk(reader[2], version, range_no, nr)
            finally:
                lock.rollback()  # the metadata lock: held only while the chunk was read
            shared.writer.write(gen_dir, chunk, rows)  # written while the next one is read
            total += chunk.rows
            if progress is not None:
                progress(chunk)
    finally:
        if reader is not None:
            reader[2].close()
        if own:
            shared.close()


def _schema(log: ChangeLog, table_id: int) -> tuple[TableSchema, int]:
    ts = log.ddl_resolved_ts()
    schema, version = log.schema_at(table_id, ts), log.schema_version_at(table_id, ts)
    if schema is None or version is None:
        raise PullerBusyError(f"table {table_id} is not in the change log at its DDL mark {ts}")
    return schema, version


def _read_chunk(
    client: ChunkClient, version: int, range_no: int, nr: NextRead
) -> tuple[Chunk, Any]:
    got = client.select((decode_key(nr.lo), decode_key(nr.bound)), nr.limit, snapshot=True)
    n = got.rows.num_rows
    full = nr.limit is not None and n == nr.limit
    hi = encode_key(got.last_key) if full else nr.bound
    chunk = Chunk(range_no, nr.chunk_no, got.position, nr.lo, hi,
                  not full and not nr.fills_hole, n, version, got.binlog)  # fmt: skip
    return chunk, got.rows


def _lock_and_check(lock: Any, log: ChangeLog, table_id: int) -> tuple[TableSchema, int]:
    """Take the table's metadata lock on ``lock`` (its transaction stays open: the caller
    ends it) once the catalog's columns are the change log's schema; that schema. While the
    catalog is ahead (a DDL the puller has not written yet), wait for the change log."""
    deadline = time.monotonic() + SCHEMA_WAIT_S
    while True:
        schema, version = _schema(log, table_id)
        # one statement: it begins the transaction (``ReadSession.lock``), takes the table's
        # metadata lock, then reads its columns
        columns = read_columns(lock, schema.database, schema.table, lock=True)
        want = [(c.name, c.type) for c in schema.columns]
        if [(n, t) for n, t, _, _ in columns] == want:
            return schema, version
        lock.rollback()
        if time.monotonic() > deadline:
            raise PullerBusyError(
                f"table {schema.qualified_name}: its columns upstream are not the change log's "
                f"after {SCHEMA_WAIT_S:.0f} s (a DDL the puller has not reached yet?)"
            )
        time.sleep(0.5)


def read_spec(
    spec: dict[str, Any], session: ReadSession | None = None, progress: Progress | None = None
) -> int:
    """Read one (table, range) spec to its end; rows read."""
    return read_range(parse_uri(spec["upstream_uri"]), spec["root"], spec["table_id"],
                      spec["generation"], spec["range"], spec["chunk_rows"], progress,
                      client=spec.get("client", "auto"), session=session)  # fmt: skip


def claim(claims: str | os.PathLike[str], spec: dict[str, Any]) -> bool:
    """Whether this reader takes the spec's (table, generation, range): the first to create
    its file in ``claims`` (one directory per job, shared by the job's tasks) does."""
    name = f"{spec['table_id']}-{spec['generation']}-{spec['range']}"
    try:
        os.close(os.open(Path(claims) / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except FileExistsError:
        return False
    return True


def read_group(
    specs: list[dict[str, Any]], task: int, claims: str | None = None
) -> list[dict[str, Any]]:
    """Read the specs one after another (one session per change log); a ``RESULT`` row each.
    ``claims``: a directory the job's tasks share; each of them is given every spec and reads
    those it claims first (``claim``), so a task whose reads went faster takes more of them
    and none waits at the end for another's last ones (None: all of ``specs``)."""
    out, sessions = [], {}
    try:
        for spec in specs:
            if claims is not None and not claim(claims, spec):
                continue  # another task's
            key = (spec["upstream_uri"], spec["root"])
            if key not in sessions:
                sessions[key] = ReadSession(parse_uri(key[0]), key[1])
            began, chunks = time.time(), []
            rows = read_spec(spec, sessions[key], chunks.append)
            out.append({"table_id": spec["table_id"], "range": spec["range"], "rows": rows,
                        "chunks": len(chunks), "task": task, "began": began,
                        "ended": time.time()})  # fmt: skip
    finally:
        try:
            for session in sessions.values():
                session.close()
        finally:
            for _, root in sessions:  # its last chunks written: the puller places them now
                ring_reads_ended(root)
    return out


def read_groups(
    groups: list[str], batches: Iterator[pa.RecordBatch], claims: str | None = None
) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body over ``spark.range``: group ``id``'s specs, one after another
    (at a lower CPU priority: ``yield_cpu``); ``claims``: as ``read_group``'s."""
    yield_cpu()
    out = []
    for batch in batches:
        for gid in batch.column("id").to_pylist():
            out += read_group(json.loads(groups[gid]), gid, claims)
    yield pa.RecordBatch.from_pylist(out, schema=RESULT)


# The niceness of a Spark worker reading snapshot chunks: where the CPU is short, the
# captures' ticks (the binlog stream of the other tables) come first, the reads take what
# they leave -- among processes of one session: with Linux's autogroup scheduling (on here)
# a niceness counts only within its session, and the stack's Spark Connect server (whose
# workers these are) is a session of its own, the captures' run workers the daemon's (the
# readers at 0 got no more CPU than at 10 here). Against the daemon's session it is the
# server's autogroup niceness that counts (``services.stack.spark_nice``). The workers
# belong to the snapshot runs' own Spark session (``SNAPSHOT_SESSION``).
# ``CDC_DAGSTER_SNAPSHOT_NICE`` (in the Spark server's environment) sets it, 0-19.
# (not an integer: 10).
_NICE = os.environ.get("CDC_DAGSTER_SNAPSHOT_NICE", "").strip()
SNAPSHOT_NICE = min(19, max(0, int(_NICE))) if _NICE.lstrip("-").isdigit() else 10


def yield_cpu() -> None:
    """Lower this process's CPU priority to ``SNAPSHOT_NICE`` (once; threads it starts
    later inherit it); where that is not allowed, nothing."""
    try:
        if os.getpriority(os.PRIO_PROCESS, 0) < SNAPSHOT_NICE:
            os.setpriority(os.PRIO_PROCESS, 0, SNAPSHOT_NICE)
    except OSError:
        pass


def plan_table(
    upstream: UpstreamConfig,
    root: str,
    table_id: int,
    generation: int,
    parallelism: int,
    chunk_rows: int,
) -> Plan:
    """Split the table into key ranges read in parallel (``plan_tables``)."""
    return plan_tables(upstream, root, {table_id: generation}, parallelism, chunk_rows)[table_id]


def plan_tables(
    upstream: UpstreamConfig,
    root: str,
    snapshots: dict[int, int],
    parallelism: int,
    chunk_rows: int,
) -> dict[int, Plan]:
    """Each snapshot's (table id -> generation) key ranges, read in parallel: a single
    integer key by equal spans of [min, max]; any other key as one range. Written once (a
    resumed run reuses it), with the table's row count then (what progress counts chunks
    against). One connection and one change-log reader for all of them."""
    plans: dict[int, Plan] = {}
    for tid, gen in snapshots.items():
        if (plan := read_plan(root, tid, gen)) is not None:
            plans[tid] = plan
    todo = [tid for tid in snapshots if tid not in plans]
    if not todo:
        return plans
    log = ChangeLog(root)
    conn = connect(upstream)
    try:
        schemas = {tid: _schema(log, tid)[0] for tid in todo}
        estimates = _estimates(conn, [(s.database, s.table) for s in schemas.values()])
        keys = {tid: key for tid in todo if parallelism > 1 and (key := _split_key(schemas[tid]))}
        spans = _key_spans(conn, {tid: (schemas[tid], key) for tid, key in keys.items()})
        new = []
        for tid in todo:
            schema = schemas[tid]
            estimate = estimates.get((schema.database, schema.table), 0)
            plans[tid] = _plan(conn, schema, tid, snapshots[tid], parallelism, chunk_rows,
                               estimate, spans.get(tid))  # fmt: skip
            new.append(plans[tid])
    finally:
        conn.close()
    # each written, flushed to disk by the first chunk read against it (``plan_durable``):
    # 100 tables' plans, two fsyncs each, took 0.8 s here under a snapshot's load
    for plan in new:
        write_plan(root, plan, durable=False)
    return plans


def _split_key(schema: TableSchema) -> str | None:
    """The table's key column when it is one integer (its range split by value), else None."""
    if len(schema.primary_key) != 1:
        return None
    key = schema.column(schema.primary_key[0])
    return key.name if key.type.startswith(("int", "uint")) else None


SPANS_PER_QUERY = 200  # tables whose key spans one UNION ALL reads


def _key_spans(conn: Any, tables: dict[int, tuple[TableSchema, str]]) -> dict[int, tuple[Any, Any]]:
    """Each table's (MIN, MAX) of its integer key column (``tables``: id -> (schema, key));
    (None, None): empty. A few hundred tables a query (a round trip each was ~2-4 ms of a
    100-table plan here, more under load)."""
    out: dict[int, tuple[Any, Any]] = {}
    items = sorted(tables.items())
    with conn.cursor() as cur:
        for i in range(0, len(items), SPANS_PER_QUERY):
            parts = []
            for tid, (schema, key) in items[i : i + SPANS_PER_QUERY]:
                table = f"{_q(schema.database)}.{_q(schema.table)}"
                parts.append(f"SELECT {tid}, MIN({_q(key)}), MAX({_q(key)}) FROM {table}")
            cur.execute(" UNION ALL ".join(parts))
            for tid, lo, hi in cur.fetchall():  # a union's type may be DECIMAL: ints again
                out[int(tid)] = (None, None) if lo is None else (int(lo), int(hi))
    return out


def _estimates(conn: Any, names: list[tuple[str, str]]) -> dict[tuple[str, str], int]:
    """InnoDB's row estimates of the tables (``information_schema``: one query a database)."""
    out: dict[tuple[str, str], int] = {}
    by_db: dict[str, list[str]] = {}
    for db, table in names:
        by_db.setdefault(db, []).append(table)
    with conn.cursor() as cur:
        for db, tables in by_db.items():
            marks = ", ".join(["%s"] * len(tables))
            cur.execute(
                "SELECT TABLE_NAME, TABLE_ROWS FROM information_schema.TABLES "
                f"WHERE TABLE_SCHEMA = %s AND TABLE_NAME IN ({marks})",
                (db, *tables),
            )
            out.update({(db, name): int(rows or 0) for name, rows in cur.fetchall()})
    return out


def _plan(
    conn: Any,
    schema: TableSchema,
    table_id: int,
    generation: int,
    parallelism: int,
    chunk_rows: int,
    estimate: int,
    key_span: tuple[Any, Any] | None = None,
) -> Plan:
    """One table's plan. The row count sizes the ranges and the progress shown (chunks
    done / total). An exact ``COUNT(*)`` scans the table (5 s for 10M rows here; 100 tables
    of 100k rows took 4.5 s to plan with one each), so it is made only where InnoDB's
    estimate is small (under ``EXACT_COUNT_SMALL``: a few ms) or doubtful: below a million rows
    and, for an integer key, under half the key's span (statistics not yet updated after
    a bulk load); else the estimate counts, at most the key's span. ``key_span``: the
    integer key's (MIN, MAX) read already (``_key_spans``)."""
    ranges: list[tuple[Key, Key]] = [(None, None)]
    key_name = _split_key(schema)
    split = key_name is not None and parallelism > 1
    table = f"{_q(schema.database)}.{_q(schema.table)}"
    with conn.cursor() as cur:
        lo = hi = None
        if split and key_span is not None:
            lo, hi = key_span
        elif split:
            cur.execute(f"SELECT MIN({_q(key_name)}), MAX({_q(key_name)}) FROM {table}")
            lo, hi = cur.fetchone()
        span = hi - lo + 1 if lo is not None else 0
        count = min(estimate, span) if span else estimate
        doubtful = estimate < EXACT_COUNT_BELOW and (not split or span > 2 * estimate)
        if estimate < EXACT_COUNT_SMALL or doubtful:
            cur.execute(f"SELECT COUNT(*) FROM {table}")
            count = int(cur.fetchone()[0])
    n = min(parallelism, max(1, (count or 0) // chunk_rows))
    if split and lo is not None and n > 1:
        cuts = [lo + (hi - lo) * i // n for i in range(1, n)]
        bounds: list[Key] = [None, *([c] for c in cuts), None]
        ranges = list(itertools.pairwise(bounds))
    return Plan(table_id, generation, tuple(ranges), int(count or 0), chunk_rows)


__all__ = [
    "CHUNK_ROWS",
    "RESULT",
    "RESULT_DDL",
    "SNAPSHOT_NICE",
    "ChunkWriter",
    "ReadSession",
    "claim",
    "plan_table",
    "plan_tables",
    "read_group",
    "read_groups",
    "read_range",
    "read_spec",
    "yield_cpu",
]
