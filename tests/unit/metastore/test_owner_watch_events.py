"""What each etcd change means to a waiting owner (``owner_watch.sort_event``): the owner's
own writes wake nobody; a user's or a capture's do."""

from __future__ import annotations

import dataclasses

from cdc_dagster.metastore.changefeeds import ChangefeedState, ChangefeedStatus, encode_record
from cdc_dagster.metastore.client import KeyValue, WatchEvent, WatchEventType
from cdc_dagster.metastore.keys import KeyLayout
from cdc_dagster.metastore.owner_watch import Change, Seen, sort_event

L = KeyLayout("c")
OWNER_REV = 5
NORMAL = ChangefeedStatus(100, 200, ChangefeedState.NORMAL, 7)


def kv(key: str, value: bytes = b"x", rev: int = 10, create: int = 3) -> KeyValue:
    return KeyValue(key, value, create, rev, 1, 0)


def put(key: str, value: bytes = b"x", prev: bytes | None = None, create: int = 3) -> WatchEvent:
    before = kv(key, prev, rev=9, create=create) if prev is not None else None
    return WatchEvent(WatchEventType.PUT, kv(key, value, create=create), before)


def delete(key: str) -> WatchEvent:
    return WatchEvent(WatchEventType.DELETE, kv(key, b""), kv(key, b"x", rev=9))


def status(s: ChangefeedStatus) -> bytes:
    return encode_record(s, "w1")


def test_the_owners_status_write_that_only_moves_checkpoints_wakes_nobody() -> None:
    moved = dataclasses.replace(NORMAL, checkpoint_ts=150, resolved_ts=250)
    event = put(L.changefeed_status("cf"), status(moved), status(NORMAL))
    assert sort_event(L, OWNER_REV, event) is Change.NONE


def test_a_pause_a_resume_and_a_create_are_urgent() -> None:
    key = L.changefeed_status("cf")
    paused = dataclasses.replace(NORMAL, state=ChangefeedState.STOPPED)
    resumed = dataclasses.replace(NORMAL, epoch=8)
    assert sort_event(L, OWNER_REV, put(key, status(paused), status(NORMAL))) is Change.URGENT
    assert sort_event(L, OWNER_REV, put(key, status(resumed), status(paused))) is Change.URGENT
    assert sort_event(L, OWNER_REV, put(key, status(NORMAL))) is Change.URGENT  # no prev
    assert sort_event(L, OWNER_REV, put(L.changefeed_info("cf"))) is Change.URGENT


def test_captures_admin_requests_and_applied_markers_are_urgent_their_removal_by_the_owner_not() -> (
    None
):
    for key in (L.capture("c1"), L.desired_capture("c1"), L.admin_request("cf", "r1"),
                L.ddl_applied("cf", 9, "d"), L.syncpoint_recorded("cf", 9)):  # fmt: skip
        assert sort_event(L, OWNER_REV, put(key)) is Change.URGENT, key
    assert sort_event(L, OWNER_REV, delete(L.capture("c1"))) is Change.URGENT  # a capture gone
    assert sort_event(L, OWNER_REV, delete(L.admin_request("cf", "r1"))) is Change.NONE


def test_task_statuses_are_progress_only_when_their_value_changed() -> None:
    key = L.task("cf", "c1")
    assert sort_event(L, OWNER_REV, put(key, b"new", b"old")) is Change.PROGRESS
    assert sort_event(L, OWNER_REV, put(key, b"same", b"same")) is Change.NONE


def test_mailbox_takes_and_agent_states_are_noted_the_owners_own_puts_and_ddl_states_not() -> None:
    assert sort_event(L, OWNER_REV, delete(L.mailbox("c1"))) is Change.TAKE
    assert sort_event(L, OWNER_REV, put(L.mailbox("c1"))) is Change.NONE
    assert sort_event(L, OWNER_REV, put(L.agent_state("cf", "c1"))) is Change.AGENT
    assert sort_event(L, OWNER_REV, put(L.ddl("cf"))) is Change.NONE
    assert sort_event(L, OWNER_REV, put(L.gc_safepoint)) is Change.NONE
    assert sort_event(L, OWNER_REV, put(L.problem("cf", "c1"))) is Change.NONE


def test_the_election_key_gone_or_anothers_is_lost_a_renewal_is_not() -> None:
    assert sort_event(L, OWNER_REV, put(L.owner, create=OWNER_REV)) is Change.NONE
    assert sort_event(L, OWNER_REV, put(L.owner, create=OWNER_REV + 3)) is Change.LOST
    assert sort_event(L, OWNER_REV, delete(L.owner)) is Change.LOST


def test_a_capture_answered_only_with_every_changefeeds_state_out_of_a_tick_after_its_take() -> (
    None
):
    seen = Seen(takes={"c1": 20}, agents={("a", "c1"): (22, False), ("b", "c1"): (21, True)})
    assert not seen.answered("c1", ("a", "b"), since=15)  # b is between its halves
    seen.agents[("b", "c1")] = (23, False)
    assert seen.answered("c1", ("a", "b"), since=15)
    assert not seen.answered("c1", ("a",), since=20)  # the take was before the owner's put
    seen.agents[("a", "c1")] = (19, False)  # a state of the tick before the take
    assert not seen.answered("c1", ("a",), since=15)
