"""The owner's per-tick read and write against a real etcd."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from cdc_dagster.metastore import (
    ChangefeedInfo,
    ChangefeedProgress,
    ChangefeedState,
    ChangefeedStatus,
    ConfigCache,
    DdlState,
    Metastore,
    NotOwnerError,
    status_codec,
)
from cdc_dagster.metastore.changefeeds import encode_record
from cdc_dagster.metastore.client import Put
from scheduler_core.messages import Barrier, Liveness
from scheduler_core.model import TableState
from scheduler_core.ts import compose


def test_snapshot_reads_captures_changefeeds_and_one_task_key_per_capture_in_one_round_trip(
    metastore: Metastore, make_task_status
) -> None:
    metastore.changefeeds.create("orders", "delta:///lake")
    sessions = [metastore.captures.register(f"cap-{i}", 5) for i in range(3)]
    try:
        for i, session in enumerate(sessions):
            metastore.task_statuses.put(session, "orders", make_task_status(i * 10, i * 10 + 1))
        before = metastore.client.stats

        snapshot = metastore.read_owner_snapshot()

        assert (metastore.client.stats - before).round_trips == 1
        assert sorted(snapshot.captures) == ["cap-0", "cap-1", "cap-2"]
        assert list(snapshot.changefeeds) == ["orders"]
        tasks = snapshot.tasks["orders"]
        assert sorted(tasks) == ["cap-0", "cap-1", "cap-2"]
        assert tasks["cap-2"].tables == make_task_status(20, 21).tables
    finally:
        for session in sessions:
            session.deregister()


def test_commit_persists_progress_and_ddl_state_and_never_moves_a_checkpoint_back(
    metastore: Metastore,
) -> None:
    created = metastore.changefeeds.create("orders", "delta:///lake")
    start = created.status.checkpoint_ts
    ddl = DdlState(Barrier(start + 50, {7: start + 20}), finished_ddl_ts=start + 10)
    owner = metastore.election.try_campaign("owner", 5)
    assert owner is not None
    try:
        metastore.commit_owner_tick(
            owner,
            metastore.read_owner_snapshot(),
            {"orders": ChangefeedProgress(start + 30, start + 40)},
            {"orders": ddl},
        )
        metastore.commit_owner_tick(
            owner,
            metastore.read_owner_snapshot(),
            {"orders": ChangefeedProgress(start + 5, start + 6)},
        )
    finally:
        owner.resign()

    snapshot = metastore.read_owner_snapshot()
    status = snapshot.changefeeds["orders"].status
    assert (status.checkpoint_ts, status.resolved_ts) == (start + 30, start + 40)
    assert snapshot.ddl["orders"] == ddl


def test_commit_by_a_deposed_owner_is_refused_and_writes_nothing(metastore: Metastore) -> None:
    created = metastore.changefeeds.create("orders", "delta:///lake")
    old = metastore.election.try_campaign("old", 5)
    assert old is not None
    snapshot = metastore.read_owner_snapshot()
    old.resign()
    new = metastore.election.try_campaign("new", 5)
    assert new is not None
    try:
        ahead = created.status.checkpoint_ts + 100
        with pytest.raises(NotOwnerError) as refused:
            metastore.commit_owner_tick(old, snapshot, {"orders": ChangefeedProgress(ahead, ahead)})
        assert refused.value.current_rev == new.owner_rev
        assert metastore.changefeeds.get("orders").status == created.status
        assert metastore.gc_safepoint() == 0
    finally:
        new.resign()


# --- many changefeeds: etcd's 128 operations per transaction ------------------------------


def _bulk_create(metastore: Metastore, count: int, start: int) -> None:
    """Write ``count`` changefeeds' info and status keys directly, 50 per transaction."""
    layout = metastore.layout
    for first in range(0, count, 50):
        puts = []
        for i in range(first, min(first + 50, count)):
            cf_id = f"cf-{i}"
            info = ChangefeedInfo(cf_id, f"delta:///lake/{i}", ("*.*",), start)
            status = ChangefeedStatus(start, start, ChangefeedState.NORMAL, epoch=start)
            puts.append(Put(layout.changefeed_info(cf_id), encode_record(info, "bulk")))
            puts.append(Put(layout.changefeed_status(cf_id), encode_record(status, "bulk")))
        metastore.client.txn([], puts)


def test_one_owner_tick_advances_1000_changefeeds_in_guarded_transactions_within_etcd_limits(
    metastore: Metastore,
) -> None:
    start = compose(1_700_000_000_000)
    _bulk_create(metastore, 1000, start)
    owner = metastore.election.try_campaign("owner", 5)
    assert owner is not None
    sent: list[tuple[int, int]] = []
    real_txn = metastore.client.txn

    def counting_txn(compares, success, failure=()):  # type: ignore[no-untyped-def]
        sent.append((len(compares), len(success)))
        assert compares[0] == owner.guard(), "every owner write carries the owner guard"
        return real_txn(compares, success, failure)

    try:
        snapshot = metastore.read_owner_snapshot()
        assert len(snapshot.changefeeds) == 1000
        progress = {
            cf_id: ChangefeedProgress(start + 10, start + 20) for cf_id in snapshot.changefeeds
        }
        metastore.client.txn = counting_txn  # type: ignore[method-assign]
        commit = metastore.commit_owner_tick(owner, snapshot, progress)
    finally:
        metastore.client.txn = real_txn  # type: ignore[method-assign]
        owner.resign()

    assert commit.transactions == len(sent) > 1
    assert all(compares <= 128 and ops <= 128 for compares, ops in sent)
    after = metastore.read_owner_snapshot()
    assert {
        (cf.status.checkpoint_ts, cf.status.resolved_ts) for cf in after.changefeeds.values()
    } == {(start + 10, start + 20)}
    assert after.gc_safepoint == start + 10
    assert {cf.status_revision for cf in commit.changefeeds.values()} <= {
        cf.status_revision for cf in after.changefeeds.values()
    }


def test_a_deposed_owner_writes_nothing_for_any_of_1000_changefeeds(metastore: Metastore) -> None:
    start = compose(1_700_000_000_000)
    _bulk_create(metastore, 1000, start)
    old = metastore.election.try_campaign("old", 5)
    assert old is not None
    snapshot = metastore.read_owner_snapshot()
    old.resign()
    progress = {cf_id: ChangefeedProgress(start + 10, start + 20) for cf_id in snapshot.changefeeds}
    with pytest.raises(NotOwnerError):
        metastore.commit_owner_tick(old, snapshot, progress)
    after = metastore.read_owner_snapshot()
    assert {cf.status.checkpoint_ts for cf in after.changefeeds.values()} == {start}


def test_config_cache_decodes_only_configs_written_since_the_last_read(
    metastore: Metastore,
) -> None:
    for cf_id in ("a", "b", "c"):
        metastore.changefeeds.create(cf_id, f"delta:///lake/{cf_id}")
    cache = ConfigCache()
    first = metastore.read_owner_snapshot(cache)
    assert cache.decoded == 3
    second = metastore.read_owner_snapshot(cache)
    assert cache.decoded == 3, "unchanged configs must come from the cache"
    assert second.changefeeds["b"].info == first.changefeeds["b"].info

    metastore.changefeeds.pause("b")
    metastore.changefeeds.update("b", sink_uri="delta:///lake/b2")
    metastore.changefeeds.remove("c")
    third = metastore.read_owner_snapshot(cache)

    assert cache.decoded == 4
    assert third.changefeeds["b"].info.sink_uri == "delta:///lake/b2"
    assert sorted(third.changefeeds) == ["a", "b"]


# --- one bad input must not stop the owner ----------------------------------------------------


def _checkpoint_above_resolved() -> bytes:
    """A task status whose table reports checkpoint 200 > resolved 100 (as a buggy capture would)."""
    ids = np.array([1], np.int64)
    body = b"".join(
        (
            status_codec._shuffled(np.diff(ids, prepend=np.int64(0))),
            bytes([int(TableState.REPLICATING)]),
            status_codec._column(np.array([200], np.int64)),
            status_codec._column(np.array([100], np.int64)),
        )
    )
    header = status_codec._HEADER.pack(b"TS", 1, int(Liveness.ALIVE), 1, 7, 1)
    return header + zlib.compress(body)


@pytest.mark.parametrize(
    "bad_value",
    [
        pytest.param(_checkpoint_above_resolved(), id="checkpoint_above_resolved"),
        pytest.param(b"not a task status", id="garbage"),
    ],
)
def test_one_malformed_capture_report_is_dropped_and_the_others_are_read(
    metastore: Metastore, make_task_status, bad_value: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    metastore.changefeeds.create("orders", "delta:///lake")
    good = metastore.captures.register("good", 5)
    bad = metastore.captures.register("bad", 5)
    try:
        metastore.task_statuses.put(good, "orders", make_task_status(1, 2))
        metastore.client.put(metastore.layout.task("orders", "bad"), bad_value, bad.lease_id)

        snapshot = metastore.read_owner_snapshot()

        assert list(snapshot.tasks["orders"]) == ["good"]
        assert snapshot.dropped_reports == 1
        assert "task status of changefeed orders" in snapshot.capture_errors["bad"]
        assert "good" not in snapshot.capture_errors
        assert "dropping a report of capture bad" in caplog.text
    finally:
        good.deregister()
        bad.deregister()


def test_a_corrupt_changefeed_record_drops_that_changefeed_only(metastore: Metastore) -> None:
    metastore.changefeeds.create("good", "delta:///lake/good")
    metastore.changefeeds.create("bad", "delta:///lake/bad")
    metastore.client.put(metastore.layout.changefeed_status("bad"), b"{not json")

    snapshot = metastore.read_owner_snapshot()

    assert list(snapshot.changefeeds) == ["good"]
    assert "bad" in snapshot.changefeed_errors


def test_a_config_cache_out_of_step_with_etcd_is_reset_not_fatal(metastore: Metastore) -> None:
    metastore.changefeeds.create("orders", "delta:///lake")
    cache = ConfigCache()
    cache.replace(10**12, {}, 0)  # as if filled from another etcd, far ahead

    snapshot = metastore.read_owner_snapshot(cache)

    assert list(snapshot.changefeeds) == ["orders"]
    assert cache.revision == snapshot.revision


def test_a_corrupt_ddl_state_drops_that_changefeed_only(metastore: Metastore) -> None:
    metastore.changefeeds.create("good", "delta:///lake/good")
    metastore.changefeeds.create("bad", "delta:///lake/bad")
    metastore.client.put(metastore.layout.ddl("bad"), b"\xff not json")

    snapshot = metastore.read_owner_snapshot()

    assert list(snapshot.changefeeds) == ["good"]
    assert "DDL state" in snapshot.changefeed_errors["bad"]
