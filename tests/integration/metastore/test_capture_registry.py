"""The capture registry against a real etcd: leases, epochs, fencing, watches."""

from __future__ import annotations

import time

import pytest

from cdc_dagster.metastore import Metastore
from cdc_dagster.metastore.errors import CaptureNotRegisteredError


def _wait_until(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_capture_whose_lease_expires_leaves_alive_list_and_reregisters_with_new_epoch(
    metastore: Metastore, make_task_status
) -> None:
    watch = metastore.captures.watch(lambda alive: None)
    try:
        stays = metastore.captures.register("stays", 1)
        lapses = metastore.captures.register("lapses", 1, keepalive=False)
        metastore.task_statuses.put(lapses, "cf", make_task_status(1, 2))
        assert watch.wait_for(lambda alive: set(alive) == {"stays", "lapses"}, 5)

        assert _wait_until(
            lambda: [c.capture_id for c in metastore.captures.list_alive()] == ["stays"], 5
        )
        assert watch.wait_for(lambda alive: set(alive) == {"stays"}, 5)
        assert metastore.task_statuses.read("cf") == {}, "task statuses go with the capture's lease"
        with pytest.raises(CaptureNotRegisteredError):
            metastore.task_statuses.put(lapses, "cf", make_task_status(1, 2))

        again = metastore.captures.register("lapses", 1)
        assert again.epoch != lapses.epoch
        assert watch.wait_for(lambda alive: alive.get("lapses") == again.info, 5)
        metastore.task_statuses.put(again, "cf", make_task_status(4))
        with pytest.raises(CaptureNotRegisteredError):
            metastore.task_statuses.put(lapses, "cf", make_task_status(1, 2))
        again.deregister()
    finally:
        watch.stop()
        stays.deregister()


def test_reregistration_rotates_the_epoch_and_fences_the_previous_registration(
    metastore: Metastore, make_task_status
) -> None:
    old = metastore.captures.register("cap", 2)
    new = metastore.captures.register("cap", 2)
    try:
        assert new.epoch != old.epoch
        registered = metastore.captures.get("cap")
        assert registered is not None and registered.epoch == new.epoch
        metastore.task_statuses.put(new, "cf", make_task_status(5))
        with pytest.raises(CaptureNotRegisteredError):
            metastore.task_statuses.put(old, "cf", make_task_status(9))
        assert metastore.task_statuses.read("cf")["cap"].tables == make_task_status(5).tables
    finally:
        old.keeper.stop()
        new.deregister()


def test_deregister_removes_capture_and_its_task_statuses_at_once(
    metastore: Metastore, make_task_status
) -> None:
    session = metastore.captures.register("leaving", 5)
    metastore.task_statuses.put(session, "cf", make_task_status(3))
    assert set(metastore.task_statuses.read("cf")) == {"leaving"}

    session.deregister()

    assert metastore.captures.list_alive() == []
    assert metastore.task_statuses.read("cf") == {}


def test_kept_alive_capture_outlives_its_ttl(metastore: Metastore) -> None:
    session = metastore.captures.register("kept", 1)
    try:
        time.sleep(2.5)
        assert [c.capture_id for c in metastore.captures.list_alive()] == ["kept"]
        assert session.alive()
    finally:
        session.deregister()


def test_watch_sees_captures_join_and_leave_with_their_epochs(metastore: Metastore) -> None:
    seen: list[dict[str, str]] = []
    watch = metastore.captures.watch(
        lambda alive: seen.append({k: v.epoch for k, v in alive.items()})
    )
    try:
        a = metastore.captures.register("a", 5)
        b = metastore.captures.register("b", 5)
        assert watch.wait_for(lambda alive: set(alive) == {"a", "b"}, 5)
        a.deregister()
        assert watch.wait_for(lambda alive: set(alive) == {"b"}, 5)
        assert watch.alive()["b"].epoch == b.epoch
        assert {"a": a.epoch, "b": b.epoch} in seen
    finally:
        watch.stop()
        b.deregister()


def test_later_capture_run_attaches_renews_the_lease_and_writes_under_the_same_epoch(
    metastore: Metastore, make_task_status
) -> None:
    first_run = metastore.captures.register("cap", 1, keepalive=False)
    later_run = metastore.captures.attach("cap")
    try:
        assert (later_run.epoch, later_run.lease_id) == (first_run.epoch, first_run.lease_id)
        for _ in range(4):  # 2 s of runs, each renewing a 1 s lease
            time.sleep(0.5)
            later_run.keep_alive()
        metastore.task_statuses.put(later_run, "cf", make_task_status(8))
        assert set(metastore.task_statuses.read("cf")) == {"cap"}
    finally:
        later_run.deregister()
    with pytest.raises(CaptureNotRegisteredError):
        metastore.captures.attach("cap")
