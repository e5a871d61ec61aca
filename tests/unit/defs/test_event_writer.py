"""The follow loop's event writer (cdc_dagster/defs/capture/event_writer.py): writes in a
thread of its own, in order; coalesces an asset's waiting materializations; errors reach
the loop."""

from __future__ import annotations

import threading
import time

import dagster as dg
import pytest

from cdc_dagster.defs.capture.event_writer import EventWriter


def _event(name: str, rows: int) -> dg.AssetMaterialization:
    return dg.AssetMaterialization(asset_key=name, metadata={"rows_applied": rows})


class _Log:
    """What was written, in order; each write of an event waits for ``gate``."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.written: list[str] = []

    def event(self, e: dg.AssetMaterialization) -> None:
        self.entered.set()
        assert self.gate.wait(10)
        self.written.append(f"{e.asset_key.to_user_string()}={e.metadata['rows_applied'].value}")

    def info(self, line: str) -> None:
        self.written.append(line)


def test_put_returns_at_once_while_a_write_is_slow_and_all_is_written_in_order() -> None:
    log = _Log()
    log.gate.clear()  # the event log is slow: the first write hangs until released
    writer = EventWriter(log.event, log.info)
    writer.put([_event("a", 1)], "tick 1")
    assert log.entered.wait(5)
    t0 = time.perf_counter()
    writer.put([_event("b", 1)], "tick 2")
    writer.put([_event("c", 1)], "tick 3")
    assert time.perf_counter() - t0 < 0.5  # the loop did not wait for the write
    assert writer.waiting() == 4
    log.gate.set()
    assert writer.flush(10)
    writer.close()
    assert log.written == ["a=1", "tick 1", "b=1", "c=1", "tick 2", "tick 3"]


def test_a_newer_materialization_of_an_asset_replaces_the_waiting_one() -> None:
    """While the writer is behind, an asset's latest materialization (its whole state) is
    what gets written: what waits is bounded by the number of assets."""
    log = _Log()
    log.gate.clear()
    writer = EventWriter(log.event, log.info)
    writer.put([_event("first", 0)])
    assert log.entered.wait(5)
    for rows in range(1, 50):
        writer.put([_event("a", rows), _event("b", rows)])
    writer.put([_event("c", 1), _event("a", 50)])
    assert writer.waiting() == 3
    log.gate.set()
    writer.close()
    assert log.written == ["first=0", "b=49", "c=1", "a=50"]


def test_a_write_that_fails_is_raised_in_the_loop_and_at_close() -> None:
    calls: list[str] = []

    def broken(e: dg.AssetMaterialization) -> None:
        calls.append(e.asset_key.to_user_string())
        raise OSError("event log storage is gone")

    writer = EventWriter(broken, lambda line: None)
    writer.put([_event("a", 1)])
    with pytest.raises(OSError, match="storage is gone"):
        writer.flush(10)
    with pytest.raises(OSError, match="storage is gone"):
        writer.put([_event("b", 1)])
    with pytest.raises(OSError, match="storage is gone"):
        writer.close()
    assert calls == ["a"]  # nothing is written after the failure


def test_close_writes_what_is_queued_first() -> None:
    log = _Log()
    log.gate.clear()
    writer = EventWriter(log.event, log.info)
    writer.put([_event("a", 1)], "tick 1")
    assert log.entered.wait(5)
    writer.put([_event("b", 2)], "tick 2")
    threading.Timer(0.3, log.gate.set).start()
    writer.close()
    assert log.written == ["a=1", "tick 1", "b=2", "tick 2"]
    assert writer.waiting() == 0


def test_the_same_asset_of_two_changefeeds_is_not_coalesced() -> None:
    """Two changefeeds replicating one upstream table share its asset: each one's latest
    state is written."""
    log = _Log()
    log.gate.clear()
    writer = EventWriter(log.event, log.info)
    writer.put([_event("first", 0)])
    assert log.entered.wait(5)

    def of(cf: str, rows: int) -> dg.AssetMaterialization:
        return dg.AssetMaterialization(
            asset_key="t", metadata={"rows_applied": rows, "changefeed": cf}
        )

    writer.put([of("cf1", 1)])
    writer.put([of("cf2", 7)])
    writer.put([of("cf1", 2)])
    assert writer.waiting() == 2
    log.gate.set()
    writer.close()
    assert log.written == ["first=0", "t=7", "t=2"]
