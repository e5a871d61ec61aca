"""Chunked, lock-free, resumable snapshots: the files the chunk readers and the puller share.

A table to snapshot (a new changefeed's tables, a table joining, a re-snapshot) gets a
*generation* in the puller's state, which holds the table's resolved mark where it was
asked for until the snapshot is complete. Then, under the change log's root:

```
snapshot/<table_id>/<gen>/plan.json                     the key ranges (chunk readers run them in parallel)
snapshot/<table_id>/<gen>/chunks/<range>-<chunk>.parquet rows of one chunk, read at one binlog position
snapshot/<table_id>/<gen>/done/<range>-<chunk>.json      the chunk is in the change log (or was empty)
snapshot/<table_id>/<gen>/gtid-positions                the puller asks readers for GTID positions
snapshot/chunks-written                                 a byte appended after each chunk written (``ChunkBell``)
```

A chunk is read in a short ``START TRANSACTION WITH CONSISTENT SNAPSHOT`` whose binlog
position MariaDB reports (DBLog's watermark, read-only: no signal table, no lock but a
metadata lock for the chunk's few milliseconds): the server's id and the snapshot's binlog
file and offset (``Chunk.binlog``), which the puller, that sees every transaction's file and
offset go by, turns into GTIDs itself (``mysql.adoption``). A reader asks MariaDB for the
GTIDs only where the puller said it cannot (``gtid_positions``: the readers reach another
server than the puller): ``BINLOG_GTID_POS`` reads the binlog file from its start to the
offset, 0.07 s at 380 MB into a file here, 0.44 s at 1.08 GB. The puller places the chunk's rows in
the stream exactly there -- at a free TS between the table's last change at or before that
position and its first change after it (``mysql.state.SLOTS``) -- so no reconciliation
with the binlog is needed: each chunk row says what its key held at that point, and every
later change follows it. A chunk placed twice (a crash between placing and marking it
done) says the same thing twice. Chunks within a range follow one another by key
(keyset: each starts after the last key of the one before); a range is covered when its
chunks are done from its low end to one marked ``last``.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import json
import logging
import os
import re
import shutil
import uuid
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from cdc_dagster.mysql.state import load_state
from cdc_dagster.upstream.changelog import (
    CHUNKS_WRITTEN,
    READING_S,
    fsync_path,
    snapshot_bell,
    snapshot_reading,
    write_json,
)

log = logging.getLogger(__name__)

CHUNK_KEY = b"cdc_dagster.chunk"
GTID_POSITIONS = "gtid-positions"
_CHUNK_NAME = re.compile(r"(\d{4})-(\d{6})\.(parquet|json)")

Key = list[Any] | None  # a primary-key tuple as JSON values; None: the table's end


def encode_key(values: tuple[Any, ...] | list[Any] | None) -> Key:
    """Key values (as pymysql gives them) as JSON values."""
    if values is None:
        return None
    out: list[Any] = []
    for v in values:
        if isinstance(v, bytes):
            out.append({"b64": base64.b64encode(v).decode()})
        elif isinstance(v, Decimal):
            out.append({"dec": str(v)})
        elif isinstance(v, dt.datetime | dt.date | dt.timedelta):
            out.append({"text": str(v)})
        else:
            out.append(v)
    return out


def decode_key(key: Key) -> tuple[Any, ...] | None:
    """JSON key values back into query arguments."""
    if key is None:
        return None
    out: list[Any] = []
    for v in key:
        if isinstance(v, dict):
            out.append(
                base64.b64decode(v["b64"]) if "b64" in v else Decimal(v["dec"]) if "dec" in v
                else v["text"]
            )  # fmt: skip
        else:
            out.append(v)
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Plan:
    """A table's snapshot split into key ranges ``(lo, hi]`` (None: open end)."""

    table_id: int
    generation: int
    ranges: tuple[tuple[Key, Key], ...]
    rows: int = 0  # the table's rows when planned (an estimate of the work: progress)
    chunk_rows: int = 0  # the chunk size it was planned with (0: a plan from before)

    def to_json(self) -> dict[str, Any]:
        return {
            "table_id": self.table_id,
            "generation": self.generation,
            "ranges": [list(r) for r in self.ranges],
            "rows": self.rows,
            "chunk_rows": self.chunk_rows,
        }

    @staticmethod
    def from_json(obj: dict[str, Any]) -> Plan:
        return Plan(
            obj["table_id"],
            obj["generation"],
            tuple(tuple(r) for r in obj["ranges"]),
            int(obj.get("rows", 0)),
            int(obj.get("chunk_rows", 0)),
        )


@dataclass(frozen=True, slots=True)
class Chunk:
    """One chunk: keys in ``(lo, hi]`` of range ``range_no`` as read at ``position``."""

    range_no: int
    chunk_no: int
    position: dict[int, str]  # MariaDB GTID per domain of the chunk's snapshot
    lo: Key
    hi: Key  # the last key read; the range's high end when ``last``
    last: bool  # the range ends with this chunk
    rows: int
    schema_version: int  # of the change log's schema the rows were read with
    # where it was read as (server id, binlog file, offset), when ``position`` is not given
    binlog: tuple[int, str, int] | None = None

    @property
    def name(self) -> str:
        return f"{self.range_no:04d}-{self.chunk_no:06d}"

    def to_json(self) -> dict[str, Any]:
        return {
            "range": self.range_no,
            "chunk": self.chunk_no,
            "position": {str(k): v for k, v in self.position.items()},
            "lo": self.lo,
            "hi": self.hi,
            "last": self.last,
            "rows": self.rows,
            "schema_version": self.schema_version,
            **({"binlog": list(self.binlog)} if self.binlog else {}),
        }

    @staticmethod
    def from_json(obj: dict[str, Any]) -> Chunk:
        binlog = obj.get("binlog")
        return Chunk(
            obj["range"],
            obj["chunk"],
            {int(k): v for k, v in obj["position"].items()},
            obj["lo"],
            obj["hi"],
            obj["last"],
            obj["rows"],
            obj["schema_version"],
            (int(binlog[0]), str(binlog[1]), int(binlog[2])) if binlog else None,
        )


# ``snapshot/claims/<job>/``: which task of a snapshot job reads which range (``chunk_reader.claim``)
CLAIMS = "claims"


def claims_dir(root: str | os.PathLike[str], job: str) -> Path:
    return Path(root) / "snapshot" / CLAIMS / job


def generation_dir(root: str | os.PathLike[str], table_id: int, generation: int) -> Path:
    return Path(root) / "snapshot" / str(table_id) / str(generation)


def gtid_positions(gen_dir: Path) -> bool:
    """Whether the puller asked this generation's readers for GTID positions."""
    return (gen_dir / GTID_POSITIONS).exists()


def ask_gtid_positions(gen_dir: Path) -> None:
    """The puller cannot place binlog coordinates read on another server: readers of this
    generation read GTID positions from now on."""
    gen_dir.mkdir(parents=True, exist_ok=True)
    (gen_dir / GTID_POSITIONS).touch()


def release_generation(gen_dir: Path) -> None:
    """Remove a complete snapshot's files: renamed away first, at once, so a reader that
    still sees ``gen_dir`` after listing it listed it whole (``read_range``)."""
    away = gen_dir.with_name(f".released-{gen_dir.name}-{uuid.uuid4().hex}")
    try:
        os.rename(gen_dir, away)
    except FileNotFoundError:
        return
    shutil.rmtree(away, ignore_errors=True)


def sweep_generations(root: str | os.PathLike[str], snapshots: dict[int, int]) -> int:
    """Remove the generation dirs of snapshots no longer held (``snapshots``: table id ->
    generation), and what a removal cut short left; how many. A puller that saved a table's
    release and died before removing its files leaves them; nothing reads them again."""
    base = Path(root) / "snapshot"
    if not base.is_dir():
        return 0
    removed = 0
    for table_dir in base.iterdir():
        if table_dir.name == CLAIMS:
            continue  # the snapshot jobs' claims (``chunk_reader.claim``): theirs to remove
        for gen_dir in table_dir.iterdir() if table_dir.is_dir() else ():
            keep = (
                table_dir.name.isdigit()
                and gen_dir.name.isdigit()
                and (snapshots.get(int(table_dir.name)) == int(gen_dir.name))
            )
            if keep or not gen_dir.is_dir():
                continue
            if gen_dir.name.isdigit():
                release_generation(gen_dir)
            else:  # a ``.released-*`` dir whose removal was cut short
                shutil.rmtree(gen_dir, ignore_errors=True)
            removed += 1
    return removed


PLAN_NAME = "plan.json"
_DURABLE_PLANS: set[Path] = set()  # generation dirs whose plan this process made durable


def write_plan(root: str | os.PathLike[str], plan: Plan, durable: bool = True) -> None:
    """The table generation's plan (atomically). ``durable=False``: not flushed to disk
    here -- the first chunk written against it flushes it first (``plan_durable``), so no
    chunk or done mark is ever on disk without its plan: 100 tables' plans, two fsyncs
    each, took 0.8 s of a snapshot run's start under its load, its reads not yet begun."""
    path = generation_dir(root, plan.table_id, plan.generation) / PLAN_NAME
    write_json(path, plan.to_json(), fsync=durable)
    if durable:
        _DURABLE_PLANS.add(path.parent)


def plan_durable(gen_dir: Path) -> None:
    """Flush the generation's plan (its file, then its directory) to disk, once a process
    (a plan that was on disk stays there: each later call is a set lookup)."""
    if gen_dir in _DURABLE_PLANS:
        return
    try:
        fsync_path(gen_dir / PLAN_NAME)
    except FileNotFoundError:
        return  # none to flush (a test's chunk written without one)
    fsync_path(gen_dir)
    _DURABLE_PLANS.add(gen_dir)


def read_plan(root: str | os.PathLike[str], table_id: int, generation: int) -> Plan | None:
    """The generation's plan; None: not planned -- or its file was written and never flushed
    (``write_plan(durable=False)``) before the machine stopped, left empty or cut short:
    then no chunk was written against it either (``plan_durable``), and it is planned again."""
    path = generation_dir(root, table_id, generation) / PLAN_NAME
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        return Plan.from_json(json.loads(text))
    except (ValueError, KeyError, TypeError):
        log.warning("snapshot plan %s is not whole (a machine stop before it was flushed; no "
                    "chunk was written against it): the table is planned again", path)  # fmt: skip
        return None


def write_chunk(gen_dir: Path, chunk: Chunk, rows: pa.Table) -> None:
    """A chunk's rows (or, empty, its done mark directly: nothing to place); then the
    puller's bell (``ChunkBell``)."""
    plan_durable(gen_dir)  # the plan on disk before anything read against it
    if chunk.rows == 0:
        write_json(gen_dir / "done" / f"{chunk.name}.json", chunk.to_json())
        _ring(gen_dir)
        return
    path = gen_dir / "chunks" / f"{chunk.name}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex}"
    rows = rows.replace_schema_metadata({CHUNK_KEY: json.dumps(chunk.to_json()).encode()})
    pq.write_table(rows, tmp)
    fsync_path(tmp)  # on disk before the puller links it into the change log (as its own files are)
    os.replace(tmp, path)
    _ring(gen_dir)


# A reader appends its table's id (a line) after each chunk it wrote; the puller looks at
# its size between transactions and places what was written without waiting for its flush
# interval (its size, not its mtime: two chunks written within one tick of the kernel's
# coarse file clock, ~4 ms, leave the same mtime), and reads which tables to look at again
# (``BellLog``). A few bytes per chunk of up to ``CHUNK_ROWS`` rows.
BELL_LOOK_S = 0.1  # the puller looks at the bell at most this often (one stat)
# A reader (a Spark task, or the snapshot run reading in its own process) appends a byte
# here once it has no range left to read and its last chunk is written: the puller places
# what is left at once instead of gathering chunks (``puller.PLACING_SPAN``) for more.
READS_ENDED = "reads-ended"


def _ring(gen_dir: Path) -> None:
    # <root>/snapshot/<table>/<gen>; not rung: the puller places it at its next flush
    _append(snapshot_bell(gen_dir.parent.parent.parent), f"{gen_dir.parent.name}\n".encode())


def ring_reads_ended(root: str | os.PathLike[str]) -> None:
    """Say that a reader has written its last chunk under ``root`` (``READS_ENDED``; not
    said: its last chunks gather as any others)."""
    _append(snapshot_bell(root).with_name(READS_ENDED), b".")


def _append(path: Path, data: bytes) -> None:
    """Append ``data`` in one write (whole or none); an error leaves it unwritten."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


class BellLog:
    """The tables whose chunks were written since the last ``rung`` (the table ids the
    readers append to the bell), so a puller's flush looks again only at those (and at
    the tables it still waits on) instead of every table being snapshotted."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.path = snapshot_bell(root)
        self.offset = 0

    def rung(self) -> set[int] | None:
        """The table ids rung for since the last call; None: not known (the first call,
        a bell that shrank or was replaced, a record that is not a table id, an error):
        look at every table."""
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if self.offset == 0 or size < self.offset:
                    self.offset = size
                    return None
                f.seek(self.offset)
                data = f.read(size - self.offset)
        except FileNotFoundError:
            if self.offset:
                self.offset = 0
                return None
            return set()  # no chunk written yet
        except OSError:
            self.offset = 0
            return None
        end = data.rfind(b"\n") + 1  # a record being written is taken at the next call
        self.offset += end
        try:
            return {int(t) for t in data[:end].split()}
        except ValueError:
            return None


class ChunkBell:
    """Whether a reader wrote a chunk under ``root`` since the last ``rang`` that said so
    (the size of ``snapshot/chunks-written``), looked at no more than every ``look_s``.
    A puller's flush places chunks (``mysql.adoption``) once a second; a snapshot's last
    chunk waited ~0.5 s on average for it, and each table's release as long."""

    def __init__(self, root: str | os.PathLike[str], look_s: float = BELL_LOOK_S) -> None:
        self.path = snapshot_bell(root)
        self.look_s = look_s
        self.next_look = 0.0
        self.seen = 0
        self.ends = self.path.with_name(READS_ENDED)
        self.ends_seen = 0  # its size as the last flush began
        self.next_end_look = 0.0

    def flushed(self) -> None:
        """A flush begins: the readers that ended so far have their chunks placed by it."""
        self.ends_seen = _size(self.ends)

    def ended(self, now: float) -> bool:
        """Whether a reader wrote its last chunk (``ring_reads_ended``) since the last flush
        began, looked at no more than every ``look_s``; ``now``: ``time.monotonic()``."""
        if now < self.next_end_look:
            return False
        self.next_end_look = now + self.look_s
        return _size(self.ends) > self.ends_seen

    def rang(self, now: float) -> bool:
        """``now``: ``time.monotonic()``."""
        if now < self.next_look:
            return False
        self.next_look = now + self.look_s
        try:
            size = os.stat(self.path).st_size
        except OSError:
            return False
        if size == self.seen:
            return False
        self.seen = size
        return True


def chunk_of(path: Path) -> Chunk:
    """The chunk record of a chunk file (from its Parquet metadata)."""
    meta = pq.read_metadata(path).metadata or {}
    return Chunk.from_json(json.loads(meta[CHUNK_KEY]))


def _of_range(name: str, range_no: int | None) -> bool:
    return _CHUNK_NAME.fullmatch(name) is not None and (
        range_no is None or name.startswith(f"{range_no:04d}-")
    )


def pending_chunks(gen_dir: Path, range_no: int | None = None) -> list[tuple[Path, Chunk]]:
    """Chunk files written and not yet placed (of one range, or all), in (range, chunk)
    order. A file the puller removes meanwhile (placed, so marked done first; or dropped, to
    be read again) is left out: a reader lists these before ``done_chunks``, so a chunk is
    never in neither."""
    d = gen_dir / "chunks"
    if not d.exists():
        return []
    out = []
    for p in sorted(p for p in d.iterdir() if _of_range(p.name, range_no)):
        try:
            out.append((p, chunk_of(p)))
        except FileNotFoundError:
            continue
    return out


def done_chunks(gen_dir: Path, range_no: int | None = None) -> dict[tuple[int, int], Chunk]:
    """Chunks in the change log (or empty), of one range or all, by (range, chunk)."""
    d = gen_dir / "done"
    if not d.exists():
        return {}
    out = {}
    try:
        for p in d.iterdir():
            if _of_range(p.name, range_no):
                c = Chunk.from_json(json.loads(p.read_text()))
                out[(c.range_no, c.chunk_no)] = c
    except FileNotFoundError:
        pass  # the generation was released meanwhile (its snapshot is complete)
    return out


def mark_done(gen_dir: Path, chunk: Chunk, fsync: bool = True) -> None:
    write_json(gen_dir / "done" / f"{chunk.name}.json", chunk.to_json(), fsync=fsync)


def range_chunks(records: dict[tuple[int, int], Chunk], range_no: int) -> dict[int, Chunk]:
    return {n: c for (r, n), c in records.items() if r == range_no}


def _chain(lo: Key, chunks: dict[int, Chunk]) -> tuple[list[Chunk], Key, bool]:
    """Chunks following each other by key from ``lo``: (chain, where it ends, ended last)."""
    by_lo: dict[str, Chunk] = {}
    for _, c in sorted(chunks.items()):
        by_lo.setdefault(json.dumps(c.lo), c)
    chain, expect = [], lo
    while (c := by_lo.get(json.dumps(expect))) is not None and c not in chain:
        chain.append(c)
        if c.last:
            return chain, expect, True
        expect = c.hi
    return chain, expect, False


def covered(plan: Plan, done: dict[tuple[int, int], Chunk]) -> bool:
    """Whether every range of ``plan`` is covered by done chunks, low end to a last one."""
    return all(_chain(lo, range_chunks(done, r))[2] for r, (lo, _) in enumerate(plan.ranges))


@dataclass(frozen=True, slots=True)
class NextRead:
    """What a chunk reader reads next in a range: keys in ``(lo, bound]``, ``limit`` rows
    at most (None: all of them, to fill a hole up to a chunk already read)."""

    chunk_no: int
    lo: Key
    bound: Key
    limit: int | None
    fills_hole: bool


def next_read(
    plan: Plan, range_no: int, records: dict[tuple[int, int], Chunk], limit: int
) -> NextRead | None:
    """The next read of a range given the chunks read or done so far (None: covered).
    Chunks are numbered in reading order; a hole (a chunk lost before it was placed) is
    filled up to the first chunk read after it (the lowest number outside the chain)."""
    lo, hi = plan.ranges[range_no]
    chunks = range_chunks(records, range_no)
    chain, expect, done = _chain(lo, chunks)
    if done:
        return None
    n = max(chunks, default=-1) + 1
    starts = {json.dumps(c.lo) for c in chain}
    after = sorted(k for k, c in chunks.items() if json.dumps(c.lo) not in starts)
    if after:
        return NextRead(n, expect, chunks[after[0]].lo, None, True)
    return NextRead(n, expect, hi, limit, False)


@dataclass(frozen=True, slots=True)
class SnapshotProgress:
    """Where one table's chunked snapshot is: the record the Dagster runs and ``changefeed
    query`` render (chunks and rows *read* by the chunk readers, *placed* by the puller)."""

    table_id: int
    database: str
    table: str
    generation: int
    ranges: int  # key ranges planned (0: not planned yet)
    ranges_read: int  # ranges read from their low end to their last chunk
    chunks_read: int
    chunks_placed: int
    chunks_total: int  # estimated from the planned rows until every range is read
    rows_read: int
    rows_placed: int
    rows_planned: int  # the table's rows when planned (an estimate)
    complete: bool  # every range placed: the table's resolved mark moves on

    @property
    def name(self) -> str:
        return f"{self.database}.{self.table}"

    def line(self) -> str:
        """One line for a run log."""
        if self.complete:
            return (
                f"snapshot of {self.name}: complete, {self.rows_placed} rows in "
                f"{self.chunks_placed} chunks"
            )
        if not self.ranges:
            return f"snapshot of {self.name}: not planned yet"
        return (
            f"snapshot of {self.name}: chunks {self.chunks_read}/{self.chunks_total} read "
            f"({self.chunks_placed} placed), rows {self.rows_read}/~{self.rows_planned} read "
            f"({self.rows_placed} placed), ranges {self.ranges_read}/{self.ranges} read"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "table": self.name,
            "table_id": self.table_id,
            "generation": self.generation,
            "chunks_read": self.chunks_read,
            "chunks_placed": self.chunks_placed,
            "chunks_total": self.chunks_total,
            "rows_read": self.rows_read,
            "rows_placed": self.rows_placed,
            "rows_planned": self.rows_planned,
            "ranges": self.ranges,
            "ranges_read": self.ranges_read,
            "complete": self.complete,
        }


def table_progress(
    root: str | os.PathLike[str], table_id: int, generation: int, database: str, table: str
) -> SnapshotProgress:
    """One table's snapshot progress, from its generation's files (a generation released
    meanwhile reads as not planned: the caller sees the table leave the puller state)."""
    gen_dir = generation_dir(root, table_id, generation)
    plan = read_plan(root, table_id, generation)
    # pending first: the puller marks a chunk done before it removes its file
    pending = {(c.range_no, c.chunk_no): c for _, c in pending_chunks(gen_dir)}
    done = done_chunks(gen_dir)
    read = pending | done
    ranges = 0 if plan is None else len(plan.ranges)
    ranges_read = 0
    if plan is not None:
        ranges_read = sum(
            _chain(lo, range_chunks(read, r))[2] for r, (lo, _) in enumerate(plan.ranges)
        )
    total = len(read)
    if plan is None or ranges_read < ranges:
        estimate = -(-plan.rows // plan.chunk_rows) if plan and plan.chunk_rows else 0
        total = max(estimate, len(read) + ranges - ranges_read)
    return SnapshotProgress(
        table_id,
        database,
        table,
        generation,
        ranges,
        ranges_read,
        len(read),
        len(done),
        total,
        sum(c.rows for c in read.values()),
        sum(c.rows for c in done.values()),
        0 if plan is None else plan.rows,
        plan is not None and covered(plan, done),
    )


def snapshot_progress(root: str | os.PathLike[str]) -> list[SnapshotProgress]:
    """Progress of every snapshot the change log's puller state holds, by table id."""
    state = load_state(root)
    if state is None:
        return []
    out = []
    for tid, gen in sorted(state.snapshots.items()):
        schema = state.tables.get(tid)
        db, name = (schema.database, schema.table) if schema else ("?", f"table_{tid}")
        try:
            out.append(table_progress(root, tid, gen, db, name))
        except FileNotFoundError:
            continue  # released while listed: complete, and gone from the next state read
    return out


__all__ = [
    "CHUNKS_WRITTEN",
    "READING_S",
    "BellLog",
    "Chunk",
    "ChunkBell",
    "NextRead",
    "Plan",
    "SnapshotProgress",
    "ask_gtid_positions",
    "claims_dir",
    "covered",
    "decode_key",
    "done_chunks",
    "encode_key",
    "generation_dir",
    "gtid_positions",
    "mark_done",
    "next_read",
    "pending_chunks",
    "plan_durable",
    "read_plan",
    "release_generation",
    "ring_reads_ended",
    "snapshot_progress",
    "snapshot_reading",
    "sweep_generations",
    "table_progress",
    "write_chunk",
    "write_plan",
]
