"""The owner's per-tick read and write against a real etcd."""

from __future__ import annotations

import pytest

from cdc_dagster.metastore import ChangefeedProgress, DdlState, Metastore, NotOwnerError
from scheduler_core.messages import Barrier


def test_snapshot_reads_captures_changefeeds_and_one_task_key_per_capture_in_one_round_trip(
    metastore: Metastore, make_task_status
) -> None:
    metastore.changefeeds.create("orders", "delta:///lake")
    sessions = [metastore.captures.register(f"cap-{i}", 5) for i in range(3)]
    try:
        for i, session in enumerate(sessions):
            metastore.tasks.put(session, "orders", make_task_status(i * 10, i * 10 + 1))
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
