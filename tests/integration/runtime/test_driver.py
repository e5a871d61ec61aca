"""The driver: owner + captures in one process over a real etcd, with the durable fake executor."""

from __future__ import annotations

from collections.abc import Callable

from upstream_helpers import Upstream, check_downstream

from cdc_dagster.testing.driver import Driver
from cdc_dagster.testing.fake_runtime import FileDownstream


def test_changefeed_replicates_to_the_fake_downstream(
    make_driver: Callable[..., Driver], upstream: Upstream, sink_uri: str
) -> None:
    driver = make_driver(captures=2)
    target = upstream.ts(5000)
    upstream.advance(target)
    n = driver.run_until(lambda t: driver.caught_up(t, target), max_ticks=30)
    assert n < 30
    ds = FileDownstream(sink_uri[len("file://") :])
    assert all(ds.committed(t) == target for t in upstream.table_ids)
    writes = check_downstream(sink_uri)
    assert set(writes) == set(upstream.table_ids)
    # Both captures hold tables.
    last = driver.tick()
    holders = {t.capture_id for t in last.owner.changefeeds["cf"].tables}
    assert holders == {"capture-0", "capture-1"}


def test_changefeed_starting_exactly_at_a_create_table_includes_that_table(
    make_driver: Callable[..., Driver], upstream: Upstream, sink_uri: str
) -> None:
    """start_ts = a CREATE's commit ts: the table exists at start_ts, so it is replicated."""
    from scheduler_core.ts import compose

    last_create = compose(upstream.t0_ms) + upstream.table_ids[-1]
    driver = make_driver(captures=2, start_ts=last_create)
    target = upstream.ts(5000)
    upstream.advance(target)
    n = driver.run_until(lambda t: driver.caught_up(t, target), max_ticks=30)
    assert n < 30
    ds = FileDownstream(sink_uri[len("file://") :])
    assert all(ds.committed(t) == target for t in upstream.table_ids)


def test_changefeed_starting_before_any_table_adds_tables_as_they_are_created(
    make_driver: Callable[..., Driver], upstream: Upstream, sink_uri: str
) -> None:
    """start_ts below every CREATE: the checkpoint follows the upstream and each CREATE adds its
    table at its barrier."""
    from scheduler_core.ts import compose

    driver = make_driver(captures=2, start_ts=compose(upstream.t0_ms - 1000))
    target = upstream.ts(5000)
    upstream.advance(target)
    n = driver.run_until(lambda t: driver.caught_up(t, target), max_ticks=60)
    assert n < 60
    ds = FileDownstream(sink_uri[len("file://") :])
    assert all(ds.committed(t) == target for t in upstream.table_ids)


def test_commit_reports_rows_applied_per_table(
    make_driver: Callable[..., Driver], upstream: Upstream
) -> None:
    driver = make_driver(captures=2)
    target = upstream.ts(5000)
    upstream.advance(target)
    driver.run_until(lambda t: driver.caught_up(t, target), max_ticks=30)
    lines = {t.table_id: t for c in driver.tick().commits for t in c.tables}
    assert set(lines) == set(upstream.table_ids)
    # The fake counts one per sink write; cumulative across ticks, in the run log line too.
    assert all(t.rows_applied >= 1 for t in lines.values())
    assert all(f"rows_applied {t.rows_applied}" in t.line() for t in lines.values())


def test_owner_process_restarts_under_the_same_owner_rev_do_not_stall_the_changefeed(
    make_driver: Callable[..., Driver], upstream: Upstream, metastore
) -> None:
    """A code-server restart rebuilds the owner under the same owner_rev: every table still
    reaches the target (it stalled in COMMIT: a lost dispatch was never sent again, since
    an unchanged capture report was never fed again)."""
    from cdc_dagster.runtime.owner import OwnerLoop

    driver = make_driver(captures=2)
    target = upstream.ts(5000)
    upstream.advance(target)
    for i in range(15):
        if i % 3 == 2:
            driver.owner = OwnerLoop(metastore, "owner-0", lease_ttl_s=10)
        driver.tick()
    driver.run_until(lambda t: driver.caught_up(t, target), max_ticks=30)
