"""The puller's half of chunked snapshots (``cdc_dagster.mysql.adoption``) against a recording
change-log writer: chunks are placed once the stream has passed their position, and a table
is released in the very flush that places its last chunk (not one flush interval later)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from cdc_dagster.mysql.adoption import Adopter
from cdc_dagster.mysql.context import PullerStats
from cdc_dagster.mysql.snapshots import (
    Chunk,
    Plan,
    done_chunks,
    generation_dir,
    write_chunk,
    write_plan,
)
from cdc_dagster.mysql.state import PullerState, TsAllocator

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
