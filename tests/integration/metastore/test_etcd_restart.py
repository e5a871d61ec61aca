"""etcd restarted under running clients: they reconnect; election and registrations recover."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdc_dagster.metastore import Metastore, connect
from cdc_dagster.testing.etcd import EmbeddedEtcd, EtcdTuning

TTL_S = 2


@pytest.fixture
def own_etcd(tmp_path: Path) -> Iterator[EmbeddedEtcd]:
    """An etcd of this test's own, since the test restarts it."""
    server = EmbeddedEtcd(tmp_path / "etcd", tuning=EtcdTuning.for_tests()).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.slow
def test_clients_reconnect_and_election_and_registrations_survive_an_etcd_outage_and_restart(
    own_etcd: EmbeddedEtcd,
) -> None:
    with connect(own_etcd.endpoints, cluster_id="restart") as ms:
        owner = ms.election.try_campaign("owner", TTL_S)
        assert owner is not None
        capture = ms.captures.register("cap", TTL_S)
        watch = ms.captures.watch(lambda alive: None)
        try:
            assert watch.wait_for(lambda alive: set(alive) == {"cap"}, 5)
            old_port = own_etcd.client_port

            own_etcd.stop()
            during = _create_in_background(ms, "during-outage")
            time.sleep(TTL_S + 1)  # down for longer than a lease TTL
            own_etcd.start()
            during.join(timeout=15)
            assert own_etcd.client_port == old_port
            assert ms.changefeeds.get("during-outage").info.sink_uri == "delta:///tmp/blackhole", (
                "a call made while etcd was down must complete once it is back"
            )
            # Keep-alives must resume: the leases would lapse within a TTL without them.
            time.sleep(2 * TTL_S)

            _assert_recovered(ms, owner, capture, watch)
        finally:
            watch.stop()
            capture.deregister()
            owner.resign()


def _create_in_background(ms: Metastore, changefeed_id: str) -> threading.Thread:
    thread = threading.Thread(
        target=ms.changefeeds.create, args=(changefeed_id, "delta:///tmp/blackhole"), daemon=True
    )
    thread.start()
    return thread


def _assert_recovered(ms: Metastore, owner, capture, watch) -> None:
    current = ms.election.current_owner()
    assert current is not None and current.owner_rev == owner.owner_rev
    assert owner.is_owner()
    assert owner.put(ms.layout.prefix + "after-restart", b"ok") > owner.owner_rev
    assert [c.capture_id for c in ms.captures.list_alive()] == ["cap"]
    assert capture.alive()

    late = ms.captures.register("late", TTL_S)
    try:
        assert watch.wait_for(lambda alive: set(alive) == {"cap", "late"}, 5), (
            "the capture watch must resume after the restart"
        )
        assert (
            ms.changefeeds.create("after", "delta:///tmp/blackhole").status.state.value == "normal"
        )
    finally:
        late.deregister()
