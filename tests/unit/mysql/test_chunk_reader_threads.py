"""A worker's snapshot reads, several at once (``chunk_reader.read_group``): every spec read
exactly once, the reads overlapping, and a failing read stopping the others after their
chunk in hand, its error raised."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from cdc_dagster.mysql import chunk_reader
from cdc_dagster.mysql.errors import PullerBusyError
from cdc_dagster.mysql.snapshots import Chunk


class FakeReads:
    """``read_spec`` stand-in: each spec is ``chunks`` chunks of 10 rows, ``pause_s`` each."""

    def __init__(self, chunks: int = 3, pause_s: float = 0.05, fail: int | None = None) -> None:
        self.chunks, self.pause_s, self.fail = chunks, pause_s, fail
        self.lock = threading.Lock()
        self.active = self.most_active = 0
        self.read: list[tuple[int, int]] = []  # (table id, chunk no) of every chunk read
        self.threads: set[str] = set()

    def __call__(self, spec: dict[str, Any], session: Any, progress: Any) -> int:
        with self.lock:
            self.active += 1
            self.most_active = max(self.most_active, self.active)
            self.threads.add(threading.current_thread().name)
        try:
            for n in range(self.chunks):
                time.sleep(self.pause_s)
                if spec["table_id"] == self.fail:
                    raise PullerBusyError(f"table {self.fail}: no snapshot plan")
                with self.lock:
                    self.read.append((spec["table_id"], n))
                progress(Chunk(spec["range"], n, {}, None, None, False, 10, 1))
            return 10 * self.chunks
        finally:
            with self.lock:
                self.active -= 1


def _specs(n: int) -> list[dict[str, Any]]:
    return [{"upstream_uri": "mysql://u@h:3306", "root": "/nonexistent", "table_id": t,
             "generation": 1, "range": 0, "chunk_rows": 10, "weight": 100 - t}
            for t in range(n)]  # fmt: skip


@pytest.fixture
def no_sessions(monkeypatch: pytest.MonkeyPatch) -> None:
    class Session:
        def __init__(self, *a: Any) -> None:
            pass

        def close(self) -> None:
            pass

    monkeypatch.setattr(chunk_reader, "ReadSession", Session)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_every_spec_is_read_once_with_threads_reading_at_once(
    monkeypatch: pytest.MonkeyPatch, no_sessions: None, threads: int
) -> None:
    fake = FakeReads()
    monkeypatch.setattr(chunk_reader, "read_spec", fake)
    out = chunk_reader.read_group(_specs(7), 4, threads)
    assert sorted(r["table_id"] for r in out) == list(range(7))
    assert all(r["rows"] == 30 and r["chunks"] == 3 and r["task"] == 4 for r in out)
    assert sorted(fake.read) == [(t, n) for t in range(7) for n in range(3)]
    assert fake.most_active == threads  # that many reads at once, never more
    assert len(fake.threads) == threads


def test_one_spec_is_read_in_the_callers_thread(
    monkeypatch: pytest.MonkeyPatch, no_sessions: None
) -> None:
    fake = FakeReads()
    monkeypatch.setattr(chunk_reader, "read_spec", fake)
    assert [r["table_id"] for r in chunk_reader.read_group(_specs(1), 0, 4)] == [0]
    assert fake.threads == {threading.current_thread().name}


def test_a_failing_read_stops_the_others_and_its_error_is_raised(
    monkeypatch: pytest.MonkeyPatch, no_sessions: None
) -> None:
    """Table 1 fails in its first chunk; the reader of table 0 ends after its chunk in hand
    and no other spec is begun (each chunk it read is recorded: a next run resumes)."""
    fake = FakeReads(chunks=20, pause_s=0.02, fail=1)
    monkeypatch.setattr(chunk_reader, "read_spec", fake)
    with pytest.raises(PullerBusyError, match="table 1: no snapshot plan"):
        chunk_reader.read_group(_specs(6), 0, 2)
    assert {t for t, _ in fake.read} == {0}  # tables 2-5 never begun
    assert len(fake.read) <= 3  # table 0 stopped within a chunk or two of the failure
