"""Owner election against a real etcd: one owner, failover after a crash, zombie fencing."""

from __future__ import annotations

import signal
import time

import pytest

from cdc_dagster.metastore import Metastore, NotOwnerError
from cdc_dagster.metastore.errors import LeaseExpiredError

TTL_S = 2


def _first_to_answer(candidates, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for candidate in candidates:
            if not candidate.silent_for(0.05):
                return candidate
    pytest.fail(f"no candidate answered within {timeout_s}s")


@pytest.mark.slow
def test_two_candidates_one_owner_and_kill_9_hands_over_after_the_ttl(
    metastore: Metastore, spawn_candidate
) -> None:
    a, b = spawn_candidate("cand-a", TTL_S), spawn_candidate("cand-b", TTL_S)
    a.send("campaign 30")
    b.send("campaign 30")
    first = _first_to_answer([a, b], timeout_s=10)
    second = b if first is a else a
    won = first.read(timeout_s=1)
    assert won["event"] == "owner"
    # The loser keeps waiting for longer than a TTL: the winner's lease is kept alive.
    assert second.silent_for(TTL_S * 1.5)
    owner = metastore.election.current_owner()
    assert owner is not None
    assert (owner.owner_id, owner.owner_rev) == (first.owner_id, won["owner_rev"])

    killed_at = time.monotonic()
    first.signal(signal.SIGKILL)
    took_over = second.read(timeout_s=TTL_S + 5)
    waited = time.monotonic() - killed_at

    assert took_over["event"] == "owner"
    assert took_over["owner_rev"] > won["owner_rev"]
    assert waited > TTL_S / 2, "the new owner must wait for the dead owner's lease to expire"
    owner = metastore.election.current_owner()
    assert owner is not None and owner.owner_id == second.owner_id


@pytest.mark.slow
def test_zombie_owner_resumed_after_losing_its_lease_has_every_write_refused(
    metastore: Metastore, spawn_candidate
) -> None:
    zombie, heir = spawn_candidate("zombie", TTL_S), spawn_candidate("heir", TTL_S)
    zombie.send("campaign 10")
    old_rev = zombie.read(timeout_s=10)["owner_rev"]
    zombie.send("write before-pause")
    assert zombie.read(timeout_s=5)["ok"] is True

    zombie.signal(signal.SIGSTOP)
    heir.send(f"campaign {TTL_S + 10}")
    new_rev = heir.read(timeout_s=TTL_S + 10)["owner_rev"]
    zombie.signal(signal.SIGCONT)

    for i in range(3):
        zombie.send(f"write after-resume-{i}")
        answer = zombie.read(timeout_s=10)
        assert answer["ok"] is False and answer["current_rev"] == new_rev
    heir.send("write heir")
    assert heir.read(timeout_s=5)["ok"] is True

    assert new_rev > old_rev
    data = {
        kv.key.rsplit("/", 1)[1]: kv
        for kv in metastore.client.get_prefix(metastore.layout.prefix + "data/").kvs
    }
    assert sorted(data) == ["before-pause", "heir"]
    assert data["before-pause"].mod_revision < new_rev


def test_second_candidate_gets_nothing_while_an_owner_holds_the_key(metastore: Metastore) -> None:
    owner = metastore.election.try_campaign("first", TTL_S)
    assert owner is not None
    try:
        assert metastore.election.try_campaign("second", TTL_S) is None
        current = metastore.election.current_owner()
        assert current is not None and (current.owner_id, current.owner_rev) == (
            "first",
            owner.owner_rev,
        )
    finally:
        owner.resign()


def test_resigned_owner_is_refused_and_successor_gets_higher_owner_rev(
    metastore: Metastore,
) -> None:
    first = metastore.election.try_campaign("first", TTL_S)
    assert first is not None
    first.put(metastore.layout.prefix + "data/k", b"first")
    first.resign()
    assert metastore.election.current_owner() is None

    second = metastore.election.try_campaign("second", TTL_S)
    assert second is not None
    try:
        assert second.owner_rev > first.owner_rev
        with pytest.raises(NotOwnerError) as refused:
            first.put(metastore.layout.prefix + "data/k", b"zombie")
        assert refused.value.current_rev == second.owner_rev
        assert metastore.client.get(metastore.layout.prefix + "data/k").value == b"first"
    finally:
        second.resign()


def test_owner_whose_lease_is_revoked_is_no_longer_owner(metastore: Metastore) -> None:
    session = metastore.election.try_campaign("owner", TTL_S)
    assert session is not None
    assert session.is_owner()
    metastore.client.revoke_lease(session.info.lease_id)  # as if the lease had expired

    with pytest.raises(LeaseExpiredError):
        session.keeper.refresh()
    assert not session.is_owner()
    with pytest.raises(NotOwnerError):
        session.put(metastore.layout.prefix + "data/k", b"late")
    assert metastore.election.current_owner() is None


def test_later_owner_tick_attaches_with_the_same_owner_rev_and_others_cannot(
    metastore: Metastore,
) -> None:
    first_tick = metastore.election.try_campaign("owner", TTL_S)
    assert first_tick is not None
    first_tick.keeper.stop()  # the process that campaigned is gone; its lease lives on
    try:
        later_tick = metastore.election.attach("owner")
        assert later_tick is not None
        assert later_tick.owner_rev == first_tick.owner_rev
        later_tick.keeper.refresh()
        later_tick.put(metastore.layout.prefix + "data/k", b"tick")
        assert metastore.election.attach("someone-else") is None
    finally:
        first_tick.resign()
    assert metastore.election.attach("owner") is None
