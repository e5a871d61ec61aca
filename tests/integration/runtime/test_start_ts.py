"""A changefeed may start at any ts: at a CREATE's commit ts, between creates, before any table."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from upstream_helpers import Upstream

from cdc_dagster.metastore import Metastore
from cdc_dagster.testing.driver import Driver
from cdc_dagster.testing.fake_runtime import FileDownstream
from scheduler_core.ts import compose


def _downstream(sink_uri: str) -> FileDownstream:
    return FileDownstream(sink_uri[len("file://") :])


def test_start_at_a_create_commit_ts_holds_that_table_from_the_start(
    make_driver: Callable[..., Driver], upstream: Upstream, sink_uri: str
) -> None:
    # Table 4 was created at compose(t0) + 4: at that ts it exists (TiCDC: a changefeed at
    # start_ts sees the schema at start_ts), so it belongs to the initial set.
    start = compose(upstream.t0_ms) + 4
    driver = make_driver(start_ts=start)
    first = driver.tick()
    cf = first.owner.changefeeds["cf"]
    assert {t.table_id for t in cf.tables} == set(upstream.table_ids)
    assert not first.owner.ready_ddls  # the CREATE at start_ts is not re-run
    target = upstream.ts(5000)
    upstream.advance(target)
    assert driver.run_until(lambda t: driver.caught_up(t, target), max_ticks=30) < 30
    ds = _downstream(sink_uri)
    assert all(ds.committed(t) == target for t in upstream.table_ids)


def test_start_between_creates_adds_later_tables_at_their_barrier(
    make_driver: Callable[..., Driver], upstream: Upstream, sink_uri: str
) -> None:
    start = compose(upstream.t0_ms) + 2  # tables 1 and 2 exist, 3 and 4 come later
    driver = make_driver(start_ts=start)
    first = driver.tick()
    assert {t.table_id for t in first.owner.changefeeds["cf"].tables} == {1, 2}
    target = upstream.ts(5000)
    upstream.advance(target)
    assert driver.run_until(lambda t: driver.caught_up(t, target), max_ticks=40) < 40
    last = driver.tick()
    assert {t.table_id for t in last.owner.changefeeds["cf"].tables} == {1, 2, 3, 4}
    ds = _downstream(sink_uri)
    assert all(ds.committed(t) == target for t in upstream.table_ids)


def test_owner_rebuild_at_a_create_commit_ts_keeps_the_table(
    make_driver: Callable[..., Driver], upstream: Upstream, metastore: Metastore
) -> None:
    # A new owner (or a new code-server process) rebuilds from a checkpoint that sits
    # exactly on a CREATE's commit ts.
    start = compose(upstream.t0_ms) + 4
    driver = make_driver(start_ts=start)
    driver.tick()
    driver.owner.resign()
    again = driver.tick()  # rebuilt from etcd
    assert {t.table_id for t in again.owner.changefeeds["cf"].tables} == set(upstream.table_ids)
    assert not again.owner.ready_ddls


def test_changefeed_before_any_table_follows_the_upstream_and_adds_tables(
    tmp_path: Path, metastore: Metastore
) -> None:
    up = Upstream(tmp_path / "changelog", tables=0)
    sink_uri = f"file://{tmp_path / 'downstream'}"
    driver = Driver(
        tmp_path / "state", up.root, sink_uri, captures=2, metastore=metastore, start_ts=up.ts(0)
    )
    # Nothing exists yet: the checkpoint follows the change log's resolved ts.
    up.advance(up.ts(1000))
    driver.tick()
    t = driver.tick()
    assert t.owner.changefeeds["cf"].checkpoint_ts == up.ts(1000)
    # Two tables are created later; they are added as their CREATE passes its barrier.
    up.table_ids = [1, 2]
    up.create(1, up.ts(2000))
    up.create(2, up.ts(3000))
    target = up.ts(5000)
    up.advance(target)
    assert driver.run_until(lambda t: driver.caught_up(t, target), max_ticks=40) < 40
    last = driver.tick().owner.changefeeds["cf"]
    assert {p.table_id for p in last.tables} == {1, 2}
    ds = _downstream(sink_uri)
    assert ds.committed(1) == ds.committed(2) == target


def test_changefeed_on_an_empty_change_log_waits_for_its_ddl_stream(
    tmp_path: Path, metastore: Metastore
) -> None:
    up = Upstream(tmp_path / "changelog", tables=0)  # resolved two minutes ago
    sink_uri = f"file://{tmp_path / 'downstream'}"
    # Starts now, but the change log's DDLs are resolved only to a minute ago: a CREATE at
    # or below the start may still come, so the owner waits (no error, no table).
    driver = Driver(tmp_path / "state", up.root, sink_uri, captures=1, metastore=metastore)
    start = metastore.changefeeds.get("cf").status.checkpoint_ts
    for _ in range(2):
        t = driver.tick()
        assert t.owner.is_owner
        assert "cf" not in t.owner.changefeeds
    up.advance(up.ts(180_000))  # a minute from now: the DDL stream passed the start
    driver.tick()
    cf = driver.tick().owner.changefeeds["cf"]
    assert cf.tables == ()
    assert cf.checkpoint_ts == up.ts(180_000) > start


def test_start_at_a_create_the_ddl_stream_has_not_resolved_yet(
    make_driver: Callable[..., Driver], upstream: Upstream, sink_uri: str
) -> None:
    # The CREATE is written but the DDL stream is resolved below it when the changefeed
    # starts there (the demo's start at the generator's last bootstrap CREATE).
    upstream.table_ids.append(5)
    create_ts = upstream.ts(5000)
    upstream.create(5, create_ts)
    driver = make_driver(start_ts=create_ts)
    driver.tick()
    target = upstream.ts(8000)
    upstream.advance(target)
    assert driver.run_until(lambda t: driver.caught_up(t, target), max_ticks=30) < 30
    last = driver.tick().owner
    assert {t.table_id for t in last.changefeeds["cf"].tables} == {1, 2, 3, 4, 5}
    ds = _downstream(sink_uri)
    assert all(ds.committed(t) == target for t in upstream.table_ids)
