"""Through the driver: fencing of stale epochs, move / drain / add / remove capture, a
CREATE TABLE DDL through its gate, and syncpoints."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from upstream_helpers import Upstream, check_downstream

from cdc_dagster.admin import AdminError
from cdc_dagster.pipeline.staging import registration_area
from cdc_dagster.runtime.capture import capture_commit, capture_prepare
from cdc_dagster.runtime.spec import ExecutorSpec
from cdc_dagster.runtime.wire import decode, encode
from cdc_dagster.testing.driver import Driver
from cdc_dagster.testing.fake_runtime import FileDownstream
from cdc_dagster.upstream.uri import changelog_uri
from scheduler_core.messages import DispatchTableRequest, Header, RemoveTableRequest


def _holders(driver: Driver) -> dict[int, str | None]:
    return {t.table_id: t.capture_id for t in driver.tick().owner.changefeeds["cf"].tables}


def test_dispatch_for_another_epoch_is_rejected_by_the_capture(
    make_driver: Callable[..., Driver], upstream: Upstream
) -> None:
    driver = make_driver(captures=2)
    upstream.advance(upstream.ts(3000))
    driver.run_until(lambda t: driver.caught_up(t, upstream.resolved), max_ticks=30)
    owner = driver.owner.tick()
    msgs = decode(owner.run_config("capture-0")["cf"])
    held = [t for t, c in _holders(driver).items() if c == "capture-0"]
    h = msgs[0].header
    for epoch in ("bogus", f"{h.capture_epoch.split('.')[0]}.{h.owner_rev - 1}"):
        bad = Header(h.owner_rev, epoch, h.changefeed_epoch, h.seq)
        remove = DispatchTableRequest(
            bad, msgs[0].sender, "capture-0", (RemoveTableRequest("capture-0", held[0]),)
        )
        ctx = driver.context("capture-0")
        out = capture_prepare(ctx, decode(encode([remove])))
        assert out.rejected == {"rejected_capture_epoch": 1}
        done = capture_commit(ctx)
        assert {t.table_id: t.state for t in done.tables}[held[0]] == "replicating"


def test_move_drain_add_and_remove_capture_complete(
    make_driver: Callable[..., Driver], upstream: Upstream, sink_uri: str
) -> None:
    driver = make_driver(captures=2)
    upstream.advance(upstream.ts(3000))
    driver.run_until(lambda t: driver.caught_up(t, upstream.resolved), max_ticks=30)
    holders = _holders(driver)
    tid = next(t for t, c in holders.items() if c == "capture-0")
    driver.move_table(tid, "capture-1")
    upstream.advance(upstream.ts(5000))
    driver.run_until(
        lambda t: driver.caught_up(t, upstream.resolved) and _holders(driver)[tid] == "capture-1",
        max_ticks=30,
    )
    with pytest.raises(AdminError, match="is not alive"):
        driver.move_table(tid, "capture-9")
    driver.add_capture("capture-2")
    driver.drain_capture("capture-0")
    upstream.advance(upstream.ts(8000))
    driver.run_until(
        lambda t: (
            driver.caught_up(t, upstream.resolved)
            and "capture-0" not in set(_holders(driver).values())
        ),
        max_ticks=40,
    )
    driver.remove_capture("capture-0")
    upstream.advance(upstream.ts(10000))
    driver.run_until(lambda t: driver.caught_up(t, upstream.resolved), max_ticks=30)
    assert set(_holders(driver).values()) <= {"capture-1", "capture-2"}
    check_downstream(sink_uri)


def test_create_table_ddl_runs_at_its_barrier_and_syncpoints_are_recorded(
    make_driver: Callable[..., Driver], upstream: Upstream, sink_uri: str
) -> None:
    driver = make_driver(captures=2, sync_point_interval_s=2)
    upstream.advance(upstream.ts(3000))
    driver.run_until(lambda t: driver.caught_up(t, upstream.resolved), max_ticks=30)
    created_at = upstream.ts(4000)
    upstream.create(5, created_at)
    upstream.table_ids.append(5)
    target = upstream.ts(9000)
    upstream.advance(target)
    driver.run_until(
        lambda t: driver.caught_up(t, target) and len(t.owner.changefeeds["cf"].tables) == 5,
        max_ticks=60,
    )
    ds = FileDownstream(sink_uri[len("file://") :])
    state = ds.state()
    assert [d[0] for d in state["ddls"]] == [created_at]
    assert ds.committed(5) == target
    writes = check_downstream(sink_uri)
    assert writes[5][0]["start_ts"] == created_at  # the new table starts at the DDL's ts
    # Nothing of the other tables was sunk past the DDL before it ran (global barrier).
    for tid in (1, 2, 3, 4):
        assert created_at in {w["end_ts"] for w in writes[tid]}
    assert len(state.get("syncpoints", [])) >= 2


def test_a_desired_capture_whose_lease_expired_is_registered_again_by_the_owner(
    make_driver: Callable[..., Driver], upstream: Upstream, sink_uri: str
) -> None:
    import time

    driver = make_driver(captures=2, lease_ttl_s=2)
    upstream.advance(upstream.ts(3000))
    driver.run_until(lambda t: driver.caught_up(t, upstream.resolved), max_ticks=30)
    old_epoch = driver.ms.captures.get("capture-1").epoch  # type: ignore[union-attr]
    healed = []
    deadline = time.monotonic() + 3.5
    while time.monotonic() < deadline:  # capture-1's runs stop: its lease lapses
        healed += driver.tick(skip=["capture-1"]).owner.registered
        time.sleep(0.3)
    assert "capture-1" in healed  # no person ran `capture add`
    new = driver.ms.captures.get("capture-1")
    assert new is not None and new.epoch != old_epoch  # a new epoch: the old one is fenced
    upstream.advance(upstream.ts(6000))
    driver.run_until(lambda t: driver.caught_up(t, upstream.resolved), max_ticks=30)
    check_downstream(sink_uri)


def test_a_capture_whose_lease_expired_registers_anew_in_its_next_run(
    make_driver: Callable[..., Driver], upstream: Upstream, sink_uri: str
) -> None:
    """Without the owner's help (not desired: registered before desired state existed)."""
    import time

    driver = make_driver(captures=2, lease_ttl_s=2)
    driver.ms.captures.undesire("capture-1")
    upstream.advance(upstream.ts(3000))
    driver.run_until(lambda t: driver.caught_up(t, upstream.resolved), max_ticks=30)
    old_epoch = driver.ms.captures.get("capture-1").epoch  # type: ignore[union-attr]
    deadline = time.monotonic() + 3.5
    while time.monotonic() < deadline:  # capture-1's runs stop: its lease lapses
        driver.tick(skip=["capture-1"])
        time.sleep(0.3)
    assert driver.ms.captures.get("capture-1") is None
    upstream.advance(upstream.ts(6000))
    step = driver.tick()
    anew = [p for p in step.prepares if p.capture_id == "capture-1"]
    assert anew and anew[0].registered_anew and anew[0].registration != old_epoch
    driver.run_until(lambda t: driver.caught_up(t, upstream.resolved), max_ticks=30)
    check_downstream(sink_uri)
    # A late run of the old registration (frozen past its lease, then thawed) writes only
    # into its own staging area: the live registration's manifest is not touched, and the
    # stray area is gone after the live registration's next tick.
    capture_dir = driver.staging_root / "cf" / "capture-1"
    live = capture_dir / registration_area(anew[0].registration)
    stale = capture_dir / registration_area(old_epoch)
    assert sorted(p.name for p in capture_dir.iterdir()) == [live.name]
    manifest = (live / "manifest.json").read_bytes()
    ctx = driver.context("capture-1")
    spec = ExecutorSpec(
        "capture-1", "cf", stale, driver.staging_root, changelog_uri(upstream.root), sink_uri,
        0, registration=old_epoch,
    )  # fmt: skip
    late = ctx.executor_factory(spec)
    late.save()
    assert (stale / "manifest.json").exists()
    assert (live / "manifest.json").read_bytes() == manifest
    driver.tick()
    assert not stale.exists()
    upstream.advance(upstream.ts(9000))
    driver.run_until(lambda t: driver.caught_up(t, upstream.resolved), max_ticks=30)
    check_downstream(sink_uri)


def test_paused_changefeed_stops_its_tables_and_resumes_where_it_left(
    make_driver: Callable[..., Driver], upstream: Upstream, sink_uri: str
) -> None:
    driver = make_driver(captures=2)
    upstream.advance(upstream.ts(3000))
    driver.run_until(lambda t: driver.caught_up(t, upstream.resolved), max_ticks=30)
    driver.ms.changefeeds.pause("cf")
    upstream.advance(upstream.ts(5000))
    driver.run_until(lambda t: all(not c.tables for c in t.commits), max_ticks=20)
    paused_at = {t: FileDownstream(sink_uri[7:]).committed(t) for t in upstream.table_ids}
    for _ in range(3):  # nothing is sunk while paused
        assert all(not c.tables for c in driver.tick().commits)
    assert {t: FileDownstream(sink_uri[7:]).committed(t) for t in upstream.table_ids} == paused_at
    driver.ms.changefeeds.resume("cf")
    driver.run_until(lambda t: driver.caught_up(t, upstream.resolved), max_ticks=30)
    check_downstream(sink_uri)


def test_each_owner_step_of_a_resume_is_moving_until_every_table_replicates(
    make_driver: Callable[..., Driver], upstream: Upstream, sink_uri: str
) -> None:
    """What the owner sensor settles on (``plan.moving``): the rebuild after a resume, then
    the steps that dispatch prepare and commit; once every table replicates, nothing."""
    from cdc_dagster.defs.owner.plan import moving
    from cdc_dagster.runtime import OwnerStep

    driver = make_driver(captures=2)
    upstream.advance(upstream.ts(3000))
    driver.run_until(lambda t: driver.caught_up(t, upstream.resolved), max_ticks=30)
    driver.ms.changefeeds.pause("cf")
    driver.run_until(lambda t: all(not c.tables for c in t.commits), max_ticks=20)
    driver.ms.changefeeds.resume("cf")
    steps = []
    for _ in range(5):
        owner = driver.tick().owner
        work = {c: w for c in owner.messages if (w := owner.run_config(c))}
        states = {t.state for t in owner.changefeeds["cf"].tables}
        steps.append((moving(OwnerStep(owner, work)), states))
    assert [m for m, _ in steps] == [["cf"], ["cf"], ["cf"], [], []], steps
    assert steps[3][1] == {"replicating"}
    driver.run_until(lambda t: driver.caught_up(t, upstream.resolved), max_ticks=30)
    check_downstream(sink_uri)
