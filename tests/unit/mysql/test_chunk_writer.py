"""A reader's chunks written in a thread while it reads the next (``ChunkWriter``): a chunk
handed over counts as read until it is in its file, one write at a time, and a failed write
is raised to the reader."""

from __future__ import annotations

import threading
import time
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


class _NoSession:
    def __init__(self, *_args) -> None:
        pass

    def close(self) -> None:
        pass


def test_tasks_sharing_a_claims_directory_read_each_range_once_and_a_faster_one_takes_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every task is given every range; each range is read by the one that claims it first,
    so together they read each exactly once, and a task whose reads go faster reads more."""
    specs = [{"upstream_uri": "mysql://u@h/", "root": str(tmp_path), "table_id": t,
              "generation": 1, "range": r} for t in range(1, 21) for r in range(2)]  # fmt: skip
    read: list[tuple[int, int, str]] = []
    guard = threading.Lock()

    def fake_read(spec, session, progress):
        slow = threading.current_thread().name == "slow"
        time.sleep(0.03 if slow else 0.005)
        with guard:
            read.append((spec["table_id"], spec["range"], threading.current_thread().name))
        return 10

    monkeypatch.setattr(chunk_reader, "read_spec", fake_read)
    monkeypatch.setattr(chunk_reader, "ReadSession", _NoSession)
    claims = tmp_path / "claims"
    claims.mkdir()
    results: dict[str, list] = {}

    def task(n: int, name: str) -> None:
        results[name] = chunk_reader.read_group(specs, n, str(claims))

    threads = [threading.Thread(target=task, args=(n, name), name=name)
               for n, name in enumerate(("slow", "fast"))]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = sorted((t, r) for t, r, _ in read)
    assert got == sorted((s["table_id"], s["range"]) for s in specs)  # each exactly once
    assert sum(len(v) for v in results.values()) == len(specs)
    assert {r["task"] for r in results["fast"]} == {1}
    by = {name: sum(1 for *_, n in read if n == name) for name in ("slow", "fast")}
    assert by["fast"] > 2 * by["slow"], by
    # ... and without a claims directory a task reads all it is given
    read.clear()
    assert len(chunk_reader.read_group(specs[:3], 0)) == 3 and len(read) == 3


def test_the_pullers_sweep_leaves_the_snapshot_jobs_claims_alone(tmp_path: Path) -> None:
    from cdc_dagster.mysql.snapshots import claims_dir, generation_dir, sweep_generations

    job = claims_dir(tmp_path, "job1")
    job.mkdir(parents=True)
    (job / "1-1-0").touch()
    old = generation_dir(tmp_path, 7, 1)
    old.mkdir(parents=True)
    assert sweep_generations(tmp_path, {}) == 1  # the generation no longer held
    assert (job / "1-1-0").exists() and not old.exists()
