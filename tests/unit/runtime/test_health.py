"""The owner's verdict on a changefeed's health, one scenario per source of a message."""

from __future__ import annotations

from cdc_dagster.metastore.problems import Problem
from cdc_dagster.runtime.health import NO_CAPTURES, HealthConfig, Motion, SnapshotMotion, judge
from cdc_dagster.runtime.progress import TableProgress
from scheduler_core.ts import compose

NOW = 1_800_000_000_000
CONFIG = HealthConfig(stall_s=60, fail_after_s=1800)
PRODUCER = "the producer of the change log at /cl"


def moving(now: int = NOW) -> Motion:
    m = Motion()
    m.observe(compose(now - 2000), compose(now - 1000), now)
    return m


def table(tid: int, ckpt_ms: int, state: str = "replicating", capture: str = "c1") -> TableProgress:
    return TableProgress(
        "cf", tid, state, capture, compose(ckpt_ms), compose(ckpt_ms), 0, name=f"db.t{tid}"
    )


def verdict(**kw: object):
    args: dict[str, object] = {
        "alive": True,
        "table_failure": None,
        "problems": {},
        "motion": moving(),
        "tables": (),
        "now_ms": NOW,
        "config": CONFIG,
        "producer": PRODUCER,
    }
    args.update(kw)
    return judge(**args)  # type: ignore[arg-type]


def test_a_moving_changefeed_with_captures_and_no_problem_is_normal() -> None:
    health = verdict()
    assert health.message is None and not health.failed


def test_no_alive_capture_warns_with_the_command_to_add_one_and_never_fails() -> None:
    health = verdict(alive=False)
    assert health.message == NO_CAPTURES and "cdc-dagster capture add" in health.message
    assert not health.failed


def test_a_capture_problem_is_shown_whole_with_its_source_and_retries() -> None:
    problem = Problem("sink delta:///proc/nope: FileNotFoundError '/proc/nope'", NOW - 30_000, 4)
    health = verdict(problems={"capture-1": problem})
    assert health.message is not None and not health.failed
    assert health.message.startswith("[capture-1] sink delta:///proc/nope: FileNotFoundError")
    assert "retried 4 times over 30 s" in health.message


def test_a_fatal_problem_fails_the_changefeed_and_says_to_resume() -> None:
    problem = Problem("binlog puller: binlog purged", NOW, fatal=True)
    health = verdict(problems={"puller": problem})
    assert health.failed and "changefeed resume" in (health.message or "")


def test_a_problem_that_lasts_past_the_limit_fails_the_changefeed() -> None:
    young = Problem("sink refused", NOW - 1_799_000)
    old = Problem("sink refused", NOW - 1_801_000)
    assert not verdict(problems={"c1": young}).failed
    aged = verdict(problems={"c1": old})
    assert aged.failed and "gave up" in (aged.message or "")


def test_a_frozen_table_fails_the_changefeed() -> None:
    health = verdict(table_failure="table 7: two primaries")
    assert health.failed and "table 7: two primaries" in (health.message or "")


def test_a_resolved_ts_that_stood_still_past_the_stall_time_names_the_producer() -> None:
    motion = moving(NOW - 61_000)
    motion.observe(motion.checkpoint_ts, motion.resolved_ts, NOW)  # nothing moved since
    health = verdict(motion=motion)
    assert health.message is not None and not health.failed
    assert "resolved ts has not moved for 61 s" in health.message and PRODUCER in health.message
    assert verdict(motion=moving(NOW - 59_000)).message is None  # within the stall time


def test_a_resolved_ts_stuck_below_the_change_logs_names_the_captures_not_the_producer() -> None:
    """A capture frozen (or failing) holds its tables' resolved ts while the producer goes
    on: the message names those tables and their capture, not the producer."""
    motion = moving(NOW - 61_000)
    motion.observe(motion.checkpoint_ts, motion.resolved_ts, NOW)
    tables = (table(1, NOW - 2_000), table(2, NOW - 62_000, capture="c2"))
    health = verdict(motion=motion, tables=tables, source_resolved_ts=compose(NOW - 1_000))
    message = health.message or ""
    assert "resolved ts has not moved for 61 s" in message and PRODUCER not in message
    assert "db.t2 (replicating on c2, resolved" in message and "captures' runs" in message
    # The change log itself no further: the producer it is.
    same = verdict(motion=motion, tables=tables, source_resolved_ts=motion.resolved_ts)
    assert PRODUCER in (same.message or "")


def snapshot(moved_ms: int, tables: int = 1) -> SnapshotMotion:
    snap = SnapshotMotion()
    lines = [f"snapshot of db.t{i}: chunks 3/10 read (2 placed)" for i in range(tables)]
    snap.observe(("sig", 1), lines, moved_ms)
    snap.observe(("sig", 1), lines, NOW)  # nothing moved since moved_ms
    return snap


def test_a_resolved_ts_held_by_a_snapshot_that_moves_is_progress_not_a_stall() -> None:
    """A table being snapshotted in chunks holds the resolved ts until its last chunk is
    placed, for as long as the snapshot takes: while chunks are read or placed, normal."""
    motion = moving(NOW - 300_000)
    motion.observe(motion.checkpoint_ts, motion.resolved_ts, NOW)
    assert verdict(motion=motion, snapshots=snapshot(NOW - 5_000)).message is None
    # The snapshot standing still as long as the stall time: named, with where it is.
    message = verdict(motion=motion, snapshots=snapshot(NOW - 61_000, tables=5)).message or ""
    assert "resolved ts has not moved for 300 s" in message
    assert "snapshot of 5 table(s), which has not moved for 61 s" in message
    assert "db.t0: chunks 3/10 read (2 placed)" in message and "and 2 more" in message
    assert "`mysql_snapshot` runs" in message and PRODUCER not in message
    # No snapshot under way: the producer, as before.
    assert PRODUCER in (verdict(motion=motion, snapshots=SnapshotMotion()).message or "")


def test_a_snapshot_motion_moves_when_its_signature_changes() -> None:
    snap = SnapshotMotion()
    snap.observe((1, 2), ["a"], NOW - 10_000)
    snap.observe((1, 2), ["a"], NOW - 5_000)
    assert snap.moved_ms == NOW - 10_000
    snap.observe((1, 3), ["a"], NOW)
    assert snap.moved_ms == NOW and snap.lines == ("a",)


def test_tables_written_one_after_another_under_a_held_resolved_ts_are_progress() -> None:
    """After a large snapshot the captures write its tables a few per tick; the resolved ts
    waits for the last one. While fewer tables are left at it (or rows are written to
    them), normal; once they stand still for the stall time, the captures are named; a
    capture frozen while others' tables move is still named (they are not at the resolved
    ts)."""
    held = compose(NOW - 200_000)

    def at(tid: int, rows: int = 0) -> TableProgress:
        return TableProgress("cf", tid, "replicating", "c1", held, held, 0, rows, f"db.t{tid}")

    def ahead(tid: int, ms: int) -> TableProgress:
        return TableProgress("cf", tid, "replicating", "c2", compose(ms), compose(ms), 0,
                             name=f"db.t{tid}")  # fmt: skip

    source = compose(NOW - 1_000)
    motion = Motion()
    motion.observe(held, held, NOW - 100_000, [at(i) for i in range(5)])
    motion.observe(held, held, NOW - 30_000, [at(i) for i in range(3)] + [ahead(3, NOW - 2_000),
                                                                        ahead(4, NOW - 2_000)])  # fmt: skip
    tables = [at(i) for i in range(3)] + [ahead(3, NOW - 1_000), ahead(4, NOW - 1_000)]
    motion.observe(held, held, NOW, tables)
    assert verdict(motion=motion, tables=tables, source_resolved_ts=source).message is None
    # rows written to a table holding it: progress too
    rows = Motion()
    rows.observe(held, held, NOW - 100_000, [at(0), at(1)])
    rows.observe(held, held, NOW - 10_000, [at(0, 5_000), at(1)])
    assert (
        verdict(motion=rows, tables=[at(0, 5_000), at(1)], source_resolved_ts=source).message
        is None
    )
    # nothing moved among them for the stall time: the captures holding them are named
    later = NOW + 31_000
    motion.observe(held, held, later, tables)
    message = verdict(motion=motion, tables=tables, source_resolved_ts=source, now_ms=later).message
    assert "resolved ts has not moved for 131 s" in (message or "")
    assert "db.t0 (replicating on c1" in (message or "")
    # a frozen capture's one table stays at it while the other tables move on: named
    frozen = Motion()
    for ms in range(NOW - 90_000, NOW + 1, 10_000):
        frozen.observe(held, held, ms, [at(0), ahead(1, ms - 1_000), ahead(2, ms - 1_000)])
    tables = [at(0), ahead(1, NOW - 1_000), ahead(2, NOW - 1_000)]
    message = verdict(motion=frozen, tables=tables, source_resolved_ts=source).message or ""
    assert "resolved ts has not moved for 90 s" in message and "db.t0" in message


def test_a_checkpoint_held_by_tables_written_one_after_another_is_progress() -> None:
    """The resolved ts moved on, the checkpoint waits for the last of a snapshot's tables the
    captures write a few at a time: normal while fewer are left behind; named once they
    stand still for the stall time."""
    old, new = compose(NOW - 200_000), compose(NOW - 1_000)

    def behind(tid: int) -> TableProgress:
        return TableProgress("cf", tid, "replicating", "c2", old, new, 0, name=f"db.t{tid}")

    def written(tid: int) -> TableProgress:
        return TableProgress("cf", tid, "replicating", "c1", new, new, 0, 100_000, f"db.t{tid}")

    motion = Motion()
    motion.observe(old, old, NOW - 100_000, [behind(i) for i in range(4)])
    motion.observe(old, new, NOW - 20_000, [behind(0), behind(1), written(2), written(3)])
    tables = [behind(0), written(1), written(2), written(3)]
    motion.observe(old, new, NOW, tables)
    assert verdict(motion=motion, tables=tables).message is None
    later = NOW + 61_000
    motion.observe(old, compose(later - 1_000), later, tables)  # the resolved ts moves on
    message = verdict(motion=motion, tables=tables, now_ms=later).message or ""
    assert "checkpoint has not moved for 161 s" in message and "db.t0 (replicating on c2" in message


def test_a_snapshot_that_ended_is_progress_for_the_stall_time_and_one_never_seen_is_not() -> None:
    """The resolved ts held through a snapshot then by the captures writing it: the snapshot's
    end restarts the stall time. With no snapshot ever seen under way, a first look (which
    finds none) does not."""
    motion = moving(NOW - 300_000)
    motion.observe(motion.checkpoint_ts, motion.resolved_ts, NOW)
    snap = SnapshotMotion()
    snap.observe((1, 5), ["snapshot of db.t1: chunks 5/9 read"], NOW - 90_000)
    snap.observe((), [], NOW - 40_000)  # ended
    assert verdict(motion=motion, snapshots=snap).message is None
    assert PRODUCER in (verdict(motion=motion, snapshots=snap, now_ms=NOW + 21_000).message or "")
    none = SnapshotMotion()
    none.observe((), [], NOW - 1_000)
    assert PRODUCER in (verdict(motion=motion, snapshots=none).message or "")


def test_a_checkpoint_behind_a_moving_resolved_ts_names_the_slowest_tables() -> None:
    motion = Motion()
    motion.observe(compose(NOW - 90_000), compose(NOW - 90_000), NOW - 90_000)
    motion.observe(compose(NOW - 90_000), compose(NOW - 1_000), NOW)  # resolved moved, not it
    tables = (
        table(1, NOW - 2_000),
        table(2, NOW - 90_000, "prepare", ""),
        table(3, NOW - 50_000, capture="c2"),
    )
    health = verdict(motion=motion, tables=tables)
    message = health.message or ""
    assert "checkpoint has not moved for 90 s" in message
    assert message.index("db.t2 (prepare, held by no capture") < message.index(
        "db.t3 (replicating on c2"
    )
    assert "db.t1" in message  # the three slowest, slowest first


def test_problems_go_first_and_a_stall_they_explain_is_not_repeated() -> None:
    motion = moving(NOW - 61_000)
    health = verdict(motion=motion, problems={"c1": Problem("sink down", NOW)})
    assert health.message is not None and "has not moved" not in health.message


def test_motion_notes_when_each_ts_last_moved() -> None:
    m = Motion()
    m.observe(10, 20, 1000)
    m.observe(10, 25, 2000)
    assert (m.checkpoint_moved_ms, m.resolved_moved_ms) == (1000, 2000)


def _slicing(rows_at: dict[int, int], start: int, stop: int, step: int = 10_000) -> Motion:
    """A changefeed whose checkpoint waits at one large table (db.t0, all its rows at one
    snapshot ts) while the resolved ts moves on; ``rows_at``: ms -> the rows its primary
    reports applied then (the other table is caught up)."""
    old = compose(NOW - 300_000)
    motion = Motion()
    for ms in range(start, stop + 1, step):
        resolved = compose(ms - 1_000)
        motion.observe(old, resolved, ms, _one_large(rows_at.get(ms, 0), ms))
    return motion


def _one_large(rows: int, ms: int) -> list[TableProgress]:
    old, resolved = compose(NOW - 300_000), compose(ms - 1_000)
    return [
        TableProgress("cf", 0, "replicating", "c1", old, resolved, 0, rows, "db.t0"),
        TableProgress("cf", 1, "replicating", "c2", resolved, resolved, 0, 5, "db.t1"),
    ]


def test_a_large_table_written_slice_by_slice_at_one_ts_keeps_the_changefeed_normal() -> None:
    """10M snapshot rows at one ts, written over many ticks: the checkpoint cannot move
    before the last slice, for minutes; its rows applied grow every tick: normal."""
    start = NOW - 240_000
    grows = {ms: (ms - start) * 1_000 for ms in range(start, NOW + 1, 10_000)}
    motion = _slicing(grows, start, NOW)
    tables = _one_large(grows[NOW], NOW)
    assert verdict(motion=motion, tables=tables).message is None


def test_a_large_table_whose_rows_stop_being_written_warns_after_the_stall_time() -> None:
    start = NOW - 240_000
    stopped_ms = NOW - 60_000  # the last slice written then; nothing since
    rows = {ms: min(ms, stopped_ms) - start for ms in range(start, NOW + 61_000, 10_000)}
    motion = _slicing(rows, start, NOW)
    assert verdict(motion=motion, tables=_one_large(rows[NOW], NOW)).message is None  # 60 s
    later = NOW + 10_000
    motion.observe(
        motion.checkpoint_ts, compose(later - 1_000), later, _one_large(rows[later], later)
    )
    message = verdict(motion=motion, tables=_one_large(rows[later], later), now_ms=later).message
    assert "checkpoint has not moved for 250 s" in (message or "")
    assert "slowest tables db.t0 (replicating on c1" in (message or "")


def test_a_capture_registered_anew_restarts_the_stall_time_once_and_hides_no_stall() -> None:
    """The capture holding the large table is registered anew: its counter goes back to 0.
    That change is motion (the new capture takes the table up), but a counter that then
    stays at 0 is a stall after the stall time, as any other."""
    start = NOW - 240_000
    restart_ms = NOW - 50_000
    ticks = range(start, NOW + 1, 10_000)
    rows = {ms: (ms - start) * 1_000 if ms < restart_ms else 0 for ms in ticks}
    motion = _slicing(rows, start, NOW)
    assert verdict(motion=motion, tables=_one_large(0, NOW)).message is None
    later = NOW + 11_000
    motion.observe(motion.checkpoint_ts, compose(later - 1_000), later, _one_large(0, later))
    message = verdict(motion=motion, tables=_one_large(0, later), now_ms=later).message or ""
    assert "checkpoint has not moved for 251 s" in message and "db.t0" in message


def test_a_checkpoint_held_from_a_snapshots_reads_to_its_first_slice_is_progress() -> None:
    """The false alarm of a 10M-row snapshot on 2 cores: created at -80 s, its reads held
    the resolved ts (and the checkpoint) until -35 s, its first 1M-row slice was pulled at
    -5 s (the resolved ts moved), and written only later: the checkpoint had not moved for
    80 s, its table's rows neither, so "the checkpoint has not moved for 80 s" though the
    snapshot had ended 35 s before. A snapshot that moved or ended within the stall time is
    motion; one that ended longer ago than that is not."""
    old = compose(NOW - 80_000)
    held = [TableProgress("cf", 1, "replicating", "c1", old, old, 0, name="db.t1")]
    motion = Motion()
    motion.observe(old, old, NOW - 80_000, held)
    motion.snapshot_moved_ms = NOW - 35_000  # the owner saw its reads end (owner.py keeps it)
    first_slice = compose(NOW - 40_000)  # its first slice pulled: its resolved ts moves
    pulled = [TableProgress("cf", 1, "replicating", "c1", old, first_slice, 0, name="db.t1")]
    motion.observe(old, first_slice, NOW - 5_000, pulled)
    motion.observe(old, first_slice, NOW, pulled)
    assert verdict(motion=motion, tables=pulled).message is None
    # ... watched still (the resolved ts held): the same from the SnapshotMotion itself
    watched = Motion()
    watched.observe(old, old, NOW - 80_000, held)
    watched.observe(old, first_slice, NOW, pulled)
    snap = SnapshotMotion()
    snap.observe((1, 5), ["snapshot of db.t1: chunks 5/9 read"], NOW - 60_000)
    snap.observe((), [], NOW - 35_000)  # ended
    assert verdict(motion=watched, tables=pulled, snapshots=snap).message is None
    # its first slice never written: named once the snapshot ended longer ago than that
    later = NOW + 26_000
    motion.observe(old, compose(later - 1_000), later, pulled)
    message = verdict(motion=motion, tables=pulled, now_ms=later).message or ""
    assert "checkpoint has not moved for 106 s" in message and "db.t1 (replicating on c1" in message


def test_a_notice_warns_after_the_rest_never_fails_and_hides_no_stall() -> None:
    notice = "[vacuum] the Delta VACUUM of 1 table(s) fails (db.t1)"
    health = verdict(notices=(notice,))
    assert health.message == notice and not health.failed
    stalled = Motion()
    stalled.observe(compose(NOW - 200_000), compose(NOW - 200_000), NOW - 120_000)
    health = verdict(motion=stalled, notices=(notice,))
    assert health.message is not None and not health.failed
    assert "not moved" in health.message and health.message.endswith(notice)
    old = Problem("sink refused", NOW - 3_600_000, 9)  # past fail_after_s: fails, notice kept
    health = verdict(problems={"capture-1": old}, notices=(notice,))
    assert health.failed and health.message.startswith("[capture-1]")
    assert health.message.endswith(notice)
