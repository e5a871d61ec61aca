"""Changefeed states tell the truth and one changefeed's failure stays its own (issue 18).

The in-process driver runs the owner and the captures with the durable fake executor; a
capture ticks every changefeed it holds tables of, each isolated from the others, as a
Dagster capture run does (``CaptureTick``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from upstream_helpers import Upstream, table

from cdc_dagster.metastore import ChangefeedState, Metastore, connect
from cdc_dagster.runtime.health import NO_CAPTURES, HealthConfig
from cdc_dagster.schema import DdlRecord
from cdc_dagster.sinks.base import SinkDDLError
from cdc_dagster.testing.driver import Driver, DriverTick
from cdc_dagster.testing.fake_runtime import FakeSink


def caught_up(tick: DriverTick, cf: str, upto_ts: int) -> bool:
    feed = tick.owner.changefeeds.get(cf)
    return bool(feed and feed.tables) and all(
        t.replicating and t.checkpoint_ts >= upto_ts for t in feed.tables
    )


def ticks_to_catch_up(driver: Driver, cf: str, upto_ts: int, max_ticks: int = 40) -> int:
    return driver.run_until(lambda t: caught_up(t, cf, upto_ts), max_ticks=max_ticks)


def test_a_broken_sink_warns_its_changefeed_only_and_heals_when_fixed(
    tmp_path: Path,
    make_driver: Callable[..., Driver],
    upstream: Upstream,
    metastore: Metastore,
    etcd_endpoints: list[str],
) -> None:
    target = upstream.ts(5000)
    upstream.advance(target)
    # Alone (a cluster of its own): how many ticks the healthy changefeed takes.
    with connect(etcd_endpoints, cluster_id=f"{metastore.layout.cluster_id}x") as ms_alone:
        alone = Driver(
            tmp_path / "alone",
            upstream.root,
            f"file://{tmp_path / 'ds-alone'}",
            2,
            metastore=ms_alone,
            start_ts=upstream.start_ts,
        )
        ticks_alone = ticks_to_catch_up(alone, "cf", target)

    driver = make_driver(captures=2)
    broken = tmp_path / "broken-sink"
    broken.write_text("a file where the downstream's directory should be")
    driver.add_changefeed("bad", f"file://{broken}", start_ts=upstream.start_ts)
    ticks_with_bad = ticks_to_catch_up(driver, "cf", target)
    assert ticks_with_bad <= ticks_alone, "the healthy changefeed was held up by the broken one"

    status = metastore.changefeeds.get("bad").status
    assert status.state is ChangefeedState.WARNING
    assert "[capture-" in status.last_error and str(broken) in status.last_error
    assert metastore.changefeeds.get("cf").status.state is ChangefeedState.NORMAL
    # The broken changefeed is retried with backoff, not every tick.
    waited = [why for t in [driver.tick() for _ in range(3)] for why in t.failed.values()]
    assert any("before retrying" in why for why in waited)

    broken.unlink()  # the cause goes away: it heals by itself
    deadline = time.monotonic() + 120
    while not caught_up(driver.tick(), "bad", target):
        assert time.monotonic() < deadline, metastore.changefeeds.get("bad").status
        time.sleep(0.5)
    healed = driver.tick()
    status = metastore.changefeeds.get("bad").status
    assert (status.state, status.last_error) == (ChangefeedState.NORMAL, "")
    assert metastore.problems.of("bad") == {} and healed.owner.health["bad"].message is None


def test_a_changefeed_with_no_alive_capture_says_how_to_add_one_until_one_comes(
    make_driver: Callable[..., Driver], upstream: Upstream, metastore: Metastore
) -> None:
    driver = make_driver(captures=0)
    driver.tick()  # the change log has not reached the start yet: waiting, and no capture
    status = metastore.changefeeds.get("cf").status
    assert status.state is ChangefeedState.WARNING and status.last_error == NO_CAPTURES
    target = upstream.ts(3000)
    upstream.advance(target)
    driver.tick()
    assert metastore.changefeeds.get("cf").status.last_error == NO_CAPTURES
    driver.add_capture("capture-0")
    ticks_to_catch_up(driver, "cf", target)
    status = metastore.changefeeds.get("cf").status
    assert (status.state, status.last_error) == (ChangefeedState.NORMAL, "")


def test_a_resolved_ts_that_stops_moving_warns_naming_the_producer_then_clears(
    make_driver: Callable[..., Driver], upstream: Upstream, metastore: Metastore
) -> None:
    driver = make_driver(captures=1, health=HealthConfig(stall_s=1.0))
    target = upstream.ts(3000)
    upstream.advance(target)
    ticks_to_catch_up(driver, "cf", target)
    time.sleep(1.2)  # the producer (this test) stops advancing the resolved marks
    driver.tick()
    status = metastore.changefeeds.get("cf").status
    assert status.state is ChangefeedState.WARNING
    assert "resolved ts has not moved" in status.last_error
    assert str(upstream.root) in status.last_error  # who should be advancing it
    upstream.advance(upstream.ts(4000))
    ticks_to_catch_up(driver, "cf", upstream.ts(4000))
    driver.tick()
    assert metastore.changefeeds.get("cf").status.state is ChangefeedState.NORMAL


def test_a_resolved_ts_held_by_a_moving_snapshot_stays_normal_and_a_stuck_one_is_named(
    make_driver: Callable[..., Driver], upstream: Upstream, metastore: Metastore
) -> None:
    """A table snapshotted in chunks holds the resolved ts for as long as its snapshot takes
    (the binlog puller's state lists it; its chunk files say how far it is): while chunks
    are read and placed the changefeed is normal, not "not moved for 106 s"; a snapshot
    that stands still is named with where it is; its end lets the resolved ts go on."""
    from cdc_dagster.mysql.snapshots import Chunk, Plan, generation_dir, mark_done, write_plan
    from cdc_dagster.mysql.state import PullerState, save_state

    driver = make_driver(captures=1, health=HealthConfig(stall_s=1.0))
    target = upstream.ts(3000)
    upstream.advance(target)
    ticks_to_catch_up(driver, "cf", target)
    generation = upstream.ts(2500)
    save_state(upstream.root, PullerState({0: "0-1-9"}, target, tables={1: table(1)},
                                          snapshots={1: generation}))  # fmt: skip
    write_plan(upstream.root, Plan(1, generation, ((None, None),), rows=40, chunk_rows=10))
    gen_dir = generation_dir(upstream.root, 1, generation)

    def place(n: int) -> None:
        mark_done(gen_dir, Chunk(0, n, {0: "0-1-9"}, None, None, False, 10, 1), fsync=False)

    deadline = time.monotonic() + 3.0  # three stall times: the resolved ts stands still
    n = 0
    while time.monotonic() < deadline:
        place(n)  # the snapshot moves: a chunk placed every 0.2 s
        n += 1
        time.sleep(0.2)
        driver.tick()
        status = metastore.changefeeds.get("cf").status
        assert status.state is ChangefeedState.NORMAL, status.last_error
    time.sleep(0.3)  # the owner looks at the snapshot at most every quarter stall time
    driver.tick()  # ... and sees its last chunk
    time.sleep(1.6)  # the snapshot stands still past the stall time
    driver.tick()
    status = metastore.changefeeds.get("cf").status
    assert status.state is ChangefeedState.WARNING
    assert "it waits for the snapshot of 1 table(s), which has not moved" in status.last_error
    assert f"snapshot of db.t1: chunks {n}/" in status.last_error
    assert "`mysql_snapshot` runs" in status.last_error
    # The snapshot complete (the puller's state forgets it), the resolved ts moves on.
    save_state(upstream.root, PullerState({0: "0-1-9"}, target, tables={1: table(1)}))
    upstream.advance(upstream.ts(4000))
    ticks_to_catch_up(driver, "cf", upstream.ts(4000))
    driver.tick()
    assert metastore.changefeeds.get("cf").status.state is ChangefeedState.NORMAL


class _OneTsSlices:
    """Table 1 of the fake data plane as a large table whose rows all share one commit ts
    (a snapshot's): its checkpoint stops at ``held_ts`` while each sink phase writes a slice
    of its rows (its rows applied grow) as long as ``writing``; released, it moves on."""

    def __init__(self, held_ts: int) -> None:
        self.held_ts = held_ts
        self.writing = True
        self.released = False
        self.slices = 0

    def factory(self, spec: Any) -> Any:
        from cdc_dagster.testing.fake_runtime import fake_executor_factory

        executor = fake_executor_factory(spec)
        sink = executor._sink

        def one_ts_sink(table_id: int, table: Any) -> bool:
            if table_id != 1 or self.released:
                return sink(table_id, table)
            if table.checkpoint_ts < self.held_ts:  # up to the snapshot's ts: as ever
                saved = table.resolved_ts
                table.resolved_ts = min(saved, self.held_ts)
                ok = sink(table_id, table)
                table.resolved_ts = saved
                return ok
            if self.writing:  # a slice of the rows at the snapshot's ts: rows, no checkpoint
                table.writes += 1
                self.slices += 1
            return True

        executor._sink = one_ts_sink
        return executor


def _state_while_ticking(driver: Driver, upstream: Upstream, metastore: Metastore,
                         seconds: float) -> list[tuple[ChangefeedState, str]]:  # fmt: skip
    """Tick for ``seconds`` with the upstream moving on; the changefeed's state each tick."""
    seen = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        upstream.advance(upstream.resolved + (100 << 18))
        driver.tick()
        status = metastore.changefeeds.get("cf").status
        seen.append((status.state, status.last_error))
        time.sleep(0.2)
    return seen


def _until_replicating_at(driver: Driver, held: int) -> None:
    """Tick until the changefeed's four tables replicate and its checkpoint is at ``held``."""
    driver.run_until(
        lambda t: (
            (feed := t.owner.changefeeds.get("cf")) is not None
            and len(feed.tables) == 4
            and all(x.replicating for x in feed.tables)
            and feed.checkpoint_ts == held
        ),
        max_ticks=40,
    )


def test_a_large_table_written_slice_by_slice_at_one_ts_stays_normal_until_its_rows_stop(
    make_driver: Callable[..., Driver], upstream: Upstream, metastore: Metastore
) -> None:
    """The false alarm a user saw: one 10M-row table of a snapshot, its rows at one commit
    ts, written by its capture in slices over many ticks; the checkpoint cannot pass that
    ts before the last slice, for minutes. Its capture reports the rows it applies, the
    owner sees them move: normal, not "the checkpoint has not moved for 70 s". Once no row
    is written for the stall time, the table is named; when it is done, normal again."""
    held = upstream.ts(2000)
    upstream.advance(upstream.ts(3000))
    slices = _OneTsSlices(held)
    driver = make_driver(
        captures=2, health=HealthConfig(stall_s=1.0), executor_factory=slices.factory
    )
    _until_replicating_at(driver, held)
    before = slices.slices
    seen = _state_while_ticking(driver, upstream, metastore, seconds=3.0)  # three stall times
    assert slices.slices - before >= len(seen)  # a slice every tick, the checkpoint held
    assert all(state is ChangefeedState.NORMAL for state, _ in seen), seen
    feed = driver.tick().owner.changefeeds["cf"]
    (large,) = [t for t in feed.tables if t.table_id == 1]
    assert feed.checkpoint_ts == held and large.checkpoint_ts == held
    assert large.rows_applied >= slices.slices - 2  # the primary's count, a tick or two late

    slices.writing = False  # the capture stops writing it: a real stall
    stopped = time.monotonic()
    deadline = stopped + 30
    while (status := metastore.changefeeds.get("cf").status).state is ChangefeedState.NORMAL:
        assert time.monotonic() < deadline, "a table whose rows stopped was never named"
        _state_while_ticking(driver, upstream, metastore, seconds=0.1)
    assert time.monotonic() - stopped > 1.0  # not before the stall time
    assert status.state is ChangefeedState.WARNING, status
    error = status.last_error
    assert "the checkpoint has not moved for" in error and "slowest tables db.t1 (" in error

    slices.released = True  # its last slice written: the checkpoint moves on
    ticks_to_catch_up(driver, "cf", upstream.resolved)
    driver.tick()
    assert metastore.changefeeds.get("cf").status.state is ChangefeedState.NORMAL


def test_a_checkpoint_held_from_a_snapshots_reads_to_its_first_slice_stays_normal(
    make_driver: Callable[..., Driver], upstream: Upstream, metastore: Metastore
) -> None:
    """The false alarm of the 10M-row snapshot (bench/throughput_bench.py, 2 cores): its
    table held the checkpoint while it was read (27-45 s; the resolved ts held too) and
    after its reads ended until its first slice was written, its resolved ts moved
    meanwhile: "the checkpoint has not moved for 61-76 s" while all was well. The owner
    watches the snapshot once the checkpoint has stood still for a quarter of the stall
    time (from half, a short read was over before its first look: its end was never seen);
    the snapshot's end is motion for the stall time, after the owner stopped watching it; a
    first slice that never comes is named after that."""
    from cdc_dagster.mysql.snapshots import Chunk, Plan, generation_dir, mark_done, write_plan
    from cdc_dagster.mysql.state import PullerState, save_state

    stall_s = 3.0
    held = upstream.ts(2000)
    upstream.advance(upstream.ts(3000))
    slices = _OneTsSlices(held)
    slices.writing = False  # no row of its slices written yet: its checkpoint stays at held
    driver = make_driver(
        captures=1, health=HealthConfig(stall_s=stall_s), executor_factory=slices.factory
    )
    _until_replicating_at(driver, held)
    checkpoint_held = time.monotonic()  # (it stood at held from before)
    time.sleep(stall_s / 2)  # held a while before the snapshot begins
    target = upstream.ts(4000)  # the resolved ts moves on once more, then the snapshot holds it
    upstream.advance(target)
    driver.run_until(lambda t: t.owner.changefeeds["cf"].resolved_ts == target, max_ticks=40)
    generation = upstream.ts(3500)
    save_state(upstream.root, PullerState({0: "0-1-9"}, target, tables={1: table(1)},
                                          snapshots={1: generation}))  # fmt: skip
    write_plan(upstream.root, Plan(1, generation, ((None, None),), rows=40, chunk_rows=10))
    gen_dir = generation_dir(upstream.root, 1, generation)
    deadline = time.monotonic() + 0.4 * stall_s  # its reads: shorter than half the stall time
    n = 0
    while time.monotonic() < deadline:
        mark_done(gen_dir, Chunk(0, n, {0: "0-1-9"}, None, None, False, 10, 1), fsync=False)
        n += 1
        time.sleep(0.1)
        driver.tick()
        status = metastore.changefeeds.get("cf").status
        assert status.state is ChangefeedState.NORMAL, status.last_error
    # The reads end (the puller's state forgets the snapshot); the owner sees it ...
    save_state(upstream.root, PullerState({0: "0-1-9"}, target, tables={1: table(1)}))
    time.sleep(stall_s / 4 + 0.1)  # the owner looks at most every quarter stall time
    driver.tick()
    # ... and the resolved ts moves on (the table's first slice pulled, none written yet):
    # the checkpoint has stood for more than the stall time, its table's rows too
    ended = time.monotonic()
    seen = _state_while_ticking(driver, upstream, metastore, seconds=stall_s / 4)
    feed = driver.tick().owner.changefeeds["cf"]
    assert feed.checkpoint_ts == held and feed.resolved_ts > target
    assert time.monotonic() - checkpoint_held > stall_s, "the checkpoint was not held long"
    # (the slices' first rows, next, are seen a tick or two later: within the stall time)
    assert time.monotonic() - ended < stall_s / 2, "too slow to see it within the stall time"
    assert all(state is ChangefeedState.NORMAL for state, _ in seen), seen
    # its slices are written: normal on (their rows move), as before
    slices.writing = True
    seen = _state_while_ticking(driver, upstream, metastore, seconds=stall_s)
    assert all(state is ChangefeedState.NORMAL for state, _ in seen), seen
    # the first slice never written: named once the snapshot ended longer ago than that
    slices.writing = False
    stopped = time.monotonic()
    deadline = stopped + 30
    while (status := metastore.changefeeds.get("cf").status).state is ChangefeedState.NORMAL:
        assert time.monotonic() < deadline, "a table whose rows stopped was never named"
        _state_while_ticking(driver, upstream, metastore, seconds=0.1)
    assert time.monotonic() - stopped > stall_s and time.monotonic() - ended > stall_s
    assert "the checkpoint has not moved for" in status.last_error
    assert "slowest tables db.t1 (" in status.last_error


def test_a_removed_changefeed_leaves_no_problem_behind(
    tmp_path: Path, make_driver: Callable[..., Driver], upstream: Upstream, metastore: Metastore
) -> None:
    driver = make_driver(captures=1)
    broken = tmp_path / "broken"
    broken.write_text("x")
    driver.add_changefeed("bad", f"file://{broken}", start_ts=upstream.start_ts)
    upstream.advance(upstream.ts(2000))
    for _ in range(4):
        driver.tick()
    assert metastore.problems.of("bad")
    metastore.changefeeds.remove("bad")
    assert metastore.problems.of("bad") == {}


def test_a_ddl_the_sink_refuses_stops_neither_the_owner_nor_the_other_changefeed(
    tmp_path: Path,
    make_driver: Callable[..., Driver],
    upstream: Upstream,
    metastore: Metastore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    refusing = tmp_path / "refusing"
    real_apply_ddl = FakeSink.apply_ddl

    def apply_ddl(self: FakeSink, changefeed_id: str, record: DdlRecord, before: object) -> None:
        if self.downstream.root == refusing:  # this downstream refuses every DDL
            raise SinkDDLError(f"downstream {refusing} refused {record.query}")
        real_apply_ddl(self, changefeed_id, record, before)  # type: ignore[arg-type]

    monkeypatch.setattr(FakeSink, "apply_ddl", apply_ddl)
    driver = make_driver(captures=1)
    driver.add_changefeed("bad", f"file://{refusing}", start_ts=upstream.start_ts)
    upstream.create(9, upstream.ts(2000))  # a CREATE TABLE after the start: applied downstream
    upstream.table_ids.append(9)
    target = upstream.ts(4000)
    upstream.advance(target)
    ticks_to_catch_up(driver, "cf", target)  # the owner kept ticking; cf got the new table
    assert 9 in {t.table_id for t in driver.tick().owner.changefeeds["cf"].tables}
    status = metastore.changefeeds.get("bad").status
    assert status.state is ChangefeedState.WARNING
    assert "[ddl] applying DDL 'CREATE TABLE db.t9'" in status.last_error
    assert "refused CREATE TABLE db.t9" in status.last_error


def test_a_ddl_that_is_never_applied_warns_naming_it_instead_of_staying_normal(
    make_driver: Callable[..., Driver], upstream: Upstream, metastore: Metastore
) -> None:
    """Found by the fault matrix: a changefeed held at a DDL's barrier whose run never came
    stayed "normal" for ten minutes. No DDL run here at all (the driver launches none)."""
    from cdc_dagster.schema import DdlRecord as Record
    from scheduler_core.ddl import DDLKind

    driver = make_driver(captures=1, health=HealthConfig(stall_s=1.0), apply_gated=False)
    at = upstream.ts(2000)
    upstream.writer.write_ddl(
        Record(at, DDLKind.TRUNCATE_TABLE, "truncate_table", "TRUNCATE TABLE db.t1", (1,))
    )
    upstream.advance(upstream.ts(4000))
    driver.run_until(
        lambda t: any(
            x.table_id == 1 and x.checkpoint_ts >= at for x in t.owner.changefeeds["cf"].tables
        ),
        max_ticks=30,
    )
    deadline = time.monotonic() + 30
    while metastore.changefeeds.get("cf").status.state is not ChangefeedState.WARNING:
        assert time.monotonic() < deadline, metastore.changefeeds.get("cf").status
        upstream.advance(upstream.resolved + 1)  # the upstream goes on
        driver.tick()
        time.sleep(0.3)
    error = metastore.changefeeds.get("cf").status.last_error
    assert "TRUNCATE TABLE db.t1" in error, error


def test_a_captures_changefeeds_run_their_halves_side_by_side(
    tmp_path: Path, make_driver: Callable[..., Driver], upstream: Upstream
) -> None:
    """A capture tick's halves run its changefeeds concurrently: each changefeed's first
    pull waits at a rendezvous for the other's, which it reaches only if the two run side
    by side (one after another, the first would wait out the timeout and fail)."""
    import threading

    from cdc_dagster.testing.fake_runtime import fake_executor_factory

    rendezvous = threading.Barrier(2, timeout=20)
    met: set[str] = set()

    def factory(spec: Any) -> Any:
        executor = fake_executor_factory(spec)
        pull = executor.pull_phase

        def pull_phase() -> None:
            if spec.changefeed_id not in met and executor.statuses():
                met.add(spec.changefeed_id)
                rendezvous.wait()
            pull()

        executor.pull_phase = pull_phase
        return executor

    target = upstream.ts(3000)
    upstream.advance(target)
    driver = make_driver(captures=1, executor_factory=factory)
    driver.add_changefeed("other", f"file://{tmp_path / 'ds-other'}", start_ts=upstream.start_ts)
    for cf in ("cf", "other"):
        ticks_to_catch_up(driver, cf, target)
    assert met == {"cf", "other"} and not rendezvous.broken


def test_a_changefeed_removed_under_a_capture_tick_is_skipped_not_the_captures_failure(
    tmp_path: Path, make_driver: Callable[..., Driver], upstream: Upstream, metastore: Metastore
) -> None:
    """``changefeed remove`` while a capture run holds the changefeed's tables: the run's next
    tick finds it gone. That is not the capture's failure (a failed capture run in the UI for
    a routine admin step): the changefeed is skipped as removed, the others tick."""
    from cdc_dagster.runtime import CaptureTick

    target = upstream.ts(2000)
    upstream.advance(target)
    driver = make_driver(captures=1)
    driver.add_changefeed("other", f"file://{tmp_path / 'ds-other'}", start_ts=upstream.start_ts)
    for cf in ("cf", "other"):
        ticks_to_catch_up(driver, cf, target)
    (capture_id,) = driver.capture_ids
    metastore.changefeeds.remove("other")
    upstream.advance(upstream.ts(4000))
    tick = CaptureTick(
        metastore,
        capture_id,
        {"cf": [], "other": []},
        staging_root=driver.staging_root,
        executor_factory=driver.executor_factory,
        lease_ttl_s=driver.lease_ttl_s,
    )
    lines = tick.prepare()
    commit_lines, _ = tick.commit()
    assert tick.removed == {"other"}
    assert "cf" in tick.prepared and "cf" in tick.committed, lines + commit_lines
    assert any(line.startswith("other: removed") for line in lines), lines
