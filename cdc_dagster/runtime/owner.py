"""The owner tick: election, one snapshot read, a Coordinator per changefeed, one guarded write.

``OwnerLoop.tick()`` is what the owner sensor runs each evaluation (and the driver each
step). Coordinators are cached in the process between ticks and rebuilt from etcd and
the change log on an owner switch or in a new process (a code-server restart is an owner
switch): the checkpoint from the changefeed status, the tables from the change log's
``tables_at(R)`` through the table filter, the DDLs after it (``R`` is the checkpoint when
everything at it is known done, else one below: :func:`rebuild_ts`; re-running a DDL that
already ran is a no-op at the sink), and the captures' reports from their task
keys, turned back into ``HeartbeatResponse``s (epoch = ``<registration>.<owner_rev>``).

DDLs and syncpoints leave the tick as work items: whoever carries one out (a gated
Dagster run, or the driver) calls :func:`apply_ready_ddl` / :func:`apply_syncpoint`,
which act on the sink and then leave a marker in etcd; the owner's next tick sees the
marker and calls ``ddl_done`` / ``syncpoint_done``. Admin requests (move table, drain
capture, rebalance) are keys the owner reads each tick: :mod:`cdc_dagster.admin`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import random
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cdc_dagster import admin, failpoints
from cdc_dagster.metastore import (
    Changefeed,
    ChangefeedProgress,
    ChangefeedState,
    DdlState,
    Metastore,
    OwnerSession,
    OwnerSnapshot,
    TaskStatus,
)
from cdc_dagster.metastore.changefeeds import wall_ms
from cdc_dagster.metastore.errors import LeaseExpiredError, MetastoreError, NotOwnerError
from cdc_dagster.metastore.problems import DDL, PULLER, SYNCPOINT, Problem
from cdc_dagster.mysql.snapshots import snapshot_progress
from cdc_dagster.runtime.health import Health, HealthConfig, Motion, SnapshotMotion, judge
from cdc_dagster.runtime.progress import MISSING, TableProgress
from cdc_dagster.runtime.spec import capture_epoch
from cdc_dagster.runtime.wire import encode
from cdc_dagster.schema import DdlRecord, TableSchema
from cdc_dagster.secrets import redact_text, redact_uri
from cdc_dagster.sinks.base import Sink, SyncpointUnpinnableError
from cdc_dagster.sinks.delta_paths import table_location
from cdc_dagster.sinks.delta_vacuum import EVERY_ENV, VACUUM_EVERY_S, VacuumFailure
from cdc_dagster.sinks.delta_vacuum import failures as vacuum_failures
from cdc_dagster.sinks.uri import OFF, delta_options, delta_root, is_delta, open_sink
from cdc_dagster.upstream.changelog import ChangeLog
from cdc_dagster.upstream.uri import UpstreamError, changelog_path, is_mysql_uri
from scheduler_core.checkpoint import barrier_cap
from scheduler_core.coordinator import Coordinator, CoordinatorConfig, TickResult
from scheduler_core.ddl import DDLEvent, DDLManager
from scheduler_core.errors import InvalidMessageError, SchedulerError
from scheduler_core.messages import Barrier, Header, HeartbeatResponse, OwnerMessage
from scheduler_core.model import Checkpoint, TableState
from scheduler_core.ts import compose, format_ts, physical_ms

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------ results
@dataclass(frozen=True, slots=True)
class ChangefeedTick:
    """One changefeed's tick: its progress, barrier and what the scheduler did."""

    changefeed_id: str
    checkpoint_ts: int
    resolved_ts: int
    barrier: Barrier
    lag_s: float
    scheduler: str | None
    dispatches: int
    finished: bool
    rebuilt: bool
    tables: tuple[TableProgress, ...] = ()


@dataclass(frozen=True, slots=True)
class ReadyDdl:
    """A DDL whose gate is open: apply it (:func:`apply_ready_ddl`); the owner then marks it done."""

    changefeed_id: str
    record: DdlRecord

    def to_config(self) -> dict[str, Any]:
        """JSON-able (a DDL run's config)."""
        return {"changefeed_id": self.changefeed_id, "record": self.record.to_json()}

    @staticmethod
    def from_config(obj: Mapping[str, Any]) -> ReadyDdl:
        """Inverse of :meth:`to_config`."""
        return ReadyDdl(str(obj["changefeed_id"]), DdlRecord.from_json(obj["record"]))

    @property
    def commit_ts(self) -> int:
        """The DDL's commit ts."""
        return self.record.commit_ts

    @property
    def table_ids(self) -> tuple[int, ...]:
        """The existing tables it touches (its gate: their checkpoints reach commit_ts)."""
        return tuple(self.record.table_ids)

    @property
    def query(self) -> str:
        """The statement."""
        return self.record.query


@dataclass(frozen=True, slots=True)
class ReadySyncpoint:
    """A syncpoint every table reached: record it (:func:`apply_syncpoint`)."""

    changefeed_id: str
    ts: int
    table_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class OwnerTick:
    """What one owner tick did, and what the Dagster plane (or the driver) must carry out."""

    is_owner: bool
    owner_id: str | None  # the current owner (this one, another, or None: nobody)
    owner_rev: int
    reason: str = ""  # why nothing happened, when nothing did
    # capture id -> changefeed id -> messages for that capture's run
    messages: Mapping[str, Mapping[str, list[OwnerMessage]]] = field(default_factory=dict)
    changefeeds: Mapping[str, ChangefeedTick] = field(default_factory=dict)
    ready_ddls: tuple[ReadyDdl, ...] = ()
    syncpoints: tuple[ReadySyncpoint, ...] = ()
    admin_errors: tuple[str, ...] = ()
    captures: tuple[str, ...] = ()  # alive captures (dynamic partitions)
    registered: tuple[str, ...] = ()  # desired captures whose lease had expired, registered again
    # every running changefeed's health this tick (no message: normal)
    health: Mapping[str, Health] = field(default_factory=dict)
    revision: int = 0  # the etcd revision the tick read (0: unknown)

    def run_config(self, capture_id: str) -> dict[str, list[dict[str, Any]]]:
        """The capture run's messages per changefeed, JSON-able (decode with wire.decode)."""
        return {cf: encode(msgs) for cf, msgs in self.messages.get(capture_id, {}).items()}


# ------------------------------------------------------------------------------ per changefeed
SEQ_SHIFT = 20  # message seqs of a rebuilt coordinator start at etcd revision << 20
REFEED_TICKS = 3  # an unchanged capture report is fed again this many ticks later


class _Feed:
    """The owner's cached state of one changefeed (rebuildable from etcd at any tick)."""

    def __init__(
        self,
        loop: OwnerLoop,
        cf: Changefeed,
        owner_rev: int,
        ddl_state: DdlState | None,
        revision: int = 0,
    ) -> None:
        info, status = cf.info, cf.status
        self.changefeed_id = info.changefeed_id
        self.epoch = status.epoch
        self.changelog = ChangeLog(changelog_path(info.upstream_uri))
        self.filter = info.filter
        cp = status.checkpoint_ts
        done = ddls_done_upto(cp, ddl_state)
        interval = info.sync_point_interval_s * 1000 or None
        self.ddl_upto = rebuild_ts(cp, done, ddl_state, interval)
        self.schemas: dict[int, TableSchema] = {
            t: s
            for t, s in self.changelog.tables_at(self.ddl_upto).items()
            if self.filter.matches(s.database, s.table)
        }
        ddl = DDLManager(
            self.ddl_upto,
            sync_point_interval_ms=interval,
            target_ts=info.target_ts or None,
            ddl_resolved_ts=self.ddl_upto,
            # Syncpoints hold nothing back: one the previous owner left unrecorded may be
            # below the checkpoint; go on from the last recorded one.
            last_syncpoint_ts=min(ddl_state.last_syncpoint_ts, self.ddl_upto) if ddl_state else 0,
        )
        self.coordinator = Coordinator(
            owner_id=loop.owner_id,
            owner_rev=owner_rev,
            changefeed_epoch=status.epoch,
            checkpoint=Checkpoint(cp, max(cp, status.resolved_ts)),
            tables=sorted(self.schemas),
            rng=random.Random(owner_rev),
            config=loop.config,
            ddl=ddl,
            # A later process of the same owner keeps its owner_rev: its messages must
            # count on from above what the earlier one sent (each etcd revision leaves
            # room for 2^20 messages; every owner tick writes, so revisions move on).
            seq_start=revision << SEQ_SHIFT,
        )
        self.records: dict[tuple[int, str], DdlRecord] = {}
        self.reports: dict[str, tuple[str, TaskStatus]] = {}
        self.ticks = 0
        self.fed_at: dict[str, int] = {}  # capture -> the tick its report was last fed
        self.seq = 0
        self.finished_ddl_ts = done  # every DDL at or below it ran (or preceded the start)
        self.last_syncpoint_ts = ddl_state.last_syncpoint_ts if ddl_state else 0
        self.fresh = True
        self.motion = Motion()
        self.snapshots: SnapshotMotion | None = None  # watched while the resolved ts stands
        self.sink_notices: tuple[str, ...] = ()  # what the sink's upkeep says (_watch_sink)
        self.sink_looked_ms = 0

    def note_ddls_done(self) -> None:
        """Advance ``finished_ddl_ts``: below the first pending DDL, or to the DDL resolved ts."""
        pending = self.coordinator.ddl.pending
        upto = pending[0].commit_ts - 1 if pending else self.ddl_upto
        self.finished_ddl_ts = max(self.finished_ddl_ts, upto)

    def feed_ddls(self) -> None:
        """Queue the change log's DDLs up to its DDL resolved ts (filtered), then advance it."""
        resolved = self.changelog.ddl_resolved_ts()
        if resolved <= self.ddl_upto:
            return
        for rec in self.changelog.ddl_records(after_ts=self.ddl_upto, upto_ts=resolved):
            event = self._filtered(rec)
            if event is not None:
                self.records[(event.commit_ts, event.query)] = rec
                self.coordinator.add_ddl(event)
        self.ddl_upto = resolved
        self.coordinator.advance_ddl_resolved(resolved)

    def _filtered(self, rec: DdlRecord) -> DDLEvent | None:
        creates = tuple(
            t
            for t in rec.creates
            if (s := rec.tables.get(t)) is not None and self.filter.matches(s.database, s.table)
        )
        table_ids = tuple(t for t in rec.table_ids if t in self.schemas)
        for t in creates:
            self.schemas[t] = rec.tables[t]  # type: ignore[assignment]
        if not creates and not table_ids and (rec.table_ids or rec.creates):
            return None  # a DDL on tables outside the filter
        if creates == tuple(rec.creates) and table_ids == tuple(rec.table_ids):
            return rec.to_event()
        try:
            drops = tuple(t for t in rec.drops if t in table_ids)
            return DDLEvent(rec.commit_ts, rec.kind, rec.query, table_ids, creates, drops)
        except InvalidMessageError:
            return rec.to_event()

    def stop_tables(self) -> None:
        """The changefeed is paused (or failed, or finished): every capture drops its tables."""
        coord = self.coordinator
        if len(coord.current_tables):
            empty = np.empty(0, np.int64)
            coord.apply_table_set_change(
                empty, coord.current_tables, coord.checkpoint.checkpoint_ts
            )

    def reports_from(
        self, snapshot: OwnerSnapshot, alive: Mapping[str, str], owner_id: str
    ) -> list[HeartbeatResponse]:
        """Task keys as heartbeat responses: a changed key now, an unchanged one again every
        ``REFEED_TICKS`` ticks. The replication sets answer reports, so a dispatch that was
        lost (sent by an earlier process of this owner just before it went, or to a run
        that never ran) is sent again only when the report that asks for it is fed again."""
        self.ticks += 1
        out = []
        for cid, status in sorted(snapshot.tasks.get(self.changefeed_id, {}).items()):
            reg = alive.get(cid)
            if reg is None:
                continue
            unchanged = _same_report(self.reports.get(cid), reg, status)
            if unchanged and self.ticks - self.fed_at.get(cid, 0) < REFEED_TICKS:
                continue
            self.reports[cid] = (reg, status)
            self.fed_at[cid] = self.ticks
            self.seq += 1
            header = Header(
                status.owner_rev,
                capture_epoch(reg, status.owner_rev),
                status.changefeed_epoch,
                self.seq,
            )
            out.append(
                HeartbeatResponse(header, cid, owner_id, status.tables, status.liveness, reg)
            )
        return out


def _same_report(before: tuple[str, TaskStatus] | None, reg: str, status: TaskStatus) -> bool:
    """Whether a capture's report says what it said when last fed, for the replication sets:
    its rows applied do not count (they are for health; a table written slice by slice at
    one ts changes only them, and the coordinator has nothing to do with that)."""
    if before is None or before[0] != reg:
        return False
    fed = before[1]
    return (fed.owner_rev, fed.changefeed_epoch, fed.liveness) == (
        status.owner_rev,
        status.changefeed_epoch,
        status.liveness,
    ) and fed.tables == status.tables


class _ReportedRows:
    """Each table's rows applied as a capture reports it (its counter since it took the
    table), looked up per capture the first time one of its tables is asked for."""

    def __init__(self, statuses: Mapping[str, TaskStatus]) -> None:
        self._statuses = statuses
        self._by_capture: dict[str, dict[int, int]] = {}

    def of(self, capture_id: str, table_id: int) -> int:
        """The rows ``capture_id`` reports applied to ``table_id`` (0: none, or no report)."""
        rows = self._by_capture.get(capture_id)
        if rows is None:
            status = self._statuses.get(capture_id)
            rows = self._by_capture[capture_id] = status.rows_by_table() if status else {}
        return rows.get(table_id, 0)


# ------------------------------------------------------------------------------ the loop
@dataclass(slots=True)
class _TickState:
    """What one owner tick reads and collects, changefeed by changefeed."""

    snapshot: OwnerSnapshot
    alive: dict[str, str]  # capture id -> registration epoch
    requests: dict[str, list[admin.Request]]
    now_ms: int
    messages: dict[str, dict[str, list[OwnerMessage]]] = field(default_factory=dict)
    ticks: dict[str, ChangefeedTick] = field(default_factory=dict)
    ddls: list[ReadyDdl] = field(default_factory=list)
    syncs: list[ReadySyncpoint] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    progress: dict[str, ChangefeedProgress] = field(default_factory=dict)
    ddl_states: dict[str, DdlState] = field(default_factory=dict)
    registered: tuple[str, ...] = ()


# While a changefeed's resolved ts stands still, its snapshots' progress is read this often
# (at most; a quarter of the stall time when that is shorter).
SNAPSHOT_LOOK_S = 5.0
# A Delta sink's vacuum failures (recorded by the writers: sinks/delta_vacuum.py) are read
# this often per changefeed.
SINK_LOOK_S = 30.0


def sink_notices(sink_uri: str, tables: Iterable[TableSchema]) -> tuple[str, ...]:
    """What the sink's upkeep says about ``tables`` (a changefeed's): a notice while the
    vacuum of some of them fails (a Delta sink whose vacuum is on); else none."""
    if not is_delta(sink_uri) or delta_options(sink_uri).vacuum_retention_hours == OFF:
        return ()
    names = {table_location(s.database, s.table): f"{s.database}.{s.table}" for s in tables}
    failing = [f for f in vacuum_failures(delta_root(sink_uri)) if f.location in names]
    return (vacuum_notice(failing, names),) if failing else ()


def vacuum_notice(failing: list[VacuumFailure], names: Mapping[str, str]) -> str:
    """What a changefeed's state says while vacuums of its tables fail (``failing``, not
    empty; ``names``: location -> ``db.table``)."""
    first = failing[0]
    shown = ", ".join(names[f.location] for f in failing[:5])
    more = f" and {len(failing) - 5} more" if len(failing) > 5 else ""
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(first.since_ms / 1000))
    return (
        f"[vacuum] the Delta VACUUM of {len(failing)} table(s) fails ({shown}{more}), so the "
        f"files their writes replaced stay on disk and the lake grows; {names[first.location]}: "
        f"{first.attempts} failed in a row since {since}, last: {first.message}. Replication "
        f"goes on. Fix what the error says; the next vacuum (after a write, every "
        f"{EVERY_ENV} seconds, {VACUUM_EVERY_S:.0f} by default) clears this. Or turn the vacuum off: pause, "
        "`cdc-dagster changefeed update ID --sink-uri 'delta:///...?vacuum_retention_hours=off'`, "
        "resume"
    )


def _producer(upstream_uri: str) -> str:
    """Who writes a changefeed's change log, for messages."""
    if is_mysql_uri(upstream_uri):
        return f"the binlog puller of {redact_uri(upstream_uri)} (its mysql_puller runs)"
    try:
        return f"the producer of the change log at {changelog_path(upstream_uri)}"
    except UpstreamError:
        return f"the producer of {redact_uri(upstream_uri)}"


class OwnerLoop:
    """The owner: keep or win the election, then one tick over every changefeed."""

    def __init__(
        self,
        metastore: Metastore,
        owner_id: str,
        *,
        lease_ttl_s: int = 30,  # sensor ticks come every 5-8 s at best: span a few
        config: CoordinatorConfig | None = None,
        now_ms: Any = wall_ms,
        table_progress: bool = True,
        health: HealthConfig | None = None,
    ) -> None:
        self.metastore = metastore
        self.owner_id = owner_id
        self.lease_ttl_s = lease_ttl_s
        self.config = config or CoordinatorConfig()
        self.now_ms = now_ms
        self.table_progress = table_progress
        self.health = health or HealthConfig()
        self._session: OwnerSession | None = None
        self._feeds: dict[str, _Feed] = {}
        self._waiting_since: dict[str, int] = {}  # changefeed -> when it began to wait

    # -------------------------------------------------------------- election
    def _ensure_owner(self) -> OwnerSession | None:
        session = self._session
        if session is not None:
            try:
                session.keeper.refresh()
            except LeaseExpiredError:
                session = None
        if session is None:
            election = self.metastore.election
            session = election.attach(self.owner_id)
            if session is not None:
                session.keeper.refresh()
            else:
                session = election.try_campaign(self.owner_id, self.lease_ttl_s)
                if session is not None:
                    # The tick renews the lease: an owner that stops ticking loses it.
                    session.keeper.stop()
        if session is None or (self._session and session.owner_rev != self._session.owner_rev):
            self._feeds.clear()  # another owner_rev: every cached coordinator is stale
        self._session = session
        return session

    def resign(self) -> None:
        """Give up ownership now."""
        if self._session is not None:
            self._session.resign()
        self._session = None
        self._feeds.clear()

    # -------------------------------------------------------------- the tick
    def tick(self) -> OwnerTick:
        """One owner tick (see the module docstring)."""
        session = self._ensure_owner()
        if session is None:
            current = self.metastore.election.current_owner()
            who = current.owner_id if current else None
            return OwnerTick(False, who, current.owner_rev if current else 0, f"owner is {who}")
        try:
            return self._tick(session)
        except NotOwnerError as exc:
            self._session = None
            self._feeds.clear()
            return OwnerTick(False, None, session.owner_rev, str(exc))

    def _tick(self, session: OwnerSession) -> OwnerTick:
        ms = self.metastore
        snapshot = ms.read_owner_snapshot()
        step = _TickState(
            snapshot,
            {cid: info.epoch for cid, info in snapshot.captures.items()},
            admin.pending_requests(ms),
            self.now_ms(),
        )
        step.registered = self._heal_captures(snapshot, step.alive)
        for _, cf in sorted(snapshot.changefeeds.items()):
            self._isolated(session, step, cf)
        failpoints.hit(failpoints.OWNER_BEFORE_WRITE)
        ms.commit_owner_tick(session, snapshot, step.progress, step.ddl_states)
        for cf_id, t in step.ticks.items():
            if t.finished:
                self._finish(session, cf_id)
        return OwnerTick(
            True,
            self.owner_id,
            session.owner_rev,
            "",
            step.messages,
            step.ticks,
            tuple(step.ddls),
            tuple(step.syncs),
            tuple(step.errors),
            tuple(sorted(step.alive)),
            step.registered,
            {cf: Health(p.problem, p.failed) for cf, p in step.progress.items()},
            snapshot.revision,
        )

    def _heal_captures(self, snapshot: OwnerSnapshot, alive: dict[str, str]) -> tuple[str, ...]:
        """Register again every capture the user asked for whose lease expired (a new epoch:
        the sink fences anything late from the old one); they join ``alive``."""
        healed = []
        for capture_id, ttl_s in sorted(snapshot.desired.items()):
            if capture_id in alive:
                continue
            info = self.metastore.captures.register_desired(capture_id, ttl_s)
            if info is not None:
                alive[capture_id] = info.epoch
                healed.append(capture_id)
        return tuple(healed)

    def _isolated(self, session: OwnerSession, step: _TickState, cf: Changefeed) -> None:
        """One changefeed's part of the tick; its failure (an upstream URI or change log the
        owner cannot read) is that changefeed's warning, never the other changefeeds' tick."""
        try:
            self._tick_changefeed(session, step, cf)
        except (MetastoreError, SchedulerError):
            raise  # the owner's own trouble, or a protocol bug: the tick fails loudly
        except Exception as exc:
            self._feeds.pop(cf.changefeed_id, None)  # rebuilt once the cause is gone
            message = (
                f"the owner cannot schedule it: {type(exc).__name__}: "
                f"{redact_text(' '.join(str(exc).split()))}"
            )
            log.warning("owner %s: changefeed %s: %s", self.owner_id, cf.changefeed_id, message)
            status = cf.status
            if status.state.running:
                step.progress[cf.changefeed_id] = ChangefeedProgress(
                    status.checkpoint_ts, status.resolved_ts, message, False, step.now_ms
                )

    def _tick_changefeed(self, session: OwnerSession, step: _TickState, cf: Changefeed) -> None:
        """One changefeed's part of the tick (its failure to build waits, visibly)."""
        cf_id, snapshot = cf.changefeed_id, step.snapshot
        stopped = not cf.status.state.running
        if stopped and not _held_anywhere(snapshot, cf_id):
            self._feeds.pop(cf_id, None)  # paused, failed or finished, and nothing held
            return
        feed = self._feed(
            cf, session.owner_rev, snapshot.ddl.get(cf_id), stopped, snapshot.revision
        )
        if feed is None:  # the change log's DDL stream has not reached the checkpoint yet
            step.progress[cf_id] = self._waiting(cf, step)
            return
        self._waiting_since.pop(cf_id, None)
        rebuilt, feed.fresh = feed.fresh, False
        if stopped:
            feed.stop_tables()
        else:
            feed.feed_ddls()
        reports = feed.reports_from(snapshot, step.alive, self.owner_id)
        result = feed.coordinator.tick(step.alive, reports, now_ms=step.now_ms)
        for m in result.messages:
            step.messages.setdefault(m.to, {}).setdefault(cf_id, []).append(m)
        if stopped:
            return  # only the removes travel; no progress, DDL or syncpoint
        step.errors += admin.apply_requests(session, feed.coordinator, step.requests.get(cf_id, []))
        step.ddls += self._ddls(feed, result)
        feed.note_ddls_done()
        step.syncs += self._syncpoint(feed, result)
        tick = self._progress(feed, result, rebuilt, snapshot.tasks.get(cf_id, {}))
        health = self._health(feed, cf, result, tick, step)
        step.ticks[cf_id] = tick
        cp = result.checkpoint
        step.progress[cf_id] = ChangefeedProgress(
            cp.checkpoint_ts, cp.resolved_ts, health.message, health.failed, step.now_ms
        )
        step.ddl_states[cf_id] = DdlState(
            result.barrier, feed.finished_ddl_ts, feed.last_syncpoint_ts
        )

    def _health(
        self,
        feed: _Feed,
        cf: Changefeed,
        result: TickResult,
        tick: ChangefeedTick,
        step: _TickState,
    ) -> Health:
        """What keeps the changefeed from moving, if anything (:mod:`cdc_dagster.runtime.health`)."""
        feed.motion.observe(tick.checkpoint_ts, tick.resolved_ts, step.now_ms, tick.tables)
        self._watch_snapshots(feed, cf, step.now_ms)
        if feed.snapshots is not None:  # kept past the watch (health.Motion.snapshot_moved_ms)
            feed.motion.snapshot_moved_ms = max(
                feed.motion.snapshot_moved_ms, feed.snapshots.progress_ms
            )
        self._watch_sink(feed, cf, step.now_ms)
        return judge(
            alive=bool(step.alive),
            table_failure=str(result.error) if result.error is not None else None,
            problems=self._problems(cf.changefeed_id, step),
            motion=feed.motion,
            tables=tick.tables,
            now_ms=step.now_ms,
            config=self.health,
            producer=_producer(cf.info.upstream_uri),
            ready_ddls=[f"{e.query!r} at {format_ts(e.commit_ts)}" for e in result.ready_ddls],
            source_resolved_ts=feed.ddl_upto,
            snapshots=feed.snapshots,
            notices=feed.sink_notices,
        )

    def _watch_sink(self, feed: _Feed, cf: Changefeed, now_ms: int) -> None:
        """Every ``SINK_LOOK_S``: whether the changefeed's tables' vacuums fail (a Delta
        sink with its vacuum on); the notice is kept between looks."""
        if feed.sink_looked_ms and now_ms - feed.sink_looked_ms < SINK_LOOK_S * 1000:
            return
        feed.sink_looked_ms = now_ms
        try:
            feed.sink_notices = sink_notices(cf.info.sink_uri, feed.schemas.values())
        except (OSError, ValueError) as exc:  # a bad URI is the sink's own problem, said there
            log.debug("changefeed %s: vacuum failures not read: %s", cf.changefeed_id, exc)

    def _watch_snapshots(self, feed: _Feed, cf: Changefeed, now_ms: int) -> None:
        """While the resolved ts or the checkpoint has stood still for a quarter of the stall
        time, watch the chunked snapshots of the changefeed's tables (the binlog puller's
        state in its change log and the snapshots' files: a read of each table's plan and
        chunk records, at most every ``SNAPSHOT_LOOK_S``); else forget them. A change log no
        puller writes has no puller state: no snapshot. (From half the stall time, a 10M-row
        snapshot read in 27-30 s was first looked at when complete: its end, never seen under
        way, was no motion, and the checkpoint it held was "not moved for 61 s" before its
        first slice was written.)"""
        motion = feed.motion
        still_s = (now_ms - min(motion.resolved_moved_ms, motion.checkpoint_moved_ms)) / 1000
        if still_s <= self.health.stall_s / 4:
            feed.snapshots = None
            return
        look_ms = min(SNAPSHOT_LOOK_S, self.health.stall_s / 4) * 1000
        if feed.snapshots is not None and now_ms - feed.snapshots.looked_ms < look_ms:
            return
        try:
            progress = [
                p
                for p in snapshot_progress(changelog_path(cf.info.upstream_uri))
                if not p.complete and feed.filter.matches(p.database, p.table)
            ]
        except (OSError, ValueError, UpstreamError) as exc:  # a file replaced as it was read
            log.debug("changefeed %s: snapshot progress not read: %s", cf.changefeed_id, exc)
            return  # looked at again next tick
        signature = tuple(
            (p.table_id, p.generation, p.chunks_read, p.chunks_placed) for p in progress
        )
        if feed.snapshots is None:
            feed.snapshots = SnapshotMotion()
        feed.snapshots.observe(signature, [p.line() for p in progress], now_ms)

    def _waiting(self, cf: Changefeed, step: _TickState) -> ChangefeedProgress:
        """A changefeed whose change log has not caught up with its checkpoint: its progress
        stands still, and its health says why (no captures, a puller's problem, or, after
        the stall time, that the change log's producer is not advancing)."""
        status = cf.status
        since = self._waiting_since.setdefault(cf.changefeed_id, step.now_ms)
        motion = Motion(status.resolved_ts, since, status.checkpoint_ts, since)
        health = judge(
            alive=bool(step.alive),
            table_failure=None,
            problems=self._problems(cf.changefeed_id, step),
            motion=motion,
            tables=(),
            now_ms=step.now_ms,
            config=self.health,
            producer=_producer(cf.info.upstream_uri),
        )
        return ChangefeedProgress(
            status.checkpoint_ts, status.resolved_ts, health.message, health.failed, step.now_ms
        )

    def _problems(self, changefeed_id: str, step: _TickState) -> dict[str, Problem]:
        """The problems recorded for the changefeed by alive captures, the puller, DDL runs."""
        return {
            source: p
            for source, p in step.snapshot.problems.get(changefeed_id, {}).items()
            if source in step.alive or source in (PULLER, DDL, SYNCPOINT)
        }

    def _feed(
        self,
        cf: Changefeed,
        owner_rev: int,
        ddl_state: DdlState | None,
        stopped: bool,
        revision: int = 0,
    ) -> _Feed | None:
        feed = self._feeds.get(cf.changefeed_id)
        if feed is not None and feed.epoch == cf.status.epoch:
            return feed
        self._feeds.pop(cf.changefeed_id, None)
        cp = cf.status.checkpoint_ts
        if not stopped:
            # The tables at the checkpoint and the DDLs at it are known only once the DDL
            # stream resolved that far: building earlier would miss a CREATE at or below it.
            resolved = ChangeLog(changelog_path(cf.info.upstream_uri)).ddl_resolved_ts()
            if resolved < cp:
                log.info(
                    "owner %s: changefeed %s waits: its change log's DDLs are resolved to %d, "
                    "below its checkpoint %d",
                    self.owner_id,
                    cf.changefeed_id,
                    resolved,
                    cp,
                )
                return None
        feed = self._feeds[cf.changefeed_id] = _Feed(self, cf, owner_rev, ddl_state, revision)
        log.info("owner %s: built changefeed %s from etcd", self.owner_id, cf.changefeed_id)
        return feed

    def _ddls(self, feed: _Feed, result: TickResult) -> list[ReadyDdl]:
        out = []
        for event in result.ready_ddls:
            if self.metastore.client.get(ddl_marker(self.metastore, feed.changefeed_id, event)):
                feed.coordinator.ddl_done(event)
                feed.finished_ddl_ts = max(feed.finished_ddl_ts, event.commit_ts)
                rec = feed.records[(event.commit_ts, event.query)]
                for t, schema in rec.tables.items():  # names after renames, for progress
                    if schema is None or t in event.drops:
                        feed.schemas.pop(t, None)
                    elif t in feed.schemas:
                        feed.schemas[t] = schema
            else:
                out.append(
                    ReadyDdl(feed.changefeed_id, feed.records[(event.commit_ts, event.query)])
                )
        return out

    def _syncpoint(self, feed: _Feed, result: TickResult) -> list[ReadySyncpoint]:
        ts = result.syncpoint_ts
        if ts is None:
            return []
        if self.metastore.client.get(syncpoint_marker(self.metastore, feed.changefeed_id, ts)):
            feed.coordinator.syncpoint_done(ts)
            feed.last_syncpoint_ts = ts
            return []
        tables = tuple(feed.coordinator.current_tables.tolist())
        return [ReadySyncpoint(feed.changefeed_id, ts, tables)]

    def _progress(
        self,
        feed: _Feed,
        result: TickResult,
        rebuilt: bool,
        statuses: Mapping[str, TaskStatus],
    ) -> ChangefeedTick:
        """The changefeed's tick; each table as its replication set has it, with the rows
        applied its primary reports (``statuses``: the task statuses read this tick), so the
        health judgement sees a table written slice by slice at one ts move."""
        now = self.now_ms()
        cp = result.checkpoint
        tables: list[TableProgress] = []
        coord = feed.coordinator
        if self.table_progress:
            reported = _ReportedRows(statuses)
            rm = coord.replications
            for t in coord.current_tables.tolist():
                s = feed.schemas.get(t)
                name = f"{s.database}.{s.table}" if s else str(t)
                if t in rm:
                    v = rm.view(t)
                    state, primary = v.state.name.lower(), v.primary or ""
                    ck, rs = v.checkpoint.checkpoint_ts, v.checkpoint.resolved_ts
                else:
                    state, primary, ck, rs = MISSING, "", 0, 0
                barrier = result.barrier.barrier_ts(t)
                rows = reported.of(primary, t) if primary else 0
                tables.append(
                    TableProgress(
                        feed.changefeed_id, t, state, primary, ck, rs, barrier, rows, name=name
                    )
                )
        return ChangefeedTick(
            feed.changefeed_id,
            cp.checkpoint_ts,
            cp.resolved_ts,
            result.barrier,
            max(0.0, (now - physical_ms(cp.checkpoint_ts)) / 1000),
            result.scheduler,
            result.dispatches,
            result.finished,
            rebuilt,
            tuple(tables),
        )

    def _finish(self, session: OwnerSession, cf_id: str) -> None:
        def change(status: Any) -> Any:
            if not status.state.running:
                return None
            return dataclasses.replace(status, state=ChangefeedState.FINISHED)

        self.metastore.changefeeds.update_status(cf_id, change, runner=session.txn)
        self._feeds.pop(cf_id, None)


def ddls_done_upto(checkpoint_ts: int, state: DdlState | None) -> int:
    """A TS at or below which every DDL of the changefeed ran downstream, from its DDL state.

    No state yet: a new changefeed, which at its start ts sees the schema at that ts (as
    TiCDC's does), so every DDL up to it counts as done. Otherwise the persisted
    ``finished_ddl_ts``, or one below the lowest barrier persisted with the checkpoint (a
    pending DDL keeps a barrier at its commit ts until it ran).
    """
    if state is None:
        return checkpoint_ts
    return max(state.finished_ddl_ts, barrier_cap(state.barrier) - 1)


def rebuild_ts(
    checkpoint_ts: int, ddls_done: int, state: DdlState | None, sync_point_interval_ms: int | None
) -> int:
    """The TS a rebuilt owner takes the tables at and queues DDLs and syncpoints after.

    The checkpoint itself when every DDL (and syncpoint) at it is known done; else one
    below it, so what sits exactly at the checkpoint runs again (the sink skips a DDL it
    already ran): TiCDC's ddlStartTs rule.
    """
    back = max(checkpoint_ts - 1, 0)
    if ddls_done < checkpoint_ts:
        return back
    if state is not None and sync_point_interval_ms and state.last_syncpoint_ts < checkpoint_ts:
        ms = physical_ms(checkpoint_ts)
        if checkpoint_ts == compose(ms) and ms % sync_point_interval_ms == 0:
            return back  # a syncpoint exactly at the checkpoint may not be recorded yet
    return checkpoint_ts


def _held_anywhere(snapshot: OwnerSnapshot, changefeed_id: str) -> bool:
    """Whether any capture still reports a table of the changefeed."""
    absent = int(TableState.ABSENT)
    return any(
        bool((st.tables.states != absent).any())
        for st in snapshot.tasks.get(changefeed_id, {}).values()
    )


# ------------------------------------------------------------------------------ DDL, syncpoint
def ddl_marker(ms: Metastore, changefeed_id: str, event: DDLEvent) -> str:
    """The key that says a DDL ran downstream."""
    digest = hashlib.sha256(event.query.encode()).hexdigest()[:12]
    return ms.layout.ddl_applied(changefeed_id, event.commit_ts, digest)


def syncpoint_marker(ms: Metastore, changefeed_id: str, ts: int) -> str:
    """The key that says a syncpoint was recorded."""
    return ms.layout.syncpoint_recorded(changefeed_id, ts)


def apply_ready_ddl(ms: Metastore, ready: ReadyDdl, *, sink: Sink | None = None) -> None:
    """Apply a ready DDL downstream (exactly once: the sink skips a DDL it already ran), then
    mark it applied so the owner's next tick lifts its barrier."""
    cf = ms.changefeeds.get(ready.changefeed_id).info
    sink = sink or open_sink(cf.sink_uri)
    changelog = ChangeLog(changelog_path(cf.upstream_uri))
    rec = ready.record
    before = {t: changelog.schema_at(t, rec.commit_ts - 1) for t in rec.table_ids}
    sink.apply_ddl(ready.changefeed_id, rec, before)
    failpoints.hit(failpoints.DDL_AFTER_APPLY)
    ms.client.put(ddl_marker(ms, ready.changefeed_id, rec.to_event()), rec.query.encode())


def apply_ddl_at(
    ms: Metastore, changefeed_id: str, commit_ts: int, *, sink: Sink | None = None
) -> list[str]:
    """Apply the change log's DDLs at ``commit_ts`` (a DDL run configured by ts); their queries.

    Call it only for a DDL the owner returned as ready (the DDL run's gate op checks that).
    """
    cf = ms.changefeeds.get(changefeed_id).info
    changelog = ChangeLog(changelog_path(cf.upstream_uri))
    records = changelog.ddl_records(after_ts=commit_ts - 1, upto_ts=commit_ts)
    for rec in records:
        apply_ready_ddl(ms, ReadyDdl(changefeed_id, rec), sink=sink)
    return [r.query for r in records]


def apply_syncpoint(ms: Metastore, ready: ReadySyncpoint, *, sink: Sink | None = None) -> str:
    """Record a syncpoint downstream, then mark it so the owner's next tick moves on; the
    line to log.

    A syncpoint the sink cannot pin (a table has no commit ending exactly at it: written
    before its sink split batches at syncpoints, or under another interval) is skipped,
    marked as such and said in the line: syncpoints hold nothing back, so refusing it would
    stop every later syncpoint and DDL instead; readers use the next one.
    """
    cf = ms.changefeeds.get(ready.changefeed_id).info
    sink = sink or open_sink(cf.sink_uri)
    changelog = ChangeLog(changelog_path(cf.upstream_uri))
    schemas = changelog.tables_at(ready.ts)
    tables = [schemas[t] for t in ready.table_ids if t in schemas]
    marker = syncpoint_marker(ms, ready.changefeed_id, ready.ts)
    try:
        sink.record_syncpoint(ready.changefeed_id, ready.ts, tables)
    except SyncpointUnpinnableError as exc:
        ms.client.put(marker, b"skipped")
        return f"syncpoint {ready.ts} of {ready.changefeed_id} skipped: {exc}"
    ms.client.put(marker, b"1")
    return f"syncpoint {ready.ts} of {ready.changefeed_id} recorded ({len(tables)} tables)"


# ------------------------------------------------------------------------------ the step
@dataclass(frozen=True, slots=True)
class OwnerStep:
    """One owner tick and what the owner carried out itself: what the control plane renders."""

    tick: OwnerTick
    # capture id -> its run config (changefeed -> wire messages), captures with messages only
    work: Mapping[str, Mapping[str, list[dict[str, Any]]]] = field(default_factory=dict)
    gated: tuple[ReadyDdl, ...] = ()  # DDLs on existing tables: each waits for a gated run
    notes: tuple[str, ...] = ()  # why nothing happened, refused admin requests, what was done
    duration_s: float = 0.0
    recorded: tuple[ReadySyncpoint, ...] = ()  # syncpoints recorded downstream this tick

    @property
    def tables(self) -> tuple[TableProgress, ...]:
        """Every changefeed's tables as the owner sees them."""
        return tuple(t for cf in self.tick.changefeeds.values() for t in cf.tables)


def owner_step(
    loop: OwnerLoop, *, apply_gated: bool = False, sink: Sink | None = None
) -> OwnerStep:
    """One :meth:`OwnerLoop.tick`, then what needs no gate: syncpoints are recorded, and DDLs
    that touch no existing table (CREATE TABLE / SCHEMA: no table checkpoint to gate on, and
    nothing writes a new table before it ran) are applied, instead of a run each. With
    ``apply_gated`` (the in-process driver, which has no gate) every ready DDL is applied."""
    started = time.perf_counter()
    tick = loop.tick()
    if not tick.is_owner:
        who = f"{tick.owner_id} (owner_rev {tick.owner_rev})" if tick.owner_id else "nobody"
        note = f"not the owner: {who} holds the election" + (
            f"; {tick.reason}" if tick.reason else ""
        )
        return OwnerStep(tick, notes=(note,), duration_s=time.perf_counter() - started)
    ms = loop.metastore
    notes = [f"admin request refused: {e}" for e in tick.admin_errors]
    notes += [f"capture {c}: its lease had expired; registered again" for c in tick.registered]
    recorded = []
    for ready in tick.syncpoints:
        said: list[str] = []  # apply_syncpoint's own line: recorded, or skipped and why
        done, note = carry_out(
            ms,
            ready.changefeed_id,
            SYNCPOINT,
            f"recording syncpoint {ready.ts} at the sink",
            lambda ready=ready, said=said: said.append(apply_syncpoint(ms, ready, sink=sink)),
        )
        notes.append(f"{ready.changefeed_id}: {said[0]}" if said else note)
        if done:
            recorded.append(ready)
    gated = []
    for ddl in tick.ready_ddls:
        if ddl.table_ids and not apply_gated:
            gated.append(ddl)
            continue
        _, note = carry_out(
            ms,
            ddl.changefeed_id,
            DDL,
            f"applying DDL {ddl.query!r} (commit ts {ddl.commit_ts}) at the sink",
            lambda ddl=ddl: apply_ready_ddl(ms, ddl, sink=sink),
        )
        notes.append(note)
    work = {c: w for c in tick.messages if (w := tick.run_config(c))}
    elapsed = time.perf_counter() - started
    return OwnerStep(tick, work, tuple(gated), tuple(notes), elapsed, tuple(recorded))


def carry_out(
    ms: Metastore, changefeed_id: str, source: str, what: str, action: Callable[[], object]
) -> tuple[bool, str]:
    """Do ``action`` for one changefeed, unless its last failure is still backing off; a
    failure is that changefeed's problem (shown in its state, retried with backoff), never
    the owner's or another changefeed's. Returns whether it was done, and a log line."""
    previous = ms.problems.get(changefeed_id, source)
    if previous is not None and previous.retry_at_ms > wall_ms():
        return False, f"{changefeed_id}: {what} waits for its retry after: {previous.message}"
    try:
        action()
    except MetastoreError:
        raise  # etcd's trouble is the owner's own, not the changefeed's
    except Exception as exc:
        message = f"{what} failed: {type(exc).__name__}: {redact_text(' '.join(str(exc).split()))}"
        problem = ms.problems.report(changefeed_id, source, message, wall_ms())
        log.warning("changefeed %s: %s (attempt %d)", changefeed_id, message, problem.attempts)
        return False, f"{changefeed_id}: {message} (attempt {problem.attempts})"
    if previous is not None:
        ms.problems.clear(changefeed_id, source)
    return True, f"{changefeed_id}: {what}: done"


def reported_checkpoints(statuses: Mapping[str, TaskStatus]) -> dict[int, int]:
    """Each table's checkpoint as the capture replicating it reports it (one changefeed's task
    statuses by capture, as ``Metastore.task_statuses.read`` returns them; the min should
    two report it: never more than one would admit)."""
    out: dict[int, int] = {}
    for status in statuses.values():
        batch = status.tables
        mask = batch.states == TableState.REPLICATING
        for t, c in zip(
            batch.table_ids[mask].tolist(), batch.checkpoint_ts[mask].tolist(), strict=True
        ):
            out[t] = min(c, out.get(t, c))
    return out


__all__ = [
    "ChangefeedTick",
    "OwnerLoop",
    "OwnerStep",
    "OwnerTick",
    "ReadyDdl",
    "ReadySyncpoint",
    "TableProgress",
    "apply_ddl_at",
    "apply_ready_ddl",
    "apply_syncpoint",
    "carry_out",
    "ddl_marker",
    "owner_step",
    "reported_checkpoints",
    "syncpoint_marker",
]
