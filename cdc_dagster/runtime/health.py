"""A changefeed's health as the owner judges it each tick: what keeps it from moving.

The sources of a message, in the order the message gives them:

1. no capture is alive (nothing can replicate);
2. a table's replication set failed (the coordinator froze it): the changefeed fails;
3. the problems the parts that ran into them recorded (:mod:`cdc_dagster.metastore.problems`:
   a capture's sink or change-log error, a puller that cannot read the binlog, a DDL the
   downstream refuses); a fatal one fails the changefeed, and so does one that has lasted
   longer than ``fail_after_s`` (TiCDC's "error stuck" duration);
4. a resolved ts that has not moved for ``stall_s`` (the change log's producer is stuck),
   unless a chunked snapshot holds it and that snapshot has moved within ``stall_s`` (a
   table being snapshotted holds the resolved ts until its last chunk is placed: that is
   progress, not a stall); a snapshot that stood still as long is named instead. The
   tables holding it moving (fewer of them left at it, or rows written to them: the
   counters their primaries report) and a snapshot's end are progress too, for
   ``stall_s``: after a large snapshot the captures write its rows table after table, the
   resolved ts held until the last one is written;
5. a checkpoint that has not moved for ``stall_s`` while the resolved ts is ahead of it (a
   DDL every table reached is not applied: the message names it; else a table is stuck:
   the message names the slowest ones, their state and holder); as in 4, the tables
   holding it moving is progress: a large table whose rows, all at one snapshot ts, are
   written slice by slice over many ticks holds the checkpoint until its last slice while
   its rows applied grow. A table whose counter stands still as long is named. Any change
   of a counter is motion, a capture registered anew (its counters back to 0) included. A
   chunked snapshot that moved or ended within ``stall_s`` is motion too: its table holds
   the checkpoint while it is read, and after its end until the first slice of its rows is
   written (on 2 cores a 10M-row table's first slice came ~40 s after its reads ended, its
   resolved ts moved meanwhile: "not moved for 76 s" while all was well).

6. what the sink's upkeep says while it fails (a Delta sink's vacuum: the owner reads the
   writers' failure records, ``cdc_dagster.sinks.delta_vacuum``): replication goes on, the
   lake grows.

No message: the changefeed is normal. The conditions of 1, 4, 5 and 6 never fail it: they heal
by themselves when their cause is gone, and they say what to do meanwhile.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cdc_dagster.metastore.problems import Problem
from cdc_dagster.runtime.progress import TableProgress
from scheduler_core.ts import format_ts

DEFAULT_STALL_S = 60.0
DEFAULT_FAIL_AFTER_S = 30 * 60.0
NO_CAPTURES = (
    "no captures are alive, so nothing replicates: register one with "
    "`cdc-dagster capture add NAME` (or start the server with `--captures N`)"
)


@dataclass(frozen=True, slots=True)
class HealthConfig:
    """How long a ts may stand still, and a problem may last, before the owner says so."""

    stall_s: float = DEFAULT_STALL_S
    fail_after_s: float = DEFAULT_FAIL_AFTER_S


@dataclass(slots=True)
class Motion:
    """When the changefeed's resolved ts and checkpoint last moved (the owner's memory;
    a new owner starts watching from its first tick)."""

    resolved_ts: int = 0
    resolved_moved_ms: int = 0
    checkpoint_ts: int = 0
    checkpoint_moved_ms: int = 0
    # the tables at the resolved ts and at the checkpoint (those holding each): how many,
    # and the rows written to them (``TableProgress.rows_applied``, as their primaries
    # report it); when that last changed (they move while the ts waits for the last one: a
    # large snapshot's tables are written a few at a time, a large table slice by slice)
    holding: tuple[int, int] = (0, 0)
    holding_moved_ms: int = 0
    behind: tuple[int, int] = (0, 0)
    behind_moved_ms: int = 0
    # when a chunked snapshot of the changefeed's tables last moved or ended, as the owner
    # saw it (``SnapshotMotion.progress_ms``), kept once the owner stops watching them (when
    # the resolved ts moves again): a large table's first slices are written after that
    snapshot_moved_ms: int = 0

    def observe(
        self,
        checkpoint_ts: int,
        resolved_ts: int,
        now_ms: int,
        tables: Sequence[TableProgress] = (),
    ) -> None:
        """Note this tick's checkpoint and resolved ts (and where its ``tables`` are)."""
        if resolved_ts != self.resolved_ts or not self.resolved_moved_ms:
            self.resolved_ts, self.resolved_moved_ms = resolved_ts, now_ms
        if checkpoint_ts != self.checkpoint_ts or not self.checkpoint_moved_ms:
            self.checkpoint_ts, self.checkpoint_moved_ms = checkpoint_ts, now_ms
        holding = _at(tables, "resolved_ts", resolved_ts)
        if holding != self.holding or not self.holding_moved_ms:
            self.holding, self.holding_moved_ms = holding, now_ms
        behind = _at(tables, "checkpoint_ts", checkpoint_ts)
        if behind != self.behind or not self.behind_moved_ms:
            self.behind, self.behind_moved_ms = behind, now_ms


def _at(tables: Sequence[TableProgress], ts: str, value: int) -> tuple[int, int]:
    """How many ``tables`` are at or below ``value`` in ``ts``, and the rows written to them."""
    at = [t for t in tables if getattr(t, ts) <= value]
    return len(at), sum(t.rows_applied for t in at)


@dataclass(slots=True)
class SnapshotMotion:
    """When the chunked snapshots of the changefeed's tables last moved (chunks read or
    placed): ``lines`` say where each unfinished one is (empty: none is under way)."""

    signature: object = None
    moved_ms: int = 0
    lines: tuple[str, ...] = ()
    looked_ms: int = 0  # when it was last observed
    progress_ms: int = 0  # when one under way moved or ended (0: none seen under way)

    def observe(self, signature: object, lines: Sequence[str], now_ms: int) -> None:
        """Note the snapshots' progress now (``signature`` changes whenever it moves)."""
        if signature != self.signature or not self.moved_ms:
            if lines or self.lines:  # under way, or it was and has ended
                self.progress_ms = now_ms
            self.signature, self.moved_ms = signature, now_ms
        self.lines, self.looked_ms = tuple(lines), now_ms


@dataclass(frozen=True, slots=True)
class Health:
    """The owner's verdict: ``message`` None is normal; ``failed`` stops the changefeed."""

    message: str | None = None
    failed: bool = False


def judge(
    *,
    alive: bool,
    table_failure: str | None,
    problems: Mapping[str, Problem],
    motion: Motion,
    tables: Sequence[TableProgress],
    now_ms: int,
    config: HealthConfig,
    producer: str,
    ready_ddls: Sequence[str] = (),
    source_resolved_ts: int = 0,
    snapshots: SnapshotMotion | None = None,
    notices: Sequence[str] = (),
) -> Health:
    """The changefeed's health this tick (see the module docstring). ``ready_ddls``: the
    DDLs whose barrier every table reached, not applied yet (named in a stall).
    ``source_resolved_ts``: how far the change log itself is resolved (0: unknown); past
    the changefeed's resolved ts, a stuck resolved ts is the captures', not the producer's.
    ``snapshots``: the chunked snapshots under way that hold the resolved ts (None: not
    looked at). ``notices``: what is wrong without holding the changefeed up (a sink's
    upkeep failing: the lake grows); said after the rest, never failing it."""
    parts: list[str] = []
    failed = False
    if not alive:
        parts.append(NO_CAPTURES)
    if table_failure:
        parts.append(f"a table failed and is frozen: {table_failure}; resume the changefeed")
        failed = True
    for source, problem in sorted(problems.items()):
        lasted_s = (now_ms - problem.since_ms) / 1000 if problem.since_ms else 0.0
        too_long = lasted_s > config.fail_after_s
        failed = failed or problem.fatal or too_long
        parts.append(_problem_line(source, problem, lasted_s, too_long))
    stalled = _stalls(
        motion, tables, now_ms, config.stall_s, producer, ready_ddls, source_resolved_ts,
        snapshots,
    )  # fmt: skip
    if stalled and not problems and alive:
        parts.append(stalled)
    parts += notices
    return Health("; ".join(parts) or None, failed)


def _problem_line(source: str, problem: Problem, lasted_s: float, too_long: bool) -> str:
    tail = (
        " (cannot be retried: fix it, then `cdc-dagster changefeed resume`)"
        if problem.fatal
        else f" (retried {problem.attempts} times over {lasted_s:.0f} s"
        + ("; gave up: fix it, then `cdc-dagster changefeed resume`)" if too_long else ")")
    )
    return f"[{source}] {problem.message}{tail}"


def _stalls(
    motion: Motion,
    tables: Sequence[TableProgress],
    now_ms: int,
    stall_s: float,
    producer: str,
    ready_ddls: Sequence[str] = (),
    source_resolved_ts: int = 0,
    snapshots: SnapshotMotion | None = None,
) -> str:
    resolved_still_s = (now_ms - motion.resolved_moved_ms) / 1000
    held = motion.resolved_moved_ms and resolved_still_s > stall_s
    if held and snapshots and snapshots.lines:
        snapshot_still_s = (now_ms - snapshots.moved_ms) / 1000
        if snapshot_still_s <= stall_s:
            # held by a snapshot that moves: progress (``changefeed query`` shows it); as
            # ever, a resolved ts standing still is judged before a checkpoint doing so
            return ""
        shown = "; ".join(snapshots.lines[:3]) + (
            f"; and {len(snapshots.lines) - 3} more" if len(snapshots.lines) > 3 else ""
        )
        return (
            f"the resolved ts has not moved for {resolved_still_s:.0f} s (it is "
            f"{format_ts(motion.resolved_ts)}): it waits for the snapshot of "
            f"{len(snapshots.lines)} table(s), which has not moved for {snapshot_still_s:.0f} s "
            f"({shown}); see the `mysql_snapshot` runs in Dagster, which read its chunks, and "
            f"the `mysql_puller` runs, which place them (a run failing or not launched)"
        )
    if held:
        progress_ms = max(motion.holding_moved_ms, snapshots.progress_ms if snapshots else 0)
        if (now_ms - progress_ms) / 1000 <= stall_s:
            # the tables holding it move (written one after another after a large
            # snapshot), or a snapshot ended: progress, judged before the checkpoint as above
            return ""
        if source_resolved_ts > motion.resolved_ts and tables:
            return (
                f"the resolved ts has not moved for {resolved_still_s:.0f} s (it is "
                f"{format_ts(motion.resolved_ts)}) though the change log is resolved to "
                f"{format_ts(source_resolved_ts)}: the tables behind are not advanced by the "
                f"captures holding them: {_slowest(tables, 'resolved_ts')}; see those "
                "captures' runs in Dagster (a run frozen, failing or not launched)"
            )
        return (
            f"the resolved ts has not moved for {resolved_still_s:.0f} s (it is "
            f"{format_ts(motion.resolved_ts)}): {producer} is not advancing it; see its "
            "runs or process, and the change log's resolved marks"
        )
    checkpoint_still_s = (now_ms - motion.checkpoint_moved_ms) / 1000
    if (
        motion.checkpoint_moved_ms
        and checkpoint_still_s > stall_s
        and motion.resolved_ts > motion.checkpoint_ts
        and (now_ms - motion.behind_moved_ms) / 1000 > stall_s  # its tables stand still too
        # ... and no snapshot moved or ended within the stall time (4 and 5 as one: its
        # table holds the checkpoint through its reads, and after them until its first
        # slice is written, which can come after its resolved ts moved)
        and (now_ms - max(motion.snapshot_moved_ms, snapshots.progress_ms if snapshots else 0))
        / 1000
        > stall_s
    ):
        if ready_ddls:
            return (
                f"the checkpoint has not moved for {checkpoint_still_s:.0f} s (it is "
                f"{format_ts(motion.checkpoint_ts)}): it waits for the DDL(s) "
                f"{'; '.join(ready_ddls)}, which every table it blocks has reached but nothing "
                "has applied yet: see the `apply_ddl` runs (a DDL gate that stays closed names "
                "the tables it waits for)"
            )
        return (
            f"the checkpoint has not moved for {checkpoint_still_s:.0f} s (it is "
            f"{format_ts(motion.checkpoint_ts)}, resolved {format_ts(motion.resolved_ts)}): "
            f"slowest tables {_slowest(tables, 'checkpoint_ts')}; see those captures' runs in "
            "Dagster"
        )
    return ""


def _slowest(tables: Sequence[TableProgress], ts: str) -> str:
    """The three tables lowest in ``ts`` (checkpoint_ts or resolved_ts), named with their
    state and capture."""
    slowest = sorted(tables, key=lambda t: (getattr(t, ts), t.table_id))[:3]
    what = ts.removesuffix("_ts")
    return ", ".join(
        f"{t.name or t.table_id} ({t.state}"
        + (f" on {t.capture_id}" if t.capture_id else ", held by no capture")
        + f", {what} {format_ts(getattr(t, ts)) if getattr(t, ts) else 'none'})"
        for t in slowest
    )
