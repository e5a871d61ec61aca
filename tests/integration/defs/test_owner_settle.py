"""The owner sensor ticks again within one evaluation once following captures answered
(``settle``), on a real etcd: a capture run is played by a thread that takes its mailbox
and writes its agent state as the two tick halves do."""

from __future__ import annotations

import json
import threading
import time

from cdc_dagster.defs.owner.mailbox import MailboxOutbox
from cdc_dagster.defs.owner.sensor import settle
from cdc_dagster.metastore import Metastore
from cdc_dagster.metastore.client import Put

HEARTBEAT = {"cf": [{"type": "heartbeat"}]}


def _tick_halves(ms: Metastore, capture: str, delay_s: float, halves: list[bool]) -> None:
    """A following run: after ``delay_s`` it takes its mailbox, then writes its agent state
    once per half (``in_tick`` True after prepare, False after commit), 0.3 s apart."""
    time.sleep(delay_s)
    assert ms.mailbox.take(capture, 7) == HEARTBEAT
    for in_tick in halves:
        time.sleep(0.3)
        value = json.dumps({"v": 1, "in_tick": in_tick}).encode()
        ms.client.txn([], [Put(ms.layout.agent_state("cf", capture), value)])


def test_settle_waits_for_the_tick_that_took_the_mailbox_to_finish(metastore: Metastore) -> None:
    ms = metastore
    old = json.dumps({"v": 1, "in_tick": False}).encode()  # its last tick, before the put
    ms.client.txn([], [Put(ms.layout.agent_state("cf", "c1"), old)])
    box = MailboxOutbox(ms.mailbox)
    box.new_owner(7)
    box.hold("c1", HEARTBEAT)
    assert box.marks["c1"] > 0
    run = threading.Thread(target=_tick_halves, args=(ms, "c1", 0.3, [True, False]))
    started = time.monotonic()
    run.start()
    assert settle(ms, {"c1": ("cf",)}, box.marks, started + 10)
    waited = time.monotonic() - started
    run.join()
    assert 0.9 <= waited < 3, waited  # the take (0.3 s), prepare and commit (0.3 s each)


def test_settle_gives_up_at_its_deadline_when_nobody_takes_the_mailbox(
    metastore: Metastore,
) -> None:
    box = MailboxOutbox(metastore.mailbox)
    box.new_owner(7)
    box.hold("c2", HEARTBEAT)
    started = time.monotonic()
    assert not settle(metastore, {"c2": ("cf",)}, box.marks, started + 0.5)
    assert 0.5 <= time.monotonic() - started < 1.5
    assert metastore.mailbox.held("c2") == 1  # still there for the capture's next run


def test_settle_waits_while_a_tick_is_between_its_halves(metastore: Metastore) -> None:
    box = MailboxOutbox(metastore.mailbox)
    box.new_owner(7)
    box.hold("c3", HEARTBEAT)
    run = threading.Thread(target=_tick_halves, args=(metastore, "c3", 0.0, [True]))
    run.start()
    run.join()
    started = time.monotonic()
    assert not settle(metastore, {"c3": ("cf",)}, box.marks, started + 0.5)
