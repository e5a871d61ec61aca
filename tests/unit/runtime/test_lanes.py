"""ChangefeedLanes: a capture's changefeeds tick side by side, each one tick at a time."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from cdc_dagster.runtime.lanes import DATA, OWNER, ChangefeedLanes, LaneTick


class _Ticks:
    """A tick function whose ticks of ``slow`` block until released; it records overlaps."""

    def __init__(self, slow: str = "") -> None:
        self.slow = slow
        self.release = threading.Event()
        self.calls: list[tuple[str, list[dict[str, Any]]]] = []
        self.active: dict[str, int] = {}
        self.overlap_same: list[str] = []  # a changefeed ticking twice at once (never)
        self._lock = threading.Lock()

    def __call__(self, cf: str, messages: list[dict[str, Any]]) -> str:
        with self._lock:
            self.calls.append((cf, list(messages)))
            if self.active.get(cf):
                self.overlap_same.append(cf)
            self.active[cf] = self.active.get(cf, 0) + 1
        try:
            if cf == self.slow:
                assert self.release.wait(10)
            if any(m.get("type") == "boom" for m in messages):
                raise RuntimeError(f"{cf} failed")
            return f"{cf}:{len(messages)}"
        finally:
            with self._lock:
                self.active[cf] -= 1


def _until(lanes: ChangefeedLanes[str], n: int, seconds: float = 5) -> list[LaneTick[str]]:
    out: list[LaneTick[str]] = []
    deadline = time.monotonic() + seconds
    while len(out) < n and time.monotonic() < deadline:
        out += lanes.finished(timeout_s=0.1)
    return out


def test_a_long_tick_of_one_changefeed_never_holds_another() -> None:
    ticks = _Ticks(slow="snap")
    lanes: ChangefeedLanes[str] = ChangefeedLanes(ticks)
    lanes.add({"snap": [], "stream": []}, DATA)
    assert lanes.start() == ["snap", "stream"]
    # The stream ticks again and again while the snapshot's one tick goes on.
    for _ in range(5):
        (done,) = _until(lanes, 1)
        assert (done.changefeed_id, done.result, done.error) == ("stream", "stream:0", None)
        lanes.add({"stream": [], "snap": []}, DATA)
        assert lanes.start() == ["stream"]  # snap's lane is busy: its tick waits
        assert lanes.busy() == {"snap", "stream"} and lanes.waiting() == {"snap"}
    ticks.release.set()
    finished = _until(lanes, 2)
    assert sorted(d.changefeed_id for d in finished) == ["snap", "stream"]
    assert lanes.start() == ["snap"]  # the tick that waited for its lane
    assert [d.changefeed_id for d in _until(lanes, 1)] == ["snap"]
    assert ticks.overlap_same == []
    assert [cf for cf, _ in ticks.calls].count("stream") == 6
    lanes.close(finish_owner_messages=True)


def test_owner_messages_wait_for_their_lane_merged_and_in_order() -> None:
    ticks = _Ticks(slow="cf")
    lanes: ChangefeedLanes[str] = ChangefeedLanes(ticks)
    lanes.add({"cf": [{"type": "dispatch", "n": 1}]}, OWNER)
    lanes.start()
    # While its tick runs, the owner sends more: two heartbeats (the newer replaces the
    # older) and a dispatch between them; a data mark does not turn them into a data tick.
    lanes.add({"cf": [{"type": "heartbeat", "n": 2}]}, OWNER)
    lanes.add({"cf": [{"type": "dispatch", "n": 3}, {"type": "heartbeat", "n": 4}]}, OWNER)
    lanes.add({"cf": []}, DATA)
    assert lanes.start() == []
    ticks.release.set()
    (first,) = _until(lanes, 1)
    assert first.why == OWNER and first.messages == [{"type": "dispatch", "n": 1}]
    assert lanes.start() == ["cf"]
    (second,) = _until(lanes, 1)
    assert second.why == OWNER
    assert [m["n"] for m in second.messages] == [3, 4]
    lanes.close(finish_owner_messages=True)


def test_a_failing_tick_comes_back_as_its_error_and_the_other_lanes_go_on() -> None:
    ticks = _Ticks()
    lanes: ChangefeedLanes[str] = ChangefeedLanes(ticks)
    lanes.add({"bad": [{"type": "boom"}], "good": [{"type": "x"}]}, OWNER)
    lanes.start()
    done = {d.changefeed_id: d for d in _until(lanes, 2)}
    assert isinstance(done["bad"].error, RuntimeError) and done["bad"].result is None
    assert done["good"].error is None and done["good"].result == "good:1"


@pytest.mark.parametrize("finish", [True, False])
def test_close_waits_for_every_lane_and_ticks_waiting_owner_messages_only_when_asked(
    finish: bool,
) -> None:
    ticks = _Ticks(slow="a")
    lanes: ChangefeedLanes[str] = ChangefeedLanes(ticks)
    lanes.add({"a": []}, DATA)
    lanes.start()
    lanes.add({"a": [{"type": "dispatch"}]}, OWNER)  # taken from the mailbox, lane busy
    lanes.add({"b": []}, DATA)  # a data tick due: dropped at close (the next run ticks it)
    threading.Timer(0.3, ticks.release.set).start()
    done = lanes.close(finish_owner_messages=finish)
    assert lanes.busy() == set() and lanes.waiting() == set()
    got = [(d.changefeed_id, d.why) for d in done]
    assert got == ([("a", DATA), ("a", OWNER)] if finish else [("a", DATA)])
    assert "b" not in [cf for cf, _ in ticks.calls]


def test_a_changefeed_not_before_its_time_waits_with_its_messages_merged() -> None:
    """``start(not_before)``: a changefeed resting (a capture's ticks while a snapshot is
    read) starts no tick before its time; the owner's messages that came meanwhile wait and
    merge; the other changefeeds start as ever."""
    ticks = _Ticks()
    lanes: ChangefeedLanes[str] = ChangefeedLanes(ticks)
    hb = {"type": "heartbeat"}
    lanes.add({"stream": [hb], "snap": []}, OWNER)
    later = time.monotonic() + 0.6
    assert lanes.start({"stream": later}) == ["snap"]
    assert _until(lanes, 1)[0].changefeed_id == "snap"
    lanes.add({"stream": [hb]}, OWNER)  # a newer heartbeat replaces the waiting one
    lanes.add({"stream": []}, DATA)
    assert lanes.start({"stream": later}) == []
    assert lanes.waiting() == {"stream"}
    time.sleep(max(0.0, later - time.monotonic()))
    assert lanes.start({"stream": later}) == ["stream"]
    (done,) = _until(lanes, 1)
    assert (done.changefeed_id, done.why, done.result) == ("stream", OWNER, "stream:1")
    assert [cf for cf, _ in ticks.calls] == ["snap", "stream"]
    lanes.close(finish_owner_messages=False)
