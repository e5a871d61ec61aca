"""The capture mailbox: held messages reach exactly one run, in order, of the newest owner."""

from __future__ import annotations

import threading

from cdc_dagster.metastore import Metastore
from cdc_dagster.metastore.mailbox import merge


def hb(n: int) -> dict:
    return {"type": "heartbeat", "n": n}


def dispatch(n: int) -> dict:
    return {"type": "dispatch", "n": n}


def test_merge_keeps_dispatches_in_order_and_the_newest_heartbeat() -> None:
    held = {"cf": [dispatch(1), hb(1)], "other": [hb(1)]}
    assert merge(held, {"cf": [dispatch(2), hb(2)]}) == {
        "cf": [dispatch(1), dispatch(2), hb(2)],
        "other": [hb(1)],
    }
    assert merge({}, {"cf": []}) == {}


def test_hold_then_take_once(metastore: Metastore) -> None:
    box = metastore.mailbox
    assert box.take("c1", 7) == {}
    assert box.hold("c1", 7, {"cf": [dispatch(1), hb(1)]})
    assert box.hold("c1", 7, {"cf": [hb(2)]})
    assert box.held("c1") == 2
    assert box.take("c1", 7) == {"cf": [dispatch(1), hb(2)]}
    assert box.take("c1", 7) == {}  # taken once
    assert box.held("c1") == 0


def test_older_owner_messages_are_dropped_and_cannot_overwrite_newer(metastore: Metastore) -> None:
    box = metastore.mailbox
    box.hold("c1", 5, {"cf": [dispatch(1)]})
    assert box.hold("c1", 6, {"cf": [dispatch(2)]})  # the new owner replaces the old one's
    assert not box.hold("c1", 5, {"cf": [dispatch(3)]})  # a stale owner is refused
    assert box.take("c1", 5) == {}  # a stale run takes nothing of the newer owner
    assert box.take("c1", 6) == {"cf": [dispatch(2)]}
    box.hold("c1", 5, {"cf": [dispatch(4)]})
    assert box.take("c1", 6) == {}  # an older owner's messages are removed, not delivered
    assert box.held("c1") == 0


def test_forget_removes_mailboxes_of_captures_that_left(metastore: Metastore) -> None:
    box = metastore.mailbox
    for c in ("c1", "c2", "c3"):
        box.hold(c, 1, {"cf": [dispatch(1)]})
    assert box.forget({"c2", "c4"}) == {"c2"}
    assert [box.held(c) for c in ("c1", "c2", "c3")] == [0, 1, 0]


def test_concurrent_holder_and_takers_deliver_every_message_once_in_order(
    metastore: Metastore,
) -> None:
    box = metastore.mailbox
    taken: list[list[int]] = []
    done = threading.Event()

    def taker() -> None:
        while not done.is_set() or box.held("c1"):
            got = box.take("c1", 3)
            if got:
                taken.append([m["n"] for m in got["cf"]])

    threads = [threading.Thread(target=taker) for _ in range(2)]
    for t in threads:
        t.start()
    for n in range(200):
        box.hold("c1", 3, {"cf": [dispatch(n)]})
    done.set()
    for t in threads:
        t.join()
    flat = [n for batch in taken for n in batch]
    assert sorted(flat) == list(range(200))  # none lost, none twice
    assert all(batch == sorted(batch) for batch in taken)  # each batch in the owner's order
