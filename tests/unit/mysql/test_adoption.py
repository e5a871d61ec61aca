"""The puller's half of chunked snapshots (``cdc_dagster.mysql.adoption``) against a recording
change-log writer: chunks are placed once the stream has passed their position, and a table
is released in the very flush that places its last chunk (not one flush interval later)."""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa

from cdc_dagster.mysql.adoption import LOOK_ALL_S, Adopter
from cdc_dagster.mysql.context import PullerStats
from cdc_dagster.mysql.puller import RELEASED_MARKS_S, Puller
from cdc_dagster.mysql.snapshots import (
    BellLog,
    Chunk,
    ChunkBell,
    Plan,
    done_chunks,
    generation_dir,
    gtid_positions,
    ring_reads_ended,
    write_chunk,
    write_plan,
)
from cdc_dagster.mysql.state import PullerState, TsAllocator
from cdc_dagster.schema import ColumnSchema, TableSchema

TID, GEN, VERSION = 1, 5, 7


@dataclass
class _Log:
    def schema_version_at(self, table_id: int, ts: int) -> int:
        return VERSION


@dataclass
class _Writer:
    """Records the chunks placed (table, ts, file) instead of linking them in."""

    log: _Log = field(default_factory=_Log)
    placed: list[tuple[int, int, str]] = field(default_factory=list)
    fsync: bool = False

    def adopt_rows(
        self, table_id: int, shard: int, ts: int, path: Path, tag: str, link: bool
    ) -> Any:
        assert path.exists() and link
        self.placed.append((table_id, ts, path.name))


@dataclass
class _Ctx:
    root: str
    state: PullerState
    writer: _Writer = field(default_factory=_Writer)
    alloc: TsAllocator = field(default_factory=lambda: TsAllocator(1 << 40))
    stats: PullerStats = field(default_factory=PullerStats)
    binlog_at: tuple[str, int] | None = None
    stream_server_id: int | None = 1
    asked: list[tuple[int, str, int]] = field(default_factory=list)
    upstream_gtids: dict[tuple[str, int], dict[int, str]] = field(default_factory=dict)

    def gtid_at(self, server_id: int, log_file: str, offset: int) -> dict[int, str] | None:
        self.asked.append((server_id, log_file, offset))
        return self.upstream_gtids.get((log_file, offset))


def _start(tmp_path: Path, ranges: int, stream_at: int) -> tuple[_Ctx, Adopter]:
    """A puller run starting at GTID sequence 8 (it remembers the table's changes from
    there), its stream now at ``stream_at``, with no change of the table since."""
    state = PullerState({0: "0-1-8"}, 0, snapshots={TID: GEN})
    bounds = [(None, None)] if ranges == 1 else [(None, [100]), ([100], None)]
    write_plan(tmp_path, Plan(TID, GEN, tuple(bounds), 200, 100))
    ctx, adopter = _Ctx(str(tmp_path), state), Adopter()
    adopter.track(ctx, TID)
    state.position[0] = f"0-1-{stream_at}"
    return ctx, adopter


def _read(tmp_path: Path, range_no: int, lo: Any, at_seq: int) -> Chunk:
    chunk = Chunk(range_no, 0, {0: f"0-1-{at_seq}"}, lo, None if range_no else lo, True, 1,
                  VERSION)  # fmt: skip
    write_chunk(generation_dir(tmp_path, TID, GEN), chunk, pa.table({"c1": [range_no]}))
    return chunk


def test_the_flush_that_places_a_tables_last_chunk_releases_it(tmp_path: Path) -> None:
    ctx, adopter = _start(tmp_path, ranges=1, stream_at=10)
    _read(tmp_path, 0, None, at_seq=9)
    adopter.adopt(ctx)
    assert [p[2] for p in ctx.writer.placed] == ["0000-000000.parquet"]
    assert ctx.state.snapshots == {}  # released in the same state save as the placing
    adopter.after_save(fsync=False)
    assert not generation_dir(tmp_path, TID, GEN).exists()


def test_a_chunk_ahead_of_the_stream_waits_and_the_table_stays_held(tmp_path: Path) -> None:
    ctx, adopter = _start(tmp_path, ranges=2, stream_at=10)
    _read(tmp_path, 0, None, at_seq=9)
    _read(tmp_path, 1, [100], at_seq=12)  # read at a position the stream has not reached
    adopter.adopt(ctx)
    assert [p[2] for p in ctx.writer.placed] == ["0000-000000.parquet"]
    assert ctx.state.snapshots == {TID: GEN}
    adopter.after_save(fsync=False)
    gen_dir = generation_dir(tmp_path, TID, GEN)
    assert set(done_chunks(gen_dir)) == {(0, 0)}
    ctx.state.position[0] = "0-1-12"  # the stream passed it
    adopter.adopt(ctx)
    assert [p[2] for p in ctx.writer.placed][1:] == ["0001-000000.parquet"]
    assert ctx.state.snapshots == {}
    adopter.after_save(fsync=False)
    assert not gen_dir.exists()


def _read_at(tmp_path: Path, range_no: int, lo: Any, server: int, offset: int) -> Chunk:
    """A chunk read at binlog coordinates (server ``server``, binlog.000003:``offset``)."""
    chunk = Chunk(range_no, 0, {}, lo, None if range_no else lo, True, 1, VERSION,
                  (server, "binlog.000003", offset))  # fmt: skip
    write_chunk(generation_dir(tmp_path, TID, GEN), chunk, pa.table({"c1": [range_no]}))
    return chunk


def test_coordinates_are_placed_at_the_gtids_of_the_transaction_that_ends_there(
    tmp_path: Path,
) -> None:
    """The stream remembers where each transaction ends; a chunk read at such an end is
    placed just below the table's first change after it, without asking the upstream; one
    ahead of the stream waits; the chunk's coordinates survive its file's metadata."""
    ctx, adopter = _start(tmp_path, ranges=2, stream_at=8)
    for seq, offset in ((9, 1000), (10, 1500), (11, 2000)):
        ctx.state.position[0] = f"0-1-{seq}"
        adopter.ended("binlog.000003", offset, ctx.state.position)
        adopter.note({TID}, 0, f"0-1-{seq}", ctx.alloc.issue(1000.0 + seq))
    first_after_10 = adopter.history[TID].changes[2][2]  # the change of seq 11
    ctx.binlog_at = ("binlog.000003", 2000)
    _read_at(tmp_path, 0, None, server=1, offset=1500)  # after seq 10
    _read_at(tmp_path, 1, [100], server=1, offset=2600)  # ahead of the stream
    adopter.adopt(ctx)
    assert [(p[1], p[2]) for p in ctx.writer.placed] == [
        (first_after_10 - 1, "0000-000000.parquet")
    ]
    assert ctx.asked == [] and ctx.state.snapshots == {TID: GEN}
    # the flush that places it is due as soon as the stream reaches its coordinates
    assert adopter.waiting == (3, 2600)
    assert not adopter.passed(("binlog.000003", 2599)) and not adopter.passed(None)
    assert adopter.passed(("binlog.000003", 2600)) and adopter.passed(("binlog.000004", 4))
    adopter.after_save(fsync=False)
    ctx.state.position[0] = "0-1-12"  # seq 12 ends at 2600: the stream is there now
    adopter.ended("binlog.000004", 2600, ctx.state.position)  # another file: not the chunk's
    ctx.binlog_at = ("binlog.000004", 2600)
    ctx.upstream_gtids[("binlog.000003", 2600)] = {0: "0-1-12"}
    adopter.adopt(ctx)  # not remembered, behind the stream: the upstream is asked
    assert ctx.asked == [(1, "binlog.000003", 2600)]
    assert [p[2] for p in ctx.writer.placed][1:] == ["0001-000000.parquet"]
    assert ctx.state.snapshots == {} and adopter.waiting is None
    assert not adopter.passed(("binlog.000009", 4))  # nothing waits: no early flush


def test_chunks_read_at_the_same_coordinates_of_a_quiet_binlog_ask_the_upstream_once(
    tmp_path: Path,
) -> None:
    """In a quiet binlog every chunk is read at its end, which the stream saw end before this
    run began remembering: the upstream is asked once for those coordinates, not once per
    chunk (each ask a connection, and MariaDB reading the binlog file up to there)."""
    ctx, adopter = _start(tmp_path, ranges=2, stream_at=8)
    ctx.binlog_at = ("binlog.000003", 700)
    ctx.upstream_gtids[("binlog.000003", 700)] = {0: "0-1-8"}
    _read_at(tmp_path, 0, None, server=1, offset=700)
    adopter.adopt(ctx)
    adopter.after_save(fsync=False)
    _read_at(tmp_path, 1, [100], server=1, offset=700)  # read later, at the same end
    adopter.adopt(ctx)
    adopter.after_save(fsync=False)
    assert ctx.asked == [(1, "binlog.000003", 700)]
    assert [p[2] for p in ctx.writer.placed] == ["0000-000000.parquet", "0001-000000.parquet"]
    assert ctx.state.snapshots == {}
    adopter.forget_ends()  # a reconnect (maybe to another server): asked again
    chunk = _read_at(tmp_path, 0, None, server=1, offset=700)
    path = generation_dir(tmp_path, TID, GEN) / "chunks" / f"{chunk.name}.parquet"
    assert adopter._position(ctx, path, chunk) == {0: 8}
    assert len(ctx.asked) == 2


def test_coordinates_of_another_server_or_from_before_the_stream_are_read_again(
    tmp_path: Path,
) -> None:
    """A chunk read on another server than the stream's is dropped, and the generation's
    readers are asked for GTID positions; one read before this run began to remember the
    table's changes (the upstream says which GTIDs) is dropped."""
    ctx, adopter = _start(tmp_path, ranges=2, stream_at=9)
    adopter.ended("binlog.000003", 1000, ctx.state.position)
    ctx.binlog_at = ("binlog.000003", 1000)
    ctx.upstream_gtids[("binlog.000003", 400)] = {0: "0-1-7"}  # the run remembers from seq 8
    gen_dir = generation_dir(tmp_path, TID, GEN)
    _read_at(tmp_path, 0, None, server=2, offset=900)
    _read_at(tmp_path, 1, [100], server=1, offset=400)
    adopter.adopt(ctx)
    assert ctx.writer.placed == [] and ctx.asked == [(1, "binlog.000003", 400)]
    assert not (gen_dir / "chunks").exists() or not any((gen_dir / "chunks").iterdir())
    assert gtid_positions(gen_dir)


def test_the_puller_flushes_once_the_stream_passes_a_chunk_its_last_flush_left_waiting(
    tmp_path: Path,
) -> None:
    """A chunk is read at the binlog's head and the puller runs a little behind: the flush the
    reader's bell brought found it ahead of the stream. The next flush comes as soon as the
    stream passes its coordinates (not a flush interval later, with no bell rung since); no
    early flush while it is ahead, nor where nothing waits."""
    ctx, adopter = _start(tmp_path, ranges=1, stream_at=8)
    ctx.binlog_at = ("binlog.000003", 2000)
    _read_at(tmp_path, 0, None, server=1, offset=2600)
    adopter.adopt(ctx)
    assert ctx.writer.placed == [] and adopter.waiting == (3, 2600)
    bell = ChunkBell(tmp_path)
    bell.rang(time.monotonic())  # nothing rung since
    puller = SimpleNamespace(state=ctx.state, adopter=adopter, bell=bell, buffered=0,
                             last_flush=time.monotonic(), flush_took=0.0,
                             binlog_at=("binlog.000003", 2400))  # fmt: skip
    puller._holds = lambda stream: Puller._holds(puller, stream)
    assert not Puller._chunk_written(puller, None)
    puller.binlog_at = ("binlog.000003", 2600)
    assert Puller._chunk_written(puller, None)
    ctx.binlog_at = puller.binlog_at
    ctx.upstream_gtids[("binlog.000003", 2600)] = {0: "0-1-9"}
    ctx.state.position[0] = "0-1-9"
    adopter.adopt(ctx)
    assert [p[2] for p in ctx.writer.placed] == ["0000-000000.parquet"]
    assert not Puller._chunk_written(puller, None)  # placed: nothing waits any more


def test_after_a_long_flush_chunks_gather_for_the_next_one(tmp_path: Path) -> None:
    """A flush that places chunks is fsyncs (0.05-1.5 s under a snapshot's load); one per
    chunk, back to back, left the stream behind the chunks read at its head. After a flush
    that took d, the next placing flush (the stream passing a waiting chunk, or the bell)
    begins no sooner than PLACING_SPAN x d after it began; after a short one, at once."""
    from cdc_dagster.mysql.puller import PLACING_SPAN

    ctx, adopter = _start(tmp_path, ranges=1, stream_at=8)
    ctx.binlog_at = ("binlog.000003", 2000)
    _read_at(tmp_path, 0, None, server=1, offset=2600)
    adopter.adopt(ctx)
    assert adopter.waiting == (3, 2600)
    bell = ChunkBell(tmp_path, look_s=0.0)  # looks at each call
    bell.rang(time.monotonic())
    now = time.monotonic()
    puller = SimpleNamespace(state=ctx.state, adopter=adopter, bell=bell, buffered=0,
                             last_flush=now - 0.5, flush_took=0.4,
                             binlog_at=("binlog.000003", 2600))  # fmt: skip
    puller._holds = lambda stream: Puller._holds(puller, stream)
    assert not Puller._chunk_written(puller, None)  # passed, but 0.5 s < PLACING_SPAN x 0.4 s
    puller.last_flush = now - PLACING_SPAN * 0.4 - 0.01
    assert Puller._chunk_written(puller, None)
    puller.last_flush, puller.flush_took = now - 0.05, 0.01  # a short flush: no wait
    assert Puller._chunk_written(puller, None)
    # the bell's flush too: the stream has not passed a chunk, one was written since
    puller.binlog_at = ("binlog.000003", 2400)
    _read_at(tmp_path, 0, None, server=1, offset=2700)
    puller.last_flush, puller.flush_took = time.monotonic() - 0.5, 0.4
    assert not Puller._chunk_written(puller, None)
    puller.last_flush = time.monotonic() - PLACING_SPAN * 0.4 - 0.01
    assert Puller._chunk_written(puller, None)


def test_a_readers_last_chunks_are_placed_at_once_not_gathered(tmp_path: Path) -> None:
    """Chunks gather after a long flush (PLACING_SPAN) while more are being read; once a
    reader says it has written its last chunk (``ring_reads_ended``), the placing flush
    comes at once, and only until the next flush begins."""
    from cdc_dagster.mysql.puller import PLACING_SPAN

    ctx, adopter = _start(tmp_path, ranges=1, stream_at=8)
    bell = ChunkBell(tmp_path, look_s=0.0)
    puller = SimpleNamespace(state=ctx.state, adopter=adopter, bell=bell, buffered=0,
                             last_flush=time.monotonic(), flush_took=0.0,
                             binlog_at=("binlog.000003", 2600))  # fmt: skip
    puller._holds = lambda stream: Puller._holds(puller, stream)
    _read_at(tmp_path, 0, None, server=1, offset=2600)  # rings the bell
    puller.last_flush, puller.flush_took = time.monotonic() - 0.5, 0.4
    assert not Puller._chunk_written(puller, None)  # 0.5 s < PLACING_SPAN x 0.4 s: gathers
    assert PLACING_SPAN * 0.4 > 0.5
    ring_reads_ended(tmp_path)
    assert Puller._chunk_written(puller, None)  # the reader's last: placed at once
    flushing = SimpleNamespace(state=ctx.state, bell=bell, _flush=lambda *a: None, flush_took=0.0)
    Puller.flush(flushing)  # a flush begins: the end it saw is its own
    _read_at(tmp_path, 0, [5], server=1, offset=2700)  # another reader's chunk
    assert not Puller._chunk_written(puller, None)  # gathers again


class _Marks:
    """A change-log writer that records which tables' resolved marks a flush advanced."""

    fsync = False

    def __init__(self) -> None:
        self.advanced: list[int] = []

    def write_binlog_events(self, *args: Any) -> None:
        pass

    def advance_resolved(self, table_id: int, shard: int, ts: int) -> None:
        self.advanced.append(table_id)

    def advance_ddl_resolved(self, ts: int) -> None:
        pass


class _NoRows:
    """A puller buffer with no rows (the table was written in this flush)."""

    def events(self, version: int) -> list[Any]:
        return []


class _Releases:
    """An adopter whose ``adopt`` places the last chunks of the tables in ``release``."""

    def __init__(self) -> None:
        self.release: set[int] = set()
        self.placed: list[Any] = []

    def adopt(self, ctx: Any) -> None:
        for tid in self.release:
            ctx.state.snapshots.pop(tid, None)
        self.placed = list(self.release)
        self.release = set()

    def after_save(self, fsync: bool) -> None:
        self.placed = []


def test_a_flush_for_snapshot_chunks_advances_the_marks_it_must_and_the_rest_each_interval(
    tmp_path: Path,
) -> None:
    """Each resolved mark is two fsyncs: a flush for chunks (several a second while they are
    read) advances those of the tables it released or wrote rows of, every other table's
    at most once a flush interval -- and all of them once no snapshot is left."""

    puller, flushed = _flusher(tmp_path, tables=6, flush_interval_s=60.0)

    assert flushed(False) == [4, 5, 6]  # not for chunks: every table not held
    assert flushed(True, release={1}) == [1]  # its last chunk placed: released with its mark
    assert flushed(True, rows={5}) == [5]  # rows of 5 written
    puller.last_full_marks -= 60.0  # a flush interval later: all of them again
    puller.released_marks[1] -= RELEASED_MARKS_S  # (1's: test_released_tables_marks_...)
    assert flushed(True) == [1, 4, 5, 6]
    assert flushed(True, release={2, 3}) == [1, 2, 3, 4, 5, 6]  # no snapshot left: all


def _flusher(tmp_path: Path, tables: int, flush_interval_s: float) -> tuple[Any, Any]:
    """A puller (a namespace with the attributes ``Puller._flush`` uses) of tables 1 to
    ``tables``, 1-3 snapshotted, and ``flushed(placing, release, rows)``: a flush of it
    releasing tables ``release`` and writing rows of ``rows``; the tables whose resolved
    marks it advanced."""

    def schema(tid: int) -> TableSchema:
        return TableSchema(tid, "db", f"t{tid}", (ColumnSchema(1, "id", "int64", False),), (1,))

    schemas = {tid: schema(tid) for tid in range(1, tables + 1)}
    state = PullerState({0: "0-1-8"}, 1, tables=schemas, versions=dict.fromkeys(schemas, 1),
                        snapshots={1: 1, 2: 1, 3: 1})  # fmt: skip
    alloc = TsAllocator(1 << 40)
    puller = SimpleNamespace(
        state=state, alloc=alloc, buffers={}, buffered=0, event_time=0.0,
        flushed_event_time=0.0, last_flush=0.0, last_full_marks=0.0, root=str(tmp_path),
        writer=_Marks(), adopter=_Releases(), stats=PullerStats(), bell=ChunkBell(tmp_path),
        config=SimpleNamespace(flush_interval_s=flush_interval_s), released_marks={},
    )  # fmt: skip
    puller._flush = functools.partial(Puller._flush, puller)
    puller._released_mark_due = functools.partial(Puller._released_mark_due, puller)
    flush = functools.partial(Puller.flush, puller)

    def flushed(placing: bool, release: set[int] = frozenset(), rows: set[int] = frozenset()):
        puller.adopter.release = set(release)
        puller.buffers = {tid: _NoRows() for tid in rows}
        puller.buffered = len(rows)
        alloc.issue(time.time())
        puller.writer.advanced = []
        flush(placing=placing)
        return sorted(puller.writer.advanced)

    return puller, flushed


def test_released_tables_marks_advance_every_few_seconds_while_others_are_snapshotted(
    tmp_path: Path,
) -> None:
    """While some tables are still snapshotted, a table released by this run with no rows
    written has its resolved mark advanced when released and then every RELEASED_MARKS_S
    (100 released tables' marks in every flush held the puller for most of a snapshot's
    reads); the tables it did not release, and those with rows, every flush as before; once
    no table is snapshotted, every mark every flush."""

    puller, flushed = _flusher(tmp_path, tables=5, flush_interval_s=1.0)

    assert flushed(False) == [4, 5]  # 4 and 5 stream (never snapshotted by this run)
    assert flushed(False, release={1}) == [1, 4, 5]  # released: its mark moves with it
    assert flushed(False) == [4, 5]  # 1 released a moment ago, 2 and 3 still read
    assert flushed(False, release={2}) == [2, 4, 5]
    assert flushed(False, rows={1}) == [1, 4, 5]  # rows of 1 written: its mark moves
    puller.released_marks[1] -= RELEASED_MARKS_S
    assert flushed(False) == [1, 4, 5]  # RELEASED_MARKS_S since 1's last mark
    assert flushed(False) == [4, 5]
    assert flushed(False, release={3}) == [1, 2, 3, 4, 5]  # none snapshotted now: all
    assert flushed(False) == [1, 2, 3, 4, 5]
    assert puller.released_marks == {}


def test_the_bell_log_names_the_tables_rung_for_and_says_when_it_cannot(tmp_path: Path) -> None:
    bell = BellLog(tmp_path)
    assert bell.rung() == set()  # no chunk written yet
    _read(tmp_path, 0, None, at_seq=9)  # rings for the table
    assert bell.rung() is None  # the first look at an existing bell: every table
    _read(tmp_path, 1, [100], at_seq=9)
    assert bell.rung() == {TID} and bell.rung() == set()
    path = tmp_path / "snapshot" / "chunks-written"
    with open(path, "ab") as f:
        f.write(b"7\n12")  # a record being written: taken once whole
    assert bell.rung() == {7}
    with open(path, "ab") as f:
        f.write(b"\n")
    assert bell.rung() == {12}
    with open(path, "ab") as f:
        f.write(b".\n")  # not a table id (an older reader's byte): every table
    assert bell.rung() is None
    path.write_bytes(b"1\n")  # shrank (replaced): every table
    assert bell.rung() is None


def test_a_flush_looks_again_only_at_tables_rung_for_or_waiting_and_at_all_now_and_then(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """A table looked at with nothing left to place is skipped until a reader rings for it
    (a chunk written without a ring is not seen), or until ``LOOK_ALL_S`` has passed."""
    import cdc_dagster.mysql.snapshots as snapshots

    ctx, adopter = _start(tmp_path, ranges=2, stream_at=10)
    adopter.adopt(ctx)  # the first: every table (nothing to place yet)
    assert adopter.quiet == {(TID, GEN)}
    monkeypatch.setattr(snapshots, "_ring", lambda gen_dir: None)
    _read(tmp_path, 0, None, at_seq=9)  # written, not rung for
    adopter.adopt(ctx)
    assert ctx.writer.placed == []  # not looked at
    monkeypatch.undo()
    _read(tmp_path, 1, [100], at_seq=12)  # rung for; ahead of the stream
    adopter.adopt(ctx)
    assert [p[2] for p in ctx.writer.placed] == ["0000-000000.parquet"]
    assert adopter.quiet == set()  # a chunk waits for the stream: looked at each flush
    adopter.after_save(fsync=False)
    ctx.state.position[0] = "0-1-12"
    adopter.adopt(ctx)
    assert [p[2] for p in ctx.writer.placed][1:] == ["0001-000000.parquet"]
    assert ctx.state.snapshots == {}
    # the safety net: a table skipped by mistake is looked at within LOOK_ALL_S
    ctx2, adopter2 = _start(tmp_path / "b", ranges=1, stream_at=10)
    adopter2.adopt(ctx2)
    monkeypatch.setattr(snapshots, "_ring", lambda gen_dir: None)
    _read(tmp_path / "b", 0, None, at_seq=9)
    adopter2.adopt(ctx2)
    assert ctx2.writer.placed == []
    adopter2._looked_all -= LOOK_ALL_S
    adopter2.adopt(ctx2)
    assert [p[2] for p in ctx2.writer.placed] == ["0000-000000.parquet"]
