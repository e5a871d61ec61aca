"""Changefeed admin against a real etcd: validation, lifecycle, compare-and-swap under contention."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable

import pytest

from cdc_dagster.metastore import (
    ChangefeedInfo,
    ChangefeedProgress,
    ChangefeedState,
    ChangefeedStore,
    Metastore,
    connect,
)
from cdc_dagster.metastore import errors as e
from cdc_dagster.sinks.uri import InvalidSinkUriError, UnknownSinkSchemeError
from scheduler_core.ts import compose

NOW_MS = 1_763_770_000_000
SAFEPOINT = compose(NOW_MS - 60_000)


@pytest.fixture
def store(metastore: Metastore) -> ChangefeedStore:
    """Changefeeds with a fixed clock at NOW_MS and a GC safepoint a minute before it."""
    metastore.client.put(metastore.layout.gc_safepoint, str(SAFEPOINT).encode())
    return ChangefeedStore(metastore.client, metastore.layout, now_ms=lambda: NOW_MS)


def test_create_then_get_and_list_show_a_normal_changefeed_at_its_start_ts(
    store: ChangefeedStore,
) -> None:
    start = compose(NOW_MS - 1000)
    created = store.create("orders", "delta:///lake", table_filter=["shop.*"], start_ts=start)
    defaulted = store.create("all-now", "delta:///tmp/blackhole")

    got = store.get("orders")
    assert got == created
    assert got.info.table_filter == ("shop.*",)
    assert (got.status.checkpoint_ts, got.status.resolved_ts) == (start, start)
    assert got.status.state is ChangefeedState.NORMAL
    assert defaulted.info.start_ts == compose(NOW_MS)
    assert [cf.changefeed_id for cf in store.list()] == ["all-now", "orders"]


def test_create_with_a_taken_id_is_refused_and_keeps_the_original(store: ChangefeedStore) -> None:
    store.create("orders", "delta:///lake")
    with pytest.raises(e.ChangefeedExistsError, match="already exists"):
        store.create("orders", "delta:///tmp/blackhole")
    assert store.get("orders").info.sink_uri == "delta:///lake"


BAD_CONFIGS = [
    ({"changefeed_id": "no_underscores"}, e.InvalidChangefeedIdError),
    ({"sink_uri": "kafka://broker:9092/topic"}, UnknownSinkSchemeError),
    ({"sink_uri": "/just/a/path"}, UnknownSinkSchemeError),
    ({"sink_uri": "delta://"}, InvalidSinkUriError),
    ({"sink_uri": "postgres://db-host:5432"}, InvalidSinkUriError),
    ({"table_filter": ["shop"]}, e.MalformedTableFilterError),
    ({"table_filter": []}, e.MalformedTableFilterError),
    ({"table_filter": ["shop.orders", "shop.or ders"]}, e.MalformedTableFilterError),
    ({"start_ts": compose(NOW_MS + 5_000)}, e.StartTsInFutureError),
    ({"start_ts": SAFEPOINT - 1}, e.StartTsBelowGcSafepointError),
    ({"start_ts": -1}, e.InvalidTsError),
    ({"start_ts": compose(NOW_MS - 10), "target_ts": compose(NOW_MS - 20)}, e.InvalidTargetTsError),
    ({"sync_point_interval_s": -5}, e.InvalidChangefeedOptionError),
]


@pytest.mark.parametrize(("override", "error"), BAD_CONFIGS)
def test_each_invalid_config_raises_its_own_error_and_writes_nothing(
    store: ChangefeedStore, metastore: Metastore, override: dict, error: type[Exception]
) -> None:
    args = {"changefeed_id": "orders", "sink_uri": "delta:///lake", **override}
    before = metastore.client.get_prefix(metastore.layout.prefix).kvs

    with pytest.raises((e.ChangefeedError, InvalidSinkUriError)) as raised:
        store.create(args.pop("changefeed_id"), args.pop("sink_uri"), **args)

    assert type(raised.value) is error
    assert metastore.client.get_prefix(metastore.layout.prefix).kvs == before


def test_update_is_refused_while_running_and_applies_once_paused(store: ChangefeedStore) -> None:
    store.create("orders", "delta:///lake")
    with pytest.raises(e.ChangefeedStateError, match="pause it first"):
        store.update("orders", sink_uri="delta:///other")
    assert store.get("orders").info.sink_uri == "delta:///lake"

    store.pause("orders")
    updated = store.update("orders", sink_uri="postgres://db:5432/wh", table_filter=["a.*"])

    assert (updated.sink_uri, updated.table_filter) == ("postgres://db:5432/wh", ("a.*",))
    assert store.get("orders").info == updated
    with pytest.raises(UnknownSinkSchemeError):
        store.update("orders", sink_uri="kafka://x")
    assert store.get("orders").info == updated


def test_pause_then_resume_returns_to_normal_under_a_higher_epoch(store: ChangefeedStore) -> None:
    created = store.create("orders", "delta:///lake")
    assert store.pause("orders").state is ChangefeedState.STOPPED
    assert store.pause("orders").state is ChangefeedState.STOPPED  # idempotent
    resumed = store.resume("orders")
    assert resumed.state is ChangefeedState.NORMAL
    assert resumed.epoch > created.status.epoch
    assert resumed.checkpoint_ts == created.status.checkpoint_ts


def test_remove_deletes_every_key_of_the_changefeed(
    store: ChangefeedStore, metastore: Metastore, make_task_status
) -> None:
    store.create("orders", "delta:///lake")
    store.create("keep", "delta:///lake")
    capture = metastore.captures.register("cap", 5)
    try:
        metastore.task_statuses.put(capture, "orders", make_task_status(1))
        store.remove("orders")
        with pytest.raises(e.ChangefeedNotFoundError):
            store.get("orders")
        assert metastore.task_statuses.read("orders") == {}
        assert [cf.changefeed_id for cf in store.list()] == ["keep"]
    finally:
        capture.deregister()


def test_concurrent_updates_from_several_threads_lose_no_write(
    store: ChangefeedStore, etcd_endpoints: list[str], cluster_id: str
) -> None:
    store.create("orders", "delta:///lake", table_filter=["seed.t"])
    store.pause("orders")
    threads, per_thread = 4, 10
    failures: list[Exception] = []
    round_trips: list[int] = []
    start = threading.Barrier(threads)

    def append(rule: str) -> Callable[[ChangefeedInfo], ChangefeedInfo]:
        return lambda info: dataclasses.replace(info, table_filter=(*info.table_filter, rule))

    def admin(n: int) -> None:
        # Each thread acts as its own admin process, with its own connection.
        with connect(etcd_endpoints, cluster_id=cluster_id) as ms:
            start.wait()
            for i in range(per_thread):
                try:
                    ms.changefeeds.update_info("orders", append(f"s{n}.t{i}"))
                except Exception as exc:  # collected and asserted on below
                    failures.append(exc)
            round_trips.append(ms.client.stats.round_trips)

    workers = [threading.Thread(target=admin, args=(n,)) for n in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()

    assert failures == []
    # One read and one write per update without contention; more means CAS retries ran.
    assert sum(round_trips) > 2 * threads * per_thread, "the threads never actually raced"
    rules = store.get("orders").info.table_filter
    expected = ["seed.t"] + [f"s{n}.t{i}" for n in range(threads) for i in range(per_thread)]
    assert sorted(rules) == sorted(expected), "every concurrent append must land exactly once"


def test_owner_progress_racing_an_admin_pause_keeps_both(
    store: ChangefeedStore, metastore: Metastore
) -> None:
    created = store.create("orders", "delta:///lake")
    owner = metastore.election.try_campaign("owner", 5)
    assert owner is not None
    try:
        snapshot = metastore.read_owner_snapshot()
        store.pause("orders")  # lands between the owner's read and its write
        ahead = created.status.checkpoint_ts + 1000
        commit = metastore.commit_owner_tick(
            owner, snapshot, {"orders": ChangefeedProgress(ahead, ahead + 5)}
        )
    finally:
        owner.resign()

    status = store.get("orders").status
    assert commit.attempts == 2
    assert status.state is ChangefeedState.STOPPED
    assert (status.checkpoint_ts, status.resolved_ts) == (ahead, ahead + 5)


def test_gc_safepoint_follows_the_lowest_unfinished_checkpoint_and_never_goes_back(
    store: ChangefeedStore, metastore: Metastore
) -> None:
    slow_start, fast_start = compose(NOW_MS - 30_000), compose(NOW_MS - 20_000)
    store.create("slow", "delta:///tmp/blackhole", start_ts=slow_start)
    store.create("fast", "delta:///tmp/blackhole", start_ts=fast_start)
    owner = metastore.election.try_campaign("owner", 5)
    assert owner is not None
    try:
        tick = metastore.commit_owner_tick(
            owner,
            metastore.read_owner_snapshot(),
            {
                "slow": ChangefeedProgress(slow_start + 10, slow_start + 10),
                "fast": ChangefeedProgress(fast_start + 99, fast_start + 99),
            },
        )
        assert tick.gc_safepoint == metastore.gc_safepoint() == slow_start + 10

        store.remove("slow")
        tick = metastore.commit_owner_tick(owner, metastore.read_owner_snapshot(), {})
        assert metastore.gc_safepoint() == fast_start + 99

        # A checkpoint reported lower than the safepoint cannot pull it back.
        tick = metastore.commit_owner_tick(
            owner,
            metastore.read_owner_snapshot(),
            {"fast": ChangefeedProgress(fast_start, fast_start)},
        )
        assert metastore.gc_safepoint() == fast_start + 99
        assert store.get("fast").status.checkpoint_ts == fast_start + 99
    finally:
        owner.resign()


def test_create_racing_a_safepoint_advance_rechecks_start_ts_and_writes_nothing(
    metastore: Metastore,
) -> None:
    start = compose(NOW_MS - 10_000)
    advanced = []

    def clock_that_lets_the_owner_advance_gc_first() -> int:
        # Called after create() read the safepoint and before it writes.
        if not advanced:
            advanced.append(True)
            metastore.client.put(metastore.layout.gc_safepoint, str(start + 1).encode())
        return NOW_MS

    store = ChangefeedStore(
        metastore.client, metastore.layout, now_ms=clock_that_lets_the_owner_advance_gc_first
    )
    with pytest.raises(e.StartTsBelowGcSafepointError):
        store.create("orders", "delta:///lake", start_ts=start)
    assert store.list() == []


def test_a_password_reference_is_stored_as_written_and_a_literal_one_never_shown(
    store: ChangefeedStore, metastore: Metastore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PG_PASSWORD", "resolved-secret")
    store.create("ref", "postgres://etl:${PG_PASSWORD}@db:5432/wh")
    raw = metastore.client.get(metastore.layout.changefeed_info("ref")).value
    assert b"${PG_PASSWORD}" in raw and b"resolved-secret" not in raw

    store.create("lit", "postgres://etl:hunter2@db:5432/wh")
    with pytest.raises(e.ChangefeedExistsError) as raised:
        store.create("lit", "delta:///tmp/blackhole")
    assert "hunter2" not in str(raised.value)
    assert "hunter2" not in repr(store.get("lit"))
