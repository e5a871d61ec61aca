"""A reader's chunks written in a thread while it reads the next (``ChunkWriter``): a chunk
handed over counts as read until it is in its file, one write at a time, and a failed write
is raised to the reader."""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow as pa
import pytest

from cdc_dagster.mysql import chunk_reader
from cdc_dagster.mysql.snapshots import Chunk, pending_chunks


def _chunk(range_no: int, n: int) -> Chunk:
    return Chunk(range_no, n, {0: "0-1-5"}, [n * 10], [n * 10 + 9], False, 1, 7)


def test_a_chunk_is_in_flight_until_written_and_one_write_waits_for_the_one_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate, started, real = threading.Event(), threading.Event(), chunk_reader.write_chunk

    def slow(gen_dir, chunk, rows):
        started.set()
        assert gate.wait(10)
        real(gen_dir, chunk, rows)

    monkeypatch.setattr(chunk_reader, "write_chunk", slow)
    w = chunk_reader.ChunkWriter()
    w.write(tmp_path, _chunk(0, 0), pa.table({"c1": [0]}))
    assert started.wait(10)
    assert set(w.in_flight(tmp_path, 0)) == {(0, 0)}  # counted read, not in a file yet
    assert w.in_flight(tmp_path, 1) == {} and pending_chunks(tmp_path) == []
    second = threading.Thread(target=w.write, args=(tmp_path, _chunk(0, 1), pa.table({"c1": [1]})))
    second.start()
    second.join(0.3)
    assert second.is_alive()  # waits for the first write: two chunks held at most
    gate.set()
    second.join(10)
    w.close()
    assert w.in_flight(tmp_path, 0) == {}
    assert [c.chunk_no for _, c in pending_chunks(tmp_path)] == [0, 1]


def test_a_failed_write_is_raised_at_the_next_write_or_the_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(gen_dir, chunk, rows):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(chunk_reader, "write_chunk", fail)
    w = chunk_reader.ChunkWriter()
    w.write(tmp_path, _chunk(0, 0), pa.table({"c1": [0]}))
    with pytest.raises(OSError, match="No space left"):
        w.write(tmp_path, _chunk(0, 1), pa.table({"c1": [1]}))
    assert w.in_flight(tmp_path, 0) == {}  # not counted read: read again by the next run
    w.write(tmp_path, _chunk(0, 2), pa.table({"c1": [2]}))
    with pytest.raises(OSError, match="No space left"):
        w.close()
